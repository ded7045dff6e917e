r"""``pyrobnn mcmc``: NUTS on a small network, on a toy problem or a UCI regression data set; draws.pt,
diagnostics.json and (toy problems) a plot.

On a UCI data set (``--dataset uci-boston --split 3``) the run follows the benchmark's protocol as ``pyrobnn train``
does (:mod:`pyrobnn.data.uci`): inputs and target standardised on the training split, RMSE and the test
log-likelihood of the predictive mixture of all draws in the target's original units (the same
:func:`~pyrobnn.cli.runs.test_report`).

The Gaussian likelihood's noise is held fixed while NUTS samples the weights. ``--grid protocol`` (or
``--grid tau=V1,V2,...``) chooses its precision :math:`\tau` (original units; :math:`\sigma = 1/(\sqrt\tau\, s_y)`
on the standardised target) on an 80/20 split of the training split only, as ``pyrobnn train --grid`` does for
the variational methods (:mod:`pyrobnn.cli.grid`): one short NUTS run per value on the first 80 %
(``--grid-samples`` warm-up steps and draws per chain), scored by the log-likelihood of its predictive mixture on
the held-out 20 %; the test split is not read until the chosen run is tested. The sampled posterior is then the
exact posterior of the same fixed-noise model whose variational approximations the other methods fit, with the
noise chosen by the same protocol (the HMC baseline of Hernández-Lobato & Adams 2015 samples :math:`\tau` under a
Gamma prior instead; here the sampled dimension stays the weights', so the batched sampler runs unchanged).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pyro
import torch

from pyrobnn.analysis.plots import boundary_plot, predictive_plot
from pyrobnn.cli.build import build_network, check_mcmc, noise_grid
from pyrobnn.cli.grid import configured, held_out_search, search_split
from pyrobnn.cli.methods import spelled
from pyrobnn.cli.options import (
    TAU,
    TOY_DATASETS,
    MCMCConfig,
    mcmc_dataset,
)
from pyrobnn.cli.report import (
    calibration_line,
    console,
    diagnostics_table,
    draws_shape,
    json_safe,
    metrics_table,
    prior_name,
    say,
    shown,
    warn,
)
from pyrobnn.cli.runs import CALIBRATION_SEED, calibration_split, load_data, test_report
from pyrobnn.files import check_writable, write_json
from pyrobnn.infer.recording import ExecutorFailed
from pyrobnn.methods import Refused

__all__ = ["SamplingFailed", "mcmc", "choose_noise"]


class SamplingFailed(RuntimeError):
    """NUTS stopped with an error (e.g. no finite potential energy at the initial weights)."""


def _sampled(cfg: MCMCConfig, nuts, data, progress: bool):
    """The posterior ``nuts`` (:class:`~pyrobnn.methods.NUTS`) samples of the network of ``cfg`` (its weights seeded
    by ``--seed``: the chains start there) on ``data``'s training set."""
    pyro.set_rng_seed(cfg.output.seed)  # weight initialisation: the chains start there (plus --init-jitter)
    model = build_network(cfg, data)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a small network's products gain nothing from intra-op threads, which only contend
    try:
        return nuts.train(model, None, data.x_train, data.y_train, seed=cfg.output.seed, compile=cfg.mcmc.compile,
                          progress=progress)
    except Refused as refusal:
        raise ValueError(spelled(refusal, "mcmc")) from None
    except ExecutorFailed:  # an explicit --compile that cannot run: the command line's one line (exit 2)
        raise
    except RuntimeError as error:
        raise SamplingFailed(str(error)) from error
    finally:
        torch.set_num_threads(threads)


def choose_noise(cfg: MCMCConfig, nuts, data) -> tuple[MCMCConfig, dict | None]:
    """``cfg`` with the ``--grid`` noise precision of highest held-out log-likelihood (``--likelihood.scale`` =
    :math:`1/(\\sqrt\\tau\\, s_y)`, :math:`s_y` of ``data``, the run's training split), and the record of the search
    ``{"grid", "score", "fit_size", "held_out_size", "warmup", "num_samples", "points", "chosen", "seconds"}``
    (``None`` without ``--grid``). Each value is sampled on the first 80 % of the training split
    (:func:`~pyrobnn.cli.runs.load_data` with ``validation=True``: a UCI data set's test split is not read) and
    scored on the other 20 %; the first of equal scores wins."""
    taus = noise_grid(cfg)
    if not taus:
        return cfg, None
    if data.task != "regression":
        raise ValueError(f"--grid chooses the Gaussian noise of a regression data set; {cfg.data.dataset} is "
                         f"{data.task}")
    held = search_split(cfg, data)
    steps = cfg.mcmc.grid_samples
    say(f"--grid: {len(taus)} noise precisions, each sampled on {len(held.x_train)} examples ({steps} warm-up + "
        f"{steps} draws per chain) and scored on {len(held.x_test)} held out (log_likelihood)")
    points = [{TAU: tau} for tau in taus]

    short = dataclasses.replace(nuts, warmup=steps, num_samples=steps)

    def evaluate(run):
        posterior = _sampled(run, short, held, progress=False)
        return {**test_report(posterior, held, cfg.output.seed),
                "prediction_r_hat_max": posterior.result.diagnostics["prediction_r_hat_max"]}

    best, record = held_out_search(points, [configured(cfg, point, held) for point in points], evaluate,
                                   "log_likelihood", held)
    return configured(cfg, points[best], data), {"grid": {TAU: list(taus)}, "warmup": steps, "num_samples": steps,
                                                 **record}


def mcmc(cfg: MCMCConfig) -> dict:
    """Sample the posterior of a small network with NUTS, on a toy problem or a UCI regression data set (its
    ``--split``); write ``draws.pt``, ``diagnostics.json`` (with the test metrics, and ``selection``, the noise
    chosen by ``--grid``) and, on a toy problem, ``boundary.png`` (classification) or ``predictive.png``
    (regression).

    The options, ``--out``, and the size of the network are checked before anything is written.
    """
    nuts = check_mcmc(cfg)
    out = Path(cfg.output.out)
    check_writable(out, "--out", directory=True)
    tick = time.perf_counter()
    data, held_out = calibration_split(cfg, load_data(cfg))  # --calibrate: its rows are never sampled on
    cfg, selection = choose_noise(cfg, nuts, data)
    seed, mc = cfg.output.seed, cfg.mcmc
    toy = mcmc_dataset(cfg.data.dataset) in TOY_DATASETS
    where = "" if toy else f" (split {cfg.data.split or 0})"
    noise = "" if data.task != "regression" else f", noise scale {cfg.likelihood.scale:.4g}"
    calibrating = "" if held_out is None else f" / {len(held_out[0])} held out to calibrate"
    say(f"pyrobnn mcmc {cfg.data.dataset}{where}: {len(data.x_train)} train{calibrating} / {len(data.x_test)} test, "
        f"model {cfg.model.name} {shown(cfg.model.hidden)}, prior {prior_name(cfg.prior)}{noise}, NUTS ({mc.sampler} "
        f"sampler) {mc.num_chains} chain{'s' if mc.num_chains != 1 else ''} x ({mc.warmup} warm-up + {mc.num_samples} "
        f"draws), seed {seed}")
    posterior = _sampled(cfg, nuts, data, cfg.output.progress)
    model, result = posterior.model, posterior.result
    size = result.diagnostics["num_weights"]
    diagnostics = result.diagnostics
    metrics = test_report(posterior, data, seed, held_out=held_out, coverage=cfg.calibration.coverage)
    result.save(out / "draws.pt", config=cfg.to_dict(), diagnostics=diagnostics, test=metrics)
    report = {"diagnostics": diagnostics, "test": metrics, "config": cfg.to_dict()}
    if selection is not None:
        report["selection"] = selection
    if held_out is not None:
        report["calibration"] = {"rows": len(held_out[0]), "fraction": cfg.calibration.fraction,
                                 "coverage": cfg.calibration.coverage, "seed": CALIBRATION_SEED}
    report["seconds"] = time.perf_counter() - tick
    write_json(out / "diagnostics.json", json_safe(report))
    written = ["draws.pt", "diagnostics.json"]
    if toy:
        classification = data.task == "classification"
        plot = out / ("boundary.png" if classification else "predictive.png")
        title = f"{cfg.data.dataset}: NUTS, {draws_shape(result.draws)}, mlp {shown(cfg.model.hidden)}"
        (boundary_plot if classification else predictive_plot)(model, posterior.guide, data, plot, title)
        written.append(plot.name)
    console.print(diagnostics_table(f"NUTS: {draws_shape(result.draws)}, {size} weights", diagnostics))
    say(f"{diagnostics['sampler']} sampler (compile {diagnostics['compile']}): function space (predictions at "
        f"{diagnostics['prediction_points']} training inputs): split R-hat max "
        f"{diagnostics['prediction_r_hat_max']:.3f}, bulk ESS min {diagnostics['prediction_ess_min']:.0f}")
    if held_out is not None:
        say(calibration_line(metrics, len(held_out[0]), cfg.calibration.coverage))
    console.print(metrics_table(f"test metrics ({len(result)} draws)", {"nuts": metrics}))
    for warning in diagnostics.get("warnings", []):
        warn(warning)
    say(f"wrote {out}/{', '.join(written)}")
    return {"diagnostics": diagnostics, "test": metrics, **({"selection": selection} if selection else {})}
