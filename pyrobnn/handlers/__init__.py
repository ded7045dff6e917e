"""Effect handlers: tricks that change how a model runs, not what it is."""

from .flipout import FlipoutMessenger, flipout
from .kl_annealing import KLAnnealingMessenger, kl_annealing
from .local_reparameterization import LocalReparameterizationMessenger, local_reparameterization
from .vdp import VDPMessenger, vdp

__all__ = [
    "FlipoutMessenger",
    "KLAnnealingMessenger",
    "LocalReparameterizationMessenger",
    "VDPMessenger",
    "flipout",
    "kl_annealing",
    "local_reparameterization",
    "vdp",
]
