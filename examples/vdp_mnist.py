"""VDP++ on MNIST: LeNet-5 trained deterministically, by Bayes by Backprop and by moment propagation.

VDP++ is the variance-only density propagation of "Efficient Scaling of Bayesian Neural Networks"
(IEEE Access 2024); Bayes by Backprop is weight sampling (Blundell et al. 2015).

The same LeNet-5 (``pyrobnn.networks.LeNet5``), the same Gaussian prior N(0, 0.1^2) and the same
diagonal Normal guide train by weight sampling (BBB) and, under the ``vdp`` handler, by
variance-only moment propagation (VDP++); a deterministic LeNet-5 is the baseline. Then the
three analyses of the VDP++ paper:

- noise robustness (Fig. 1c, Fig. 3): test accuracy and the normalised output variance of the
  predicted class under Gaussian noise at SNR -6 ... 30 dB;
- self-compression (Fig. 2): accuracy after global L1 pruning of the (posterior mean) weights;
- cost (Fig. 1a-b): ms per step, s per epoch and peak memory at batch 512 against the
  deterministic net and BBB (``pyrobnn.analysis.cost``);

and a small ViT (``pyrobnn.networks.ViT``: multi-head self-attention, LayerNorm, GELU) trained by
VDP++ on a subset, to show the transformer rules learn (the VDP++ paper's VDP-ViT on MNIST).

    python examples/vdp_mnist.py --epochs 5

The three methods are the study ``studies/vdp_mnist.toml``, whose cells are cached in ``--out``.
Saves ``snr.png`` and ``pruning.png`` in ``--out`` and prints, last, one JSON line
``{"det": {"accuracy", "accuracy_snr_-6db", "accuracy_pruned_90"}, "bbb": {...}, "vdp": {...},
"vdp_time_ratio", "vdp_memory_ratio", ...}``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pyro
from method_study import add_study_options, given, run_methods
from rich.console import Console
from rich.table import Table

from pyrobnn import BayesianNetwork, Categorical, GaussianPrior, NormalGuide
from pyrobnn.analysis.cost import compare_training_cost, cost_table
from pyrobnn.analysis.evaluate import evaluate
from pyrobnn.analysis.prune import pruning_curve
from pyrobnn.analysis.robustness import deterministic_predictor, moment_predictor, noise_robustness, sampling_predictor
from pyrobnn.device import resolve_device
from pyrobnn.infer.elbo import MeanFieldELBO
from pyrobnn.infer.optim import Optim
from pyrobnn.infer.schedules import Constant
from pyrobnn.infer.svi import fit
from pyrobnn.networks import LeNet5, ViT

METHODS = ("det", "bbb", "vdp")
COLORS = {"det": "C0", "bbb": "C1", "vdp": "C2"}
SNR_DB = (-6, -3, 0, 3, 6, 10, 20, 30)
FRACTIONS = (0.0, 0.5, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99)


def train_vit(data, args) -> dict[str, float]:
    """The small ViT (attention, LayerNorm, GELU, positional embedding) trained by VDP++ on a subset."""
    pyro.set_rng_seed(args.seed)
    n = min(args.vit_train_size, len(data.x_train))
    model = BayesianNetwork(ViT(), Categorical(vdp_objective=args.objective),
                            prior=GaussianPrior(0.0, args.prior_scale))
    guide = NormalGuide(model, init_rho=args.init_rho, share=args.share, name="vit")
    history = fit(model, guide, data.x_train[:n], data.y_train[:n], epochs=args.vit_epochs,
                  batch_size=args.batch_size, optimizer=Optim(lr=1e-3), beta=Constant(args.beta),
                  elbo=MeanFieldELBO(estimator="vdp"), seed=args.seed,
                  device=args.device, progress=not args.no_progress,
                  on_epoch_end=lambda epoch, r: print(f"vit epoch {epoch + 1}: nll {r['nll']:.4g} {r['seconds']:.1f}s",
                                                      flush=True))
    metrics = evaluate(model, guide, data.x_test, data.y_test, moments=True)
    return {"accuracy": metrics["accuracy"], "nll": metrics["nll"], "train_size": n, "epochs": args.vit_epochs,
            "first_epoch_nll": history["nll"][0], "last_epoch_nll": history["nll"][-1]}


def accuracy_of(method: str, model, x, y, samples: int):
    """``evaluate_fn`` for the pruning curve: accuracy of a (pruned) guide, or of a (pruned) plain network."""

    def accuracy(pruned):
        if method == "det":
            probs, _ = deterministic_predictor(pruned)(x)
            return float((probs.argmax(-1).cpu() == y).float().mean())
        return evaluate(model, pruned, x, y, num_samples=samples, moments=method == "vdp")["accuracy"]

    return accuracy


def predictor_of(method: str, model, guide, samples: int):
    if method == "det":
        return deterministic_predictor(model.net)
    if method == "bbb":
        return sampling_predictor(model, guide, num_samples=samples)
    return moment_predictor(model, guide)


def plot(results: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_acc, ax_var) = plt.subplots(1, 2, figsize=(10, 4))
    for method, r in results.items():
        snr = [row["snr_db"] for row in r["snr"]]
        ax_acc.plot(snr, [row["accuracy"] for row in r["snr"]], "o-", color=COLORS[method], label=method)
        if r["snr"][0]["normalized_variance"] is not None:
            ax_var.plot(snr, [row["normalized_variance"] for row in r["snr"]], "o-", color=COLORS[method], label=method)
    ax_acc.set(xlabel="SNR (dB)", ylabel="test accuracy", title="accuracy under input noise")
    ax_var.set(xlabel="SNR (dB)", ylabel="variance of the predicted class / at -6 dB",
               title="normalised output variance")
    for ax in (ax_acc, ax_var):
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "snr.png", dpi=120)
    fig, ax = plt.subplots(figsize=(5, 4))
    for method, r in results.items():
        ax.plot([row["sparsity"] for row in r["pruning"]], [row["accuracy"] for row in r["pruning"]], "o-",
                color=COLORS[method], label=method)
    ax.set(xlabel="fraction of weights pruned (global L1 of the means)", ylabel="test accuracy",
           title="self-compression")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "pruning.png", dpi=120)
    plt.close("all")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--prior-scale", type=float, default=0.1,
                        help="Gaussian prior N(0, s^2) of every weight (the KL's pull is what compresses)")
    parser.add_argument("--beta", type=float, default=1.0, help="constant KL weight")
    parser.add_argument("--init-rho", type=float, default=-3.0, help="initial rho: sigma0 = softplus(rho)")
    parser.add_argument("--share", default="weight", choices=["weight", "row"],
                        help="VDP++ variances: one per weight, or one per output unit (eq. 12)")
    parser.add_argument("--objective", default="cross_entropy", choices=["cross_entropy", "gaussian"],
                        help="VDP++ likelihood: cross-entropy on the mean, or eq. 11 (Gaussian NLL with the variance)")
    parser.add_argument("--samples", type=int, default=10, help="posterior samples for BBB predictions")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--train-size", type=int, default=None)
    parser.add_argument("--test-size", type=int, default=None)
    parser.add_argument("--no-cost", action="store_true", help="skip the cost measurement")
    parser.add_argument("--vit-epochs", type=int, default=3, help="epochs of the small ViT trained by VDP++ (0: skip)")
    parser.add_argument("--vit-train-size", type=int, default=10000, help="training images of the ViT run")
    parser.add_argument("--data-root", default=None, help="data directory (else $PYROBNN_DATA)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--no-progress", action="store_true")
    add_study_options(parser, "vdp_mnist")
    args = parser.parse_args()

    base = [*given(args, "epochs", "batch_size", "lr", "seed", "device", "train_size", "test_size", "data_root"),
            "--prior.scale", args.prior_scale, "--beta.value", args.beta, "--guide.init-rho", args.init_rho,
            "--num-samples", args.samples, "--likelihood.vdp-objective", args.objective.replace("_", "-")]
    runs = run_methods("vdp_mnist", METHODS, args, args.methods, base, {"vdp": ["--guide.share", args.share]},
                       progress=not args.no_progress)
    console = Console()
    results = {}
    for cell in runs:
        method = cell.method
        _, data, model, guide = cell.restore(args.device)
        accuracy = accuracy_of(method, model, data.x_test, data.y_test, args.samples)
        trained = model.net if method == "det" else guide
        r = {"accuracy": cell.report["test"]["accuracy"]}
        r["snr"] = noise_robustness(predictor_of(method, model, guide, args.samples), data.x_test, data.y_test,
                                    SNR_DB, seed=args.seed)
        r["pruning"] = pruning_curve(accuracy, trained, FRACTIONS)
        results[method] = r

    table = Table(title="accuracy (normalised variance of the predicted class) vs SNR")
    table.add_column("SNR dB", justify="right")
    for method in results:
        table.add_column(method, justify="right")
    for i, level in enumerate(SNR_DB):
        cells = []
        for r in results.values():
            row = r["snr"][i]
            var = "" if row["normalized_variance"] is None else f" ({row['normalized_variance']:.3f})"
            cells.append(f"{row['accuracy']:.4f}{var}")
        table.add_row(str(level), *cells)
    console.print(table)
    table = Table(title="self-compression: accuracy after global L1 pruning")
    table.add_column("pruned", justify="right")
    for method in results:
        table.add_column(method, justify="right")
    for i, fraction in enumerate(FRACTIONS):
        table.add_row(f"{fraction:.2f}", *(f"{r['pruning'][i]['accuracy']:.4f}" for r in results.values()))
    console.print(table)

    summary = {method: {"accuracy": r["accuracy"], "accuracy_snr_-6db": r["snr"][0]["accuracy"],
                        "accuracy_pruned_90": r["pruning"][FRACTIONS.index(0.9)]["accuracy"],
                        "normalized_variance": [row["normalized_variance"] for row in r["snr"]]}
               for method, r in results.items()}
    if not args.no_cost:
        labels = {"det": ("det", "weight"), "bbb": ("sample", "weight"), "vdp": ("vdp", args.share)}
        cost = compare_training_cost(LeNet5(1, 10), (1, 28, 28), 10, labels, batch_size=512,
                                     device=resolve_device(args.device))
        console.print(cost_table("cost: LeNet-5, batch 512", cost))
        summary["vdp_time_ratio"] = cost["vdp"]["time_ratio"]
        summary["vdp_memory_ratio"] = cost["vdp"]["memory_ratio"]
        summary["cost"] = cost
    if args.vit_epochs > 0:
        summary["vit"] = train_vit(data, args)
        console.print(f"ViT by VDP++: accuracy {summary['vit']['accuracy']:.4f} after {args.vit_epochs} epochs "
                      f"on {summary['vit']['train_size']} images")
    args.out.mkdir(parents=True, exist_ok=True)
    plot(results, args.out)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
