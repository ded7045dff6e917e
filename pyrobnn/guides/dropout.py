"""MC dropout as a guide (Gal & Ghahramani 2016)."""

from __future__ import annotations

import fnmatch
import warnings
from typing import Mapping, Union

import torch

from pyrobnn.distributions import DropoutWeight
from pyrobnn.guides.base import InitLoc
from pyrobnn.guides.point import PointGuide
from pyrobnn.handlers.particles import current_estimator

__all__ = ["DropoutGuide"]

Rate = Union[float, Mapping[str, float]]


def _check_rate(name: str, rate) -> float:
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate < 1:
        raise ValueError(f"{name} (the dropout probability) must be a number in [0, 1), got {rate!r}")
    return float(rate)


class DropoutGuide(PointGuide):
    r"""MC dropout: point-estimate weights :math:`M` with Bernoulli masks on the inputs of each Bayesian layer,

    .. math:: q(W) = M\operatorname{diag}(m)/(1-p), \quad m_j \sim \mathrm{Bernoulli}(1-p)

    (:class:`~pyrobnn.distributions.DropoutWeight`; Gal & Ghahramani 2016, "Dropout as a Bayesian
    approximation"). Training with the ELBO is dropout training with weight decay
    :math:`\|M\|^2/(2\sigma_p^2(1-p))` from a Gaussian prior; prediction averages T passes with fresh
    masks (``pyrobnn.infer.predict(..., num_samples=T)``, one mask per example and pass). Under the
    estimator handlers each example draws its own mask (:mod:`pyrobnn.handlers.masked_weight`); under plain Pyro
    ``SVI`` one mask per batch, which it warns about once when it trains (wrap the step in
    ``local_reparameterization()``, as ``fit`` does); a pass without gradients (prediction, one draw of the network
    per pass) does not warn. Biases are point estimates. ``rate=0`` is :class:`PointGuide`.

    :param model: the :class:`~pyrobnn.BayesianNetwork`.
    :param rate: the dropout probability p of every layer's input, or a mapping from glob patterns over
        site names to rates (first match wins, unmatched sites get 0), e.g. ``{"net.0.*": 0.0, "*": 0.3}``
        to keep a LeNet's image itself undropped; a pattern that matches no site is an error naming the sites.
    :param init_loc: initial values (default: the network's current weights).
    """

    def __init__(self, model, rate: Rate = 0.5, init_loc: InitLoc = "module", *, name: str | None = None):
        if isinstance(rate, Mapping):
            self.rates = {str(k): _check_rate(f"rate[{k!r}]", v) for k, v in rate.items()}
        else:
            self.rates = {"*": _check_rate("rate", rate)}
        self._warned = False
        super().__init__(model, init_loc, name=name)

    def sites_ready(self):
        unmatched = [p for p in self.rates if not fnmatch.filter(self.family_names, p)]
        if unmatched and list(self.rates) != ["*"]:  # the "*" of a single rate matches no site of a model without any
            raise ValueError(f"rate: the pattern {unmatched[0]!r} matches no site of the model; its sites are "
                             f"{', '.join(self.family_names)}")

    def forward(self, *args, **kwargs):
        if (torch.is_grad_enabled() and current_estimator() is None and not self._warned
                and any(self.rate(n) for n in self.family_names)):  # training: prediction's passes are whole draws
            self._warned = True
            warnings.warn("DropoutGuide outside an estimator handler draws one dropout mask per batch, not one per "
                          "example: wrap the step in pyrobnn.local_reparameterization() (fit and predict do)",
                          UserWarning, stacklevel=2)
        return super().forward(*args, **kwargs)

    def rate(self, name: str) -> float:
        """The dropout probability of the inputs of site ``name``."""
        return next((r for pattern, r in self.rates.items() if fnmatch.fnmatchcase(name, pattern)), 0.0)

    def get_posterior(self, name, prior):
        return DropoutWeight(self.param(name, "locs"), self.rate(name))
