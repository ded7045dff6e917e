"""Weight priors: how a Bayesian parameter's prior distribution is built.

A :class:`Prior` turns a reference tensor (the deterministic parameter it
replaces, which carries shape, dtype and device) into a Pyro distribution whose
event shape is the parameter's shape. :func:`pyrobnn.bayesian` attaches a prior
to every selected parameter as a :class:`~pyro.nn.PyroSample` site, so the prior
follows the module across ``.to(device)``.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass

import pyro.distributions as dist
import torch

from .distributions import IsotropicNormal, LogUniform, ScaleMixtureNormal

__all__ = ["Prior", "GaussianPrior", "ScaleMixturePrior", "LogUniformPrior", "PRIORS"]


def _positive(name: str, value: float) -> float:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


class Prior(abc.ABC):
    """Base class: ``prior(reference)`` returns the prior of a parameter shaped like ``reference``."""

    @abc.abstractmethod
    def __call__(self, reference: torch.Tensor) -> dist.TorchDistribution:
        """The prior of a parameter shaped like ``reference``: event shape ``reference.shape``."""


@dataclass(frozen=True)
class GaussianPrior(Prior):
    r"""Factorised Gaussian prior :math:`p(w) = \mathcal N(w; \mu_p, \sigma_p^2)`.

    Graves (2011) "variational dense"; paper 001 uses :math:`\mathcal N(0, 1)`
    for classification and :math:`\sigma_p = 2` for regression. The KL to a
    diagonal-Normal posterior is analytic:
    :math:`\sum \log(\sigma_p/\sigma) + (\sigma^2 + (\mu-\mu_p)^2)/(2\sigma_p^2) - 1/2`.
    """

    loc: float = 0.0
    scale: float = 1.0

    def __post_init__(self):
        if not math.isfinite(self.loc):
            raise ValueError(f"loc must be finite, got {self.loc!r}")
        _positive("scale (sigma of the Gaussian prior)", self.scale)

    def __call__(self, reference):
        return IsotropicNormal(
            self.loc, self.scale, reference.shape, device=reference.device, dtype=reference.dtype
        )


@dataclass(frozen=True)
class ScaleMixturePrior(Prior):
    r"""Blundell et al. (2015) scale mixture
    :math:`p(w) = \pi \mathcal N(0, \sigma_1^2) + (1-\pi) \mathcal N(0, \sigma_2^2)`.

    Defaults are the best setting of the paper's grid (paper 003, Table 1):
    :math:`\pi = 1/4`, :math:`\sigma_1 = 1`, :math:`\sigma_2 = e^{-8}`. No
    closed-form KL exists; the ELBO uses ``log q(w) - log p(w)``.
    """

    pi: float = 0.25
    sigma1: float = 1.0
    sigma2: float = math.exp(-8)

    def __post_init__(self):
        if not (isinstance(self.pi, (int, float)) and 0.0 < self.pi < 1.0):
            raise ValueError(f"pi (mixture weight) must lie in the open interval (0, 1), got {self.pi!r}")
        _positive("sigma1 (wide mixture component)", self.sigma1)
        _positive("sigma2 (narrow mixture component)", self.sigma2)

    def __call__(self, reference):
        return ScaleMixtureNormal(
            self.pi, self.sigma1, self.sigma2, reference.shape, device=reference.device, dtype=reference.dtype
        ).to_event(reference.dim())


@dataclass(frozen=True)
class LogUniformPrior(Prior):
    r"""The improper log-uniform prior :math:`p(w) \propto 1/|w|` of variational dropout.

    Use it with :class:`~pyrobnn.guides.MultiplicativeDropoutGuide` or
    :class:`~pyrobnn.guides.AdditiveDropoutGuide`, whose posteriors carry
    :math:`\log\alpha` and so get the approximate KL.
    """

    def __call__(self, reference):
        return LogUniform(reference.shape)


PRIORS = {"gaussian": GaussianPrior, "scale-mixture": ScaleMixturePrior, "log-uniform": LogUniformPrior}
"""Weight priors selectable by name (``pyrobnn train --prior``)."""
