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

- ``"sample"`` (Bayes by Backprop): one weight sample :math:`w = \mu + \sigma \odot \epsilon` for the
  batch, as without a handler; this mode exists for its vectorized particles (below);
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

Vectorized Monte Carlo: a weight may carry ``particles = (B, S)``.
The first such layer that receives the B-row input makes S particles of it,
so its output has S·B rows (particle-major), and every later layer sees a
batch of S·B. In ``"sample"`` mode every layer draws S weight samples
(:meth:`GaussianWeight.particle_samples`, drawn once per site) and applies them
in one batched call: a batched matrix product, or a grouped convolution over the
particles' stacked channels. In ``"local"`` mode a Linear layer on one row per
example samples its pre-activations (exact per example), while a layer whose
input has several rows per example (a convolution, a linear map of tokens)
uses S weight samples as above, because per-position pre-activation noise would
ignore that positions share weights. In ``"flipout"`` mode particle s has its own
perturbation :math:`\Delta W_s` and signs. Either way each particle is an
independent draw of the network under :math:`q(w)`, all in one pass. (Without particles, local reparameterization of a
convolution samples every position independently: the usual approximation of
Kingma et al. 2015 and Molchanov et al. 2017 for training.)
Any other operation on a ``GaussianWeight`` (a layer without a rule, a
log-density in a Monte-Carlo KL) sees one ordinary weight sample, drawn once
and reused, so unsupported layers keep plain weight sampling; in ``"moments"``
mode it goes to the moment rules of :mod:`pyrobnn.moments` instead (e.g. a
Bayesian positional embedding added to activations), which name any operation
they do not cover.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_flatten, tree_map

from .distribution_tensor import DistributionTensor

__all__ = ["GaussianWeight", "MODES", "ParticlesUnsupported", "per_unit", "variance_op"]

MODES = ("sample", "local", "flipout", "moments")

class ParticlesUnsupported(RuntimeError):
    """A network uses a Bayesian parameter outside a Linear/Conv layer under vectorized particles."""


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
        self._sample = self._particle_samples = None
        return self

    @property
    def variance(self) -> torch.Tensor:
        r""":math:`\sigma^2`, of shape ``(out, 1, ...)`` or ``(1, 1, ...)`` when it is shared per output unit
        or per layer (the scale arrives broadcast: its stride-0 dimensions are undone), else the weight's."""
        scale = self.scale
        index = tuple(slice(0, 1) if size > 1 and stride == 0 else slice(None)
                      for size, stride in zip(scale.shape, scale.stride()))
        return scale[index].square()

    def sample(self) -> torch.Tensor:
        """One weight sample :math:`\\mu + \\sigma \\odot \\epsilon`, drawn once and reused."""
        if self._sample is None:
            self._sample = torch.addcmul(self.loc, self.scale, torch.randn_like(self.loc))
        return self._sample

    def samples(self, n: int) -> torch.Tensor:
        """``n`` independent weight samples, shape ``(n,) + shape`` (not cached)."""
        noise = torch.randn((n,) + self.shape, dtype=self.dtype, device=self.device)
        return torch.addcmul(self.loc, self.scale, noise)

    def particle_samples(self) -> torch.Tensor:
        """One weight sample per particle, shape ``(S,) + shape``, drawn once and reused (by the layer
        and by a Monte-Carlo KL, so both score the same draws)."""
        if self.particles is None:
            raise ValueError("particle_samples() needs a GaussianWeight built with particles=(B, S)")
        if self._particle_samples is None:
            self._particle_samples = self.samples(self.particles[1])
        return self._particle_samples

    def moments(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and variance (:attr:`variance`, possibly shared) of the weights."""
        return self.loc, self.variance

    def __repr__(self):
        return f"GaussianWeight(shape={tuple(self.loc.shape)}, mode={self.mode!r})"

    @classmethod
    def dispatch(cls, func, args, kwargs):
        rule = _RULES.get(func)
        if rule is not None and len(args) > 1 and isinstance(args[1], GaussianWeight):
            return rule(*args, **kwargs)
        if any(isinstance(v, GaussianWeight) and v.mode == "moments" for v in tree_flatten((args, kwargs))[0]):
            from .moments import Moments  # VDP++: every operation propagates moments (or names itself)

            return Moments.dispatch(func, args, kwargs)
        if any(isinstance(v, GaussianWeight) and v.particles is not None for v in tree_flatten((args, kwargs))[0]):
            name = getattr(func, "__qualname__", getattr(func, "__name__", repr(func)))
            raise ParticlesUnsupported(
                f"{name} uses a Bayesian parameter directly: only Linear/Conv layers run S particles in one pass; "
                f"draw the samples in a loop instead (num_particles=1, or vectorized=False for prediction)"
            )
        args, kwargs = tree_map(_as_sample, (args, kwargs))
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)


def _as_sample(value):
    return value.sample() if isinstance(value, GaussianWeight) else value


def _bias_moments(bias):
    """Mean and variance of a bias that may be Gaussian, deterministic or absent."""
    return bias.moments() if isinstance(bias, GaussianWeight) else (bias, None)


def per_unit(values: torch.Tensor, op, ndim: int) -> torch.Tensor:
    """``values`` (one per output unit, or one shared) shaped to broadcast against an ``ndim``-dimensional output
    of ``op``: units are the last dimension of ``F.linear``'s output and dimension 1 of ``F.convNd``'s."""
    return values.reshape(-1) if op is F.linear else values.reshape((1, -1) + (1,) * (ndim - 2))


def variance_op(op, a: torch.Tensor, var: torch.Tensor, shape: torch.Size, *rest, **kwargs) -> torch.Tensor:
    r"""``op(a, var.expand(shape), None, *rest)`` for ``op`` = ``F.linear``/``F.convNd``, where ``var`` is a weight
    variance of ``shape`` or one shared per output unit or per layer (``(out, 1, ...)``, ``(1, ...)``).

    A shared variance factors out of the sum: :math:`\sum_i a_i \sigma_n^2 = \sigma_n^2 \sum_i a_i`, one
    window sum of ``a`` (a single-output-channel op) scaled per unit, instead of a full layer's op.
    """
    groups = kwargs.get("groups", rest[3] if len(rest) > 3 else 1)
    if var.shape == shape or var.shape[1:].numel() != 1 or groups != 1:
        return op(a, var.expand(shape), None, *rest, **kwargs)
    summed = op(a, a.new_ones((1,) + tuple(shape[1:])), None, *rest, **kwargs)
    return summed * per_unit(var, op, summed.dim())


def _gaussian_layer(op, x, weight: GaussianWeight, bias=None, *rest, **kwargs):
    """Apply ``op(x, W, b, *rest)`` (``F.linear`` or ``F.convNd``) with a Gaussian ``W``."""
    from .moments import affine_moments  # imports this module

    if weight.mode == "moments":  # VDP++: propagate mean and variance, see pyrobnn.moments
        return affine_moments(op, x, weight, bias, *rest, **kwargs)
    if weight.particles is not None and (weight.mode == "sample" or x.dim() > 2):
        return _particle_weights(op, x, weight, bias, *rest, **kwargs)
    if weight.mode == "sample":
        return op(x, weight.sample(), _as_sample(bias), *rest, **kwargs)
    if weight.mode == "local":  # the pre-activations' moments are VDP's for a deterministic input
        moments = affine_moments(op, x, weight, bias, *rest, **kwargs)
        mean, std = moments.loc, moments.variance.clamp_min(1e-16).sqrt()
        if weight.particles is not None and _shared_input(x, weight.particles):  # S draws of moments computed once
            noise = torch.randn((weight.particles[1],) + mean.shape, dtype=mean.dtype, device=mean.device)
            return torch.addcmul(mean, std, noise).flatten(0, 1)
        return torch.addcmul(mean, std, torch.randn_like(mean))
    # flipout: one weight perturbation per batch (per particle), sign-flipped per example and unit.
    bias_loc, bias_var = _bias_moments(bias)
    particles = weight.particles[1] if weight.particles is not None else 1
    mean = op(x, weight.loc, bias_loc, *rest, **kwargs)
    if particles > 1 and _shared_input(x, weight.particles):  # the first layer: S copies of the input
        x, mean = (v.repeat((particles,) + (1,) * (v.dim() - 1)) for v in (x, mean))
    delta = weight.scale * torch.randn((particles,) + weight.shape, dtype=weight.dtype, device=weight.device)
    if particles == 1:
        perturbation = op(x * _rademacher(x), delta[0], None, *rest, **kwargs)
    else:
        perturbation = _per_particle(op, x * _rademacher(x), delta, None, weight.particles, *rest, **kwargs)
    out = torch.addcmul(mean, perturbation, _rademacher(perturbation))
    if bias_var is not None:  # the bias is shared by the batch (per particle), like the weight perturbation
        noise = bias_var.sqrt() * torch.randn((particles,) + bias_loc.shape, dtype=out.dtype, device=out.device)
        unit = per_unit(bias_loc, op, out.dim()).shape
        noise = noise.view((particles,) + (1,) * (out.dim() - len(unit)) + unit)
        out = (out.view((particles, -1) + out.shape[1:]) + noise).flatten(0, 1)
    return out


def _particle_weights(op, x, weight: GaussianWeight, bias, *rest, **kwargs):
    """S particles of a layer, each with its own weight sample (:meth:`GaussianWeight.particle_samples`)."""
    b = bias.particle_samples() if isinstance(bias, GaussianWeight) else bias
    return _per_particle(op, x, weight.particle_samples(), b, weight.particles, *rest, **kwargs)


def _per_particle(op, x, w: torch.Tensor, b, particles: tuple[int, int], *rest, **kwargs):
    """``op(x_s, w[s], b_s)`` for every particle s in one call: a batched matrix product, or a grouped
    convolution over the particles' stacked channels. ``x`` has B rows (the same input for every
    particle) or S·B (particle-major); ``b`` is ``(S, out)``, one shared ``(out,)`` or None."""
    first = _shared_input(x, particles)
    batch, particles = particles
    if first:  # the first Bayesian layer: the same input for every particle
        x = x.expand((particles,) + x.shape)
    else:
        x = x.view((particles, batch) + x.shape[1:])
    if op is F.linear:  # (S, B, ..., in) @ (S, 1, in, out)
        w = w.transpose(-1, -2).view((particles,) + (1,) * (x.dim() - 3) + w.shape[-1:] + w.shape[-2:-1])
        out = torch.matmul(x, w)
        return (out if b is None else out + b.view((-1,) + (1,) * (out.dim() - 2) + b.shape[-1:])).flatten(0, 1)
    options = dict(zip(("stride", "padding", "dilation", "groups"), rest), **kwargs)
    groups = options.pop("groups", 1)
    stacked = x.transpose(0, 1).flatten(1, 2)  # (B, S*C, ...)
    out = op(stacked, w.flatten(0, 1), None, groups=particles * groups, **options)
    out = out.view((batch, particles) + w.shape[1:2] + out.shape[2:]).transpose(0, 1)  # (S, B, out, ...)
    if b is not None:
        out = out + b.reshape((particles if b.dim() > 1 else 1, 1, -1) + (1,) * (out.dim() - 3))
    return out.flatten(0, 1)


def _shared_input(x: torch.Tensor, particles: tuple[int, int]) -> bool:
    """Whether ``x`` is the B-row input shared by all S particles (else it has S·B rows, particle-major)."""
    batch, count = particles
    if x.shape[0] not in (batch, batch * count):
        raise ValueError(
            f"a layer received {x.shape[0]} rows under {count} vectorized particles with batch_size={batch}: "
            f"pass batch_size=<rows of the input> (expected {batch}, or {batch * count} after the first layer)"
        )
    return x.shape[0] == batch


def _rademacher(like: torch.Tensor) -> torch.Tensor:
    """Independent random signs ±1 shaped like ``like``."""
    return torch.rand_like(like).lt_(0.5).mul_(2).sub_(1)


def _rule(op):
    return lambda x, weight, bias=None, *rest, **kwargs: _gaussian_layer(op, x, weight, bias, *rest, **kwargs)


_RULES = {op: _rule(op) for op in (F.linear, F.conv1d, F.conv2d, F.conv3d)}
