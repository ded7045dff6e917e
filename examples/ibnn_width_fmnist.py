"""Fashion-MNIST width study: mean-field VI on the weights degrades as LeNet grows, the implicit BNN does not.

Trinh, Kaski & Heinonen (2020), "Scalable Bayesian neural networks by layer-wise input augmentation",
Fig. 4: LeNet with x1, x4, x16 (x64) times the parameters, BNN-VI against iBNN. Here LeNet-5 (conv 6, 16;
FC 120, 84; ``pyrobnn.networks.LeNet5``) with every layer ``--widths`` times as wide, so x4 and x16 the
parameters at widths 2 and 4 (62K, 244K, 973K parameters), trained on a seeded subset of ``--train-size``
Fashion-MNIST images (inputs standardised) for ``--epochs`` epochs, on CPU:

- ``bnn_vi``: Bayes by Backprop (Blundell et al. 2015): every weight and bias Bayesian, prior N(0, 1),
  ``NormalGuide`` (σ0 = softplus(``--init-rho``)), local reparameterization;
- ``ibnn``: point-estimate weights, node latents on the inputs of every conv and linear layer
  (``NodePrior(--node-scale)``), ``MixtureNodeGuide`` with K = ``--components`` (the mixture-mean KL); each
  minibatch is split among the K components (row r uses component r mod K, so the batch size and the last
  batch are multiples of K).

Both: Adam at ``--lr`` on the network and the guide (``fit(optimizer=...)`` with the variational parameters of
the iBNN at ``--variational-lr-factor`` times it, the paper's large variational rate), batch ``--batch-size``,
the KL weight rising linearly from 0 to 1 over the first two thirds of the epochs. Test (``--test-size`` images):
error of the predictive mean probabilities and NLL of the Monte-Carlo predictive, -log (1/S) Σ_s p_s(y|x), with
S = ``--samples`` draws (a multiple of K: every component drawn equally, the paper's 5·K at ``--samples 20``).

Prints a table, then as the last line one JSON object ``{"x1": {"params": .., "bnn_vi": {"nll", "error",
"seconds"}, "ibnn": {...}}, "x4": ..., "x16": ..., "bnn_vi_nll_degrades": .., "ibnn_nll_degrades": ..}``
("degrades": the widest network's NLL is above the best NLL of the narrower ones, the paper's BNN-VI getting
worse beyond 165K parameters).

    PYROBNN_DATA=/work/shared/data python examples/ibnn_width_fmnist.py          # about 8 min on 2 shared cores
    python examples/ibnn_width_fmnist.py --widths 1 2 4 8 --train-size 60000 --epochs 30   # x64, a GPU run
"""

from __future__ import annotations

import argparse
import json
import math
import time

import pyro
import torch
from rich.console import Console
from rich.table import Table

from pyrobnn import BayesianNetwork, GaussianPrior, NormalGuide
from pyrobnn.data import load_fashion_mnist
from pyrobnn.guides.mixture_node import MixtureNodeGuide
from pyrobnn.infer.optim import Optim
from pyrobnn.infer.predict import predictive_outputs
from pyrobnn.infer.schedules import LinearWarmup
from pyrobnn.infer.svi import fit
from pyrobnn.model.priors import NodePrior
from pyrobnn.networks.lenet import LeNet5

METHODS = ("bnn_vi", "ibnn")
MEAN, STD = 0.2860, 0.3530  # Fashion-MNIST pixel statistics
console = Console(width=120)


def build(method: str, width: float, num_data: int, args):
    net = LeNet5(1, 10, 28, width=width)
    if method == "bnn_vi":
        model = BayesianNetwork(net, prior=GaussianPrior(0.0, 1.0), num_data=num_data)
        return model, NormalGuide(model, init_rho=args.init_rho, name=f"bnn{width}"), Optim(lr=args.lr)
    model = BayesianNetwork(net, prior=NodePrior(args.node_scale), num_data=num_data)
    guide = MixtureNodeGuide(model, num_components=args.components, init_scale=args.init_scale, name=f"ibnn{width}")

    def two_rates(model, guide):  # the paper's large constant rate on the variational parameters
        return torch.optim.Adam([{"params": list(model.parameters()), "lr": args.lr},
                                 {"params": list(guide.parameters()), "lr": args.lr * args.variational_lr_factor}])

    return model, guide, two_rates


@torch.no_grad()
def test_metrics(model, guide, x, y, args) -> dict:
    logits = predictive_outputs(model, guide, x, num_samples=args.samples, batch_size=args.eval_batch)  # (S, N, 10)
    log_probs = logits.log_softmax(-1)
    log_predictive = log_probs.logsumexp(0) - math.log(args.samples)  # (N, 10)
    nll = -log_predictive.gather(1, y[:, None]).mean().item()
    error = (log_predictive.argmax(1) != y).float().mean().item()
    return {"nll": nll, "error": error}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--widths", type=float, nargs="+", default=[1, 2, 4],
                        help="layer-width multipliers (parameters x1, x4, x16)")
    parser.add_argument("--train-size", type=int, default=10000)
    parser.add_argument("--test-size", type=int, default=5000)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--variational-lr-factor", type=float, default=10.0,
                        help="iBNN: Adam rate of the variational parameters, times --lr")
    parser.add_argument("--init-rho", type=float, default=-5.0, help="bnn_vi: initial sigma = softplus(rho)")
    parser.add_argument("--components", type=int, default=4, help="iBNN: K")
    parser.add_argument("--node-scale", type=float, default=0.3, help="iBNN: s of the node prior N(1, s²)")
    parser.add_argument("--init-scale", type=float, default=0.5, help="iBNN: spread of the initial component means")
    parser.add_argument("--samples", type=int, default=8, help="predictive draws (a multiple of --components)")
    parser.add_argument("--eval-batch", type=int, default=250)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-root", default=None, help="default: $PYROBNN_DATA")
    args = parser.parse_args()
    k = args.components
    if args.samples % k or args.batch_size % k or (args.train_size % args.batch_size) % k:
        parser.error(f"--samples, --batch-size and the last batch (--train-size mod --batch-size) must be multiples "
                     f"of --components ({k}): row r of a batch uses component r mod K")
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    data = load_fashion_mnist(args.data_root, train_size=args.train_size, test_size=args.test_size, seed=args.seed)
    x, y = (data.x_train - MEAN) / STD, data.y_train
    x_test, y_test = (data.x_test - MEAN) / STD, data.y_test

    results = {}
    for width in args.widths:
        key = f"x{width**2:g}"
        results[key] = {}
        for method in METHODS:
            pyro.clear_param_store()
            pyro.set_rng_seed(args.seed)
            model, guide, optimizer = build(method, width, len(x), args)
            results[key]["params"] = sum(p.numel() for p in model.net.parameters()) + sum(
                s.init.numel() for s in model.sites() if method == "bnn_vi")
            tick = time.perf_counter()
            fit(model, guide, x, y, epochs=args.epochs, batch_size=args.batch_size, optimizer=optimizer,
                beta=LinearWarmup(0, max(1, 2 * args.epochs // 3)), estimator="local", seed=args.seed, progress=False)
            metrics = test_metrics(model, guide, x_test, y_test, args)
            metrics["seconds"] = time.perf_counter() - tick
            results[key][method] = metrics
            console.print(f"{key} {method}: NLL {metrics['nll']:.4f}, error {100 * metrics['error']:.2f} % "
                          f"({metrics['seconds']:.0f} s)")

    table = Table(title=f"Fashion-MNIST LeNet-5 width study ({args.train_size} training images, {args.epochs} "
                        f"epochs, {args.test_size} test images, {args.samples} draws)")
    for column in ("size", "parameters", "BNN-VI NLL", "iBNN NLL", "BNN-VI error %", "iBNN error %"):
        table.add_column(column, justify="right")
    for key, r in results.items():
        table.add_row(key, f"{r['params']:,}", *(f"{r[m]['nll']:.4f}" for m in METHODS),
                      *(f"{100 * r[m]['error']:.2f}" for m in METHODS))
    console.print(table)
    *narrower, widest = list(results)
    degrades = {m: bool(narrower) and results[widest][m]["nll"] > min(results[n][m]["nll"] for n in narrower)
                for m in METHODS}
    for m, worse in degrades.items():
        console.print(f"{m}: the NLL at {widest} is {'above' if worse else 'not above'} the best of {narrower}")
    console.print(f"total {time.perf_counter() - start:.0f} s")
    summary = {key: {"params": r["params"], **{m: {k: round(v, 4) for k, v in r[m].items()} for m in METHODS}}
               for key, r in results.items()}
    print(json.dumps({**summary, **{f"{m}_nll_degrades": worse for m, worse in degrades.items()}}))


if __name__ == "__main__":
    main()
