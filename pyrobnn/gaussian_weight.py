r"""``GaussianWeight``: a weight that is still a distribution when a layer uses it.

A Normal-family posterior sample site normally hands the network one sampled
weight tensor :math:`w = \mu + \sigma \odot \epsilon`. Under the handlers
:func:`~pyrobnn.handlers.local_reparameterization` and
:func:`~pyrobnn.handlers.flipout` the site's value is instead a
``GaussianWeight``: a ``torch.Tensor`` subclass of the weight's shape that
carries :math:`(\mu, \sigma)` and, through PyTorch's ``__torch_function__``
protocol (no global patching; it only affects calls that receive such a
tensor, so it is thread-safe and nests), decides how ``F.linear`` and
``F.conv1d/2d/3d`` use it:

- ``"local"`` (Kingma et al. 2015, local reparameterization): the
  pre-activation is sampled directly,
  :math:`b \sim \mathcal N(F(x, \mu_W) + \mu_b,\; F(x^2, \sigma_W^2) + \sigma_b^2)`,
  independently for every example;
- ``"flipout"`` (Wen et al. 2018): one perturbation :math:`\Delta W = \sigma_W \odot \epsilon`
  per batch, decorrelated across examples by random signs,
  :math:`F(x, \mu_W) + F(x \odot s, \Delta W) \odot r + b`, :math:`s, r \in \{\pm 1\}`.

Both have the marginal mean and variance of weight sampling for each example.
- ``"moments"`` (VDP++, paper 002, under :func:`~pyrobnn.handlers.vdp`): no sampling; the
  layer returns a :class:`~pyrobnn.moments.Moments` tensor with the mean and variance of
  its pre-activations, which later layers propagate.

Vectorized Monte Carlo: a local-mode weight may carry ``particles = (B, S)``.
The first such layer that receives the B-row input computes the moments of
its pre-activations once and draws S independent samples of them, so its
output has S·B rows (particle-major); every later layer simply sees a batch
of S·B. Per example this is exactly S independent draws of the network under
:math:`q(w)`, at the cost of one pass.
Any other operation on a ``GaussianWeight`` (a layer without a rule, a
log-density in a Monte-Carlo KL) sees one ordinary weight sample, drawn once
and reused, so unsupported layers keep plain weight sampling.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_map

from .distribution_tensor import DistributionTensor

__all__ = ["GaussianWeight", "MODES"]

MODES = ("local", "flipout", "moments")

class GaussianWeight(DistributionTensor):
    """A weight :math:`w \\sim \\mathcal N(\\mu, \\sigma^2)` (elementwise) that layers may use as a distribution.

    Build with ``GaussianWeight(loc, scale, mode)``; ``loc`` and ``scale`` stay attached
    to autograd, so gradients reach the guide's parameters through every rule.
    """

    loc: torch.Tensor
    scale: torch.Tensor
    mode: str
    particles: tuple[int, int] | None

    @staticmethod
    def __new__(cls, loc: torch.Tensor, scale: torch.Tensor, mode: str = "local",
                particles: tuple[int, int] | None = None):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self = cls.wrap(loc)
        self.loc, self.scale, self.mode, self.particles = loc, scale.expand_as(loc), mode, particles
        self._sample = None
        return self

    def sample(self) -> torch.Tensor:
        """One weight sample :math:`\\mu + \\sigma \\odot \\epsilon`, drawn once and reused."""
        if self._sample is None:
            self._sample = torch.addcmul(self.loc, self.scale, torch.randn_like(self.loc))
        return self._sample

    def moments(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and variance of every weight."""
        return self.loc, self.scale.square()

    def __repr__(self):
        return f"GaussianWeight(shape={tuple(self.loc.shape)}, mode={self.mode!r})"

    @classmethod
    def dispatch(cls, func, args, kwargs):
        rule = _RULES.get(func)
        if rule is not None and len(args) > 1 and isinstance(args[1], GaussianWeight):
            return rule(*args, **kwargs)
        args, kwargs = tree_map(_as_sample, (args, kwargs))
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)


def _as_sample(value):
    return value.sample() if isinstance(value, GaussianWeight) else value


def _bias_moments(bias):
    """Mean and variance of a bias that may be Gaussian, deterministic or absent."""
    return bias.moments() if isinstance(bias, GaussianWeight) else (bias, None)


def _gaussian_layer(op, x, weight: GaussianWeight, bias=None, *rest, **kwargs):
    """Apply ``op(x, W, b, *rest)`` (``F.linear`` or ``F.convNd``) with a Gaussian ``W``."""
    if weight.mode == "moments":  # VDP++: propagate mean and variance, see pyrobnn.moments
        from .moments import affine_moments

        return affine_moments(op, x, weight, bias, *rest, **kwargs)
    bias_loc, bias_var = _bias_moments(bias)
    mean = op(x, weight.loc, bias_loc, *rest, **kwargs)
    if weight.mode == "local":
        std = op(x.square(), weight.scale.square(), bias_var, *rest, **kwargs).clamp_min(1e-16).sqrt()
        if weight.particles is not None and x.shape[0] == weight.particles[0]:
            repeats = (weight.particles[1],) + (1,) * (mean.dim() - 1)
            mean, std = mean.repeat(repeats), std.repeat(repeats)
        return torch.addcmul(mean, std, torch.randn_like(mean))
    # flipout: one weight perturbation per batch, sign-flipped per example and unit.
    delta = weight.scale * torch.randn_like(weight.scale)
    sign_in = _rademacher(x)
    perturbation = op(x * sign_in, delta, None, *rest, **kwargs)
    out = torch.addcmul(mean, perturbation, _rademacher(perturbation))
    if bias_var is not None:  # the bias is shared by the batch, like the weight perturbation
        shape = (1, -1) + (1,) * (out.dim() - 2)
        out = out + (bias_var.sqrt() * torch.randn_like(bias_var)).view(shape)
    return out


def _rademacher(like: torch.Tensor) -> torch.Tensor:
    """Independent random signs ±1 shaped like ``like``."""
    return torch.rand_like(like).lt_(0.5).mul_(2).sub_(1)


def _rule(op):
    return lambda x, weight, bias=None, *rest, **kwargs: _gaussian_layer(op, x, weight, bias, *rest, **kwargs)


_RULES = {op: _rule(op) for op in (F.linear, F.conv1d, F.conv2d, F.conv3d)}
