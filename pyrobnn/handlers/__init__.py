"""How a model runs: effect handlers, the lazy values they give latent sites, moment rules, particle layout.

One Messenger per module, named ``<name>_messenger.py`` as in ``pyro.poutine``; the handler
functions, each usable as a context manager or a decorator, are made here. The estimators (how a
layer uses a weight that is still a distribution) are registered in :data:`ESTIMATORS`, the one list
that the API, the run configuration and the command line read; what each does with each posterior
family is the table of :mod:`pyrobnn.handlers.families`.
"""

from __future__ import annotations

import functools
from typing import Callable, Optional, Union

import torch

from pyrobnn.checks import choice
from pyrobnn.handlers.estimator_messenger import EstimatorMessenger
from pyrobnn.handlers.families import LAZY_VALUES, has_lazy_value, register_lazy_value
from pyrobnn.handlers.flipout_messenger import FlipoutMessenger
from pyrobnn.handlers.kl_annealing_messenger import KLAnnealingMessenger
from pyrobnn.handlers.local_reparameterization_messenger import LocalReparameterizationMessenger
from pyrobnn.handlers.vdp_messenger import VDPMessenger
from pyrobnn.handlers.weight_sampling_messenger import WeightSamplingMessenger

__all__ = [
    "ESTIMATORS",
    "LAZY_VALUES",
    "EstimatorMessenger",
    "FlipoutMessenger",
    "KLAnnealingMessenger",
    "LocalReparameterizationMessenger",
    "VDPMessenger",
    "WeightSamplingMessenger",
    "estimator",
    "flipout",
    "has_lazy_value",
    "kl_annealing",
    "local_reparameterization",
    "register_lazy_value",
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
def kl_annealing(fn: Optional[Callable] = None, beta: Union[float, torch.Tensor] = 1.0, *, validate: bool = True):
    return _apply(KLAnnealingMessenger(beta, validate=validate), fn)


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


def estimator(name: str, num_particles: int = 1, batch_size: Optional[int] = None, *,
              warn: bool = True) -> EstimatorMessenger:
    """The handler of estimator ``name`` (a key of :data:`ESTIMATORS`) with S = ``num_particles`` in one pass;
    the deterministic ``"vdp"`` takes none (``num_particles`` must be 1). ``warn=False``: say nothing when it finds
    no site to act on (for a caller that chose the estimator itself)."""
    return ESTIMATORS[choice("estimator", name, ESTIMATORS)](num_particles, batch_size, warn=warn)
