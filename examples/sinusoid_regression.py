"""Sinusoid regression with predictive bands: variational dense vs additive VD vs a deterministic MLP.

The toy problem of Blundell et al. (2015), as set in eq. (4.1) of the VariationalMLP.jl thesis
(variational dropout and variational dense layers for MLPs): y = x + 0.3 sin(2π(x+ε)) +
0.3 sin(4π(x+ε)) + ε, ε ~ N(0, 0.02²), x ~ U[0, 0.5]; 40 training points, the
other 460 for testing. A 1-64-1 ReLU MLP with a homoscedastic Gaussian
likelihood (noise scale learned) is trained full-batch:

- ``dense``: variational dense (Graves 2011), Gaussian prior with sigma_p = 2 (as in the thesis);
- ``additive``: additive variational dropout (Molchanov, Ashukha & Vetrov 2017), log-uniform prior;
- ``deterministic``: the same MLP by maximum likelihood.

The Bayesian methods use the thesis's regression schedule, KL off for ``--warmup``
epochs then annealed linearly over ``--anneal`` epochs. Prints test MSE (and
NLL) per method, saves ``--plot`` (predictive mean and ±2 std bands on
x ∈ [-0.5, 1.0], training points marked) and prints one JSON line last. The methods are the study
``studies/sinusoid_regression.toml``, whose cells are cached in ``--out``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pyro
import torch
from method_study import add_study_options, given, run_methods
from rich.console import Console

from pyrobnn.infer.predict import predict

METHODS = ("dense", "additive", "deterministic")
GRID = torch.linspace(-0.5, 1.0, 301).unsqueeze(-1)


def band_width(pred: dict, inside: torch.Tensor) -> tuple[float, float]:
    """Mean predictive std inside the training range and outside it."""
    std = pred["std"].squeeze(-1)
    return float(std[inside].mean()), float(std[~inside].mean())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3000, help="full-batch epochs (steps)")
    parser.add_argument("--warmup", type=int, default=150)
    parser.add_argument("--anneal", type=int, default=250)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", type=Path, default=Path("outputs/sinusoid.png"))
    add_study_options(parser, "sinusoid_regression")
    args = parser.parse_args()

    base = [*given(args, "epochs", "lr", "seed"), "--beta.warmup", args.warmup, "--beta.anneal", args.anneal,
            "--num-samples", args.samples]
    cells = run_methods("sinusoid_regression", METHODS, args, base=base)
    results, bands = {}, {}
    for cell in cells:
        method = cell.method
        cfg, data, model, guide = cell.restore("cpu")
        inside = (GRID[:, 0] >= data.x_train.min()) & (GRID[:, 0] <= data.x_train.max())
        pyro.set_rng_seed(args.seed)
        bands[method] = predict(model, guide, GRID, num_samples=cfg.output.num_samples)
        within, outside = band_width(bands[method], inside)
        test = cell.report["test"]
        results[method] = {"mse": test["rmse"] ** 2, "nll": test["nll"],
                           "noise_scale": float(model.likelihood.scale.detach()), "std_inside": within,
                           "std_outside": outside}
    plot(data, bands, args.plot)
    Console().print(f"wrote {args.plot}")
    print(json.dumps({k: {m: round(v, 6) for m, v in r.items()} for k, r in results.items()}))


def plot(data, bands: dict, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 4))
    FigureCanvasAgg(fig)
    x = GRID[:, 0].numpy()
    for ax, (method, pred) in zip(fig.subplots(1, len(bands), sharey=True), bands.items()):
        mean, std = pred["mean"][:, 0].numpy(), pred["std"][:, 0].numpy()
        ax.fill_between(x, mean - 2 * std, mean + 2 * std, alpha=0.3, label="±2 std")
        ax.plot(x, mean, label="predictive mean")
        ax.scatter(data.x_test[:, 0], data.y_test[:, 0], s=3, c="grey", label="test")
        ax.scatter(data.x_train[:, 0], data.y_train[:, 0], s=12, c="k", label="train (40)")
        ax.set_title(method)
        ax.set_ylim(-1.5, 2.0)
        ax.set_xlabel("x")
    fig.axes[0].legend(loc="upper left", fontsize=7)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
