r"""The estimator × posterior-family table: what each estimator handler does with each posterior.

An estimator handler (:mod:`pyrobnn.handlers`) gives a latent site whose posterior family is listed in
:data:`LAZY_VALUES` a lazy value (:mod:`pyrobnn.handlers.lazy_value`) instead of one sample; the layers that
use it then follow this table (S: ``num_particles``):

======================  ===========================  =============================  ============================
estimator               Normal (``GaussianWeight``)  MC dropout (``MaskedWeight``)  mixture node (``NodeDraws``)
======================  ===========================  =============================  ============================
``weight_sampling``     S = 1: the guide's sample;   one input mask per example     row r: component r mod K
                        S > 1: S weight samples      (and per particle)             (b + s mod K under S)
``local_reparam...``    sampled pre-activations      one input mask per example     row r: component r mod K
``flipout``             shared perturbation, signs   one input mask per example     row r: component r mod K
                        per example
``vdp``                 moments (mean, variance)     moments, var M² p/(1-p)        moments of the mixture
======================  ===========================  =============================  ============================

A site of any other family is sampled as usual, and refused under S > 1 particles
(:class:`~pyrobnn.handlers.particles.ParticlesUnsupported`). A new family joins with
:func:`register_lazy_value` (its value class implements the layers, reading ``estimator.stochastic`` and
``estimator.particles``), as ``pyro.infer.reparam`` strategies are chosen by distribution type.
"""

from __future__ import annotations

from typing import Callable

from torch.distributions import Independent, Normal

from pyrobnn.distributions import DropoutWeight, EqualMixtureNormal
from pyrobnn.handlers.gaussian_weight import GaussianWeight
from pyrobnn.handlers.lazy_value import LazyValue
from pyrobnn.handlers.masked_weight import MaskedWeight
from pyrobnn.handlers.node_draws import NodeDraws

__all__ = ["LAZY_VALUES", "register_lazy_value", "lazy_value_factory", "has_lazy_value", "base_distribution"]

LAZY_VALUES: dict[type, Callable[..., LazyValue]] = {
    Normal: GaussianWeight.of,
    DropoutWeight: MaskedWeight,
    EqualMixtureNormal: NodeDraws,
}
"""Posterior family (distribution type) -> ``factory(fn, estimator)``, the lazy value of a site sampled from
``fn``; a subclass of a listed type takes its entry."""


def register_lazy_value(distribution_type: type, factory: Callable[..., LazyValue]) -> None:
    """Give sites whose distribution is a ``distribution_type`` the value ``factory(fn, estimator)`` under every
    estimator handler (``fn`` as the site has it: ``fn.shape()`` is the value's shape)."""
    if not isinstance(distribution_type, type) or not callable(factory):
        raise TypeError("register_lazy_value(distribution_type, factory): a distribution class and a callable "
                        "factory(fn, estimator) -> LazyValue")
    LAZY_VALUES[distribution_type] = factory


def base_distribution(fn):
    """The distribution of each element of a site: ``fn.base_dist`` of an ``Independent``, else ``fn``."""
    return fn.base_dist if isinstance(fn, Independent) else fn


def lazy_value_factory(fn) -> Callable[..., LazyValue] | None:
    """The factory of :data:`LAZY_VALUES` for a site sampled from ``fn``, or None (sampled as usual)."""
    for cls in type(base_distribution(fn)).__mro__:
        if cls in LAZY_VALUES:
            return LAZY_VALUES[cls]
    return None


def has_lazy_value(fn) -> bool:
    """Whether estimator handlers give a site sampled from ``fn`` a lazy value (so it runs particles in one pass)."""
    return lazy_value_factory(fn) is not None
