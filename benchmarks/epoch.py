"""One training epoch as ``pyrobnn train`` runs it (data, augmentation, step, logging), per method and executor,
beside the plain-PyTorch floor of the same network and data, on any device.

For every method of ``--methods`` (a preset name of ``pyrobnn train --method``, with more options after it: ``"bbb
--num-particles 1"``) and every executor of ``--modes`` (``pyrobnn train --compile``: ``auto``, the default,
``none``, ``trace``, ``inductor``), the run's model, guide, objective, optimiser and augmentation are built as the
command builds them (:mod:`pyrobnn.cli`) and trained by :func:`~pyrobnn.infer.svi.fit` for ``--epochs`` epochs
(default 2): the first epoch records or compiles the step, the last is the figure (s/epoch), beside the first's
extra seconds. The floor is ``benchmarks/cifar10_floor.py`` (plain PyTorch, the same network, data and
augmentation) for as many epochs, its last epoch's time. Runs go one after another in this process.

    python benchmarks/epoch.py --dataset cifar10 --model lenet5-cifar --train-size 5000 \\
        --methods map "bbb --num-particles 1" bbb --modes auto none trace inductor [--device cuda]

The last line is one JSON object: per method and mode ``s_epoch`` and ``first_extra_s``, the executor ``auto``
chose and why, the floor's s/epoch, ratios to the floor and of ``auto`` to the fastest explicit mode.
"""

from __future__ import annotations

import argparse
import json
import shlex
import time

import pyro
import torch

from pyrobnn.cli import _parse
from pyrobnn.cli.build import build
from pyrobnn.cli.methods import expand_method
from pyrobnn.cli.runs import augmentation, fit_options, load_data
from pyrobnn.device import resolve_device
from pyrobnn.infer.svi import fit

MODES = ("auto", "none", "trace", "inductor")


def epoch_seconds(base: list[str], method: str, mode: str, epochs: int, device) -> dict:
    """``fit`` of one run configuration for ``epochs`` epochs: the last epoch's seconds, the first's extra seconds,
    and the executor that ran the steps."""
    argv = ["train", *base, "--method", *shlex.split(method), "--compile", mode, "--epochs", str(epochs),
            "--out", "unused", "--no-progress"]
    cfg = _parse(expand_method(argv))
    data = load_data(cfg)
    pyro.clear_param_store()
    pyro.set_rng_seed(cfg.optim.seed)
    model, guide = build(cfg, data)
    tick = time.perf_counter()
    history = fit(model, guide, data.x_train, data.y_train, **fit_options(cfg), transform=augmentation(cfg, data),
                  device=device, progress=False)
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = [record["seconds"] for record in history.epochs]
    return {"s_epoch": seconds[-1], "first_extra_s": max(0.0, seconds[0] - seconds[-1]), "executor": history.compile,
            "why": history.compile_reason, "wall_s": time.perf_counter() - tick, "loss": history.last["loss"]}


def floor_seconds(args, device) -> float:
    """The plain-PyTorch epoch of the same network and data (``benchmarks/cifar10_floor.py``): its last epoch."""
    from cifar10_floor import main as floor

    argv = ["--model", args.model, "--width", str(args.width), "--epochs", str(args.epochs), "--batch-size",
            str(args.batch_size), "--device", device.type, "--test-size", "1000"]
    if args.train_size:
        argv += ["--train-size", str(args.train_size)]
    if args.data_root:
        argv += ["--data-root", args.data_root]
    return floor(argv)["s_last_epoch"]


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="cifar10")
    parser.add_argument("--model", default="lenet5-cifar")
    parser.add_argument("--width", type=float, default=1.0)
    parser.add_argument("--train-size", type=int, default=5000)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--augment", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--methods", nargs="+", default=["map", "bbb --num-particles 1", "bbb"])
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--no-floor", action="store_true", help="skip the plain-PyTorch floor")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    base = ["--dataset", args.dataset, "--model", args.model, "--width", str(args.width), "--batch-size",
            str(args.batch_size), "--device", device.type, "--test-size", "100",
            *(["--train-size", str(args.train_size)] if args.train_size else []),
            *(["--augment"] if args.augment else []), *(["--data-root", args.data_root] if args.data_root else [])]
    result = {"dataset": args.dataset, "model": args.model, "width": args.width, "train_size": args.train_size,
              "batch_size": args.batch_size, "device": device.type, "threads": args.threads, "runs": {}}
    for method in args.methods:
        runs = result["runs"][method] = {mode: epoch_seconds(base, method, mode, args.epochs, device)
                                         for mode in args.modes}
        for mode, run in runs.items():
            print(f"{method:28s} {mode:9s} {run['s_epoch']:8.2f} s/epoch (+{run['first_extra_s']:.1f} s first; "
                  f"ran {run['executor']}: {run['why']})", flush=True)
        explicit = [run["s_epoch"] for mode, run in runs.items() if mode != "auto"]
        if "auto" in runs and explicit:
            runs["auto_vs_fastest"] = runs["auto"]["s_epoch"] / min(explicit)
        if "auto" in runs and "none" in runs:
            runs["auto_vs_eager"] = runs["auto"]["s_epoch"] / runs["none"]["s_epoch"]
    if not args.no_floor and args.dataset == "cifar10":
        result["floor_s_epoch"] = floor_seconds(args, device)
        for method, runs in result["runs"].items():
            for mode in args.modes:
                runs[mode]["vs_floor"] = runs[mode]["s_epoch"] / result["floor_s_epoch"]
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
