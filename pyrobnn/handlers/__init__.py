"""Effect handlers: tricks that change how a model runs, not what it is.

One Messenger per module, named ``<name>_messenger.py`` as in ``pyro.poutine``; the handler
functions, each usable as a context manager or a decorator, are made here. The estimators (how a
layer uses a Gaussian weight) are registered in :data:`ESTIMATORS`, the one list that the API,
the run configuration and the command line read.
"""

from __future__ import annotations

import functools
from typing import Callable, Optional, Union

import torch

from .estimator_messenger import EstimatorMessenger
from .flipout_messenger import FlipoutMessenger
from .kl_annealing_messenger import KLAnnealingMessenger
from .local_reparameterization_messenger import LocalReparameterizationMessenger
from .vdp_messenger import VDPMessenger
from .weight_sampling_messenger import WeightSamplingMessenger

__all__ = [
    "ESTIMATORS",
    "EstimatorMessenger",
    "FlipoutMessenger",
    "KLAnnealingMessenger",
    "LocalReparameterizationMessenger",
    "VDPMessenger",
    "WeightSamplingMessenger",
    "estimator",
    "flipout",
    "kl_annealing",
    "local_reparameterization",
    "vdp",
    "weight_sampling",
]


def _apply(messenger, fn):
    """The messenger as a context manager (``fn`` None) or ``fn`` wrapped in it (a decorator)."""
    if fn is None:
        return messenger
    if not callable(fn):
        raise ValueError(f"{fn!r} is not callable: pass the handler's options as keyword arguments")
    return functools.update_wrapper(messenger(fn), fn, updated=())


def _documented(messenger: type) -> Callable:
    def decorate(handler):
        handler.__doc__ = (f"Convenient wrapper of :class:`~{messenger.__module__}.{messenger.__name__}`\n\n"
                           f"{messenger.__doc__}")
        return handler

    return decorate


@_documented(KLAnnealingMessenger)
def kl_annealing(fn: Optional[Callable] = None, beta: Union[float, torch.Tensor] = 1.0):
    return _apply(KLAnnealingMessenger(beta), fn)


@_documented(WeightSamplingMessenger)
def weight_sampling(fn: Optional[Callable] = None, num_particles: int = 1, batch_size: Optional[int] = None):
    return _apply(WeightSamplingMessenger(num_particles, batch_size), fn)


@_documented(LocalReparameterizationMessenger)
def local_reparameterization(fn: Optional[Callable] = None, num_particles: int = 1,
                             batch_size: Optional[int] = None):
    return _apply(LocalReparameterizationMessenger(num_particles, batch_size), fn)


@_documented(FlipoutMessenger)
def flipout(fn: Optional[Callable] = None, num_particles: int = 1, batch_size: Optional[int] = None):
    return _apply(FlipoutMessenger(num_particles, batch_size), fn)


@_documented(VDPMessenger)
def vdp(fn: Optional[Callable] = None):
    return _apply(VDPMessenger(), fn)


ESTIMATORS: dict[str, type[EstimatorMessenger]] = {
    "sample": WeightSamplingMessenger,
    "local": LocalReparameterizationMessenger,
    "flipout": FlipoutMessenger,
    "vdp": VDPMessenger,
}
"""Gradient estimators by name: weight sampling (Blundell et al. 2015), local reparameterization
(Kingma et al. 2015), flipout (Wen et al. 2018), VDP++ moment propagation (deterministic, no particles)."""

def estimator(name: str, num_particles: int = 1, batch_size: Optional[int] = None) -> EstimatorMessenger:
    """The handler of estimator ``name`` (a key of :data:`ESTIMATORS`) with S = ``num_particles`` in one pass;
    the deterministic ``"vdp"`` ignores the particles."""
    if name not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {sorted(ESTIMATORS)}, got {name!r}")
    cls = ESTIMATORS[name]
    return cls(num_particles, batch_size) if cls.stochastic else cls()
