"""Effect handlers: tricks that change how a model runs, not what it is."""

from .kl_annealing import KLAnnealingMessenger, kl_annealing

__all__ = ["KLAnnealingMessenger", "kl_annealing"]
