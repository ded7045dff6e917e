"""Dispatched ATen operations and host synchronisations per training step and per prediction pass.

On a GPU a small Bayesian step is bound by kernel launches and Python, and every dispatched ATen
operation is at least one launch; on a CPU each costs its dispatch plus a pass over its operands.
Counting them (``torch.utils._python_dispatch.TorchDispatchMode``: forward, backward and optimiser
alike) measures that cost on any machine, under any load, exactly. For every network of the suite
(784-400-10 and 784-1200-1200-10 MLPs, LeNet-5 on 28x28 inputs, a CIFAR ResNet-18 at width 0.25;
batch 128) and every method:

- ``det``: the plain PyTorch step (cross-entropy, fused Adam);
- ``bbb``, ``local_reparam``, ``flipout``, ``vdp``: pyrobnn's ``NormalGuide`` + Gaussian prior under
  each estimator of :data:`pyrobnn.handlers.ESTIMATORS`, stepped by :func:`pyrobnn.infer.svi.svi_step`;
- ``bt_reparam`` / ``bt_flipout``: bayesian-torch's ``dnn_to_bnn`` layers (skipped when not installed);
- ``torch_bbb``: the hand-written Bayes-by-Backprop floor of ``benchmarks/speed.py`` (no Pyro, ``F.softplus``);
- ``torch_bbb_same_softplus``: that floor with pyrobnn's σ kernel (:func:`pyrobnn.distributions.softplus`, which
  avoids ``torch.log1p``, slow on some CPUs): the same arithmetic as ``bbb``, so what remains between the two is the
  Python of Pyro and pyrobnn.

A prediction pass is one posterior draw of the network on the batch, without gradients. A host
synchronisation is an operation whose result the host must wait for: ``aten._local_scalar_dense``
(``.item()``, ``bool(t)``, ``float(t)``), ``aten.nonzero`` and the other data-dependent shapes, and a
copy to the CPU from another device (``.cpu()``, ``.tolist()``; on a CPU run there is none to count).
Python function calls per step (``sys.setprofile``: calls of Python functions and of builtins) measure the
interpreter's share, which no operation count sees: Pyro's messages, ``PyroModule`` attribute reads, handlers.

``python benchmarks/ops.py [--networks mlp400 ...] [--json ops.json]`` prints the table and writes JSON.
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import sys
from typing import Callable

import pyro
import torch
import torch.nn.functional as F
from pyro import poutine
from speed import _torch_bbb_step
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from pyrobnn import BayesianNetwork, NormalGuide
from pyrobnn import distributions as pyrobnn_distributions
from pyrobnn.analysis.cost import training_step
from pyrobnn.handlers import estimator as estimator_handler
from pyrobnn.infer.optim import make_optimizer
from pyrobnn.model.likelihoods import Categorical
from pyrobnn.networks import MLP, LeNet5
from pyrobnn.networks.resnet import resnet18

NETWORKS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    "mlp400": (lambda: MLP(784, (400,), 10), (1, 28, 28)),
    "mlp1200x2": (lambda: MLP(784, (1200, 1200), 10), (1, 28, 28)),
    "lenet5": (lambda: LeNet5(1, 10, image_size=28), (1, 28, 28)),
    "resnet18": (lambda: resnet18(10, width=0.25), (3, 32, 32)),
}
"""Network name -> (constructor, per-example input shape)."""

ESTIMATOR_OF = {"bbb": "sample", "local_reparam": "local", "flipout": "flipout", "vdp": "vdp"}
"""pyrobnn's methods: name -> key of :data:`pyrobnn.handlers.ESTIMATORS`."""
BAYESIAN_TORCH = {"bt_reparam": "Reparameterization", "bt_flipout": "Flipout"}
COUNTERPART = {"bbb": "bt_reparam", "local_reparam": "bt_reparam", "flipout": "bt_flipout"}
"""pyrobnn's estimator -> bayesian-torch's method it must not exceed in operations per step."""
METHODS = ("det", *ESTIMATOR_OF, *BAYESIAN_TORCH, "torch_bbb", "torch_bbb_same_softplus")
NUM_DATA = 60000

SYNCHRONIZING = frozenset({"aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten.unique",
                           "aten._unique2", "aten.repeat_interleave", "aten.item", "aten.equal"})
"""ATen operations (overload packets) whose result the host waits for: a value read or a data-dependent shape."""


class OpCounter(TorchDispatchMode):
    """Within the context: ``ops``, the ATen operations dispatched (by overload packet, e.g. ``aten.mul``),
    and ``syncs``, the host synchronisations among them (:data:`SYNCHRONIZING`, and copies from a device to
    the CPU). Operations of other namespaces (the profiler's record-function markers) are not counted."""

    def __init__(self):
        super().__init__()
        self.ops: collections.Counter = collections.Counter()
        self.syncs: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func.overloadpacket)
        if name.startswith("aten."):
            self.ops[name] += 1
            if name in SYNCHRONIZING or (name in ("aten._to_copy", "aten.copy_") and _to_host(args, kwargs)):
                self.syncs[name] += 1
        return func(*args, **kwargs)

    @property
    def total(self) -> int:
        return sum(self.ops.values())


def _to_host(args, kwargs) -> bool:
    """Whether a copy goes from another device to the CPU."""
    source = args[1] if len(args) > 1 and isinstance(args[1], torch.Tensor) else args[0]
    target = kwargs.get("device") or (args[0].device if isinstance(args[0], torch.Tensor) else None)
    return source.device.type != "cpu" and target is not None and torch.device(target).type == "cpu"


def count(fn: Callable[[], object], warmup: int = 2) -> OpCounter:
    """The operations of one call of ``fn`` after ``warmup`` calls (lazily created state is set-up)."""
    for _ in range(warmup):
        fn()
    with OpCounter() as counter:
        fn()
    return counter


ORIGINS = ("pyro", "pyrobnn", "torch", "builtin", "other")
"""Where a Python call goes (:func:`python_calls_by_origin`): a function of Pyro's, pyrobnn's or torch's Python
code, a builtin (``getattr``, ``isinstance``, a C method), or anything else (the standard library, the benchmark)."""


def _origin(frame, event: str) -> str:
    if event == "c_call":
        return "builtin"
    package = (frame.f_globals.get("__name__") or "").partition(".")[0]  # the module's top package
    return package if package in ("pyro", "pyrobnn", "torch") else "other"


def python_calls_by_origin(fn: Callable[[], object], warmup: int = 2) -> dict[str, int]:
    """The Python function calls (of Python functions and of builtins, as cProfile counts them) of one call of
    ``fn`` after ``warmup`` calls, by :data:`ORIGINS`: the interpreter's share of a step, which no operation count
    sees, and whose code spends it."""
    for _ in range(warmup):
        fn()
    calls = collections.Counter()

    def profile(frame, event, arg):
        if event == "call" or (event == "c_call" and arg is not sys.setprofile):  # not the closing one
            calls[_origin(frame, event)] += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return {origin: calls[origin] for origin in ORIGINS}


def python_calls(fn: Callable[[], object], warmup: int = 2) -> int:
    """All Python function calls of one call of ``fn`` after ``warmup`` calls (:func:`python_calls_by_origin`)."""
    return sum(python_calls_by_origin(fn, warmup).values())


def bayesian_torch_step(net: nn.Module, kind: str, x: torch.Tensor, y: torch.Tensor) -> Callable[[], None] | None:
    """bayesian-torch's step of ``kind`` (``"Reparameterization"`` or ``"Flipout"``) on a copy of ``net``:
    cross-entropy + KL / N, the same fused Adam; None when bayesian-torch is not installed."""
    model = _bayesian_torch_net(net, kind, x.device)
    if model is None:
        return None
    optim = make_optimizer(model.parameters())

    def step():
        loss = F.cross_entropy(model(x), y) + _bt_kl(model) / NUM_DATA
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()

    return step


def _bayesian_torch_net(net, kind, device):
    try:
        from bayesian_torch.models.dnn_to_bnn import dnn_to_bnn
    except ImportError:
        return None
    net = copy.deepcopy(net)
    dnn_to_bnn(net, {"prior_mu": 0.0, "prior_sigma": 1.0, "posterior_mu_init": 0.0, "posterior_rho_init": -5.0,
                     "type": kind, "moped_enable": False})
    return net.to(device)


def _bt_kl(net):
    from bayesian_torch.models.dnn_to_bnn import get_kl_loss

    return get_kl_loss(net)


def training_steps(name: str, x: torch.Tensor, y: torch.Tensor,
                   methods=METHODS) -> dict[str, Callable[[], object]]:
    """One closure ``step()`` (an optimiser step on ``(x, y)``) per available method in ``methods``, all on
    copies of the same network ``name``; each pyrobnn guide under its own name in Pyro's param store."""
    torch.manual_seed(0)
    net = NETWORKS[name][0]()
    steps: dict[str, Callable[[], object] | None] = {}
    for method in methods:
        if method == "det" or method in ESTIMATOR_OF:
            steps[method] = training_step(net, x, y, ESTIMATOR_OF.get(method, "det"), name=method, compile="none")
        elif method in BAYESIAN_TORCH:
            steps[method] = bayesian_torch_step(net, BAYESIAN_TORCH[method], x, y)
        elif method == "torch_bbb":
            steps[method] = _torch_bbb_step(net, x, y, NUM_DATA)
        elif method == "torch_bbb_same_softplus":  # skipped on packages before c077138, which have no softplus
            softplus = getattr(pyrobnn_distributions, "softplus", None)
            steps[method] = None if softplus is None else _torch_bbb_step(net, x, y, NUM_DATA, softplus=softplus)
        else:
            raise ValueError(f"unknown method {method!r}: one of {METHODS}")
    return {k: v for k, v in steps.items() if v is not None}


def compiled_step(name: str, x: torch.Tensor, y: torch.Tensor, estimator: str = "sample",
                  compile: str = "inductor") -> Callable[[], object]:
    """pyrobnn's step of ``estimator`` on network ``name`` (as :func:`training_steps`'), run by the executor
    ``compile`` (:data:`pyrobnn.infer.recording.COMPILE_MODES`: ``"auto"``, the default of ``svi_step``, ``"trace"``,
    ``"inductor"``); ``estimator="det"``: the plain PyTorch step with the network under ``torch.compile`` (its
    forward and backward compiled), the baseline of compiled steps."""
    torch.manual_seed(0)
    return training_step(NETWORKS[name][0](), x, y, estimator, num_data=NUM_DATA,
                         name=f"{estimator}_compiled_{compile}", compile=compile)


def prediction_passes(name: str, x: torch.Tensor, methods=METHODS) -> dict[str, Callable[[], object]]:
    """One closure per method: one posterior draw of the network on ``x``, without gradients."""
    torch.manual_seed(0)
    net = NETWORKS[name][0]().to(x.device).eval()
    passes: dict[str, Callable[[], object]] = {}
    for method in methods:
        if method == "det":
            passes[method] = torch.no_grad()(lambda: net(x))
        elif method in ESTIMATOR_OF:
            model = BayesianNetwork(copy.deepcopy(net), Categorical(vdp_objective="cross_entropy"),
                                    num_data=NUM_DATA).to(x.device).eval()
            guide = NormalGuide(model, name=f"{method}_predict").to(x.device)
            passes[method] = _pyrobnn_pass(model, guide, x, ESTIMATOR_OF[method])
        elif method in BAYESIAN_TORCH:
            bnn = _bayesian_torch_net(net, BAYESIAN_TORCH[method], x.device)
            if bnn is not None:
                passes[method] = torch.no_grad()(lambda bnn=bnn: bnn.eval()(x))
    return passes


def _pyrobnn_pass(model, guide, x, estimator: str):
    @torch.no_grad()
    def run():
        with estimator_handler(estimator):
            return poutine.replay(model.net, trace=poutine.trace(guide).get_trace())(x)

    return run


def measure(name: str, device: torch.device, batch: int = 128, methods=METHODS) -> dict[str, dict]:
    """Per method: ``step_ops``, ``step_syncs``, ``step_python_calls`` (and ``step_python_calls_by_origin``),
    ``predict_ops``, ``predict_syncs`` and the ops by name."""
    x = torch.rand((batch,) + NETWORKS[name][1], device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    pyro.clear_param_store()
    result: dict[str, dict] = {}
    with pyro.validation_enabled(False):
        for method, step in training_steps(name, x, y, methods).items():
            counter = count(step)
            origins = python_calls_by_origin(step, warmup=0)  # count() warmed it up
            result[method] = {"step_ops": counter.total, "step_syncs": sum(counter.syncs.values()),
                              "step_python_calls": sum(origins.values()), "step_python_calls_by_origin": origins,
                              "step_by_op": dict(counter.ops.most_common())}
        for method, run in prediction_passes(name, x, methods).items():
            counter = count(run)
            result[method].update(predict_ops=counter.total, predict_syncs=sum(counter.syncs.values()))
    return result


def print_table(figures: dict[str, dict[str, dict]]) -> None:
    from rich.console import Console
    from rich.table import Table

    methods = [m for m in METHODS if any(m in f for f in figures.values())]
    table = Table(title="ATen ops per training step / per prediction pass [host syncs per step] (Python calls per "
                        "step)")
    table.add_column("network")
    for method in methods:
        table.add_column(method, justify="right")
    for name, f in figures.items():
        cells = []
        for m in methods:
            if m not in f:
                cells.append("-")
                continue
            mark = ""
            if m in COUNTERPART and COUNTERPART[m] in f:
                mark = " ≤" if f[m]["step_ops"] <= f[COUNTERPART[m]]["step_ops"] else " >"
            predict = f"/{f[m]['predict_ops']}" if "predict_ops" in f[m] else ""
            calls = f" ({f[m]['step_python_calls']})" if "step_python_calls" in f[m] else ""
            cells.append(f"{f[m]['step_ops']}{predict} [{f[m]['step_syncs']}]{calls}{mark}")
        table.add_row(name, *cells)
    console = Console(width=200)
    console.print(table)
    console.print("≤ / >: pyrobnn's step against its bayesian-torch counterpart "
                    f"({', '.join(f'{k} vs {v}' for k, v in COUNTERPART.items())})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--networks", nargs="+", choices=tuple(NETWORKS), default=tuple(NETWORKS))
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--json", default=None, help="write the figures (with the ops by name) to this file")
    args = parser.parse_args()
    torch.set_num_threads(1)  # counts do not depend on threads; leave the shared cores to others
    figures = {name: measure(name, torch.device(args.device), args.batch) for name in args.networks}
    print_table(figures)
    if args.json:
        with open(args.json, "w") as file:
            json.dump(figures, file, indent=1)
    print(json.dumps({name: {m: {k: v for k, v in f.items() if k != "step_by_op"} for m, f in fs.items()}
                      for name, fs in figures.items()}))


if __name__ == "__main__":
    main()
