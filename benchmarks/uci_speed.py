"""Where the time of the UCI regression benchmark goes: one run of ``pyrobnn train`` at the protocol's settings, and
what the study files cost at that rate.

Measured in this process on Boston Housing, split 0 (455 training rows, batches of 128, so 4 steps an epoch; 364
rows and 3 steps for each grid point), one hidden layer of 50 units, ``--epochs`` epochs at Adam 1e-2, 1000
predictive samples (studies/uci_quick.toml):

- ``mcdropout``: MC dropout with ``--guide.rate 0.05`` and tau = 0.15, without ``--grid``;
- ``mcdropout_grid``: the same with ``--grid protocol`` (4 dropout rates x 3 taus trained on 80 % of the split, the
  3 taus of a rate as one stacked network, then the chosen point on all of it): 4 stacked trainings and 1 alone;
- ``bbb``: Bayes by Backprop (``--method bbb``: 5 weight samples a step), without ``--grid``;
- ``torch_step_us``: the floor, one step of the same dropout network written in plain PyTorch (MSE, two dropout
  masks, Adam), no Pyro;
- ``fit_us_per_step``: :func:`~pyrobnn.infer.svi.fit` alone on a grid point's 80 % (364 rows, 3 steps an epoch),
  for every method of studies/uci.toml (at its settings there), with the traced step (``trace``) and, for MC
  dropout and BBB, the eager one (``trace``, ``compile="trace"``: what the grid's
  points and, with the study files' ``--compile trace``, the final fit run), side by side: ``[us per step once
  running (the median epoch), seconds of the first epoch beyond that (the traced step's recordings)]``;
- ``stacked_us_per_step``: :func:`~pyrobnn.infer.replicas.fit_replicas` of the 3 points of one stack (the grid's
  taus) on the same 80 %, per method: ``[us per step of all 3 once running, seconds of the first epoch beyond that]``.

Each run's training time per optimiser step (``us_per_step``, from the per-epoch times ``fit`` records) and its
wall time are reported; the study estimates multiply the steps a study takes (per cell, for each data set's size:
``epochs x S x steps of 80 %`` stacked steps, S stacks of 3 grid points, and ``epochs x F x steps of the split``
single steps, F final fits) by the measured stacked and traced times per step (and, for comparison, every point
alone and eager), add each training's first-epoch cost, and add the per-cell time outside the trainings (prediction
of every grid point and of the test split, data, checkpoints) as measured on the Boston grid cell. Cells run on
``--workers`` cores at once.

    python benchmarks/uci_speed.py [--epochs 400] [--threads 1] [--workers 2]

The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import statistics
import tempfile
import time
from pathlib import Path

import pyro
import torch

from pyrobnn.cli import _parse
from pyrobnn.cli.build import build
from pyrobnn.cli.methods import expand_method
from pyrobnn.cli.runs import fit_options, load_data
from pyrobnn.cli.train import train
from pyrobnn.data import load_dataset
from pyrobnn.infer.replicas import fit_replicas
from pyrobnn.infer.svi import fit

BASE = ["--dataset", "uci-boston", "--split", "0", "--hidden", "50", "--lr", "0.01", "--batch-size", "128",
        "--num-samples", "1000", "--compile", "trace", "--no-progress"]

SIZES = {"uci-boston": 455, "uci-concrete": 927, "uci-energy": 691, "uci-wine": 1439, "uci-yacht": 277}
"""Training rows of each data set's splits (90 % of its rows)."""

GRID_STACKS = {"mcdropout": 4, "bbb": 1, "variational-dense": 1, "vd-additive": 1, "ibnn-4": 1, "ensemble-5": 1,
               "laplace": 1}
"""Stacks of ``--grid protocol`` per method, each the 3 taus of one dropout rate trained as one stacked network
(:data:`pyrobnn.cli.grid.STACKED`): 4 dropout rates for MC dropout, one stack otherwise."""

TAUS = 3
"""Grid points in a stack (the data sets' ``tau_values.txt``)."""

FINAL_FITS = {"ensemble-5": 5}
"""Trainings of the chosen point (an ensemble trains its members one after the other)."""


def steps(rows: int, epochs: int, batch: int = 128, points: int = 0, fits: int = 1) -> int:
    """Optimiser steps of one cell: ``points`` grid points on 80 % of ``rows``, then ``fits`` trainings on all."""
    return epochs * (points * math.ceil(int(0.8 * rows) / batch) + fits * math.ceil(rows / batch))


def timed_run(args: list[str], out: Path) -> dict:
    """Run ``pyrobnn train`` in this process; its wall time, its steps and its training time per step."""
    cfg = _parse(expand_method(["train", *BASE, *args, "--out", str(out)]))
    tick = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        metrics = train(cfg)
    wall = time.perf_counter() - tick
    report = json.loads((out / "metrics.json").read_text())
    epochs = report["history"]
    per_step = sum(record["seconds"] for record in epochs) / (len(epochs) * math.ceil(455 / 128))
    grid = report.get("selection", {}).get("seconds", 0.0)
    return {"wall_s": wall, "grid_s": grid, "us_per_step": 1e6 * per_step, "rmse": metrics["rmse"],
            "log_likelihood": metrics["log_likelihood"], "chosen": report.get("selection", {}).get("chosen")}


def torch_step_us(repeats: int = 300) -> float:
    """One training step of the 13-50-1 dropout network in plain PyTorch (the floor without Pyro)."""
    torch.manual_seed(0)
    x, y = torch.randn(128, 13), torch.randn(128, 1)
    net = torch.nn.Sequential(torch.nn.Dropout(0.05), torch.nn.Linear(13, 50), torch.nn.ReLU(),
                              torch.nn.Dropout(0.05), torch.nn.Linear(50, 1))
    opt = torch.optim.Adam(net.parameters(), 1e-2)
    tick = time.perf_counter()
    for _ in range(repeats):
        loss = (net(x) - y).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return 1e6 * (time.perf_counter() - tick) / repeats


SETTINGS = {"ibnn-4": ["--num-particles", "4"]}
"""The per-method options of studies/uci.toml's ``[settings]``."""


def _method_config(method: str, epochs: int):
    return _parse(expand_method(["train", *BASE, "--method", method, *SETTINGS.get(method, []), "--epochs",
                                 str(epochs), "--out", "unused"]))


def fit_cost(method: str, compile, epochs: int) -> tuple[float, float]:
    """``fit`` on a Boston grid point (the 80 % of split 0) at the method's settings: microseconds per step once
    running (the median epoch), and the seconds the first epoch takes beyond that (a traced step's recordings)."""
    cfg = _method_config(method, epochs)
    held = load_data(cfg, validation=True)
    pyro.set_rng_seed(0)
    model, guide = build(cfg, held)
    history = fit(model, guide, held.x_train, held.y_train, **{**fit_options(cfg), "compile": compile},
                  device="cpu", progress=False)
    seconds = [record["seconds"] for record in history.epochs]
    epoch = statistics.median(seconds[1:])
    return 1e6 * epoch / math.ceil(len(held.x_train) / 128), max(0.0, seconds[0] - epoch)


def stacked_cost(method: str, epochs: int) -> tuple[float, float]:
    """:func:`~pyrobnn.infer.replicas.fit_replicas` of one stack (:data:`TAUS` replicas) on a Boston grid point's
    80 %: microseconds per stacked step once running (the median epoch), and the first epoch's extra seconds."""
    cfg = _method_config(method, epochs)
    held = load_data(cfg, validation=True)
    pairs = []
    for _ in range(TAUS):
        pyro.set_rng_seed(0)
        pairs.append(build(cfg, held))
    history = fit_replicas(pairs, held.x_train, held.y_train, **{**fit_options(cfg), "compile": "trace"},
                           device="cpu")[0]
    seconds = [record["seconds"] for record in history.epochs]
    epoch = statistics.median(seconds[1:])
    return 1e6 * epoch / math.ceil(len(held.x_train) / 128), max(0.0, seconds[0] - epoch)


def study_minutes(single: dict, stacked: dict | None, cell_overhead_s: float, epochs: int, splits: int, methods,
                  workers: int) -> float:
    """Wall minutes of a study of ``methods`` on the five shared data sets and ``splits`` splits: each method's
    stacks at ``stacked[method]`` = ``(us per step, first-epoch seconds)`` and its final fits at ``single[method]``
    (every method of :data:`GRID_STACKS` measured); ``stacked=None``: every grid point trained alone at ``single``."""
    seconds = 0.0
    for method in methods:
        rate, setup = single[method]
        rate *= 1e-6
        fits = FINAL_FITS.get(method, 1)
        if stacked is None:
            trainings, grid_rate, grid_setup = GRID_STACKS[method] * TAUS, rate, setup
        else:
            stacked_rate, grid_setup = stacked[method]
            trainings, grid_rate = GRID_STACKS[method], stacked_rate * 1e-6
        for rows in SIZES.values():
            grid = steps(int(0.8 * rows), epochs, fits=trainings)
            final = steps(rows, epochs, fits=fits)
            seconds += splits * (grid * grid_rate + final * rate + trainings * grid_setup + fits * setup
                                 + cell_overhead_s)
    return seconds / workers / 60


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=400)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a study worker of 2 on 2 cores: 1)")
    parser.add_argument("--workers", type=int, default=2, help="cells at once in the estimates")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    y_std = float(load_dataset("uci-boston", split=0).y_std)
    scale = 1 / (math.sqrt(0.15) * y_std)  # tau = 0.15 in original units
    epochs = ["--epochs", str(args.epochs)]
    with tempfile.TemporaryDirectory() as tmp:
        runs = {
            "mcdropout": timed_run(["--method", "mcdropout", "--guide.rate", "0.05", "--likelihood.scale", str(scale),
                                    *epochs], Path(tmp) / "a"),
            "mcdropout_grid": timed_run(["--method", "mcdropout", "--grid", "protocol", *epochs], Path(tmp) / "b"),
            "bbb": timed_run(["--method", "bbb", "--likelihood.scale", str(scale), *epochs], Path(tmp) / "c"),
        }
    floor = torch_step_us()
    fit_epochs = max(1, args.epochs // 4)
    methods = ("mcdropout", "bbb")  # the quick study's
    modes = {method: (("eager", "none"), ("trace", "trace")) if method in methods else (("trace", "trace"),)
             for method in GRID_STACKS}
    per_fit = {method: {mode: fit_cost(method, compile, fit_epochs) for mode, compile in modes[method]}
               for method in GRID_STACKS}
    per_stack = {method: stacked_cost(method, fit_epochs) for method in GRID_STACKS}
    single = {mode: {method: cost[mode] for method, cost in per_fit.items() if mode in cost}
              for mode in ("eager", "trace")}
    boston_steps = steps(455, args.epochs)
    stacks = GRID_STACKS["mcdropout"]
    cell_seconds = (steps(364, args.epochs, fits=stacks) * per_stack["mcdropout"][0] * 1e-6
                    + stacks * per_stack["mcdropout"][1]
                    + boston_steps * single["trace"]["mcdropout"][0] * 1e-6 + single["trace"]["mcdropout"][1])
    overhead = max(0.0, runs["mcdropout_grid"]["wall_s"] - cell_seconds)
    quick = study_minutes(single["trace"], per_stack, overhead, args.epochs, 5, methods, args.workers)
    quick_alone = study_minutes(single["trace"], None, overhead, args.epochs, 5, methods, args.workers)
    quick_eager = study_minutes(single["eager"], None, overhead, args.epochs, 5, methods, args.workers)
    full = study_minutes(single["trace"], per_stack, overhead, args.epochs, 20, tuple(GRID_STACKS), args.workers)
    full_alone = study_minutes(single["trace"], None, overhead, args.epochs, 20, tuple(GRID_STACKS), args.workers)
    for name, run in runs.items():
        print(f"{name:15s} wall {run['wall_s']:6.1f} s (grid {run['grid_s']:5.1f} s)  {run['us_per_step']:6.0f} us/step"
              f"  rmse {run['rmse']:.3f}  ll {run['log_likelihood']:.3f}  {run['chosen'] or ''}")
    for method, cost in per_fit.items():
        stack = per_stack[method]
        eager = cost.get("eager")
        shown = "" if eager is None else f"eager {eager[0]:6.0f} us/step ({eager[0] / cost['trace'][0]:.2f}x), "
        print(f"fit on a grid point ({method:17s}): {shown}trace {cost['trace'][0]:6.0f} us/step, a stack of {TAUS} "
              f"{stack[0]:6.0f} us/step ({TAUS * cost['trace'][0] / stack[0]:.2f}x {TAUS} traced steps); first "
              f"epoch beyond that: trace {cost['trace'][1]:.2f} s, stack {stack[1]:.2f} s (recording)")
    print(f"plain torch step {floor:.0f} us; steps of one Boston cell: {boston_steps} without the grid, "
          f"{steps(364, args.epochs, fits=stacks)} stacked steps with it; per-cell time outside the steps "
          f"{overhead:.1f} s")
    print(f"estimated on {args.workers} workers: quick study (5 splits, mcdropout + bbb) {quick:.1f} min (every "
          f"point alone: {quick_alone:.1f} min; alone and eager: {quick_eager:.1f} min), full study (20 splits, "
          f"{len(GRID_STACKS)} methods) {full:.0f} min (every point alone: {full_alone:.0f} min)")
    print(json.dumps({"epochs": args.epochs, "threads": args.threads, "runs": runs, "torch_step_us": floor,
                      "fit_us_per_step": per_fit, "stacked_us_per_step": per_stack, "cell_overhead_s": overhead,
                      "quick_study_min": quick, "quick_study_alone_min": quick_alone,
                      "quick_study_eager_min": quick_eager, "full_study_min": full,
                      "full_study_alone_min": full_alone, "workers": args.workers}))

if __name__ == "__main__":
    main()
