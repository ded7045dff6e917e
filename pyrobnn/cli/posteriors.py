"""Posteriors made of point estimates in ``pyrobnn train``: a deep ensemble (``--ensemble M``), the Laplace
approximation of the MAP fit (``--laplace``), SWAG (``--swag``; MultiSWAG with ``--ensemble M``) or SG-MCMC draws
(``--sgmcmc``), as the empirical posterior of their draws.

:func:`trainer` is the training function of a run (:func:`~pyrobnn.infer.svi.fit`, or
:func:`~pyrobnn.infer.ensemble.fit_ensemble`, :func:`~pyrobnn.infer.swag.fit_swag` or
:func:`~pyrobnn.infer.sgmcmc.fit_sgmcmc`, called with the same arguments); :func:`empirical_posterior` turns what it
trained into the posterior that the test report uses and writes its ``draws.pt`` (kind ``ensemble``, ``laplace``,
``swag`` or ``sgmcmc``, read back by ``pyrobnn evaluate`` as the ``draws.pt`` of ``pyrobnn mcmc``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from pyrobnn.cli.build import build, learning_rate, sampler, sgmcmc_options, swag_start
from pyrobnn.cli.options import RunConfig
from pyrobnn.cli.report import say
from pyrobnn.cli.runs import ENSEMBLE_KIND, LAPLACE_KIND, SGMCMC_KIND, SWAG_KIND, augmentation, save_draws
from pyrobnn.infer.ensemble import fit_ensemble
from pyrobnn.infer.iterates import Recorded
from pyrobnn.infer.laplace import fit_laplace
from pyrobnn.infer.sgmcmc import SGMCMCResult, fit_sgmcmc
from pyrobnn.infer.svi import fit
from pyrobnn.infer.swag import SWAG, SWAGResult, fit_swag, replicas

__all__ = ["Posterior", "trainer", "empirical_posterior", "restarts", "collector", "collected_posterior"]


@dataclass
class Posterior:
    """What the test report of a run uses: the guide, how many samples it predicts with, the row name of the metrics
    table, and the entries it adds to ``metrics.json``."""

    guide: object
    num_samples: int
    name: str
    report: dict


def restarts(cfg: RunConfig) -> bool:
    """Whether the run keeps what it collects in memory only (SWAG's moments, SG-MCMC's draws), so that ``--resume``
    trains it again from the start."""
    return cfg.posterior.swag or cfg.posterior.sgmcmc != "none"


def fresh(options: dict) -> dict:
    """``fit``'s ``options`` with a checkpoint that does not resume: a run that keeps what it collects in memory
    (:func:`restarts`) trains again from the start under ``--resume``."""
    checkpoint = options.get("checkpoint")
    if checkpoint is not None and checkpoint.resume:
        options = {**options, "checkpoint": dataclasses.replace(checkpoint, resume=False)}
    return options


def trainer(cfg: RunConfig, data, announce: bool = True) -> Callable:
    """The run's training function, called as :func:`~pyrobnn.infer.svi.fit`: ``fit`` itself, or with ``--ensemble M``
    :func:`~pyrobnn.infer.ensemble.fit_ensemble` of M members built as the run's own model and guide, with ``--swag``
    :func:`~pyrobnn.infer.swag.fit_swag` (M SWAGs with ``--ensemble M``), with ``--sgmcmc``
    :func:`~pyrobnn.infer.sgmcmc.fit_sgmcmc` (its chains built as the run's model and guide; several chains take no
    checkpoint or callbacks). ``announce``: say which member or chain is built."""
    post = cfg.posterior
    members = max(post.ensemble, 1)
    if not post.ensemble and not restarts(cfg):
        return fit

    def member(m: int, what: str = "ensemble member", count: int = members):
        if announce:
            say(f"{what} {m + 1}/{count} (seed {cfg.optim.seed + m})")
        return build(cfg, data)

    if post.sgmcmc != "none":
        chains = post.sgmcmc_chains

        def sample(model, guide, x, y, *, optimizer=None, **options):
            options = fresh(options)
            if chains > 1:  # one stacked network: no checkpoint, callbacks or progress bar
                options = {k: v for k, v in options.items() if k not in ("checkpoint", "on_epoch_end", "progress")}
            return fit_sgmcmc(model, guide, x, y, lr=learning_rate(cfg), **sgmcmc_options(cfg), chains=chains,
                              make_chain=lambda c: member(c, "chain", chains), **options)

        return sample
    if post.swag:
        if members > 1:
            member(0, "SWAG")

        def swag(model, guide, x, y, **options):
            return fit_swag(model, guide, x, y, start=swag_start(cfg), rank=post.swag_rank,
                            num_samples=cfg.output.num_samples, members=members,
                            make_member=lambda m: member(m, "SWAG"), **fresh(options))

        return swag
    member(0)  # announces member 0, whose model and guide the run has built
    return functools.partial(fit_ensemble, members=cfg.posterior.ensemble, make_member=member)


def collector(cfg: RunConfig, rows: int, optimizer) -> Recorded | None:
    """The optimizer factory that collects what ``--swag`` or ``--sgmcmc`` keep (SWAG's moments over ``optimizer``,
    the run's SGD; the SG-MCMC sampler instead of it) on ``rows`` training rows, recording the optimisers it builds;
    None for the other posteriors."""
    steps = math.ceil(rows / cfg.optim.batch_size)
    if cfg.posterior.swag:
        return Recorded(SWAG(swag_start(cfg), cfg.posterior.swag_rank, steps, optimizer))
    if cfg.posterior.sgmcmc != "none":
        return Recorded(sampler(cfg, steps))
    return None


def collected_posterior(cfg: RunConfig, collected: Recorded, model, rows: Sequence[int], data):
    """The draws of the networks ``rows`` (in the order :func:`collector`'s optimisers trained them, stacked or one
    after another) as :class:`~pyrobnn.infer.swag.SWAGResult` (``--num-samples`` draws of each SWAG, BatchNorm
    statistics on ``data``'s training rows, replayed in ``model``) or :class:`~pyrobnn.infer.sgmcmc.SGMCMCResult`."""
    if cfg.posterior.swag:
        trained = replicas(collected)
        aug = augmentation(cfg, data)
        return SWAGResult.of(model, [trained[r] for r in rows], cfg.output.num_samples, cfg.optim.seed, data.x_train,
                             None if aug is None else aug.normalize)
    result = SGMCMCResult.of(model, collected)
    return SGMCMCResult(model, {name: value[list(rows)] for name, value in result.draws.items()},
                        draw_epochs=result.draw_epochs)


def empirical_posterior(cfg: RunConfig, trained, model, guide, data, out: Path) -> Posterior:
    """The posterior the run's test report uses. With ``--swag``, ``--ensemble`` or ``--sgmcmc``, ``trained`` is what
    :func:`trainer` returned (:class:`~pyrobnn.infer.swag.SWAGResult`, :class:`~pyrobnn.infer.ensemble.EnsembleResult`,
    :class:`~pyrobnn.infer.sgmcmc.SGMCMCResult`), its draws; with ``--laplace``, the MAP fit ``guide``'s
    :func:`~pyrobnn.infer.laplace.fit_laplace` (``--num-samples`` draws of the last layer, seeded by ``--seed``); the
    draws are written to ``out/draws.pt`` and predicted with, every one once. Otherwise the guide itself, with
    ``--num-samples``."""
    if cfg.posterior.swag:
        result = trained
        kind, report = SWAG_KIND, {"members": len(result.moments), "draws_per_member": cfg.output.num_samples,
                                   "start": swag_start(cfg), "rank": cfg.posterior.swag_rank,
                                   "collected": [moments.count for moments in result.moments],
                                   "batchnorm_recomputed": result.batchnorm}
        summary = (f"{len(result)} draws ({len(result.moments)} x {cfg.output.num_samples}) of the Gaussian fitted to "
                   f"{result.moments[0].count} iterates, rank {result.moments[0].columns}"
                   + (", BatchNorm statistics recomputed for each" if result.batchnorm else ""))
    elif cfg.posterior.ensemble:
        kind, result, report = ENSEMBLE_KIND, trained, {"members": cfg.posterior.ensemble}
        summary = f"{len(result)} members"
    elif cfg.posterior.laplace:
        aug = augmentation(cfg, data)
        result = fit_laplace(model, guide, data.x_train, data.y_train, num_samples=cfg.output.num_samples,
                             seed=cfg.optim.seed, transform=None if aug is None else aug.normalize)
        kind, report = LAPLACE_KIND, {"prior_precision": result.prior_precision,
                                      "log_marginal_likelihood": result.log_marginal_likelihood}
        summary = (f"{len(result)} draws of the last layer, prior precision {result.prior_precision[0]:.4g} (by the "
                   f"marginal likelihood, log {result.log_marginal_likelihood:.4g})")
    elif cfg.posterior.sgmcmc != "none":
        result = trained
        diagnostics = result.diagnostics()  # R-hat and ESS need 4 draws a chain (else inf and 0: reported as null)
        r_hat, ess = (max(d["r_hat_max"] for d in diagnostics.values()),
                      min(d["ess_min"] for d in diagnostics.values()))
        kind, report = SGMCMC_KIND, {"sampler": cfg.posterior.sgmcmc, **sgmcmc_options(cfg), "chains": result.chains,
                                     "draw_epochs": result.draw_epochs,
                                     "r_hat_max": r_hat if math.isfinite(r_hat) else None,
                                     "ess_min": ess if len(result.draw_epochs) >= 4 else None}
        summary = (f"{len(result)} draws ({result.chains} chain(s) x {len(result.draw_epochs)}, after epochs "
                   f"{result.draw_epochs[0]}-{result.draw_epochs[-1]})"
                   + (f", smallest ESS {ess:.1f}" if report["ess_min"] is not None else ""))
    else:
        return Posterior(guide, cfg.output.num_samples, cfg.method or cfg.guide.name, {})
    stacked = cfg.posterior.swag or cfg.posterior.sgmcmc != "none"  # (members or chains, draws, ...) already
    save_draws(out / "draws.pt", kind, cfg, model,
               result.draws if stacked else {name: value.unsqueeze(0) for name, value in result.draws.items()},
               state=getattr(result, "state", None), **{kind: report})
    say(f"{kind}: {summary}; wrote {out}/draws.pt")
    posterior = result.posterior()
    return Posterior(posterior, len(posterior), cfg.method or kind, {kind: report})
