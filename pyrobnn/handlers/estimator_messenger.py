r"""The mechanism every estimator handler shares: Normal-family sites become :class:`GaussianWeight` s.

An estimator handler gives every Normal-family latent sample site a
:class:`~pyrobnn.gaussian_weight.GaussianWeight` value instead of a sampled
tensor, and is itself the strategy that the layers consuming it call
(``layer``/``other``, see :mod:`pyrobnn.gaussian_weight`); each subclass (one file
each) holds its own rule. Sites that already have a value (the model replaying
the guide, observed sites), Pyro's subsample sites and non-Normal latent sites
pass through untouched, so the handler is placed around the whole ELBO or
prediction call (or around the guide), like :func:`~pyrobnn.handlers.kl_annealing`.

``num_particles`` S > 1 vectorizes Monte Carlo by the layout of :mod:`pyrobnn.particles`.

Other posterior families join by registering a lazy value for their distribution type with
:func:`lazy_value` (e.g. the dropout posterior of :class:`~pyrobnn.guides.DropoutGuide`): the value
is a :class:`~pyrobnn.distribution_tensor.DistributionTensor` that implements the layers itself,
reading ``estimator.stochastic`` and ``estimator.particles``.
"""

from __future__ import annotations

from typing import Callable

import torch
from pyro.poutine.messenger import Messenger
from pyro.poutine.util import site_is_subsample
from torch.distributions import Independent, Normal

from .._compat import DisableTorchFunctionSubclass, tree_map
from ..checks import positive_int
from ..gaussian_weight import GaussianWeight, as_sample
from ..particles import Particles, ParticlesUnsupported

__all__ = ["EstimatorMessenger", "lazy_value", "has_lazy_value"]

_LAZY_VALUES: dict[type, Callable] = {}


def lazy_value(distribution_type: type):
    """Register ``factory(fn, estimator) -> DistributionTensor``, the value an estimator handler gives a latent
    site whose distribution ``fn`` (or ``fn.base_dist`` when ``fn`` is an ``Independent``) is a
    ``distribution_type``; ``fn`` is passed as the site has it (``fn.shape()`` is the value's shape).
    Used as a decorator; returns the factory."""

    def register(factory):
        _LAZY_VALUES[distribution_type] = factory
        return factory

    return register


def _base(fn):
    """The distribution of each element of a site: ``fn.base_dist`` of an ``Independent``, else ``fn``."""
    return fn.base_dist if isinstance(fn, Independent) else fn


def _factory(fn):
    for cls in type(_base(fn)).__mro__:
        if cls in _LAZY_VALUES:
            return _LAZY_VALUES[cls]
    return None


def has_lazy_value(fn) -> bool:
    """Whether estimator handlers give a site sampled from ``fn`` a lazy value (so it runs particles in one pass)."""
    return _factory(fn) is not None


@lazy_value(Normal)
def _gaussian_weight(fn, estimator) -> GaussianWeight:
    base = _base(fn)
    loc, scale = base.loc, base.scale
    if loc.shape != fn.shape():
        loc, scale = loc.expand(fn.shape()), scale.expand(fn.shape())
    return GaussianWeight(loc, scale, estimator)


def _name(func) -> str:
    return getattr(func, "__qualname__", getattr(func, "__name__", repr(func)))


class EstimatorMessenger(Messenger):
    """Abstract base: subclasses define :meth:`layer` (and may override :meth:`other`, :meth:`kl_draws`).

    :param num_particles: S > 1 runs S independent draws of the network in one pass.
    :param batch_size: the number of rows of the input (needed when ``num_particles > 1``).
    """

    stochastic: bool = True
    """Whether the estimator samples (and so takes particles); VDP++ does not."""

    def __init__(self, num_particles: int = 1, batch_size: int | None = None):
        num_particles = positive_int("num_particles", num_particles)
        if num_particles > 1 and not (isinstance(batch_size, int) and batch_size > 0):
            raise ValueError(f"{type(self).__name__}(num_particles > 1) needs batch_size=<rows of the input>")
        super().__init__()
        self.particles = Particles(batch_size, num_particles) if num_particles > 1 else None

    # -- the effects -----------------------------------------------------------------------
    def _pyro_sample(self, msg):
        if msg["is_observed"] or msg["done"] or msg["value"] is not None or site_is_subsample(msg):
            return
        fn = msg["fn"]
        factory = _factory(fn)
        if factory is None:
            if self.particles is not None:
                raise ParticlesUnsupported(
                    f"site {msg['name']!r} has a {type(_base(fn)).__name__} posterior: only Normal-family sites run "
                    f"{self.particles.count} particles in one pass"
                )
            return  # sampled as usual
        if fn.batch_shape:
            raise ValueError(
                f"site {msg['name']!r} is sampled inside the vectorized plate(s) "
                f"{[f.name for f in msg['cond_indep_stack']]} (Trace_ELBO(vectorize_particles=True) or "
                f"Predictive(parallel=True)): {type(self).__name__} needs one weight per layer; vectorize with "
                f"num_particles=S here (or pyrobnn.predict.predict) instead"
            )
        msg["value"] = factory(fn, self)
        msg["done"] = True

    def _pyro_align_targets(self, msg):
        if self.particles is not None and msg["args"][0] is not None:
            msg["value"] = self.particles.repeat(msg["args"][0])
            msg["done"] = True

    # -- the strategy the layers call --------------------------------------------------------
    def layer(self, op, x, weight: GaussianWeight, bias=None, *rest, **kwargs):
        """``op(x, weight, bias, *rest)`` (``F.linear`` or ``F.convNd``) with a Gaussian ``weight``."""
        raise NotImplementedError

    def other(self, func, args, kwargs):
        """Any other operation on a Gaussian weight sees one weight sample, drawn once and reused."""
        if self.particles is not None:
            raise ParticlesUnsupported(
                f"{_name(func)} uses a Bayesian parameter directly: only Linear/Conv layers run S particles in "
                "one pass; draw the samples in a loop instead (num_particles=1, or vectorized=False for prediction)"
            )
        args, kwargs = tree_map(as_sample, (args, kwargs))
        with DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    def kl_draws(self, weight: GaussianWeight) -> torch.Tensor:
        """The draws a Monte-Carlo KL of ``weight`` scores: the particles' weights, or the one sample."""
        if self.particles is not None:
            return weight.particle_samples(self.particles.count)
        return weight.sample().unsqueeze(0)

    def sampled_layer(self, op, x, weight: GaussianWeight, bias=None, *rest, **kwargs):
        r"""The layer with whole weights sampled, :math:`w_s = \mu + \sigma \odot \epsilon_s`: one sample for
        the batch, or one per particle applied in one batched call (:meth:`Particles.layer`)."""
        if self.particles is None:
            return op(x, weight.sample(), as_sample(bias), *rest, **kwargs)
        count = self.particles.count
        b = bias.particle_samples(count) if isinstance(bias, GaussianWeight) else bias
        return self.particles.layer(op, x, weight.particle_samples(count), b, *rest, **kwargs)
