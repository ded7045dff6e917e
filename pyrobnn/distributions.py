"""Distributions that Pyro lacks and the priors of pyrobnn need."""

from __future__ import annotations

import math

import pyro.distributions as dist
import torch
from pyro.distributions import TorchDistribution, constraints
from torch.distributions import Independent, Normal, register_kl


class ScaleMixtureNormal(TorchDistribution):
    r"""Zero-mean two-component scale mixture of Gaussians (Blundell et al. 2015, eq. 7):

    .. math:: p(w) = \pi\,\mathcal N(w; 0, \sigma_1^2) + (1 - \pi)\,\mathcal N(w; 0, \sigma_2^2)

    A wide slab (:math:`\sigma_1`) and a narrow spike (:math:`\sigma_2 \ll 1`).
    The three hyper-parameters are scalars shared by every weight of the batch
    shape, so the log-density costs two squares and one ``logaddexp`` per
    weight. There is no closed-form KL divergence to a Gaussian posterior: the
    ELBO falls back on the Monte-Carlo estimate ``log q(w) - log p(w)``.
    """

    arg_constraints = {}
    support = constraints.real
    has_rsample = False

    def __init__(self, pi: float, sigma1: float, sigma2: float, batch_shape=torch.Size(), *,
                 device=None, dtype=None, validate_args=None):
        self.pi, self.sigma1, self.sigma2 = float(pi), float(sigma1), float(sigma2)
        self._device, self._dtype = device, dtype
        half_log_2pi = 0.5 * math.log(2 * math.pi)
        self._log_w1 = math.log(self.pi) - math.log(self.sigma1) - half_log_2pi
        self._log_w2 = math.log1p(-self.pi) - math.log(self.sigma2) - half_log_2pi
        super().__init__(torch.Size(batch_shape), validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        return ScaleMixtureNormal(self.pi, self.sigma1, self.sigma2, batch_shape,
                                  device=self._device, dtype=self._dtype)

    def _full(self, value: float) -> torch.Tensor:
        return torch.full(self.batch_shape, value, device=self._device, dtype=self._dtype)

    @property
    def mean(self):
        return self._full(0.0)

    @property
    def variance(self):
        return self._full(self.pi * self.sigma1**2 + (1 - self.pi) * self.sigma2**2)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return torch.logaddexp(
            self._log_w1 - 0.5 / self.sigma1**2 * value * value,
            self._log_w2 - 0.5 / self.sigma2**2 * value * value,
        )

    def sample(self, sample_shape=torch.Size()):
        shape = self._extended_shape(sample_shape)
        with torch.no_grad():
            wide = torch.rand(shape, device=self._device) < self.pi
            noise = torch.randn(shape, device=self._device, dtype=self._dtype)
            return noise * torch.where(wide, self.sigma1, self.sigma2).to(noise.dtype)


class IsotropicNormal(TorchDistribution):
    r"""The prior :math:`\mathcal N(\mu_p, \sigma_p^2)` of every weight of one tensor, as one event.

    Location and scale are two Python scalars shared by all weights; the event
    shape is the parameter's shape. Keeping them scalar lets the KL to a
    diagonal Normal posterior ``Normal(mu, sigma).to_event(d)`` be reduced
    while it is computed (three sums, no per-weight prior tensors):

    .. math:: \mathrm{KL}(q\|p) = \sum_i \log\frac{\sigma_p}{\sigma_i}
        + \frac{\sigma_i^2 + (\mu_i - \mu_p)^2}{2\sigma_p^2} - \frac12
    """

    arg_constraints = {}
    support = constraints.real
    has_rsample = True

    def __init__(self, loc: float, scale: float, event_shape, *, device=None, dtype=None, validate_args=None):
        self.loc, self.scale = float(loc), float(scale)
        self._device, self._dtype = device, dtype
        super().__init__(torch.Size(), torch.Size(event_shape), validate_args=validate_args)

    def _dims(self) -> tuple[int, ...]:
        return tuple(range(-len(self.event_shape), 0))

    def expand(self, batch_shape, _instance=None):
        """Batched copies are ordinary ``Normal(...).to_event(d)`` (the scalar shortcut is per event)."""
        shape = torch.Size(batch_shape) + self.event_shape
        full = torch.empty((), device=self._device, dtype=self._dtype)
        return dist.Normal(full.new_tensor(self.loc).expand(shape), full.new_tensor(self.scale).expand(shape)
                           ).to_event(len(self.event_shape))

    @property
    def mean(self):
        return torch.full(self.event_shape, self.loc, device=self._device, dtype=self._dtype)

    @property
    def variance(self):
        return torch.full(self.event_shape, self.scale**2, device=self._device, dtype=self._dtype)

    def sample(self, sample_shape=torch.Size()):
        with torch.no_grad():
            return self.rsample(sample_shape)

    def rsample(self, sample_shape=torch.Size()):
        shape = self._extended_shape(sample_shape)
        return self.loc + self.scale * torch.randn(shape, device=self._device, dtype=self._dtype)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        centred = value - self.loc if self.loc else value
        constant = self.event_shape.numel() * (math.log(self.scale) + 0.5 * math.log(2 * math.pi))
        return _sum_event(centred.square(), self._dims()) * (-0.5 / self.scale**2) - constant


def _sum_event(value: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """Sum over the event dimensions (none for a scalar parameter)."""
    return value.sum(dims) if dims else value


class _DiagonalNormalKL(torch.autograd.Function):
    r""":math:`\sum_i \mathrm{KL}(\mathcal N(\mu_i, \sigma_i^2) \| \mathcal N(\mu_p, \sigma_p^2))` for
    scalar prior hyper-parameters, reduced in the forward pass, with the closed-form gradients
    :math:`\partial/\partial\mu_i = (\mu_i - \mu_p)/\sigma_p^2` and
    :math:`\partial/\partial\sigma_i = \sigma_i/\sigma_p^2 - 1/\sigma_i`
    (three passes over the weights forward, three backward, instead of autograd's dozen)."""

    @staticmethod
    def forward(ctx, loc, scale, prior_loc: float, prior_scale: float):
        centred = (loc - prior_loc if prior_loc else loc).reshape(-1)
        flat_scale = scale.reshape(-1)
        precision = 1.0 / prior_scale**2
        ctx.save_for_backward(centred, flat_scale)
        ctx.precision, ctx.shape = precision, scale.shape
        return ((torch.dot(flat_scale, flat_scale) + torch.dot(centred, centred)) * (0.5 * precision)
                - flat_scale.log().sum() + flat_scale.numel() * (math.log(prior_scale) - 0.5))

    @staticmethod
    def backward(ctx, grad):
        centred, scale = ctx.saved_tensors
        grad_loc = grad_scale = None
        if ctx.needs_input_grad[0]:
            grad_loc = (centred * (grad * ctx.precision)).view(ctx.shape)
        if ctx.needs_input_grad[1]:
            grad_scale = ((scale * ctx.precision - scale.reciprocal()) * grad).view(ctx.shape)
        return grad_loc, grad_scale, None, None


@register_kl(Independent, IsotropicNormal)
@register_kl(Normal, IsotropicNormal)
def _kl_diagonal_normal_isotropic(q, p):
    base = q.base_dist if isinstance(q, Independent) else q
    if not isinstance(base, Normal) or q.event_shape != p.event_shape:
        raise NotImplementedError  # torch's "no closed form for this pair": the ELBO falls back to Monte Carlo
    if q.batch_shape == () and base.loc.shape == base.scale.shape == p.event_shape:
        return _DiagonalNormalKL.apply(base.loc, base.scale, p.loc, p.scale)
    dims = p._dims()
    centred = base.loc - p.loc if p.loc else base.loc
    return (
        (_sum_event(base.scale.square(), dims) + _sum_event(centred.square(), dims)) * (0.5 / p.scale**2)
        - _sum_event(base.scale.log(), dims)
        + p.event_shape.numel() * (math.log(p.scale) - 0.5)
    )
