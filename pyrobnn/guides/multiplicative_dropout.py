"""Multiplicative variational dropout (Kingma, Salimans & Welling 2015)."""

from __future__ import annotations

import torch

from pyrobnn.checks import choice, finite
from pyrobnn.distributions import KL_APPROXIMATIONS, DropoutNormal
from pyrobnn.guides.base import SHARING, InitLoc, SiteGuide, shared_shape

__all__ = ["MultiplicativeDropoutGuide"]


class MultiplicativeDropoutGuide(SiteGuide):
    r"""Gaussian dropout with learned rates: :math:`w = \theta(1 + \sqrt\alpha\,\epsilon)`, i.e.
    :math:`q(w) = \mathcal N(\theta, \alpha\theta^2)` (sampled as :math:`\theta + \sqrt\alpha|\theta|\epsilon`,
    the same distribution).

    :math:`\log\alpha` is learned per weight, per row (output unit) or per layer, and clipped to
    at most ``max_log_alpha`` (0, i.e. :math:`\alpha \le 1`, as in the paper, where its KL
    approximation :math:`-\mathrm{KL} \approx C + \tfrac12\log\alpha + c_1\alpha + c_2\alpha^2 + c_3\alpha^3`
    holds). With a larger ``max_log_alpha`` use ``approximation="molchanov"``.
    """

    pruning_rule = "log-alpha"

    def __init__(self, model, init_loc: InitLoc = "module", init_log_alpha: float = -4.0,
                 share: str = "weight", max_log_alpha: float = 0.0, approximation: str = "kingma", *,
                 name: str | None = None):
        share = choice("share", share, SHARING)
        init_log_alpha = finite("init_log_alpha", init_log_alpha)
        approximation = choice("approximation", approximation, KL_APPROXIMATIONS)
        if init_log_alpha > max_log_alpha:
            raise ValueError(f"init_log_alpha ({init_log_alpha}) must not exceed max_log_alpha ({max_log_alpha})")
        self.init_log_alpha, self.share = init_log_alpha, share
        self.max_log_alpha, self.approximation = float(max_log_alpha), approximation
        self.pruned_values = {"locs": 0.0}
        super().__init__(model, init_loc, name=name)

    def setup_site(self, site, loc):
        self.add_param(site, "locs", loc)
        shape = shared_shape(loc.shape, self.share)
        self.add_param(site, "log_alphas", torch.full(shape, self.init_log_alpha, dtype=loc.dtype, device=loc.device))

    def log_alpha(self, name):
        return self.param(name, "log_alphas").clamp(max=self.max_log_alpha)

    def loc_scale(self, name):
        theta = self.param(name, "locs")
        return theta, ((0.5 * self.log_alpha(name)).exp() * theta.abs()).clamp_min(1e-20)

    def get_posterior(self, name, prior):
        theta, scale = self.loc_scale(name)
        return DropoutNormal(theta, scale, self.log_alpha(name), self.approximation).to_event(theta.dim())
