r"""Lazy values: what an estimator handler gives a latent site instead of one sample.

Under an estimator handler (:mod:`pyrobnn.handlers`) a site whose posterior family has a lazy value
(:mod:`pyrobnn.handlers.families`) receives a :class:`LazyValue`: a ``torch.Tensor`` subclass of the site's
shape that still carries the posterior and the handler (``estimator``) that made it. The layers that use
it ask the handler's rule (weight sampling, local reparameterization, flipout, VDP++ moments) through
PyTorch's ``__torch_function__`` protocol (:class:`~pyrobnn.handlers.distribution_tensor.DistributionTensor`):
nothing is patched globally, so it is thread-safe and nests.

- :class:`LazyValue`: every lazy value; it knows its ``moments()`` and the draws a Monte-Carlo KL scores
  (:meth:`LazyValue.kl_draws`).
- :class:`LazyWeight`: a lazy value that is a weight, with a sample cache: one sample drawn once and reused
  by every non-layer operation, and one sample per particle shared by the layer and the KL.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pyro.distributions import TorchDistribution

from pyrobnn.handlers.distribution_tensor import DistributionTensor

__all__ = ["LAYERS", "LazyValue", "LazyWeight", "ScoredByDraws", "as_sample", "unscored"]

LAYERS = frozenset({F.linear, F.conv1d, F.conv2d, F.conv3d})
"""The layer functions an estimator has a rule for: ``op(x, weight, bias, *rest)``."""


class LazyValue(DistributionTensor):
    """The value of a latent site under an estimator handler: a distribution, not a sample.
    ``estimator`` is the handler that made it; subclasses define :meth:`kl_draws`, ``moments()`` and
    ``dispatch()``."""

    estimator: object

    def kl_draws(self) -> torch.Tensor:
        """The draws a Monte-Carlo KL (or a Pyro ELBO's ``log_prob``) scores, shape ``(S,) + shape``."""
        raise NotImplementedError


class LazyWeight(LazyValue):
    """A weight still known by its posterior when a layer uses it
    (:class:`~pyrobnn.handlers.gaussian_weight.GaussianWeight`, :class:`~pyrobnn.handlers.masked_weight.MaskedWeight`).
    Subclasses define :meth:`samples`."""

    loc: torch.Tensor

    def _init_cache(self) -> None:
        self._sample = self._draws = None

    def samples(self, n: int) -> torch.Tensor:
        """``n`` independent weight samples, shape ``(n,) + shape`` (fresh draws)."""
        raise NotImplementedError

    def sample(self) -> torch.Tensor:
        """One weight sample, drawn once and reused."""
        if self._sample is None:
            self._sample = self.samples(1)[0]
        return self._sample

    def particle_samples(self, n: int) -> torch.Tensor:
        """One weight sample per particle, ``(n,) + shape``, drawn once and reused (by the layer and by a
        Monte-Carlo KL, so both score the same draws)."""
        if self._draws is None or self._draws.shape[0] != n:
            self._draws = self.samples(n)
        return self._draws

    def kl_draws(self) -> torch.Tensor:
        """The estimator's draws of this weight: one per particle, or the one sample."""
        return self.estimator.kl_draws(self)


def as_sample(value):
    """``value``'s single weight sample if it is a :class:`LazyWeight`, else ``value``."""
    return value.sample() if isinstance(value, LazyWeight) else value


class ScoredByDraws(TorchDistribution):
    r"""The distribution of a site whose value is a :class:`LazyValue`, as Pyro's own ELBOs score it.

    ``Trace_ELBO`` and its kin score every latent site by ``fn.log_prob(value)``. A lazy value is no sample: it
    stands for the draws the layers used (one per particle, or per example), so the estimator handler gives both
    the guide's and the model's site this wrapper, whose ``log_prob`` averages the wrapped density over the
    value's :meth:`~LazyValue.kl_draws`, :math:`\frac1S\sum_s \log f(w_s)`: the same draws on both sides, so
    ``log q - log p`` is the Monte-Carlo KL that :class:`~pyrobnn.MeanFieldELBO` uses where no closed form
    exists. Any other value is scored by the wrapped distribution itself.
    """

    arg_constraints: dict = {}

    def __init__(self, base):
        self.base = base
        super().__init__(base.batch_shape, base.event_shape, validate_args=False)

    @property
    def has_rsample(self) -> bool:
        return self.base.has_rsample

    @property
    def support(self):
        return self.base.support

    def sample(self, sample_shape=torch.Size()):
        return self.base.sample(sample_shape)

    def rsample(self, sample_shape=torch.Size()):
        return self.base.rsample(sample_shape)

    def log_prob(self, value):
        if isinstance(value, LazyValue):
            return self.base.log_prob(value.kl_draws()).mean(0)
        return self.base.log_prob(value)


def unscored(fn):
    """The distribution behind a :class:`ScoredByDraws` (``fn`` itself otherwise), e.g. for a closed-form KL."""
    return fn.base if isinstance(fn, ScoredByDraws) else fn
