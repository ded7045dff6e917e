"""Speed and memory of Bayesian training steps against the deterministic step, side by side.

For each network (784-400-10 MLP, 784-1200-1200-10 MLP, LeNet-5 on 28x28 inputs;
batch 128) and each method, one Adam step is timed in interleaved rounds (every
round times every method, the figure is the median over rounds, so machine
load hits all methods alike):

- ``det``: plain PyTorch, cross-entropy;
- ``bbb``: pyrobnn ``NormalGuide`` + Gaussian prior, weight sampling (Blundell et al. 2015);
- ``local_reparam``: the same under ``local_reparameterization`` (Kingma, Salimans & Welling 2015);
- ``flipout``: the same under ``flipout`` (Wen et al. 2018);
- ``vdp``: the same network and guide trained by VDP++ moment propagation (``vdp``; "Efficient
  Scaling of Bayesian Neural Networks", IEEE Access 2024) (these four: the estimators of
  :data:`pyrobnn.handlers.ESTIMATORS`, each guide under its own name in Pyro's param store);
- ``autonormal``: Pyro's ``AutoNormal`` + ``TraceMeanField_ELBO`` + ``pyro.optim.Adam``;
- ``bt_reparam`` / ``bt_flipout``: bayesian-torch's ``dnn_to_bnn`` layers (optional:
  ``pip install bayesian-torch``; skipped when absent).

Peak memory (:func:`pyrobnn.analysis.cost.peak_memory`): what one step allocates beyond the
set-up (network, guide, optimiser state): activations, samples, gradients; on CPU the
peak size of the tensors alive at once, on CUDA ``torch.cuda.max_memory_allocated``. Prediction: 100 posterior samples
on 10,000 MNIST test images (random images when no data root is set), the
vectorized predictive against the loop over samples.

The last line is one JSON object with every figure and every ratio to ``det``;
for the 784-400-10 CPU case its top level holds ``bbb_ratio``,
``local_reparam_ratio``, ``flipout_ratio``, ``bt_reparam_ratio``,
``bt_flipout_ratio``, ``autonormal_ratio`` and ``predict_speedup``.
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import pyro
import torch
import torch.nn.functional as F
from torch import nn

from pyrobnn import BayesianNetwork, GaussianPrior, NormalGuide
from pyrobnn.analysis.cost import peak_memory, synchronize, time_steps, training_step
from pyrobnn.infer.optim import make_optimizer
from pyrobnn.networks import MLP, LeNet5

NETWORKS = {
    "mlp400": lambda: MLP(784, (400,), 10),
    "mlp1200x2": lambda: MLP(784, (1200, 1200), 10),
    "lenet5": lambda: LeNet5(1, 10, image_size=28),
}
METHODS = ("det", "bbb", "local_reparam", "flipout", "vdp", "autonormal", "bt_reparam", "bt_flipout")
ESTIMATOR_OF = {"det": "det", "bbb": "sample", "local_reparam": "local", "flipout": "flipout", "vdp": "vdp"}
NUM_DATA = 60000


def _bayesian_torch(net: nn.Module, kind: str, x, y):
    try:
        from bayesian_torch.models.dnn_to_bnn import dnn_to_bnn, get_kl_loss
    except ImportError:
        return None
    net = copy.deepcopy(net)
    dnn_to_bnn(net, {"prior_mu": 0.0, "prior_sigma": 1.0, "posterior_mu_init": 0.0, "posterior_rho_init": -5.0,
                     "type": kind, "moped_enable": False})
    net.to(x.device)
    optim = make_optimizer(net.parameters())

    def step():
        loss = F.cross_entropy(net(x), y) + get_kl_loss(net) / NUM_DATA
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()

    return step


def _autonormal(net: nn.Module, x, y):
    model = BayesianNetwork(copy.deepcopy(net), prior=GaussianPrior(), num_data=NUM_DATA).to(x.device)
    guide = pyro.infer.autoguide.AutoNormal(model)
    svi = pyro.infer.SVI(model, guide, pyro.optim.Adam({"lr": 1e-3}), pyro.infer.TraceMeanField_ELBO())
    return lambda: svi.step(x, y)


def steppers(name: str, x, y) -> dict:
    """One closure ``step()`` (an optimiser step on ``(x, y)``) per available method, all on copies of
    the same network."""
    torch.manual_seed(0)
    pyro.clear_param_store()  # AutoNormal's names are the same for every network
    net = NETWORKS[name]()
    methods = {method: training_step(net, x, y, estimator, name=method) for method, estimator in ESTIMATOR_OF.items()}
    methods.update(autonormal=_autonormal(net, x, y), bt_reparam=_bayesian_torch(net, "Reparameterization", x, y),
                   bt_flipout=_bayesian_torch(net, "Flipout", x, y))
    return {k: v for k, v in methods.items() if v is not None}


def _batch(device, batch=128):
    return torch.rand(batch, 1, 28, 28, device=device), torch.randint(0, 10, (batch,), device=device)


def measure(name: str, device, args) -> dict[str, float]:
    """ms/step (median over interleaved rounds) and peak MiB of every method on one network."""
    x, y = _batch(device)
    methods = steppers(name, x, y)
    with pyro.validation_enabled(False):
        ms = time_steps(methods, rounds=args.rounds, repeats=args.steps, device=device)
        entry = {f"{k}_ms": round(v, 3) for k, v in ms.items()}
        entry.update({f"{k}_ratio": round(v / ms["det"], 2) for k, v in ms.items() if k != "det"})
        if not args.no_memory:
            entry.update({f"{k}_mib": round(peak_memory(step, device), 1) for k, step in methods.items()})
    return entry


def time_prediction(device, data_root, samples: int = 100) -> dict[str, float]:
    """Seconds for ``samples`` posterior draws on 10k MNIST test images, vectorized vs loop."""
    from pyrobnn.infer.predict import predictive_outputs

    try:
        from pyrobnn.data import load_dataset

        x = load_dataset("mnist", data_root, download=False).x_test
    except FileNotFoundError:
        x = torch.rand(10000, 1, 28, 28)
    x = x.to(device)
    model = BayesianNetwork(MLP(784, (400,), 10), prior=GaussianPrior(), num_data=NUM_DATA).to(device)
    guide = NormalGuide(model).to(device)
    result = {}
    for key, vectorized in (("predict_loop_s", False), ("predict_vectorized_s", True)):
        synchronize(device)
        tick = time.perf_counter()
        predictive_outputs(model, guide, x, num_samples=samples, vectorized=vectorized)
        synchronize(device)
        result[key] = time.perf_counter() - tick
    result["predict_speedup"] = result["predict_loop_s"] / result["predict_vectorized_s"]
    return result


def run_device(device, args) -> dict:
    figures = {name: measure(name, device, args) for name in NETWORKS}
    figures.update({k: round(v, 3) for k, v in time_prediction(device, args.data_root).items()})
    return figures


def print_table(device: str, figures: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{device}: ms per step (x deterministic) [peak MiB], batch 128")
    table.add_column("network")
    methods = [m for m in METHODS if f"{m}_ms" in figures["mlp400"]]
    for method in methods:
        table.add_column(method, justify="right")
    for name in NETWORKS:
        f = figures[name]
        cells = []
        for m in methods:
            ratio = "" if m == "det" else f" ({f[f'{m}_ratio']:.2f}x)"
            memory = f" [{f[f'{m}_mib']:.0f}]" if f"{m}_mib" in f else ""
            cells.append(f"{f[f'{m}_ms']:.2f}{ratio}{memory}")
        table.add_row(name, *cells)
    Console().print(table)
    Console().print(f"{device}: 100-sample prediction on 10k images: loop {figures['predict_loop_s']:.2f} s, "
                    f"vectorized {figures['predict_vectorized_s']:.2f} s ({figures['predict_speedup']:.1f}x)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--no-memory", action="store_true", help="skip the per-method memory subprocesses")
    parser.add_argument("--devices", nargs="+", choices=("cpu", "cuda"), default=None,
                        help="devices to measure (default: cpu, and cuda when present)")
    args = parser.parse_args()
    devices = args.devices or (["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
    if "cuda" in devices and not torch.cuda.is_available():
        parser.error("--devices cuda: no CUDA device is available here")
    torch.set_num_threads(args.threads)
    result = {"threads": args.threads}
    for device in devices:
        result[device] = run_device(torch.device(device), args)
        print_table(device, result[device])
    if "cpu" in result:
        headline = result["cpu"]["mlp400"]
        for key in ("bbb", "local_reparam", "flipout", "bt_reparam", "bt_flipout", "autonormal"):
            if f"{key}_ratio" in headline:
                result[f"{key}_ratio"] = headline[f"{key}_ratio"]
        result["predict_speedup"] = result["cpu"]["predict_speedup"]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
