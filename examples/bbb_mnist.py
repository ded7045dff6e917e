"""Bayes by Backprop (Blundell et al. 2015) on MNIST against dropout and vanilla networks.

The protocol of Blundell et al. (2015) as reproduced in PyTorch by Rahmanto ("Reproducing 'Weight
Uncertainty in Neural Networks' with PyTorch"): a 784-h-10 ReLU MLP,
pixels in [0, 1], Adam 1e-3 halved every 100 epochs, batch 128. BBB uses the
scale-mixture prior (pi = 0.25, sigma1 = 1, sigma2 = e^-8), a diagonal Normal
posterior with sigma = softplus(rho), 5 posterior samples per minibatch and
Blundell's geometric per-minibatch KL weights. The dropout (p = 0.5) and
vanilla networks are trained by the same loop as maximum-likelihood models.

    python examples/bbb_mnist.py --hidden 400 --epochs 20

Prints a results table and, as its last line, one JSON object
``{"bbb": {"test_acc": ...}, "dropout": {...}, "vanilla": {...}}``.
"""

from __future__ import annotations

import argparse
import json

import pyro
import torch
from rich.console import Console
from rich.table import Table

from pyrobnn import BayesianNetwork, NormalGuide, ScaleMixturePrior
from pyrobnn.analysis.evaluate import evaluate
from pyrobnn.data import load_dataset
from pyrobnn.handlers import ESTIMATORS
from pyrobnn.infer.optim import Optim, StepDecay
from pyrobnn.infer.schedules import Constant, Geometric
from pyrobnn.infer.svi import fit
from pyrobnn.networks import MLP

METHODS = ("bbb", "dropout", "vanilla")


def run(method: str, data, args) -> dict[str, float]:
    """Train one method and return its test metrics."""
    bayesian = method == "bbb"
    pyro.set_rng_seed(args.seed)  # every method starts from the same initial network
    net = MLP(784, (args.hidden,), 10, dropout=0.5 if method == "dropout" else 0.0)
    model = BayesianNetwork(net, prior=ScaleMixturePrior(0.25, 1.0, torch.e**-8), deterministic=not bayesian)
    guide = NormalGuide(model, init_rho=args.init_rho, name=method)
    history = fit(
        model, guide, data.x_train, data.y_train,
        epochs=args.epochs, batch_size=128, optimizer=Optim(lr=1e-3, schedule=StepDecay(100, 0.5)),
        beta=Geometric() if bayesian else Constant(1.0), num_particles=args.particles if bayesian else 1,
        estimator=args.estimator if bayesian else "sample",
        seed=args.seed, device=args.device, progress=not args.no_progress,
        on_epoch_end=lambda epoch, r: print(f"{method} epoch {epoch + 1}: loss {r['loss']:.4g} "
                                            f"nll {r['nll']:.4g} (per example) kl {r['kl']:.4g} nats "
                                            f"{r['seconds']:.1f}s", flush=True),
    )
    metrics = evaluate(model, guide, data.x_test, data.y_test, num_samples=args.samples if bayesian else 1)
    seconds = sum(history["seconds"])
    return {"test_acc" if k == "accuracy" else k: v for k, v in metrics.items()} | {"train_seconds": seconds}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=400, help="hidden width h of the 784-h-10 MLP")
    parser.add_argument("--particles", type=int, default=5, help="posterior samples per minibatch (BBB)")
    parser.add_argument("--estimator", default="sample",
                        choices=[name for name, handler in ESTIMATORS.items() if handler.stochastic],
                        help="BBB gradient estimator (sampling ones of pyrobnn.handlers.ESTIMATORS): weight sampling "
                             "(Blundell et al. 2015), local reparameterization (Kingma, Salimans & Welling 2015), "
                             "flipout (Wen et al. 2018)")
    parser.add_argument("--samples", type=int, default=100, help="posterior samples for test predictions")
    parser.add_argument("--init-rho", type=float, default=-5.0, help="initial rho: sigma0 = softplus(rho)")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--train-size", type=int, default=None, help="subset of the 60k training images")
    parser.add_argument("--data-root", default=None, help="data directory (else $PYROBNN_DATA)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args()

    data = load_dataset("mnist", args.data_root, train_size=args.train_size, seed=args.seed)
    results = {}
    for method in args.methods:
        results[method] = run(method, data, args)
        Console().print(f"{method}: " + ", ".join(f"{k} {v:.4f}" for k, v in results[method].items()))

    table = Table(title=f"MNIST 784-{args.hidden}-10, {args.epochs} epochs (Rahmanto's reproduction of "
                        "Blundell et al. 2015, 300 epochs: BBB 98.07 / dropout 98.43 / vanilla 98.09 % at h = 400)")
    for column in ("method", "test acc %", "NLL", "ECE", "Brier", "train s"):
        table.add_column(column, justify="right")
    for method, m in results.items():
        table.add_row(method, f"{100 * m['test_acc']:.2f}", f"{m['nll']:.4f}", f"{m['ece']:.4f}",
                      f"{m['brier']:.4f}", f"{m['train_seconds']:.0f}")
    Console().print(table)
    print(json.dumps({method: {k: round(v, 5) for k, v in m.items()} for method, m in results.items()}))


if __name__ == "__main__":
    main()
