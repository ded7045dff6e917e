"""CIFAR-10 with real architectures: deterministic, MC dropout, BBB, local reparameterization, flipout and
VDP++ on one network, clean and under corruption.

Paper 000 (Bayes by Backprop and MC dropout on CIFAR-10 with LeNet-5, AlexNet and ResNet) and paper 002
(VDP++ on ResNet-18) make their claims here. Every method is the same ``pyrobnn.networks`` network, the same
data pipeline (the training set as uint8 on the device, random crop and flip per batch on the device,
:class:`pyrobnn.data.augment.ImageAugment`) and the same ``fit``/``evaluate``; a method is one argument:

=========  =================================================================================
det        :class:`~pyrobnn.PointGuide` (MAP: the Gaussian prior is the weight decay)
mcdropout  :class:`~pyrobnn.DropoutGuide` (Gal & Ghahramani 2016), T passes at test time
bbb        :class:`~pyrobnn.NormalGuide`, one weight sample per batch (Blundell et al. 2015)
local      the same guide under local reparameterization (Kingma et al. 2015)
flipout    the same guide under flipout (Wen et al. 2018)
vdp        the same guide trained and evaluated by moment propagation (VDP++)
ibnn<K>    implicit BNN (Trinh, Kaski & Heinonen 2020): :class:`~pyrobnn.NodePrior` N(1, 0.3²) on every
           layer's inputs, :class:`~pyrobnn.MixtureNodeGuide` with K components (``ibnn4``, ``ibnn16``),
           two learning rates (:class:`~pyrobnn.infer.optim.TwoGroupSGD`), KL weight 0 -> 1 over 2/3 of the run
=========  =================================================================================

Recipe (per model, overridable): SGD with Nesterov momentum 0.9 on the per-example loss, a linear warm-up
over the first epoch's steps, then a cosine learning rate over the epochs, weight decay ``wd`` on the weights only,
as the prior :math:`\\mathcal N(0, 1/(N\\,wd))`
(the KL of the means is then exactly that decay), KL weight ``--beta`` for the Bayesian guides.
The corruption benchmark (``pyrobnn.data.corruptions``, CIFAR-10-C families generated in code) runs on the
test subset at the ``--corruptions`` severities. Our CIFAR-10 copy is JPEG-compressed (lossy): numbers are
not exactly comparable with the PNG originals.

CPU check (what CI-sized runs use, a few minutes on 2 cores)::

    python examples/cifar10.py --model resnet18 --methods det mcdropout bbb --epochs 1 --train-size 2000 \\
        --test-size 200 --samples 4 --corruptions 3

Writes ``reliability_<method>.png`` and ``severity.png`` to ``--out`` (plus one checkpoint per method, so a run
can be resumed with ``--resume``) and prints a table and, last, one JSON line
``{"<model>": {"<method>": {"accuracy", "nll", "ece", "brier", "corrupted": {"accuracy", "nll", "ece"},
"s_per_epoch", "peak_memory_mb"}}}``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import pyro
import torch
from rich.console import Console
from rich.table import Table

from pyrobnn import (
    BayesianNetwork,
    Categorical,
    DropoutGuide,
    GaussianPrior,
    MixtureNodeGuide,
    NodePrior,
    NormalGuide,
    PointGuide,
)
from pyrobnn.analysis.evaluate import evaluate
from pyrobnn.analysis.metrics import reliability_diagram
from pyrobnn.analysis.shift import evaluate_corruptions, plot_metric_vs_severity
from pyrobnn.data import load_dataset
from pyrobnn.data.augment import ImageAugment
from pyrobnn.data.corruptions import CIFAR10_C, CORRUPTIONS, SEVERITIES
from pyrobnn.device import resolve_device
from pyrobnn.infer.elbo import MeanFieldELBO
from pyrobnn.infer.optim import FlatThenLinear, Optim, TwoGroupSGD
from pyrobnn.infer.predict import predict, predict_moments
from pyrobnn.infer.schedules import Constant, LinearWarmup
from pyrobnn.infer.svi import Checkpoint, fit
from pyrobnn.networks import build_net

METHODS = {"det": "sample", "mcdropout": "local", "bbb": "sample", "local": "local", "flipout": "flipout",
           "vdp": "vdp", "ibnn4": "local", "ibnn16": "local"}
"""Method -> the estimator it trains with (MC dropout and iBNN: ``local``, one draw per example)."""

RECIPES = {
    "lenet5-cifar": dict(lr=0.05, wd=5e-4, dropout=0.3, batch_size=128),
    "alexnet": dict(lr=0.02, wd=5e-4, dropout=0.5, batch_size=128),
    "resnet18": dict(lr=0.05, wd=5e-4, dropout=0.1, batch_size=128),
    "resnet50": dict(lr=0.05, wd=5e-4, dropout=0.1, batch_size=128),
    "vgg16": dict(lr=0.05, wd=5e-4, dropout=0.1, batch_size=128),
    "wrn28-10": dict(lr=0.1, wd=5e-4, dropout=0.1, batch_size=128),
}
"""Per model: per-example learning rate, weight decay, MC-dropout rate (paper 000: 0.3 for LeNet, 0.5 for
AlexNet), batch size."""

CPU_CORRUPTIONS = ("gaussian_noise", "defocus_blur", "fog", "contrast", "jpeg_compression")
"""One corruption per CIFAR-10-C family (noise, blur, weather, digital, plus JPEG), the default on a CPU."""


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="resnet18", choices=sorted(RECIPES))
    p.add_argument("--methods", nargs="+", default=["det", "mcdropout", "bbb"], choices=list(METHODS))
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=None, help="default: the model's recipe")
    p.add_argument("--lr", type=float, default=None, help="per-example SGD learning rate (default: recipe)")
    p.add_argument("--wd", type=float, default=None, help="weight decay of the weights (default: recipe)")
    p.add_argument("--dropout", type=float, default=None, help="MC-dropout rate (default: recipe)")
    p.add_argument("--warmup-epochs", type=float, default=1.0,
                   help="ramp the learning rate up linearly over this many epochs' steps (0: none)")
    p.add_argument("--beta", type=float, default=0.1, help="KL weight of the Bayesian guides (paper 000: 0.1)")
    p.add_argument("--init-rho", type=float, default=-6.0, help="initial rho of the Normal guide")
    p.add_argument("--node-scale", type=float, default=0.3, help="iBNN: s of the node prior N(1, s^2)")
    p.add_argument("--node-init-scale", type=float, default=0.75, help="iBNN: spread of the initial means")
    p.add_argument("--train-size", type=int, default=None)
    p.add_argument("--test-size", type=int, default=None)
    p.add_argument("--samples", type=int, default=16, help="posterior samples per test prediction")
    p.add_argument("--corruptions", type=int, nargs="*", default=[3], help="severities (1-5) to evaluate")
    p.add_argument("--corruption-types", nargs="+", default=None, choices=sorted(CORRUPTIONS),
                   help="default: the 14 CIFAR-10-C types generated in code on a GPU; on a CPU one per family "
                        f"({', '.join(CPU_CORRUPTIONS)})")
    p.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto",
                   help="auto: bf16 autocast on CUDA, fp32 on CPU")
    p.add_argument("--device", default="auto")
    p.add_argument("--data-root", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("runs/cifar10"))
    p.add_argument("--resume", action="store_true", help="continue each method from its checkpoint in --out")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True)
    args = p.parse_args(argv)
    for name in ("epochs", "samples"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if any(s not in SEVERITIES for s in args.corruptions):
        p.error(f"--corruptions takes severities 1 to 5, got {args.corruptions}")
    recipe = RECIPES[args.model]
    for key in ("lr", "wd", "dropout", "batch_size"):
        if getattr(args, key) is None:
            setattr(args, key, recipe[key])
    return args


def components(method: str) -> int:
    """K of an ``ibnn<K>`` method (1 for the others)."""
    return int(method[4:]) if method.startswith("ibnn") else 1


def build(args, method: str, num_data: int):
    """Model and guide of one method: the same network and likelihood for all; the Gaussian weight prior (whose
    KL on the means is the weight decay wd) for all but the implicit BNN's node prior."""
    net = build_net(args.model, (3, 32, 32), 10)
    k = components(method)
    prior = NodePrior(args.node_scale) if k > 1 else GaussianPrior(0.0, 1.0 / math.sqrt(num_data * args.wd))
    likelihood = Categorical(vdp_objective="cross_entropy")  # VDP++'s choice for large problems
    model = BayesianNetwork(net, likelihood, prior=prior, num_data=num_data, input_shape=(3, 32, 32))
    if k > 1:
        return model, MixtureNodeGuide(model, num_components=k, init_scale=args.node_init_scale, name=method)
    if method == "det":
        return model, PointGuide(model, name=method)
    if method == "mcdropout":  # every layer's input dropped, but the image itself
        first = model.sites()[0].name.rsplit(".", 1)[0]
        return model, DropoutGuide(model, rate={f"{first}.*": 0.0, "*": args.dropout}, name=method)
    return model, NormalGuide(model, init_rho=args.init_rho, name=method)


def peak_memory_mb(device) -> float | None:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return None  # CPU allocators keep no peak statistics (pyrobnn.analysis.cost measures tensors instead)


def run_method(args, method, data, aug, device, precision):
    pyro.set_rng_seed(args.seed)
    num_data = len(data.x_train)
    model, guide = build(args, method, num_data)
    if device.type == "cuda":
        model.to(memory_format=torch.channels_last)
        torch.cuda.reset_peak_memory_stats(device)
    x_train, y_train = data.x_train.to(device), data.y_train.to(device)
    cosine = lambda e: 0.5 * (1 + math.cos(math.pi * e / args.epochs))  # noqa: E731
    warmup = round(args.warmup_epochs * math.ceil(num_data / args.batch_size))
    k = components(method)
    if k > 1:  # Trinh et al. 2020: SGD on the weights (decayed), a constant large rate on the mixture
        training = dict(optimizer=TwoGroupSGD(lr=args.lr, variational_lr=0.2 * k, weight_decay=args.wd,
                                              schedule=FlatThenLinear(args.epochs), warmup_steps=warmup),
                        num_particles=2, beta=LinearWarmup(0, max(1, round(2 * args.epochs / 3))))
    else:
        beta = Constant(1.0 if method in ("det", "mcdropout") else args.beta)  # det: the KL is the weight decay
        training = dict(optimizer=Optim("sgd", args.lr, schedule=cosine, warmup_steps=warmup), beta=beta)
    history = fit(model, guide, x_train, y_train, epochs=args.epochs, batch_size=args.batch_size,
                  elbo=MeanFieldELBO(estimator=METHODS[method], precision=precision), transform=aug, seed=args.seed,
                  device=device, checkpoint=Checkpoint(args.out / f"{method}.pt", resume=args.resume),
                  progress=args.progress, **training)
    samples = 1 if method == "det" else math.ceil(args.samples / k) * k  # iBNN: a multiple of K
    x_test = aug.normalize(data.x_test.to(device))
    x01 = data.x_test.to(device).float().div_(255)
    if method == "vdp":
        clean = evaluate(model, guide, x_test, data.y_test, moments=True)
        probs = predict_moments(model, guide, x_test)["probs"]
    else:
        clean = evaluate(model, guide, x_test, data.y_test, num_samples=samples)
        probs = predict(model, guide, x_test, num_samples=samples)["probs"]
    # corrupted images: the posterior predictive by sampling for every method (VDP++'s guide included)
    shifted = evaluate_corruptions(model, guide, x01, data.y_test, corruptions=args.corruption_types,
                                   severities=args.corruptions, num_samples=samples, transform=aug.normalize,
                                   seed=args.seed) if args.corruptions else None
    seconds = [r["seconds"] for r in history.epochs]
    return {
        **{k: clean[k] for k in ("accuracy", "nll", "ece", "brier")},
        "corrupted": None if shifted is None else {k: shifted["mean"][k] for k in ("accuracy", "nll", "ece")},
        "_shift": shifted,
        "s_per_epoch": sum(seconds) / max(len(seconds), 1),
        "peak_memory_mb": peak_memory_mb(device),
        "_probs": probs.cpu(),
    }


def plots(args, results, y_test):
    for method, r in results.items():
        reliability_diagram(r["_probs"], y_test, args.out / f"reliability_{method}.png",
                            title=f"{args.model} {method}")
    if args.corruptions:
        plot_metric_vs_severity({m: r["_shift"] for m, r in results.items()}, args.out / "severity.png",
                                title=f"CIFAR-10 {args.model}: accuracy under corruption")


def main(argv=None):
    args = parse_args(argv)
    device = resolve_device(args.device)
    if args.corruption_types is None:
        args.corruption_types = list(CIFAR10_C if device.type == "cuda" else CPU_CORRUPTIONS)
    precision = ("bf16" if device.type == "cuda" else "fp32") if args.precision == "auto" else args.precision
    data = load_dataset("cifar10", root=args.data_root, train_size=args.train_size, test_size=args.test_size,
                        seed=args.seed, dtype=torch.uint8)
    aug = ImageAugment.for_dataset("cifar10", channels_last=device.type == "cuda")
    args.out.mkdir(parents=True, exist_ok=True)
    results = {m: run_method(args, m, data, aug, device, precision) for m in args.methods}
    plots(args, results, data.y_test)

    table = Table(title=f"CIFAR-10 {args.model}: {len(data.x_train)} train / {len(data.x_test)} test (JPEG copy), "
                        f"{args.epochs} epochs, {device.type}, {precision}")
    for column in ("method", "acc", "NLL", "ECE", "Brier", "corr. acc", "corr. NLL", "corr. ECE", "s/epoch"):
        table.add_column(column, justify="right")
    for method, r in results.items():
        c = r["corrupted"] or {}
        table.add_row(method, *(f"{r[k]:.4f}" for k in ("accuracy", "nll", "ece", "brier")),
                      *(f"{c[k]:.4f}" if k in c else "-" for k in ("accuracy", "nll", "ece")),
                      f"{r['s_per_epoch']:.1f}")
    Console(file=sys.stdout).print(table)
    report = {m: {k: v for k, v in r.items() if not k.startswith("_")} for m, r in results.items()}
    print(json.dumps({args.model: report}))


if __name__ == "__main__":
    main()
