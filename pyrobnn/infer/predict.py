"""Monte-Carlo posterior predictive: S weight samples from the guide, one network pass each."""

from __future__ import annotations

import contextlib

import torch
from pyro import poutine
from torch import nn

from pyrobnn._compat import DropoutBase
from pyrobnn.device import device_of
from pyrobnn.guides.base import SiteGuide
from pyrobnn.handlers import local_reparameterization, vdp
from pyrobnn.handlers.families import has_lazy_value
from pyrobnn.handlers.moments import Moments
from pyrobnn.handlers.particles import ParticlesUnsupported, mismatched_rows_unsupported

__all__ = ["predict", "predict_moments", "predictive_outputs", "prediction_mode"]


@contextlib.contextmanager
def prediction_mode(model: nn.Module, mc_dropout: bool = False):
    """Eval mode (BatchNorm running statistics, dropout off) for the duration, restored afterwards.

    ``mc_dropout=True`` keeps dropout layers sampling (Gal & Ghahramani 2016).
    """
    was_training = [m.training for m in model.modules()]
    model.eval()
    if mc_dropout:
        for m in model.modules():
            if isinstance(m, DropoutBase):
                m.train()
    try:
        yield model
    finally:
        for m, mode in zip(model.modules(), was_training):
            m.training = mode


def _vectorizable(guide) -> bool:
    """Whether the guide is a :class:`~pyrobnn.guides.SiteGuide` whose every site has a posterior that estimator
    handlers draw in one pass (a family of :mod:`pyrobnn.handlers.families`: Normal, dropout, mixture nodes)."""
    return (isinstance(guide, SiteGuide) and bool(guide.site_names)
            and all(has_lazy_value(guide.posterior(name)) for name in guide.site_names))


@torch.no_grad()
def predictive_outputs(model, guide, x: torch.Tensor, num_samples: int = 100, batch_size: int = 1000,
                       mc_dropout: bool = False, vectorized: bool | None = None,
                       max_rows: int = 200_000) -> torch.Tensor:
    """Network outputs under ``num_samples`` posterior draws, shape ``(S, N, ...)``.

    ``vectorized`` (default: whenever every posterior has a lazy value, e.g. Normal family or dropout)
    draws the S samples in batched passes under :func:`~pyrobnn.handlers.local_reparameterization` with
    ``num_particles``: per example, exactly S independent draws of the network under
    :math:`q(w)`; at most ``max_rows`` rows (particles x examples) go through the network at
    once. Otherwise (or when the network uses a Bayesian parameter outside a Linear/Conv layer, e.g.
    a positional embedding or attention weights) a Python loop draws one weight sample per pass,
    shared by all chunks of ``batch_size`` inputs.
    """
    if not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive integer, got {num_samples!r}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    x = x.to(device_of(guide, model))
    model.check_input(x)
    explicit = vectorized is not None
    if vectorized is None:
        vectorized = _vectorizable(guide)
    with prediction_mode(model, mc_dropout):
        if vectorized:
            try:
                return _vectorized_outputs(model, guide, x, num_samples, batch_size, max_rows)
            except ParticlesUnsupported:  # e.g. a residual adding the B-row input to S·B rows
                if explicit:
                    raise
        outputs = []
        for _ in range(num_samples):
            guide_trace = poutine.trace(guide).get_trace()
            net = poutine.replay(model.net, trace=guide_trace)
            outputs.append(torch.cat([net(chunk) for chunk in x.split(batch_size)]))
    return torch.stack(outputs)


@torch.no_grad()
def predict_moments(model, guide, x: torch.Tensor, batch_size: int = 1000) -> dict[str, torch.Tensor]:
    """VDP++ prediction in one deterministic pass: the output ``mean`` and ``var`` of the network
    under :func:`~pyrobnn.handlers.vdp`; for classification also ``probs`` and ``probs_var``, the
    propagated moments of the softmax."""
    x = x.to(device_of(guide, model))
    model.check_input(x)
    parts = []
    with prediction_mode(model), vdp():
        guide_trace = poutine.trace(guide).get_trace()
        net = poutine.replay(model.net, trace=guide_trace)
        for chunk in x.split(batch_size):
            out = net(chunk)
            if not isinstance(out, Moments):
                out = Moments(out, torch.zeros_like(out))
            summary = {"mean": out.loc, "var": out.variance}
            if model.task == "classification":
                probs = torch.nn.functional.softmax(out, -1)
                summary.update(probs=probs.loc, probs_var=probs.variance)
            parts.append(summary)
    return {key: torch.cat([part[key] for part in parts]) for key in parts[0]}


def _vectorized_outputs(model, guide, x, num_samples, batch_size, max_rows):
    # a K-component mixture guide (MixtureNodeGuide) gives particle s of example b component (b + s) mod K:
    # every example sees each component equally often when each pass draws a multiple of K
    k = guide.num_components
    if num_samples % k:
        raise ValueError(f"num_samples ({num_samples}) must be a multiple of the guide's {k} mixture components, "
                         f"e.g. {num_samples - num_samples % k or k} or {num_samples - num_samples % k + k}")
    chunks = []
    for chunk in x.split(batch_size):
        per_pass = max(k, min(num_samples, max_rows // len(chunk)) // k * k)
        draws = []
        for start in range(0, num_samples, per_pass):
            particles = min(per_pass, num_samples - start)
            with local_reparameterization(num_particles=particles, batch_size=len(chunk)) as handler, \
                    mismatched_rows_unsupported(handler.particles):
                guide_trace = poutine.trace(guide).get_trace()
                out = poutine.replay(model.net, trace=guide_trace)(chunk)
            draws.append(handler.particles.split(out) if particles > 1 else out.unsqueeze(0))
        chunks.append(torch.cat(draws))
    return torch.cat(chunks, dim=1)


@torch.no_grad()
def predict(model, guide, x: torch.Tensor, num_samples: int = 100, batch_size: int = 1000,
            mc_dropout: bool = False, vectorized: bool | None = None) -> dict[str, torch.Tensor]:
    """Posterior predictive summaries.

    Classification: ``probs`` (predictive mean), ``total`` (predictive entropy),
    ``aleatoric`` (expected entropy), ``epistemic`` (mutual information).
    Regression: ``mean``, ``std`` (total), ``epistemic_std``, ``aleatoric_std``.
    """
    outputs = predictive_outputs(model, guide, x, num_samples, batch_size, mc_dropout, vectorized)
    return model.likelihood.predictive(outputs)
