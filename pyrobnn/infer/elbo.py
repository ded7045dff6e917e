r"""The mean-field ELBO of pyrobnn, with its terms exposed.

.. math::
    \mathcal L = \sum_{\text{obs}} s \log p(y|x,w) - \sum_{\text{latent}} s\, \mathrm{KL}(q\|p)

where s is each site's scale: N/B for the data (``pyro.plate`` subsampling),
β for the weights (:func:`pyrobnn.handlers.kl_annealing`). The KL is analytic
wherever ``torch.distributions.kl_divergence`` knows the pair (``register_kl``
adds more) and the single-sample estimate ``log q(w) - log p(w)`` otherwise
(e.g. the scale-mixture prior), averaged over the particles' weight samples when
the estimator's handler draws S of them in one pass (``vectorize_particles=True``).
Guide sites the model does not have (the auxiliary sites of Pyro's autoguides) add
their :math:`\log q`, so for any guide with reparameterized sites the loss equals
``Trace_ELBO``'s in expectation. Unlike
``TraceMeanField_ELBO`` it evaluates a prior's log-density only when no closed form
exists, and reports the data and KL terms separately for logging. The sites of one joint posterior (a
:class:`~pyrobnn.guides.normal.JointNormal`: every site of a ``NormalGuide``) under one prior law and one β get
their KL in one computation over all weights (:meth:`~pyrobnn.guides.normal.JointNormal.kl`).
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple, Protocol, runtime_checkable

import torch
from pyro import poutine
from pyro.distributions.util import is_identically_one, scale_and_mask
from pyro.infer import ELBO
from pyro.poutine.util import site_is_subsample
from torch.distributions import kl_divergence

from pyrobnn.checks import choice, positive_int
from pyrobnn.distributions import JointFactor
from pyrobnn.handlers import ESTIMATORS
from pyrobnn.handlers import estimator as estimator_handler
from pyrobnn.handlers.distribution_tensor import DistributionTensor
from pyrobnn.handlers.families import base_distribution
from pyrobnn.handlers.lazy_value import unscored
from pyrobnn.handlers.particles import ParticlesUnsupported, mismatched_rows_unsupported

__all__ = ["MeanFieldELBO", "ELBOTerms", "Objective", "PRECISIONS"]


class ELBOTerms(NamedTuple):
    loss: torch.Tensor  #: differentiable negative ELBO (β-weighted KL)
    nll: torch.Tensor  #: scaled negative log-likelihood (full-dataset estimate)
    kl: torch.Tensor  #: KL(q || p), unweighted by β
    prior: torch.Tensor | None = None  #: the β-weighted KL as ``loss`` holds it, differentiable (None: not kept)


@runtime_checkable
class Objective(Protocol):
    """What the step engine (:class:`~pyrobnn.infer.step.Step`) trains on: the terms of the loss of one step, and
    how its particles are drawn. :class:`MeanFieldELBO` is the one pyrobnn has."""

    num_particles: int
    vectorize_particles: bool

    @property
    def stochastic(self) -> bool:
        """Whether the loss draws random numbers (weights, masks); VDP++'s moments do not."""

    def terms(self, model, guide, *args, **kwargs) -> ELBOTerms:
        """:class:`ELBOTerms` of the step on ``args`` (the loss with the β-weighted KL, the scaled NLL, the KL)."""


def _site_kl(guide_site, model_site) -> torch.Tensor:
    q, p = unscored(guide_site["fn"]), unscored(model_site["fn"])
    if p.batch_shape and q.event_shape == p.batch_shape + p.event_shape:  # a prior written without .to_event:
        p = p.to_event(len(p.batch_shape))  # its batch dimensions are the posterior's event (one global site)
    try:
        return kl_divergence(q, p)
    except NotImplementedError:  # torch's "no closed form for this pair": estimate by Monte Carlo
        value = guide_site["value"]
        if isinstance(value, DistributionTensor):  # a lazy weight: the estimator's draws (S particles, or one)
            draws = value.kl_draws()
            return (q.log_prob(draws) - p.log_prob(draws)).mean(0)
        return q.log_prob(value) - p.log_prob(value)


def _total(values: list[torch.Tensor]) -> torch.Tensor:
    """The sum of scalar tensors, in one operation."""
    return values[0] if len(values) == 1 else torch.stack(values).sum()


class _Weighted(dict):
    """KL terms by the scale (β) that weights them in the loss: one product per scale, not per site."""

    def add(self, value: torch.Tensor, scale) -> None:
        key = scale if isinstance(scale, (int, float)) else id(scale)
        self.setdefault(key, (scale, []))[1].append(value)

    def total(self) -> torch.Tensor:
        parts = [_total(values) if is_identically_one(scale) else _total(values) * scale
                 for scale, values in self.values()]
        return _total(parts)


def _add_kl(site_kl: torch.Tensor, scale, mask, kls: list, weighted: _Weighted) -> None:
    """Record a site's KL: unweighted (``kls``, for the log) and weighted by its scale and mask (the loss)."""
    total = site_kl.sum() if site_kl.dim() else site_kl
    kls.append(total)
    if mask is None:
        weighted.add(total, scale)
    else:
        weighted.add(scale_and_mask(site_kl, scale, mask).sum(), 1.0)


def _check_reparameterized(site) -> None:
    if not site["fn"].has_rsample:
        raise ValueError(
            f"MeanFieldELBO needs reparameterized guide sites, but {site['name']!r} is sampled from "
            f"{type(site['fn']).__name__}: use pyro.infer.Trace_ELBO or TraceGraph_ELBO for this guide"
        )


PRECISIONS = ("fp32", "bf16")
"""Arithmetic of the network's matmuls and convolutions: float32, or bfloat16 under ``torch.autocast`` (the
KL, the guide's parameters and the log-likelihood stay in float32)."""


class MeanFieldELBO(ELBO):
    r"""Negative ELBO averaged over ``num_particles`` posterior samples: the objective of a training step as one
    object, as Pyro's ``Trace_ELBO(num_particles, vectorize_particles)`` is.

    Usable as the ``loss`` of :class:`pyro.infer.SVI`, or directly: ``terms = elbo.terms(model, guide, x, y)`` gives
    the loss, the NLL and the KL.

    :param num_particles: S, the posterior samples averaged per step.
    :param vectorize_particles: draw the S particles in one batched pass of the network (the particle layout of
        :mod:`pyrobnn.handlers.particles`, under the estimator's handler) instead of a loop; a network that cannot
        run them in one pass (a Bayesian parameter used on the input shared by the particles) falls back to the loop.
    :param estimator: a key of :data:`pyrobnn.handlers.ESTIMATORS` whose handler the terms are computed under
        (``"sample"`` weight sampling, ``"local"`` local reparameterization, ``"flipout"``, ``"vdp"``), or None: the
        handlers around the call, if any (a plain Pyro script's ``with local_reparameterization(): svi.step()``).
    :param precision: ``"fp32"``, or ``"bf16"``: the network under ``torch.autocast`` (:data:`PRECISIONS`).

    The loss is :math:`\frac{N}{B}\sum_b -\frac1S\sum_s \log p(y_b|x_b, w_s) + \mathrm{KL}(q\|p)`, the NLL and the
    KL of :class:`ELBOTerms` summed.

    Example: four particles in one pass under local reparameterization, then one step of Pyro's SVI.

    >>> import pyro, torch
    >>> from torch import nn
    >>> from pyrobnn import BayesianNetwork, MeanFieldELBO, NormalGuide
    >>> pyro.clear_param_store(); pyro.set_rng_seed(0)
    >>> model = BayesianNetwork(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)), num_data=32)
    >>> guide = NormalGuide(model)
    >>> x, y = torch.randn(32, 4), torch.randint(0, 3, (32,))
    >>> elbo = MeanFieldELBO(num_particles=4, vectorize_particles=True, estimator="local")
    >>> terms = elbo.terms(model, guide, x, y)
    >>> torch.allclose(terms.loss, terms.nll + terms.kl)
    True
    >>> svi = pyro.infer.SVI(model, guide, pyro.optim.Adam({"lr": 1e-3}), loss=elbo)
    >>> loss = svi.step(x, y)  # a float: the loss before the step
    >>> abs(loss - terms.loss.item()) / terms.loss.item() < 0.1
    True
    """

    def __init__(self, num_particles: int = 1, vectorize_particles: bool = False, *, estimator: str | None = None,
                 precision: str = "fp32", **kwargs):
        num_particles = positive_int("num_particles", num_particles)
        if estimator is not None and not ESTIMATORS[choice("estimator", estimator, ESTIMATORS)].stochastic \
                and num_particles > 1:
            raise ValueError(f"estimator={estimator!r} propagates moments deterministically: num_particles must be "
                             f"1, got {num_particles}")
        self.estimator, self.precision = estimator, choice("precision", precision, PRECISIONS)
        super().__init__(num_particles=num_particles, vectorize_particles=vectorize_particles, **kwargs)

    def __repr__(self):
        return (f"MeanFieldELBO(num_particles={self.num_particles}, vectorize_particles={self.vectorize_particles}, "
                f"estimator={self.estimator!r}, precision={self.precision!r})")

    @property
    def stochastic(self) -> bool:
        """Whether a step draws (every estimator but VDP++'s moments)."""
        return self.estimator is None or ESTIMATORS[self.estimator].stochastic

    def terms(self, model, guide, *args, **kwargs) -> ELBOTerms:
        x = args[0] if args and torch.is_tensor(args[0]) else None
        arithmetic = contextlib.nullcontext() if self.precision == "fp32" or x is None else \
            torch.autocast(device_type=x.device.type, dtype=torch.bfloat16)
        vectorized = self.vectorize_particles and self.num_particles > 1
        if vectorized and x is None:
            raise ValueError("MeanFieldELBO(vectorize_particles=True) needs the input batch as the model's first "
                             "argument: its rows lay out the particles")
        if self.estimator is None and not vectorized:
            with arithmetic:
                return self._terms(model, guide, args, kwargs, self.num_particles)
        name = self.estimator or "sample"
        warn = self.estimator not in (None, "sample") or vectorized  # one weight sample is no choice to report
        try:
            with arithmetic, estimator_handler(name, self.num_particles if vectorized else 1,
                                               len(x) if vectorized else None, warn=warn) as handler, \
                    mismatched_rows_unsupported(handler.particles):
                return self._terms(model, guide, args, kwargs, 1 if vectorized else self.num_particles)
        except ParticlesUnsupported:
            if not vectorized:
                raise
        with arithmetic, estimator_handler(name, 1, warn=warn):  # the particles in a loop
            return self._terms(model, guide, args, kwargs, self.num_particles)

    def _terms(self, model, guide, args, kwargs, loops: int) -> ELBOTerms:
        nlls, kls, weighted = [], [], _Weighted()
        for _ in range(loops):
            model_trace, guide_trace = self._get_trace(model, guide, args, kwargs)
            joints: dict = {}  # the sites of one JointNormal with one prior law and one scale: one KL
            for name, site in model_trace.nodes.items():
                if site["type"] != "sample" or site_is_subsample(site):
                    continue
                if site["is_observed"]:
                    nlls.append(scale_and_mask(site["fn"].log_prob(site["value"]), site["scale"], site["mask"]).sum())
                    continue
                guide_site = guide_trace.nodes.get(name)
                if guide_site is None:
                    raise ValueError(f"the guide has no site {name!r}: it must cover every latent site")
                _check_reparameterized(guide_site)
                factor = base_distribution(unscored(guide_site["fn"]))
                joint = factor.joint if isinstance(factor, JointFactor) else None
                prior = unscored(site["fn"])
                key = joint.prior_key(prior) if joint is not None and guide_site["mask"] is None else None
                if key is not None:
                    scale = guide_site["scale"]
                    group = joints.setdefault((id(joint), key, scale if isinstance(scale, (int, float)) else id(scale)),
                                              (joint, prior, scale, {}, []))
                    group[3][factor.index] = guide_site["value"]
                    group[4].append((guide_site, site))
                    continue
                _add_kl(_site_kl(guide_site, site), guide_site["scale"], guide_site["mask"], kls, weighted)
            for joint, prior, scale, values, sites in joints.values():
                joint_kl = joint.kl(prior, values)
                if joint_kl is not None:
                    _add_kl(joint_kl, scale, None, kls, weighted)
                    continue
                for guide_site, site in sites:
                    _add_kl(_site_kl(guide_site, site), guide_site["scale"], None, kls, weighted)
            for name, site in guide_trace.nodes.items():  # auxiliary guide sites (autoguides): their log q
                if site["type"] != "sample" or site_is_subsample(site) or name in model_trace.nodes:
                    continue
                _check_reparameterized(site)
                log_q = scale_and_mask(site["fn"].log_prob(site["value"]), site["scale"], site["mask"]).sum()
                _add_kl(log_q, 1.0, None, kls, weighted)
        nll = -_total(nlls) if nlls else torch.zeros(())
        kl = _total(kls).detach() if kls else torch.zeros(())
        prior = weighted.total() if kls else torch.zeros((), device=nll.device)
        loss = prior + nll if kls else nll
        n = loops
        if n == 1:
            return ELBOTerms(loss, nll.detach(), kl, prior)
        return ELBOTerms(loss / n, nll.detach() / n, kl / n, prior / n)

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
