"""Distributions that Pyro lacks and the priors of pyrobnn need."""

from __future__ import annotations

import math

import pyro.distributions as dist
import torch
from pyro.distributions import TorchDistribution, constraints
from torch.distributions import register_kl


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


class IsotropicNormal(dist.Normal):
    r"""A Normal whose location and scale are one scalar each, broadcast over the batch shape.

    The prior :math:`\mathcal N(\mu_p, \sigma_p^2)` shared by every weight of a
    tensor. Keeping the hyper-parameters scalar lets the KL to a diagonal
    Normal posterior be evaluated with scalar arithmetic on the prior side:

    .. math:: \mathrm{KL}(\mathcal N(\mu, \sigma^2) \| \mathcal N(\mu_p, \sigma_p^2))
        = \log\sigma_p - \log\sigma + \frac{\sigma^2 + (\mu - \mu_p)^2}{2\sigma_p^2} - \frac12
    """

    def __init__(self, loc: float, scale: float, batch_shape, *, device=None, dtype=None, validate_args=None):
        self.prior_loc, self.prior_scale = float(loc), float(scale)
        full = torch.empty((), device=device, dtype=dtype)
        super().__init__(
            full.new_tensor(self.prior_loc).expand(batch_shape),
            full.new_tensor(self.prior_scale).expand(batch_shape),
            validate_args=validate_args,
        )

    def expand(self, batch_shape, _instance=None):
        return IsotropicNormal(
            self.prior_loc, self.prior_scale, batch_shape, device=self.loc.device, dtype=self.loc.dtype
        )


@register_kl(dist.Normal, IsotropicNormal)
def _kl_normal_isotropic(q, p):
    centred = q.loc if p.prior_loc == 0.0 else q.loc - p.prior_loc
    return (
        (q.scale * q.scale + centred * centred) * (0.5 / p.prior_scale**2)
        - q.scale.log()
        + (math.log(p.prior_scale) - 0.5)
    )
