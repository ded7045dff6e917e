"""Sparse variational networks on MNIST / Fashion-MNIST: the VariationalMLP.jl thesis's experiments in Pyro.

LeNet-300-100 trained three ways, as in chapter 4 of the VariationalMLP.jl thesis (variational
dropout and variational dense layers for MLPs):

- ``dense``: variational dense (Graves 2011): diagonal Normal with log-variance
  parameterisation, Gaussian N(0, 1) prior, pruned by signal-to-noise |mu|/sigma < 0.83;
- ``additive``: sparse variational dropout (Molchanov, Ashukha & Vetrov 2017), log-uniform prior,
  pruned by log alpha > 3;
- ``multiplicative``: variational dropout (Kingma, Salimans & Welling 2015): w = theta (1 + sqrt(alpha) eps) with
  log alpha learned per weight, log-uniform prior, pruned by log alpha > 3. Kingma's alpha <= 1
  (the guide's default) can never reach log alpha = 3, so here alpha is bounded by
  ``--max-log-alpha`` (default 8, as the additive guide's clip) and the KL uses Molchanov's
  approximation, valid for every alpha: the multiplicative against the additive
  parameterisation of the same posterior, as compared in the thesis (Fig. 4.9).

Two pre-training strategies: ``frequentist`` (a deterministic network trained for
half the epochs, then the posterior means start from its weights with tiny
variances and the KL is annealed in linearly) and ``warmup`` (Bayesian from the
start, KL off for the first quarter of the epochs, then annealed). Training uses
local reparameterization (Kingma, Salimans & Welling 2015) and records the sparsity of the
guide's principled rule after every epoch (in each cell's ``metrics.json``). The three methods are the study
``studies/sparse_vd_mnist.toml`` (cells cached in ``--out``; the pre-training is a study of its own in
``--out/pretrain``). For each method it reports test accuracy, accuracy after
principled pruning and after random pruning at the same per-layer sparsity, the
per-layer sparsity, and test error against the number of Monte-Carlo samples T
(mean and std over repeats).

    python examples/sparse_vd_mnist.py --dataset mnist --method all --pretrain frequentist --epochs 40

The last line is one JSON object: per method ``{"accuracy", "pruned_accuracy",
"random_pruned_accuracy", "sparsity", "layer_sparsity", "error_vs_T"}``, ``layer_sparsity``
a dict ``{site: fraction removed}``.
"""

from __future__ import annotations

import argparse
import copy
import json

import pyro
import torch
from method_study import STUDIES, add_study_options, given, run_methods
from rich.console import Console
from rich.table import Table

from pyrobnn.analysis.evaluate import evaluate
from pyrobnn.analysis.prune import apply_masks, principled_masks, random_masks, sparsity
from pyrobnn.studies import Study, load_study

METHODS = ("dense", "additive", "multiplicative")
T_VALUES = (1, 2, 5, 10, 20, 50)


def pretrain(base: list, args) -> str:
    """Frequentist pre-training: a deterministic LeNet-300-100 for half the epochs (a study of one cell in
    ``--out/pretrain``); returns its checkpoint, where the posterior means of every method start."""
    file = load_study(STUDIES / "sparse_vd_mnist.toml")
    study = Study(base=[*file.base, *base, "--bayesian", "none", "--epochs", args.epochs // 2, "--num-samples", 1],
                  name="pretrain")
    record, = study.run(args.out / "pretrain", workers=args.workers, force=args.force, progress=False)
    if record["status"] != "done":
        raise SystemExit(f"frequentist pre-training failed: {record['error']}")
    print(f"frequentist pre-training: {args.epochs // 2} epochs, test accuracy {record['metrics']['accuracy']:.4f}",
          flush=True)
    return str(args.out / "pretrain" / "cells" / record["key"] / "checkpoint.pt")


def report(accuracy: float, model, guide, data, args) -> dict:
    """Accuracy, pruned accuracies, sparsity and error vs T of one trained method."""
    x, y = data.x_test, data.y_test
    masks = principled_masks(guide)
    removed = sparsity(masks)
    errors = {}
    for t in T_VALUES:
        runs = []
        for repeat in range(args.repeats):
            pyro.set_rng_seed(args.seed + repeat)
            runs.append(1.0 - evaluate(model, guide, x, y, num_samples=t)["accuracy"])
        errors[t] = (float(torch.tensor(runs).mean()), float(torch.tensor(runs).std()) if len(runs) > 1 else 0.0)
    random_guide = copy.deepcopy(guide)
    apply_masks(random_guide, random_masks(masks, seed=args.seed))
    pyro.set_rng_seed(args.seed)
    random_accuracy = evaluate(model, random_guide, x, y, num_samples=args.samples)["accuracy"]
    apply_masks(guide, masks)
    pyro.set_rng_seed(args.seed)
    pruned_accuracy = evaluate(model, guide, x, y, num_samples=args.samples)["accuracy"]
    total = removed.pop("total")
    return {"accuracy": accuracy, "pruned_accuracy": pruned_accuracy, "random_pruned_accuracy": random_accuracy,
            "sparsity": total, "layer_sparsity": removed,
            "error_vs_T": {str(t): {"mean": m, "std": s} for t, (m, s) in errors.items()}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="mnist", choices=["mnist", "fashion-mnist"])
    parser.add_argument("--method", default="all", choices=[*METHODS, "all"])
    parser.add_argument("--pretrain", default="frequentist", choices=["frequentist", "warmup"])
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--max-log-alpha", type=float, default=8.0,
                        help="multiplicative: bound on log alpha (0 is Kingma's alpha <= 1 with his KL approximation)")
    parser.add_argument("--samples", type=int, default=20, help="MC samples for the accuracy figures")
    parser.add_argument("--repeats", type=int, default=5, help="repeats of the error-vs-T measurement")
    parser.add_argument("--train-size", type=int, default=None)
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto")
    add_study_options(parser, "sparse_vd_mnist")
    args = parser.parse_args()
    if args.epochs < 2:
        parser.error("--epochs must be at least 2 (pre-training and Bayesian phases)")

    base = [*given(args, "dataset", "lr", "train_size", "data_root", "seed", "device"), "--num-samples", args.samples]
    if args.pretrain == "frequentist":  # KL annealed in over the Bayesian epochs
        bayesian = args.epochs - args.epochs // 2
        schedule = ["--init-from", pretrain(base, args), "--epochs", bayesian, "--beta.warmup", 0,
                    "--beta.anneal", max(1, bayesian // 2)]
    else:  # Bayesian warm-up: KL off, then annealed
        warmup = args.epochs // 4
        schedule = ["--epochs", args.epochs, "--beta.warmup", warmup, "--beta.anneal", max(1, warmup)]
    kingma = ["--guide.approximation", "kingma"] if args.max_log_alpha <= 0 else []
    cells = run_methods("sparse_vd_mnist", METHODS, args, None if args.method == "all" else [args.method],
                        [*base, *schedule], {"multiplicative": ["--guide.max-log-alpha", args.max_log_alpha, *kingma]})
    results = {}
    for cell in cells:
        _, data, model, guide = cell.restore(args.device)
        results[cell.method] = report(cell.report["test"]["accuracy"], model, guide, data, args)

    console = Console()
    table = Table(title=f"LeNet-300-100 on {args.dataset}, {args.epochs} epochs, {args.pretrain} pre-training "
                        "(test accuracy %: not pruned / principled / random at the same sparsity)")
    for column in ("method", "accuracy", "pruned", "random pruned", "sparsity %", "per layer %"):
        table.add_column(column, justify="right")
    for method, r in results.items():
        table.add_row(method, f"{100 * r['accuracy']:.2f}", f"{100 * r['pruned_accuracy']:.2f}",
                      f"{100 * r['random_pruned_accuracy']:.2f}", f"{100 * r['sparsity']:.1f}",
                      " / ".join(f"{100 * s:.0f}" for s in r["layer_sparsity"].values()))
    console.print(table)
    errors = Table(title=f"test error % vs number of MC samples T (mean ± std over {args.repeats} repeats)")
    errors.add_column("method")
    for t in T_VALUES:
        errors.add_column(f"T={t}", justify="right")
    for method, r in results.items():
        cells = (r["error_vs_T"][str(t)] for t in T_VALUES)
        errors.add_row(method, *(f"{100 * e['mean']:.2f} ± {100 * e['std']:.2f}" for e in cells))
    console.print(errors)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
