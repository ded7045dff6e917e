"""Effect handlers: tricks that change how a model runs, not what it is."""

from .flipout import FlipoutMessenger, flipout
from .kl_annealing import KLAnnealingMessenger, kl_annealing
from .local_reparameterization import LocalReparameterizationMessenger, local_reparameterization

__all__ = [
    "FlipoutMessenger",
    "KLAnnealingMessenger",
    "LocalReparameterizationMessenger",
    "flipout",
    "kl_annealing",
    "local_reparameterization",
]
