"""Point estimates: the MAP (or maximum-likelihood) baseline as a guide."""

from __future__ import annotations

import pyro.distributions as dist
import torch

from pyrobnn.distributions import LogUniform, support_transform
from pyrobnn.guides.base import SiteGuide

__all__ = ["PointGuide", "point_values"]


class PointGuide(SiteGuide):
    r"""A point mass :math:`q(w) = \delta(w - M)` per site, as Pyro's ``AutoDelta``.

    The ELBO then reduces to the MAP objective :math:`-\sum_n \log p(y_n|x_n, M) - \log p(M)` (the log prior
    of a Gaussian :math:`\mathcal N(0, \sigma_p^2)` is L2 weight decay :math:`\|M\|^2/2\sigma_p^2`), so the
    deterministic baseline trains, predicts and is evaluated through the same ``fit``/``predict``/``evaluate``
    as every other guide (predict with ``num_samples=1``: every draw is the same network).
    For plain maximum likelihood use ``BayesianNetwork(..., deterministic=True)`` with no guide sites.

    :param model: the :class:`~pyrobnn.BayesianNetwork`.
    :param init_loc: initial values (default: the network's current weights).
    """

    pruning_rule = "magnitude"
    pruned_values = {"locs": 0.0}

    def setup_site(self, site, loc):
        if isinstance(site.prior_distribution(), LogUniform):
            raise ValueError(
                f"{type(self).__name__} keeps point estimates, but site {site.name!r} has the log-uniform prior "
                "p(w) ~ 1/|w|, whose density is unbounded at w = 0: the MAP objective has no optimum (every weight "
                "collapses to 0). Use a Gaussian or scale-mixture prior, or a guide with a variance (normal, "
                "additive, multiplicative)")
        self.add_param(site, "locs", loc)

    def get_posterior(self, name, prior):
        loc = self.param(name, "locs")
        return dist.Delta(loc, event_dim=loc.dim())

    def setup_fallback(self, site, loc):
        """A site off the family (a noise scale): its point value, kept in the unconstrained space."""
        self.add_param(site, "locs", support_transform(site.prior_distribution()).inv(loc))

    def fallback_posterior(self, name, prior):
        r""":math:`\delta(\theta - T(u))`, :math:`T` = :func:`~pyrobnn.distributions.support_transform`: the MAP
        value of a constrained latent, as Pyro's ``AutoDelta``."""
        value = self.fallback_value(name, prior)
        return dist.Delta(value, event_dim=value.dim())


def point_values(guide) -> dict[str, torch.Tensor]:
    r"""``{site: value}`` of a guide whose every posterior is a point mass :math:`\delta(w - M)` (a
    :class:`PointGuide`: a MAP fit), detached copies. Any other guide is a ``ValueError``: deep ensembles and the
    Laplace approximation start from point estimates, and a posterior with a spread (or MC dropout's masks) has
    none to give."""
    names = getattr(guide, "site_names", None)
    if not isinstance(guide, SiteGuide) or not names:
        raise ValueError(f"a point-estimate guide over the network's sites is needed (PointGuide), got "
                         f"{type(guide).__name__}")
    posteriors = {name: guide.posterior(name) for name in names}
    spread = [name for name, q in posteriors.items() if not isinstance(q, dist.Delta)]
    if spread:
        raise ValueError(f"{type(guide).__name__} is no point estimate (site {spread[0]!r} has a "
                         f"{type(posteriors[spread[0]]).__name__} posterior): train a MAP fit with PointGuide "
                         "(--guide point)")
    return {name: q.v.detach().clone() for name, q in posteriors.items()}
