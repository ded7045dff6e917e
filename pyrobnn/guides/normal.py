"""Diagonal Normal posterior: Bayes by Backprop (Blundell et al. 2015)."""

from __future__ import annotations

import pyro.distributions as dist
import torch

from pyrobnn.checks import choice, finite
from pyrobnn.guides.base import SHARING, InitLoc, SiteGuide, shared_shape

__all__ = ["NormalGuide", "PARAMETERIZATIONS"]


class _Softplus(torch.autograd.Function):
    r""":math:`\log(1 + e^{\rho})` (``rho`` itself above 20, as ``F.softplus``) with gradient
    :math:`\mathrm{sigmoid}(\rho)`: the same values as ``F.softplus`` in about half its CPU time."""

    @staticmethod
    def forward(ctx, rho):
        ctx.save_for_backward(rho)
        return torch.where(rho > 20.0, rho, torch.log1p(torch.exp(rho)))

    @staticmethod
    def backward(ctx, grad):
        (rho,) = ctx.saved_tensors
        return grad * torch.sigmoid(rho)


def softplus(rho: torch.Tensor) -> torch.Tensor:
    r""":math:`\sigma = \log(1 + e^{\rho})`, the positive scale of Bayes by Backprop."""
    return _Softplus.apply(rho)


PARAMETERIZATIONS = ("softplus", "log_variance")
"""How :class:`NormalGuide` parameterises :math:`\\sigma`."""


class NormalGuide(SiteGuide):
    r"""Diagonal Normal posterior :math:`q(w) = \mathcal N(\mu, \sigma^2)`, sampled as
    :math:`w = \mu + \sigma \odot \epsilon`, :math:`\epsilon \sim \mathcal N(0, I)`.

    Two parameterisations of :math:`\sigma`:

    - ``"softplus"``: :math:`\sigma = \log(1 + e^{\rho})`, Bayes by Backprop (Blundell et al.
      2015, sec. 3.2);
    - ``"log_variance"``: :math:`\sigma = \exp(\tfrac12 \log\sigma^2)`, variational dense
      (Graves 2011, with a Gaussian prior).

    Against a Gaussian prior the ELBO uses the analytic KL; against the scale
    mixture it uses ``log q(w) - log p(w)``.

    :param model: the :class:`~pyrobnn.BayesianNetwork`.
    :param init_loc: initial means (default: the network's current weights).
    :param init_rho: initial :math:`\rho`; :math:`\sigma_0 = \mathrm{softplus}(\rho_0)` in both
        parameterisations (-5 gives :math:`\sigma_0 \approx 6.7\cdot 10^{-3}`; a very negative
        value makes the guide reproduce the deterministic network).
    :param parameterization: ``"softplus"`` or ``"log_variance"``.
    :param share: one :math:`\sigma` per ``"weight"``, per output unit (``"row"``: the weights
        :math:`v_n` of unit :math:`n` share :math:`\sigma_{v_n}`, :math:`q(v_n) = \mathcal N(\mu_{v_n},
        \sigma_{v_n}^2 I)`, whose KL against :math:`\mathcal N(0, I)` is VDP++'s eq. 12 (Dera et al.),
        :math:`\tfrac12\sum_n (\|\mu_{v_n}\|^2 + j\sigma_{v_n}^2 - j\log\sigma_{v_n}^2 - j)`), or per ``"layer"``.
    """

    def __init__(self, model, init_loc: InitLoc = "module", init_rho: float = -5.0,
                 parameterization: str = "softplus", share: str = "weight", *, name: str | None = None):
        init_rho = finite("init_rho", init_rho)
        self.share = choice("share", share, SHARING)
        parameterization = choice("parameterization", parameterization, PARAMETERIZATIONS)
        self.init_rho, self.parameterization = init_rho, parameterization
        self._scale_role = "rhos" if parameterization == "softplus" else "log_variances"
        self.pruned_values = {"locs": 0.0, self._scale_role: -40.0 if parameterization == "softplus" else -80.0}
        super().__init__(model, init_loc, name=name)

    def setup_site(self, site, loc):
        self.add_param(site, "locs", loc)
        rho = torch.full(shared_shape(loc.shape, self.share), self.init_rho, dtype=loc.dtype, device=loc.device)
        self.add_param(site, self._scale_role, rho if self.parameterization == "softplus"
                       else 2 * torch.nn.functional.softplus(rho).log())

    def loc_scale(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Posterior mean and standard deviation of site ``name``."""
        raw = self.param(name, self._scale_role)
        scale = softplus(raw) if self.parameterization == "softplus" else (0.5 * raw).exp()
        return self.param(name, "locs"), scale

    def get_posterior(self, name, prior):
        loc, scale = self.loc_scale(name)
        return dist.Normal(loc, scale).to_event(loc.dim())
