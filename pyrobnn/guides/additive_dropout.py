"""Additive variational dropout: sparse VD (Molchanov, Ashukha & Vetrov 2017)."""

from __future__ import annotations

import torch

from pyrobnn.checks import finite
from pyrobnn.distributions import DropoutNormal
from pyrobnn.guides.base import InitLoc, SiteGuide

__all__ = ["AdditiveDropoutGuide", "PRUNED_LOG_ALPHA"]

PRUNED_LOG_ALPHA = 3.0
r""":math:`\log\alpha` above which a weight is pruned (binary dropout rate above 0.95; Molchanov et al. 2017):
the default of :func:`pyrobnn.analysis.prune.log_alpha_masks`."""


class AdditiveDropoutGuide(SiteGuide):
    r"""Sparse variational dropout: :math:`q(w) = \mathcal N(\theta, \sigma^2)`, :math:`\alpha = \sigma^2/\theta^2`,
    with :math:`\theta` and :math:`\log\sigma^2` learned directly.

    The additive reparameterisation :math:`w = \theta + \sigma\epsilon` (Molchanov, Ashukha & Vetrov 2017) gives
    gradients that do not carry the multiplicative noise of :math:`\theta(1 + \sqrt\alpha\,\epsilon)`.

    With :class:`~pyrobnn.LogUniformPrior` the ELBO uses Molchanov's approximation
    :math:`-\mathrm{KL} \approx k_1\sigma(k_2 + k_3\log\alpha) - \tfrac12\log(1 + 1/\alpha) - k_1`,
    with :math:`\log\alpha` clipped to ``clip`` (default [-8, 8]) for stability. Weights with
    :math:`\log\alpha > 3` (dropout rate above 0.95) can be pruned.

    :param init_log_sigma2: initial :math:`\log\sigma^2` of every weight (-10: nearly deterministic,
        as after frequentist pre-training).
    :param mask_pruned: the posterior's mean is :math:`\theta\,[\log\alpha \le 3]`: a weight that the pruning rule
        removes contributes only its noise, in training and in prediction, so the data no longer pull its
        :math:`\theta` away from 0 and the KL prunes it for good (``train_clip`` in the authors' code,
        github.com/bayesgroup/variational-dropout-sparsifies-dnn). The KL is that of the unmasked
        :math:`\log\alpha`.
    """

    pruning_rule = "log-alpha"

    def __init__(self, model, init_loc: InitLoc = "module", init_log_sigma2: float = -10.0,
                 clip: tuple[float, float] = (-8.0, 8.0), mask_pruned: bool = False, *, name: str | None = None):
        init_log_sigma2 = finite("init_log_sigma2", init_log_sigma2)
        if not (len(clip) == 2 and clip[0] < clip[1]):
            raise ValueError(f"clip must be (low, high) with low < high, got {clip!r}")
        if not isinstance(mask_pruned, bool):
            raise ValueError(f"mask_pruned must be True or False, got {mask_pruned!r}")
        self.init_log_sigma2, self.clip = init_log_sigma2, (float(clip[0]), float(clip[1]))
        self.mask_pruned = mask_pruned
        self.pruned_values = {"locs": 0.0, "log_variances": -80.0}
        super().__init__(model, init_loc, name=name)

    def setup_site(self, site, loc):
        self.add_param(site, "locs", loc)
        self.add_param(site, "log_variances", torch.full_like(loc, self.init_log_sigma2))

    def loc_scale(self, name):
        return self.param(name, "locs"), (0.5 * self.param(name, "log_variances")).exp()

    def log_alpha(self, name):
        r""":math:`\log\alpha = \log\sigma^2 - \log\theta^2`, clipped; a pruned weight (:math:`\theta = 0`)
        has the largest :math:`\alpha` (dropout rate 1), so it stays pruned and costs no KL."""
        theta, log_sigma2 = self.param(name, "locs"), self.param(name, "log_variances")
        log_alpha = (log_sigma2 - torch.log(theta * theta + 1e-8)).clamp(*self.clip)
        return torch.where(theta == 0, self.clip[1], log_alpha)

    def get_posterior(self, name, prior):
        theta, scale = self.loc_scale(name)
        log_alpha = self.log_alpha(name)
        if self.mask_pruned:
            theta = torch.where(log_alpha <= PRUNED_LOG_ALPHA, theta, torch.zeros_like(theta))
        return DropoutNormal(theta, scale, log_alpha, "molchanov").to_event(theta.dim())
