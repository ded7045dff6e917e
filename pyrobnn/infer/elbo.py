r"""The mean-field ELBO of pyrobnn, with its terms exposed.

.. math::
    \mathcal L = \sum_{\text{obs}} s \log p(y|x,w) - \sum_{\text{latent}} s\, \mathrm{KL}(q\|p)

where s is each site's scale: N/B for the data (``pyro.plate`` subsampling),
β for the weights (:func:`pyrobnn.handlers.kl_annealing`). The KL is analytic
wherever ``torch.distributions.kl_divergence`` knows the pair (``register_kl``
adds more) and the single-sample estimate ``log q(w) - log p(w)`` otherwise
(e.g. the scale-mixture prior), averaged over the particles' weight samples when
the handlers draw S of them in one pass. Guide sites the model does not have (the
auxiliary sites of Pyro's autoguides) add their :math:`\log q`, so for any guide
with reparameterized sites the loss equals ``Trace_ELBO``'s in expectation. Unlike
``TraceMeanField_ELBO`` it evaluates a prior's log-density only when no closed form
exists, and reports the data and KL terms separately for logging.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from pyro import poutine
from pyro.distributions.util import scale_and_mask
from pyro.infer import ELBO
from pyro.poutine.util import site_is_subsample
from torch.distributions import kl_divergence

from pyrobnn.handlers.distribution_tensor import DistributionTensor
from pyrobnn.handlers.lazy_value import unscored

__all__ = ["MeanFieldELBO", "ELBOTerms"]


class ELBOTerms(NamedTuple):
    loss: torch.Tensor  #: differentiable negative ELBO (β-weighted KL)
    nll: torch.Tensor  #: scaled negative log-likelihood (full-dataset estimate)
    kl: torch.Tensor  #: KL(q || p), unweighted by β


def _site_kl(guide_site, model_site) -> torch.Tensor:
    q, p = unscored(guide_site["fn"]), unscored(model_site["fn"])
    try:
        return kl_divergence(q, p)
    except NotImplementedError:  # torch's "no closed form for this pair": estimate by Monte Carlo
        value = guide_site["value"]
        if isinstance(value, DistributionTensor):  # a lazy weight: the estimator's draws (S particles, or one)
            draws = value.kl_draws()
            return (q.log_prob(draws) - p.log_prob(draws)).mean(0)
        return q.log_prob(value) - p.log_prob(value)


def _check_reparameterized(site) -> None:
    if not site["fn"].has_rsample:
        raise ValueError(
            f"MeanFieldELBO needs reparameterized guide sites, but {site['name']!r} is sampled from "
            f"{type(site['fn']).__name__}: use pyro.infer.Trace_ELBO or TraceGraph_ELBO for this guide"
        )


class MeanFieldELBO(ELBO):
    """Negative ELBO averaged over ``num_particles`` posterior samples, drawn in a loop.

    Usable as the ``loss`` of :class:`pyro.infer.SVI`, or directly:
    ``terms = elbo.terms(model, guide, x, y)`` gives the loss, the NLL and the KL.
    S particles in one pass come from an estimator handler instead
    (``weight_sampling(num_particles=S, batch_size=B)``), so ``vectorize_particles`` is refused.
    """

    def __init__(self, num_particles: int = 1, vectorize_particles: bool = False, **kwargs):
        if vectorize_particles:
            raise ValueError(
                "MeanFieldELBO(vectorize_particles=True) is not supported: a network takes one weight per "
                "layer; vectorize with a handler instead, e.g. `with weight_sampling(num_particles=S, "
                "batch_size=B): svi.step(x, y)` (or fit(..., num_particles=S))"
            )
        super().__init__(num_particles=num_particles, **kwargs)

    def terms(self, model, guide, *args, **kwargs) -> ELBOTerms:
        loss = nll = kl = 0.0
        for _ in range(self.num_particles):
            model_trace, guide_trace = self._get_trace(model, guide, args, kwargs)
            for name, site in model_trace.nodes.items():
                if site["type"] != "sample" or site_is_subsample(site):
                    continue
                if site["is_observed"]:
                    log_p = scale_and_mask(site["fn"].log_prob(site["value"]), site["scale"], site["mask"])
                    nll = nll - log_p.sum()
                    continue
                guide_site = guide_trace.nodes.get(name)
                if guide_site is None:
                    raise ValueError(f"the guide has no site {name!r}: it must cover every latent site")
                _check_reparameterized(guide_site)
                site_kl = _site_kl(guide_site, site)
                kl = kl + site_kl.sum().detach()
                loss = loss + scale_and_mask(site_kl, guide_site["scale"], guide_site["mask"]).sum()
            for name, site in guide_trace.nodes.items():  # auxiliary guide sites (autoguides): their log q
                if site["type"] != "sample" or site_is_subsample(site) or name in model_trace.nodes:
                    continue
                _check_reparameterized(site)
                log_q = scale_and_mask(site["fn"].log_prob(site["value"]), site["scale"], site["mask"]).sum()
                kl = kl + log_q.detach()
                loss = loss + log_q
        n = self.num_particles
        return ELBOTerms((loss + nll) / n, nll.detach() / n, torch.as_tensor(kl) / n)

    def _get_trace(self, model, guide, args, kwargs):
        guide_trace = poutine.trace(guide).get_trace(*args, **kwargs)
        model_trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(*args, **kwargs)
        return model_trace, guide_trace

    def differentiable_loss(self, model, guide, *args, **kwargs):
        return self.terms(model, guide, *args, **kwargs).loss

    def loss(self, model, guide, *args, **kwargs):
        with torch.no_grad():
            return self.differentiable_loss(model, guide, *args, **kwargs).item()

    def loss_and_grads(self, model, guide, *args, **kwargs):
        loss = self.differentiable_loss(model, guide, *args, **kwargs)
        loss.backward()
        return loss.item()
