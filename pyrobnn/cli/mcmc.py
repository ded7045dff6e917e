"""``pyrobnn mcmc``: NUTS on a small network and a toy problem; draws.pt, diagnostics.json and a plot."""

from __future__ import annotations

import math
from pathlib import Path

import pyro
import torch

from pyrobnn.analysis.plots import boundary_plot, predictive_plot
from pyrobnn.checkpoint import save_checkpoint
from pyrobnn.cli.build import build_network, check_mcmc
from pyrobnn.cli.options import MCMC_MAX_WEIGHTS, MCMCConfig, api_value
from pyrobnn.cli.report import console, diagnostics_table, draws_shape, json_safe, metrics_table, say, shown, warn
from pyrobnn.cli.runs import MCMC_KIND, load_data, test_report
from pyrobnn.files import check_writable, write_json
from pyrobnn.infer.mcmc import sample_posterior

__all__ = ["SamplingFailed", "mcmc"]


class SamplingFailed(RuntimeError):
    """NUTS stopped with an error (e.g. no finite potential energy at the initial weights)."""


def mcmc(cfg: MCMCConfig) -> dict:
    """Sample the posterior of a small network on a toy problem with NUTS; write ``draws.pt``,
    ``diagnostics.json`` and ``boundary.png`` (classification) or ``predictive.png`` (regression).

    The options, ``--out``, and the size of the network are checked before anything is written.
    """
    check_mcmc(cfg)
    out = Path(cfg.output.out)
    check_writable(out, "--out", directory=True)
    seed, mc = cfg.output.seed, cfg.mcmc
    data = load_data(cfg)
    pyro.set_rng_seed(seed)  # weight initialisation: the chains start there (plus --init-jitter)
    model = build_network(cfg, data)
    sites = model.sites()
    size = sum(math.prod(site.shape) for site in sites)
    if size > MCMC_MAX_WEIGHTS:
        raise ValueError(f"--hidden {shown(cfg.model.hidden)}: the network has {size} Bayesian weights; pyrobnn mcmc "
                         f"samples at most {MCMC_MAX_WEIGHTS} (NUTS explores one dimension per weight): use narrower "
                         "--hidden layers, --bayesian last-layer, or `pyrobnn train`")
    classification = data.task == "classification"
    plot = out / ("boundary.png" if classification else "predictive.png")
    say(f"pyrobnn mcmc {cfg.data.dataset}: {len(data.x_train)} train / {len(data.x_test)} test, model "
         f"{cfg.model.name} {shown(cfg.model.hidden)}, {size} Bayesian weights in {len(sites)} tensors, prior "
         f"{cfg.prior.name}, NUTS ({mc.sampler} sampler) {mc.num_chains} chain{'s' if mc.num_chains != 1 else ''} x "
         f"({mc.warmup} warm-up + {mc.num_samples} draws), seed {seed}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a small network's products gain nothing from intra-op threads, which only contend
    try:
        result = sample_posterior(model, data.x_train, data.y_train, num_samples=mc.num_samples, warmup=mc.warmup,
                                  num_chains=mc.num_chains, seed=seed, init_jitter=mc.init_jitter,
                                  target_accept=mc.target_accept, max_tree_depth=mc.max_tree_depth,
                                  sampler=api_value(mc.sampler), compiler=api_value(mc.compiler), jit=mc.jit,
                                  progress=cfg.output.progress)
    except RuntimeError as error:
        raise SamplingFailed(str(error)) from error
    finally:
        torch.set_num_threads(threads)
    posterior = result.posterior()
    diagnostics = result.diagnostics
    metrics = test_report(model, posterior, data, len(posterior), seed)
    save_checkpoint(out / "draws.pt", {
        "kind": MCMC_KIND, "config": cfg.to_dict(), "model": model.state_dict(),
        "guide": {}, "epoch": None,  # keys every pyrobnn checkpoint has; NUTS has neither guide nor epochs
        "draws": {name: value.detach().cpu().contiguous() for name, value in result.draws.items()},
        "diagnostics": diagnostics, "test": metrics,
    })
    write_json(out / "diagnostics.json", json_safe({"diagnostics": diagnostics, "test": metrics,
                                                     "config": cfg.to_dict()}))
    title = f"{cfg.data.dataset}: NUTS, {draws_shape(result.draws)}, mlp {shown(cfg.model.hidden)}"
    (boundary_plot if classification else predictive_plot)(model, posterior, data, plot, title)
    console.print(diagnostics_table(f"NUTS: {draws_shape(result.draws)}, {size} weights",
                                    diagnostics))
    say(f"{diagnostics['sampler']} sampler ({diagnostics['compiler']}): function space (predictions at "
        f"{diagnostics['prediction_points']} training inputs): split R-hat max "
        f"{diagnostics['prediction_r_hat_max']:.3f}, bulk ESS min {diagnostics['prediction_ess_min']:.0f}")
    console.print(metrics_table(f"test metrics ({len(posterior)} draws)", {"nuts": metrics}))
    for warning in diagnostics.get("warnings", []):
        warn(warning)
    say(f"wrote {out}/draws.pt, diagnostics.json, {plot.name}")
    return {"diagnostics": diagnostics, "test": metrics}
