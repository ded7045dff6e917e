r"""``MaskedWeight``: an MC-dropout weight that is still a distribution when a layer uses it.

Under an estimator handler (:mod:`pyrobnn.handlers`) a site whose posterior is a
:class:`~pyrobnn.distributions.DropoutWeight` gets a ``MaskedWeight`` value, as a Normal-family site
gets a :class:`~pyrobnn.handlers.gaussian_weight.GaussianWeight`. A sampling estimator (weight sampling, local
reparameterization, flipout: for dropout they are the same rule) applies it as MC dropout does,
one mask per example (Gal & Ghahramani 2016):

.. math:: \mathrm{op}(x_b \odot m_b / (1-p),\; M) + b, \qquad m_{b,j} \sim \mathrm{Bernoulli}(1 - p),

``m_b`` one value per input feature of example ``b`` (per input channel of a convolution, shared over
positions; per input feature of a sequence, shared over its tokens), so each example sees its own
exact draw of :math:`W = M\operatorname{diag}(m_b)/(1-p)`. With S particles each particle's copy of
an example draws its own mask. Under :func:`~pyrobnn.handlers.vdp` the weight enters the moment rules
with mean :math:`M` and variance :math:`M^2 p/(1-p)` (masks treated as independent per weight, the
VDP++ approximation). Any other operation sees one weight sample, drawn once and reused.
"""

from __future__ import annotations

import torch

from pyrobnn._compat import tree_flatten
from pyrobnn.distributions import DropoutWeight
from pyrobnn.handlers.lazy_value import LAYERS, LazyWeight, as_sample

__all__ = ["MaskedWeight"]


class MaskedWeight(LazyWeight):
    """The weight :math:`W = M\\operatorname{diag}(m)/(1-p)` of a :class:`DropoutWeight` posterior, applied by
    ``estimator`` (the handler that made it)."""

    posterior: DropoutWeight

    @staticmethod
    def __new__(cls, posterior: DropoutWeight, estimator):
        self = cls.wrap(posterior.loc)
        self.posterior, self.loc, self.estimator = posterior, posterior.loc, estimator
        self._init_cache()
        return self

    def moments(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.loc, self.posterior.variance

    def samples(self, n: int) -> torch.Tensor:
        """``n`` independent weight samples (one mask each), ``(n,) + shape``."""
        return self.posterior.rsample((n,))

    def __repr__(self):
        return (f"MaskedWeight(shape={tuple(self.loc.shape)}, rate={self.posterior.rate}, "
                f"estimator={type(self.estimator).__name__})")

    def layer(self, op, x, weight, bias=None, *rest, **kwargs):
        """``op(x, W, b)`` with the input dropped per example (module docstring)."""
        if self.estimator.particles is not None:
            x = self.estimator.particles.rows(x)
        if self.posterior.dropped:
            if op is torch.nn.functional.linear:  # one mask per example, shared by its tokens
                shape = x.shape[:1] + (1,) * (x.dim() - 2) + x.shape[-1:]
            else:  # one mask per example and input channel, shared by positions
                shape = x.shape[:2] + (1,) * (x.dim() - 2)
            x = x * self.posterior.keep_mask(shape)
        return op(x, self.loc, as_sample(bias), *rest, **kwargs)

    @classmethod
    def dispatch(cls, func, args, kwargs):
        if func in LAYERS and len(args) > 1 and isinstance(args[1], MaskedWeight):
            weight = args[1]
            if weight.estimator.stochastic:
                return weight.layer(func, *args, **kwargs)
            return weight.estimator.layer(func, *args, **kwargs)  # moment propagation
        weight = next(v for v in tree_flatten((args, kwargs))[0] if isinstance(v, MaskedWeight))
        return weight.estimator.other(func, args, kwargs)
