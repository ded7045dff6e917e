r"""``GaussianWeight``: a weight that is still a distribution when a layer uses it.

A Normal-family posterior sample site normally hands the network one sampled
weight :math:`w = \mu + \sigma \odot \epsilon`. Under an estimator handler
(:mod:`pyrobnn.handlers`) the site's value is a ``GaussianWeight`` instead: a
``torch.Tensor`` subclass of the weight's shape that carries :math:`(\mu, \sigma)`
and the handler that made it. Through PyTorch's ``__torch_function__`` protocol
(nothing is patched globally: only calls that receive such a tensor are affected,
so it is thread-safe and nests) every operation on it is handed to that handler,
the *estimator*:

- ``F.linear`` / ``F.convNd`` with the weight as second argument go to
  ``estimator.layer(op, x, weight, bias, ...)``: each handler's own rule
  (weight sampling, local reparameterization, flipout, VDP++ moments);
- any other operation goes to ``estimator.other(func, args, kwargs)``, which by
  default sees one ordinary weight sample, drawn once and reused.
"""

from __future__ import annotations

import torch
from torch.distributions import Independent

from pyrobnn._compat import tree_flatten
from pyrobnn.distributions import JointFactor
from pyrobnn.handlers.lazy_value import LAYERS, LazyWeight

__all__ = ["GaussianWeight"]


class GaussianWeight(LazyWeight):
    r"""A weight :math:`w \sim \mathcal N(\mu, \sigma^2)` (elementwise) used by layers as ``estimator`` says.

    ``loc`` and ``scale`` stay attached to autograd, so gradients reach the guide's parameters
    through every rule. ``estimator`` is the handler that made it (see module docstring).
    """

    scale: torch.Tensor

    @staticmethod
    def __new__(cls, loc: torch.Tensor, scale: torch.Tensor, estimator, variance: torch.Tensor | None = None):
        self = cls.wrap(loc)
        self.loc, self.estimator = loc, estimator
        self.scale = scale if scale.shape == loc.shape else scale.expand_as(loc)
        self._variance = variance
        self._init_cache()
        return self

    @classmethod
    def of(cls, fn, estimator) -> "GaussianWeight":
        r"""The lazy value of a site sampled from a Normal ``fn`` (or an ``Independent`` of one), at the site's
        shape ``fn.shape()``. A factor of a :class:`~pyrobnn.guides.normal.JointNormal` brings its variance, a view
        of :math:`\sigma^2` squared once over all weights."""
        base = fn.base_dist if isinstance(fn, Independent) else fn
        loc, scale = base.loc, base.scale
        if loc.shape != fn.shape():
            loc, scale = loc.expand(fn.shape()), scale.expand(fn.shape())
        return cls(loc, scale, estimator, base.joint.variance(base.index) if isinstance(base, JointFactor) else None)

    @property
    def variance(self) -> torch.Tensor:
        r""":math:`\sigma^2`, of shape ``(out, 1, ...)`` or ``(1, 1, ...)`` when it is shared per output unit
        or per layer (the scale arrives broadcast: its stride-0 dimensions are undone), else the weight's."""
        if self._variance is not None and self._variance.shape == self.shape:
            return self._variance
        scale = self.scale
        index = tuple(slice(0, 1) if size > 1 and stride == 0 else slice(None)
                      for size, stride in zip(scale.shape, scale.stride()))
        return scale[index].square()

    def moments(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and variance (:attr:`variance`, possibly shared) of the weights."""
        return self.loc, self.variance

    def samples(self, n: int) -> torch.Tensor:
        r"""``n`` independent weight samples :math:`\mu + \sigma \odot \epsilon`, shape ``(n,) + shape``."""
        noise = torch.randn((n,) + self.shape, dtype=self.dtype, device=self.device)
        return torch.addcmul(self.loc, self.scale, noise)

    def __repr__(self):
        return f"GaussianWeight(shape={tuple(self.loc.shape)}, estimator={type(self.estimator).__name__})"

    @classmethod
    def dispatch(cls, func, args, kwargs):
        if func in LAYERS and len(args) > 1 and isinstance(args[1], GaussianWeight):
            return args[1].estimator.layer(func, *args, **kwargs)
        weight = next(v for v in tree_flatten((args, kwargs))[0] if isinstance(v, GaussianWeight))
        return weight.estimator.other(func, args, kwargs)
