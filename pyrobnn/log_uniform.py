r"""The log-uniform prior of variational dropout and its KL approximations.

The improper prior :math:`p(\log|w|) = \text{const}`, i.e. :math:`p(w) \propto 1/|w|`
(Kingma, Salimans & Welling 2015; Molchanov, Ashukha & Vetrov 2017; paper 001
ch. 3). Against a Gaussian posterior :math:`q(w) = \mathcal N(\theta, \alpha\theta^2)`
the KL depends on :math:`\alpha` alone,

.. math:: \mathrm{KL}(q\|p) = -\tfrac12\log\alpha + \mathbb E_{\epsilon\sim\mathcal N(0,1)}
          \log|1 + \sqrt\alpha\,\epsilon| + \text{const},

which has no closed form. Two published approximations (SPEC 4.2, 4.3):

- Kingma et al. (2015), for :math:`\alpha \le 1`:
  :math:`-\mathrm{KL} \approx C + \tfrac12\log\alpha + c_1\alpha + c_2\alpha^2 + c_3\alpha^3`;
- Molchanov et al. (2017), for every :math:`\alpha`:
  :math:`-\mathrm{KL} \approx k_1\,\sigma(k_2 + k_3\log\alpha) - \tfrac12\log(1 + 1/\alpha) - k_1`.

A posterior declares which approximation applies by being a :class:`DropoutNormal`
(a ``Normal`` that carries :math:`\log\alpha` and the approximation's name);
``register_kl`` makes :func:`torch.distributions.kl_divergence`, and so the
annealed ELBO, use it.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyro.distributions as dist
import torch
from pyro.distributions import TorchDistribution, constraints
from torch.distributions import Independent, register_kl

from .priors import Prior

__all__ = [
    "LogUniform", "LogUniformPrior", "DropoutNormal", "kingma_kl", "molchanov_kl",
    "KINGMA_CONSTANTS", "MOLCHANOV_CONSTANTS", "KL_APPROXIMATIONS",
]

KINGMA_CONSTANTS = (1.16145124, -1.50204118, 0.58629921)
"""c1, c2, c3 of Kingma et al. (2015), eq. (10)."""
MOLCHANOV_CONSTANTS = (0.63576, 1.87320, 1.48695)
"""k1, k2, k3 of Molchanov et al. (2017), eq. (14)."""


def kingma_kl(log_alpha: torch.Tensor) -> torch.Tensor:
    r"""Elementwise :math:`\mathrm{KL} \approx -(\tfrac12\log\alpha + c_1\alpha + c_2\alpha^2 + c_3\alpha^3)`
    (the constant C dropped; accurate for :math:`\alpha \le 1`)."""
    c1, c2, c3 = KINGMA_CONSTANTS
    alpha = log_alpha.exp()
    return -(0.5 * log_alpha + alpha * (c1 + alpha * (c2 + alpha * c3)))


def molchanov_kl(log_alpha: torch.Tensor) -> torch.Tensor:
    r"""Elementwise :math:`\mathrm{KL} \approx k_1 - k_1\,\sigma(k_2 + k_3\log\alpha) + \tfrac12\log(1 + e^{-\log\alpha})`
    (zero as :math:`\alpha \to \infty`)."""
    k1, k2, k3 = MOLCHANOV_CONSTANTS
    return k1 - k1 * torch.sigmoid(k2 + k3 * log_alpha) + 0.5 * torch.nn.functional.softplus(-log_alpha)


KL_APPROXIMATIONS = {"kingma": kingma_kl, "molchanov": molchanov_kl}


class LogUniform(TorchDistribution):
    r"""Improper :math:`p(w) \propto 1/|w|` over a tensor (event shape = the parameter's shape).

    ``log_prob`` is :math:`-\sum\log|w|` (normalising constant omitted); it cannot be sampled.
    """

    arg_constraints = {}
    support = constraints.real

    def __init__(self, event_shape, batch_shape=torch.Size(), *, validate_args=None):
        super().__init__(torch.Size(batch_shape), torch.Size(event_shape), validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        return LogUniform(self.event_shape, batch_shape)

    def log_prob(self, value):
        dims = tuple(range(-len(self.event_shape), 0))
        log_abs = -value.abs().log()
        return log_abs.sum(dims) if dims else log_abs

    def sample(self, sample_shape=torch.Size()):
        raise ValueError("the log-uniform prior is improper and cannot be sampled: initialise the guide "
                         "from the network's weights (init_loc='module'), not from the prior")


@dataclass(frozen=True)
class LogUniformPrior(Prior):
    r"""The improper log-uniform prior :math:`p(w) \propto 1/|w|` of variational dropout.

    Use it with :class:`~pyrobnn.guides.MultiplicativeDropoutGuide` or
    :class:`~pyrobnn.guides.AdditiveDropoutGuide`, whose posteriors carry
    :math:`\log\alpha` and so get the approximate KL.
    """

    def __call__(self, reference):
        return LogUniform(reference.shape)


class DropoutNormal(dist.Normal):
    r""":math:`\mathcal N(\theta, \sigma^2)` with :math:`\alpha = \sigma^2/\theta^2`: the posterior of
    variational dropout, carrying ``log_alpha`` and the name of its KL approximation."""

    def __init__(self, loc, scale, log_alpha, approximation: str = "molchanov", validate_args=None):
        if approximation not in KL_APPROXIMATIONS:
            raise ValueError(f"approximation must be one of {sorted(KL_APPROXIMATIONS)}, got {approximation!r}")
        super().__init__(loc, scale, validate_args=validate_args)
        self.log_alpha, self.approximation = log_alpha, approximation

    def expand(self, batch_shape, _instance=None):
        shape = torch.Size(batch_shape)
        return DropoutNormal(self.loc.expand(shape), self.scale.expand(shape), self.log_alpha.expand(shape),
                             self.approximation)


@register_kl(Independent, LogUniform)
@register_kl(DropoutNormal, LogUniform)
def _kl_dropout_normal_log_uniform(q, p):
    base = q.base_dist if isinstance(q, Independent) else q
    if not isinstance(base, DropoutNormal):
        raise NotImplementedError  # torch's "no closed form for this pair": the ELBO falls back to Monte Carlo
    kl = KL_APPROXIMATIONS[base.approximation](base.log_alpha)
    kl = kl.expand(base.loc.shape) if kl.shape != base.loc.shape else kl
    if kl.dim() < len(p.event_shape):
        raise ValueError(f"posterior of shape {tuple(kl.shape)} does not match the prior's event shape "
                         f"{tuple(p.event_shape)}")
    dims = tuple(range(-len(p.event_shape), 0))
    return kl.sum(dims) if dims else kl

