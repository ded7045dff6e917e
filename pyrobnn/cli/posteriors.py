"""Posteriors made of point estimates in ``pyrobnn train``: a deep ensemble (``--ensemble M``) or the Laplace
approximation of the MAP fit (``--laplace``), as the empirical posterior of their draws.

:func:`trainer` is the training function of a run (:func:`~pyrobnn.infer.svi.fit`, or
:func:`~pyrobnn.infer.ensemble.fit_ensemble` with the same arguments); :func:`empirical_posterior` turns what it
trained into the posterior that the test report uses and writes its ``draws.pt`` (kind ``ensemble`` or ``laplace``,
read back by ``pyrobnn evaluate`` as the ``draws.pt`` of ``pyrobnn mcmc``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from pyrobnn.cli.build import build
from pyrobnn.cli.options import RunConfig
from pyrobnn.cli.report import say
from pyrobnn.cli.runs import ENSEMBLE_KIND, LAPLACE_KIND, augmentation, save_draws
from pyrobnn.infer.ensemble import fit_ensemble
from pyrobnn.infer.laplace import fit_laplace
from pyrobnn.infer.svi import fit

__all__ = ["Posterior", "trainer", "empirical_posterior"]


@dataclass
class Posterior:
    """What the test report of a run uses: the guide, how many samples it predicts with, the row name of the metrics
    table, and the entries it adds to ``metrics.json``."""

    guide: object
    num_samples: int
    name: str
    report: dict


def trainer(cfg: RunConfig, data) -> Callable:
    """The run's training function, called as :func:`~pyrobnn.infer.svi.fit`: ``fit`` itself, or with ``--ensemble M``
    :func:`~pyrobnn.infer.ensemble.fit_ensemble` of M members built as the run's own model and guide."""
    if not cfg.posterior.ensemble:
        return fit

    def member(m: int):
        say(f"ensemble member {m + 1}/{cfg.posterior.ensemble} (seed {cfg.optim.seed + m})")
        return build(cfg, data)

    member(0)  # announces member 0, whose model and guide the run has built
    return functools.partial(fit_ensemble, members=cfg.posterior.ensemble, make_member=member)


def empirical_posterior(cfg: RunConfig, trained, model, guide, data, out: Path) -> Posterior:
    """The posterior the run's test report uses. With ``--ensemble``, ``trained`` is the
    :class:`~pyrobnn.infer.ensemble.EnsembleResult` of :func:`trainer`, its members' draws; with ``--laplace``, the
    MAP fit ``guide``'s :func:`~pyrobnn.infer.laplace.fit_laplace` (``--num-samples`` draws of the last layer, seeded by
    ``--seed``); both are written to ``out/draws.pt``. Otherwise the guide itself, with ``--num-samples``."""
    if cfg.posterior.ensemble:
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
    else:
        return Posterior(guide, cfg.output.num_samples, cfg.method or cfg.guide.name, {})
    save_draws(out / "draws.pt", kind, cfg, model, {name: value.unsqueeze(0) for name, value in result.draws.items()},
               **{kind: report})
    say(f"{kind}: {summary}; wrote {out}/draws.pt")
    posterior = result.posterior()
    return Posterior(posterior, len(posterior), cfg.method or kind, {kind: report})
