"""y = x³ depth study: mean-field VI (Bayes by Backprop) collapses with depth, the implicit BNN does not.

Trinh, Kaski & Heinonen (2020), "Scalable Bayesian neural networks by layer-wise input augmentation",
Fig. 1 (SPEC section 6): 30 training points x ~ U[-4, 4], y = x³ + N(0, 3²) (``pyrobnn.data.cubic``), a ReLU
MLP with 256 units in each of 1 to 5 hidden layers, fitted by

- ``bbb``: every weight and bias Bayesian, prior N(0, 1), diagonal Normal posterior (``NormalGuide``,
  σ0 = softplus(-5)), local reparameterization;
- ``ibnn``: the weights are point estimates and every Linear layer's inputs are multiplied by node latents
  z ~ N(1, s²) (``NodePrior(s)``, mode "in"), with the K-component mixture posterior (``MixtureNodeGuide``,
  the paper's mixture-mean KL); the K particles of a step cover the K components (row b of particle s uses
  component (b + s) mod K), so each training point is fitted by every component in one pass.

Both on the same standardised data (x' = (x - m_x)/s_x, y' = (y - m_y)/s_y), with the Gaussian likelihood of
the true noise, 3/s_y in those units, full batch, Adam (``--lr``) for ``--steps`` steps, the KL weight rising
linearly from 0 to 1 over the first two thirds (as the paper). Test: a grid of ``--test-points`` x in [-6, 6]
with y = x³ + N(0, 3²); in range |x| <= 4 (``test_ll``), out of range 4 < |x| <= 6 (``ll_out_of_range``).
The log-likelihood is that of the Monte-Carlo predictive, log (1/S) Σ_s N(y; f_s(x), 3²) per point in the
original units, averaged over the points (S = ``--samples``, a multiple of K). Writes one PNG per method and
depth (predictive mean and 95 % band of mean ± 1.96 std, noise included) and all panels in ``ibnn_cubic.png``;
prints a table, and as the last line one JSON object ``{"depth_<L>": {"bbb": {"test_ll", "ll_out_of_range"},
"ibnn": {...}}}``.

    python examples/ibnn_cubic.py                    # depths 1-5, about 3-5 min on 2 shared CPU cores
    python examples/ibnn_cubic.py --depths 1 5 --steps 500
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import pyro
import torch
from rich.console import Console
from rich.table import Table

from pyrobnn import BayesianNetwork, Gaussian, GaussianPrior, NormalGuide
from pyrobnn.data import cubic
from pyrobnn.guides.mixture_node import MixtureNodeGuide
from pyrobnn.infer.elbo import MeanFieldELBO
from pyrobnn.infer.optim import Optim
from pyrobnn.infer.predict import predictive_outputs
from pyrobnn.infer.schedules import LinearWarmup
from pyrobnn.infer.svi import fit
from pyrobnn.model.priors import NodePrior
from pyrobnn.networks import MLP

METHODS = ("bbb", "ibnn")
NOISE = 3.0
Z95 = 1.959964
console = Console(width=120)


def make_data(args):
    d = cubic(n_train=30, n_test=args.test_points, seed=args.seed)
    mx, sx = d.x_train.mean(), d.x_train.std()
    my, sy = d.y_train.mean(), d.y_train.std()
    return {"x": (d.x_train - mx) / sx, "y": (d.y_train - my) / sy, "x_test": (d.x_test - mx) / sx,
            "y_test": d.y_test, "x_raw": d.x_train, "y_raw": d.y_train, "grid_raw": d.x_test,
            "y_shift": float(my), "y_scale": float(sy)}


def build(method: str, depth: int, data, args):
    net = MLP(1, [args.width] * depth, 1)
    likelihood = Gaussian(NOISE / data["y_scale"])
    if method == "bbb":
        model = BayesianNetwork(net, likelihood, prior=GaussianPrior(0.0, 1.0), num_data=30)
        return model, NormalGuide(model, init_rho=-5.0, name=f"bbb{depth}"), 1
    model = BayesianNetwork(net, likelihood, prior=NodePrior(args.node_scale), num_data=30)
    guide = MixtureNodeGuide(model, num_components=args.components, init_scale=args.init_scale, name=f"ibnn{depth}")
    return model, guide, args.components


def evaluate_run(model, guide, data, args):
    """Test log-likelihood in and out of range (original units) and the predictive mean/std on the grid."""
    outputs = predictive_outputs(model, guide, data["x_test"], num_samples=args.samples)  # (S, N, 1)
    means = outputs[..., 0] * data["y_scale"] + data["y_shift"]
    log_p = torch.distributions.Normal(means, NOISE).log_prob(data["y_test"][:, 0])
    ll = log_p.logsumexp(0) - math.log(args.samples)
    inside = data["grid_raw"][:, 0].abs() <= 4
    summary = model.likelihood.predictive(outputs)
    band = {"mean": summary["mean"][:, 0] * data["y_scale"] + data["y_shift"],
            "std": summary["std"][:, 0] * data["y_scale"]}
    return {"test_ll": ll[inside].mean().item(), "ll_out_of_range": ll[~inside].mean().item()}, band


def train_one(method: str, depth: int, data, args):
    pyro.clear_param_store()
    pyro.set_rng_seed(args.seed)
    model, guide, particles = build(method, depth, data, args)
    tick = time.perf_counter()
    history = fit(model, guide, data["x"], data["y"], epochs=args.steps, batch_size=30, optimizer=Optim(lr=args.lr),
                  beta=LinearWarmup(0, 2 * args.steps // 3),
                  elbo=MeanFieldELBO(particles, vectorize_particles=True, estimator="local"), seed=args.seed,
                  progress=False)
    metrics, band = evaluate_run(model, guide, data, args)
    metrics["seconds"] = time.perf_counter() - tick
    metrics["kl"] = history.last["kl"]
    return metrics, band


def plot(panels: dict, data, path: Path, cols: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = math.ceil(len(panels) / cols)
    fig = plt.figure(figsize=(3.2 * cols, 2.8 * rows))
    axes = fig.subplots(rows, cols, sharex=True, sharey=True, squeeze=False).reshape(-1)
    x = data["grid_raw"][:, 0].numpy()
    for ax, (title, band) in zip(axes, panels.items()):
        mean, std = band["mean"].numpy(), band["std"].numpy()
        ax.fill_between(x, mean - Z95 * std, mean + Z95 * std, alpha=0.3, label="95 % band")
        ax.plot(x, mean, label="predictive mean")
        ax.plot(x, x**3, "k--", linewidth=0.8, label="y = x³")
        ax.scatter(data["x_raw"][:, 0].numpy(), data["y_raw"][:, 0].numpy(), s=8, c="r", zorder=3, label="train")
        ax.axvspan(-6, -4, color="0.9", zorder=0)
        ax.axvspan(4, 6, color="0.9", zorder=0)
        ax.set_ylim(-300, 300)
        ax.set_title(title, fontsize=9)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    axes[0].legend(loc="upper left", fontsize=6)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--depths", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--steps", type=int, default=1000, help="full-batch Adam steps per method and depth")
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--components", type=int, default=8, help="K of the iBNN's mixture posterior")
    parser.add_argument("--node-scale", type=float, default=0.5, help="s of the node prior N(1, s²)")
    parser.add_argument("--init-scale", type=float, default=0.5, help="spread σ0 of the initial component means")
    parser.add_argument("--samples", type=int, default=200, help="predictive draws (a multiple of --components)")
    parser.add_argument("--test-points", type=int, default=1200, help="test grid over x in [-6, 6]")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("outputs/ibnn_cubic"))
    args = parser.parse_args()
    if args.samples % args.components:
        parser.error(f"--samples ({args.samples}) must be a multiple of --components ({args.components})")
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    data = make_data(args)

    results, panels = {}, {}
    for depth in args.depths:
        results[f"depth_{depth}"] = {}
        for method in METHODS:
            metrics, band = train_one(method, depth, data, args)
            results[f"depth_{depth}"][method] = metrics
            title = f"{method}, {depth} x {args.width}"
            panels[title] = band
            plot({title: band}, data, args.out / f"cubic_{method}_depth{depth}.png", cols=1)
            console.print(f"depth {depth} {method}: test LL {metrics['test_ll']:.3f}, out of range "
                          f"{metrics['ll_out_of_range']:.3f} ({metrics['seconds']:.1f} s)")
    ordered = {t: panels[t] for m in METHODS for t in panels if t.startswith(m)}
    plot(ordered, data, args.out / "ibnn_cubic.png", cols=len(args.depths))

    table = Table(title=f"y = x³, 30 points: test log-likelihood per point (nats, original units; noise-only "
                        f"optimum {-0.5 * math.log(2 * math.pi * NOISE**2) - 0.5:.3f})")
    for column in ("hidden layers", "BBB in range", "iBNN in range", "BBB out of range", "iBNN out of range",
                   "BBB s", "iBNN s"):
        table.add_column(column, justify="right")
    for depth in args.depths:
        r = results[f"depth_{depth}"]
        table.add_row(str(depth), *(f"{r[m]['test_ll']:.3f}" for m in METHODS),
                      *(f"{r[m]['ll_out_of_range']:.3f}" for m in METHODS),
                      *(f"{r[m]['seconds']:.0f}" for m in METHODS))
    console.print(table)
    deepest = f"depth_{max(args.depths)}"
    better = results[deepest]["ibnn"]["test_ll"] > results[deepest]["bbb"]["test_ll"]
    console.print(f"at depth {max(args.depths)} the iBNN's test log-likelihood "
                  f"{'beats' if better else 'does NOT beat'} BBB's; wrote {args.out}/ibnn_cubic.png and one PNG per "
                  f"method and depth; total "
                  f"{time.perf_counter() - start:.0f} s")
    print(json.dumps({depth: {m: {k: round(r[m][k], 4) for k in ("test_ll", "ll_out_of_range")} for m in METHODS}
                      for depth, r in results.items()}))


if __name__ == "__main__":
    main()
