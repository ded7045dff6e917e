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

Both: Adam at ``--lr`` on the network and the guide (the variational parameters of the iBNN at
``--variational-lr-factor`` times it, the paper's large variational rate), batch ``--batch-size``,
the KL weight rising linearly from 0 to 1 over the first two thirds of the epochs. Test (``--test-size`` images):
error of the predictive mean probabilities and NLL of the Monte-Carlo predictive, -log (1/S) Σ_s p_s(y|x), with
S = ``--samples`` draws (a multiple of K: every component drawn equally, the paper's 5·K at ``--samples 20``).

The two methods and the widths are the study ``studies/ibnn_width_fmnist.toml`` (cells cached in ``--out``;
"seconds" is a cell's wall time: training and its test report). Prints the study's table, then as the last line one
JSON object ``{"x1": {"params": .., "bnn_vi": {"nll", "error",
"seconds"}, "ibnn": {...}}, "x4": ..., "x16": ..., "bnn_vi_nll_degrades": .., "ibnn_nll_degrades": ..}``
("degrades": the widest network's NLL is above the best NLL of the narrower ones, the paper's BNN-VI getting
worse beyond 165K parameters).

    PYROBNN_DATA=/work/shared/data python examples/ibnn_width_fmnist.py          # about 8 min on 2 shared cores
    python examples/ibnn_width_fmnist.py --widths 1 2 4 8 --train-size 60000 --epochs 30   # x64, a GPU run
"""

from __future__ import annotations

import argparse
import json

import torch
from method_study import add_study_options, given, run_methods
from rich.console import Console

from pyrobnn.networks.lenet import LeNet5

METHODS = ("bnn_vi", "ibnn")
console = Console(width=120)


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
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-root", default=None, help="default: $PYROBNN_DATA")
    add_study_options(parser, "ibnn_width_fmnist")
    args = parser.parse_args()
    k = args.components
    if args.samples % k or args.batch_size % k or (args.train_size % args.batch_size) % k:
        parser.error(f"--samples, --batch-size and the last batch (--train-size mod --batch-size) must be multiples "
                     f"of --components ({k}): row r of a batch uses component r mod K")
    torch.set_num_threads(args.threads)

    base = [*given(args, "train_size", "test_size", "epochs", "batch_size", "lr", "seed", "data_root"),
            "--beta.anneal", max(1, 2 * args.epochs // 3), "--num-samples", args.samples]
    extra = {"bnn_vi": ["--guide.init-rho", args.init_rho],
             "ibnn": ["--prior.scale", args.node_scale, "--guide.components", k, "--guide.init-scale", args.init_scale,
                      "--variational-lr-factor", args.variational_lr_factor]}
    cells = run_methods("ibnn_width_fmnist", METHODS, args, base=base, extra=extra, vary={"width": args.widths})
    results = {f"x{width**2:g}": {"params": sum(p.numel() for p in LeNet5(1, 10, 28, width=width).parameters())}
               for width in args.widths}
    for cell in cells:
        test = cell.report["test"]
        results[f"x{float(cell.axes['width'])**2:g}"][cell.method] = {
            "nll": test["nll"], "error": 1 - test["accuracy"], "seconds": cell.record["train_seconds"]}
    *narrower, widest = list(results)
    degrades = {m: bool(narrower) and results[widest][m]["nll"] > min(results[n][m]["nll"] for n in narrower)
                for m in METHODS}
    for m, worse in degrades.items():
        console.print(f"{m}: the NLL at {widest} is {'above' if worse else 'not above'} the best of {narrower}")
    summary = {key: {"params": r["params"], **{m: {k: round(v, 4) for k, v in r[m].items()} for m in METHODS}}
               for key, r in results.items()}
    print(json.dumps({**summary, **{f"{m}_nll_degrades": worse for m, worse in degrades.items()}}))


if __name__ == "__main__":
    main()
