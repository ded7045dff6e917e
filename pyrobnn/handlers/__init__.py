"""Effect handlers: tricks that change how a model runs, not what it is."""

from .flipout import FlipoutMessenger, flipout
from .kl_annealing import KLAnnealingMessenger, kl_annealing
from .local_reparameterization import LocalReparameterizationMessenger, local_reparameterization
from .vdp import VDPMessenger, vdp
from .weight_sampling import WeightSamplingMessenger, weight_sampling

__all__ = [
    "FlipoutMessenger",
    "KLAnnealingMessenger",
    "LocalReparameterizationMessenger",
    "VDPMessenger",
    "WeightSamplingMessenger",
    "flipout",
    "kl_annealing",
    "local_reparameterization",
    "vdp",
    "weight_sampling",
]
