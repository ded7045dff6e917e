"""Where the time of the UCI regression benchmark goes: one run of ``pyrobnn train`` at the protocol's settings, and
what the study files cost at that rate.

Measured in this process on Boston Housing, split 0 (455 training rows, batches of 128, so 4 steps an epoch; 364
rows and 3 steps for each grid point), one hidden layer of 50 units, ``--epochs`` epochs at Adam 1e-2, 1000
predictive samples (studies/uci_quick.toml):

- ``mcdropout``: MC dropout with ``--guide.rate 0.05`` and tau = 0.15, without ``--grid``;
- ``mcdropout_grid``: the same with ``--grid protocol`` (4 dropout rates x 3 taus trained on 80 % of the split, then
  the chosen point on all of it): 13 trainings;
- ``bbb``: Bayes by Backprop (``--method bbb``: 5 weight samples a step), without ``--grid``;
- ``torch_step_us``: the floor, one step of the same dropout network written in plain PyTorch (MSE, two dropout
  masks, Adam), no Pyro;
- ``fit_us_per_step``: :func:`~pyrobnn.infer.svi.fit` alone on a grid point's 80 % (364 rows, 3 steps an epoch),
  per method, with the eager step (``eager``) and the traced one (``trace``, ``compile="trace"``: what the grid's
  points and, with the study files' ``--compile trace``, the final fit run), side by side: ``[us per step once
  running (the median epoch), seconds of the first epoch beyond that (the traced step's recordings)]``.

Each run's training time per optimiser step (``us_per_step``, from the per-epoch times ``fit`` records) and its
wall time are reported; the study estimates multiply the steps a study takes (``epochs x (G x steps of 80 % + steps
of the split)`` per cell, for each data set's size) by the measured traced time per step (and, for comparison, the
eager one), add each training's first-epoch cost, and add the per-cell time outside the trainings (prediction of
every grid point and of the test split, data, checkpoints) as measured on the Boston grid cell. Cells run on
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
from pyrobnn.infer.svi import TRACE, fit

BASE = ["--dataset", "uci-boston", "--split", "0", "--hidden", "50", "--lr", "0.01", "--batch-size", "128",
        "--num-samples", "1000", "--compile", "trace", "--no-progress"]

SIZES = {"uci-boston": 455, "uci-concrete": 927, "uci-energy": 691, "uci-wine": 1439, "uci-yacht": 277}
"""Training rows of each data set's splits (90 % of its rows)."""

GRID_POINTS = {"mcdropout": 12, "bbb": 3, "variational-dense": 3, "vd-additive": 3, "ibnn-4": 3, "ensemble-5": 3,
               "laplace": 3}
"""Grid points of ``--grid protocol`` per method: 4 dropout rates x 3 taus for MC dropout, the 3 taus otherwise."""

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


def fit_cost(method: str, compile, epochs: int) -> tuple[float, float]:
    """``fit`` on a Boston grid point (the 80 % of split 0) at the method's settings: microseconds per step once
    running (the median epoch), and the seconds the first epoch takes beyond that (a traced step's recordings)."""
    cfg = _parse(expand_method(["train", *BASE, "--method", method, "--epochs", str(epochs), "--out", "unused"]))
    held = load_data(cfg, validation=True)
    pyro.set_rng_seed(0)
    model, guide = build(cfg, held)
    history = fit(model, guide, held.x_train, held.y_train, **{**fit_options(cfg), "compile": compile},
                  device="cpu", progress=False)
    seconds = [record["seconds"] for record in history.epochs]
    epoch = statistics.median(seconds[1:])
    return 1e6 * epoch / math.ceil(len(held.x_train) / 128), max(0.0, seconds[0] - epoch)


def study_minutes(us_per_step: dict, setup_s: dict, cell_overhead_s: float, epochs: int, splits: int, methods,
                  workers: int) -> float:
    """Wall minutes of a study of ``methods`` on the five shared data sets and ``splits`` splits, every step (grid
    points and final fits) at ``us_per_step`` and every training paying ``setup_s`` once (by method; others at
    BBB's rates)."""
    seconds = 0.0
    for method in methods:
        rate, setup = us_per_step.get(method, us_per_step["bbb"]) * 1e-6, setup_s.get(method, setup_s["bbb"])
        trainings = GRID_POINTS[method] + FINAL_FITS.get(method, 1)
        for rows in SIZES.values():
            n = steps(rows, epochs, points=GRID_POINTS[method], fits=FINAL_FITS.get(method, 1))
            seconds += splits * (n * rate + trainings * setup + cell_overhead_s)
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
    per_fit = {method: {mode: fit_cost(method, compile, fit_epochs)
                        for mode, compile in (("eager", False), ("trace", TRACE))} for method in ("mcdropout", "bbb")}
    rates = {mode: {method: per_fit[method][mode][0] for method in per_fit} for mode in ("eager", "trace")}
    setups = {mode: {method: per_fit[method][mode][1] for method in per_fit} for mode in ("eager", "trace")}
    boston_steps = steps(455, args.epochs)
    cell_steps = steps(455, args.epochs, points=GRID_POINTS["mcdropout"])
    trainings = GRID_POINTS["mcdropout"] + 1
    overhead = max(0.0, runs["mcdropout_grid"]["wall_s"] - cell_steps * rates["trace"]["mcdropout"] * 1e-6
                   - trainings * setups["trace"]["mcdropout"])
    quick = study_minutes(rates["trace"], setups["trace"], overhead, args.epochs, 5, ("mcdropout", "bbb"),
                          args.workers)
    quick_eager = study_minutes(rates["eager"], setups["eager"], overhead, args.epochs, 5, ("mcdropout", "bbb"),
                                args.workers)
    full = study_minutes(rates["trace"], setups["trace"], overhead, args.epochs, 20, tuple(GRID_POINTS),
                         args.workers)
    for name, run in runs.items():
        print(f"{name:15s} wall {run['wall_s']:6.1f} s (grid {run['grid_s']:5.1f} s)  {run['us_per_step']:6.0f} us/step"
              f"  rmse {run['rmse']:.3f}  ll {run['log_likelihood']:.3f}  {run['chosen'] or ''}")
    for method, cost in per_fit.items():
        print(f"fit on a grid point ({method:9s}): eager {cost['eager'][0]:6.0f} us/step, trace {cost['trace'][0]:6.0f}"
              f" us/step ({cost['eager'][0] / cost['trace'][0]:.2f}x); first epoch beyond that: eager "
              f"{cost['eager'][1]:.2f} s, trace {cost['trace'][1]:.2f} s (recording)")
    print(f"plain torch step {floor:.0f} us; steps of one Boston cell: {boston_steps} without the grid, "
          f"{steps(455, args.epochs, points=12)} with it; per-cell time outside the steps {overhead:.1f} s")
    print(f"estimated on {args.workers} workers: quick study (5 splits, mcdropout + bbb) {quick:.1f} min "
          f"(every step eager: {quick_eager:.1f} min), full study (20 splits, {len(GRID_POINTS)} methods) "
          f"{full:.0f} min")
    print(json.dumps({"epochs": args.epochs, "threads": args.threads, "runs": runs, "torch_step_us": floor,
                      "fit_us_per_step": per_fit, "cell_overhead_s": overhead, "quick_study_min": quick,
                      "quick_study_eager_min": quick_eager, "full_study_min": full, "workers": args.workers}))


if __name__ == "__main__":
    main()
