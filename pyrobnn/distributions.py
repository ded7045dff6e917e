"""Distributions that Pyro lacks and the priors of pyrobnn need."""

from __future__ import annotations

import math

import pyro.distributions as dist
import torch
from pyro.distributions import TorchDistribution, constraints
from torch.distributions import register_kl
from torch.distributions.utils import broadcast_all


class ScaleMixtureNormal(TorchDistribution):
    r"""Zero-mean two-component scale mixture of Gaussians (Blundell et al. 2015, eq. 7):

    .. math:: p(w) = \pi\,\mathcal N(w; 0, \sigma_1^2) + (1 - \pi)\,\mathcal N(w; 0, \sigma_2^2)

    A wide slab (:math:`\sigma_1`) and a narrow spike (:math:`\sigma_2 \ll 1`).
    There is no closed-form KL divergence to a Gaussian posterior, so the ELBO
    falls back on the Monte-Carlo estimate ``log q(w) - log p(w)``.
    """

    arg_constraints = {
        "pi": constraints.unit_interval,
        "sigma1": constraints.positive,
        "sigma2": constraints.positive,
    }
    support = constraints.real
    has_rsample = False

    def __init__(self, pi, sigma1, sigma2, validate_args=None):
        self.pi, self.sigma1, self.sigma2 = broadcast_all(pi, sigma1, sigma2)
        super().__init__(self.pi.shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(ScaleMixtureNormal, _instance)
        batch_shape = torch.Size(batch_shape)
        new.pi = self.pi.expand(batch_shape)
        new.sigma1 = self.sigma1.expand(batch_shape)
        new.sigma2 = self.sigma2.expand(batch_shape)
        super(ScaleMixtureNormal, new).__init__(batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @property
    def mean(self):
        return torch.zeros_like(self.pi)

    @property
    def variance(self):
        return self.pi * self.sigma1**2 + (1 - self.pi) * self.sigma2**2

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        half_log_2pi = 0.5 * math.log(2 * math.pi)
        lp1 = self.pi.log() - self.sigma1.log() - half_log_2pi - 0.5 * (value / self.sigma1) ** 2
        lp2 = (
            torch.log1p(-self.pi) - self.sigma2.log() - half_log_2pi - 0.5 * (value / self.sigma2) ** 2
        )
        return torch.logaddexp(lp1, lp2)

    def sample(self, sample_shape=torch.Size()):
        shape = self._extended_shape(sample_shape)
        with torch.no_grad():
            wide = torch.rand(shape, device=self.pi.device) < self.pi.expand(shape)
            scale = torch.where(wide, self.sigma1.expand(shape), self.sigma2.expand(shape))
            return scale * torch.randn(shape, device=self.pi.device, dtype=self.pi.dtype)


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
