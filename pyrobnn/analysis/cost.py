"""What a training step costs: milliseconds and peak memory, measured side by side.

- :func:`time_steps`: median milliseconds per step of several methods, timed in interleaved
  rounds (every round times every method, so machine load hits them alike);
- :func:`training_step`: one optimiser step of a network trained deterministically (plain PyTorch)
  or as a BNN with any estimator, as a closure to time;
- :func:`compare_training_cost`: both, for several methods on one network, with ratios to ``det``;
- :func:`peak_memory`: the peak memory a step allocates on top of what exists before it
  (parameters, optimiser state, data): on CUDA ``torch.cuda.max_memory_allocated``; on CPU the
  peak total size of the tensors alive at once, counted by :class:`LiveTensorMemory` (CPU
  allocators keep no statistics, and a process's resident high-water mark also counts memory
  the allocator keeps after tensors die).

VDP++ ("Efficient Scaling of Bayesian Neural Networks", IEEE Access 2024, Fig. 1) compares epoch
time and peak GPU memory at batch 512 this way.
"""

from __future__ import annotations

import copy
import statistics
import time
import weakref
from typing import Callable

import torch
import torch.nn.functional as F
from rich.table import Table

from pyrobnn._compat import TorchDispatchMode, tree_flatten
from pyrobnn.guides import NormalGuide
from pyrobnn.handlers import ESTIMATORS
from pyrobnn.infer.elbo import MeanFieldELBO
from pyrobnn.infer.optim import make_optimizer
from pyrobnn.infer.svi import svi_step
from pyrobnn.model import BayesianNetwork
from pyrobnn.model.likelihoods import Categorical

__all__ = ["LiveTensorMemory", "compare_training_cost", "cost_table", "peak_memory", "synchronize", "time_steps",
           "training_step"]


class LiveTensorMemory(TorchDispatchMode):
    """Within the context, the bytes of tensor storages created by PyTorch operations (forward,
    backward and optimiser alike) that are alive: ``current``, and its maximum ``peak``."""

    def __init__(self):
        super().__init__()
        self.current = self.peak = 0
        self._live: dict[tuple[int, int], int] = {}

    def _release(self, key):
        self.current -= self._live.pop(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for value in tree_flatten(out)[0]:
            if isinstance(value, torch.Tensor) and value.device.type != "meta":
                storage = value.untyped_storage()
                key = (storage.data_ptr(), storage.nbytes())
                if key[0] and key not in self._live:  # a new storage (views share their base's)
                    self._live[key] = key[1]
                    self.current += key[1]
                    self.peak = max(self.peak, self.current)
                    weakref.finalize(storage, self._release, key)
        return out


def synchronize(device: torch.device | None) -> None:
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def peak_memory(step: Callable[[], object], device: torch.device | str | None = None, repeats: int = 1) -> float:
    """MiB of peak memory allocated by ``repeats`` calls of ``step`` beyond what was allocated before
    (call ``step`` once beforehand so lazily created optimiser state counts as set-up)."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        for _ in range(repeats):
            step()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - before) / 2**20
    with LiveTensorMemory() as tracker:
        for _ in range(repeats):
            step()
    return tracker.peak / 2**20


def time_steps(steps: dict[str, Callable[[], object]], rounds: int = 5, repeats: int = 10, warmup: int = 3,
               device: torch.device | str | None = None) -> dict[str, float]:
    """Median milliseconds per call of every ``steps[name]()``, over ``rounds`` interleaved rounds of
    ``repeats`` calls each (after ``warmup`` calls of each)."""
    for name, value in (("rounds", rounds), ("repeats", repeats)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    for step in steps.values():
        for _ in range(warmup):
            step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            synchronize(device)
            tick = time.perf_counter()
            for _ in range(repeats):
                step()
            synchronize(device)
            times[name].append((time.perf_counter() - tick) / repeats * 1e3)
    return {name: statistics.median(values) for name, values in times.items()}


def training_step(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, method: str = "det",
                  share: str = "weight", num_data: int = 60000, prior=None,
                  name: str | None = None, compile: str = "auto") -> Callable[[], object]:
    """A closure performing one Adam step on ``(x, y)`` with a copy of ``net``.

    ``method`` is ``"det"`` (plain PyTorch cross-entropy) or a key of
    :data:`pyrobnn.handlers.ESTIMATORS`: the network as a :class:`~pyrobnn.BayesianNetwork` with
    ``prior`` (default N(0, 1)) and a :class:`~pyrobnn.NormalGuide` (``share``: one variance per
    weight or per output unit), stepped by :func:`pyrobnn.infer.svi.svi_step`, which runs the model
    under that estimator's handler (:func:`pyrobnn.handlers.estimator`), as the training loop does.
    ``name`` prefixes the guide's parameters in Pyro's param store (default ``"<method>_step"``);
    steps timed side by side with the same estimator take different names. ``compile`` is
    :func:`~pyrobnn.infer.svi.svi_step`'s; for ``"det"``, ``"inductor"`` runs the network under ``torch.compile``
    and ``"auto"`` or ``"none"`` as it is.
    """
    net = copy.deepcopy(net).to(x.device)
    if method == "det":
        if compile not in ("auto", "none", "inductor"):
            raise ValueError(f"compile for the det step is 'auto', 'none' or 'inductor', got {compile!r}")
        optim = make_optimizer(net.parameters())
        forward = torch.compile(net) if compile == "inductor" else net

        def step():
            loss = F.cross_entropy(forward(x), y)
            optim.zero_grad(set_to_none=True)
            loss.backward()
            optim.step()

        return step
    if method not in ESTIMATORS:
        raise ValueError(f"method must be 'det' or an estimator {sorted(ESTIMATORS)}, got {method!r}")
    model = BayesianNetwork(net, Categorical(vdp_objective="cross_entropy"), prior=prior,
                            num_data=num_data).to(x.device)
    guide = NormalGuide(model, share=share, name=f"{method}_step" if name is None else name).to(x.device)
    optim = make_optimizer(guide.parameters())
    return lambda: svi_step(model, guide, optim, x, y, elbo=MeanFieldELBO(estimator=method), compile=compile)


def compare_training_cost(net: torch.nn.Module, input_shape: tuple[int, ...], num_classes: int,
                          methods: dict[str, tuple[str, str]], batch_size: int = 512, num_data: int = 60000,
                          device: torch.device | str = "cpu", rounds: int = 5, repeats: int = 5,
                          seed: int = 0) -> dict[str, dict[str, float]]:
    """Per method: ``ms_step``, ``s_epoch`` (``num_data / batch_size`` steps), ``peak_mib`` and their
    ratios to the method named ``"det"`` (``time_ratio``, ``memory_ratio``), measured side by side on
    one random batch. ``methods`` maps a label to ``(method, share)`` of :func:`training_step`."""
    if "det" not in methods:
        raise ValueError("methods must include 'det' (the deterministic baseline of the ratios)")
    generator = torch.Generator().manual_seed(seed)
    x = torch.rand((batch_size,) + tuple(input_shape), generator=generator).to(device)
    y = torch.randint(0, num_classes, (batch_size,), generator=generator).to(device)
    steps = {label: training_step(net, x, y, method, share, num_data, name=f"{label}_step")
             for label, (method, share) in methods.items()}
    ms = time_steps(steps, rounds=rounds, repeats=repeats, device=device)
    memory = {label: peak_memory(step, device) for label, step in steps.items()}
    steps_per_epoch = -(-num_data // batch_size)
    return {label: {"ms_step": ms[label], "s_epoch": ms[label] * steps_per_epoch / 1e3, "peak_mib": memory[label],
                    "time_ratio": ms[label] / ms["det"], "memory_ratio": memory[label] / memory["det"]}
            for label in steps}


def cost_table(title: str, cost: dict[str, dict[str, float]]):
    """A rich table of :func:`compare_training_cost`'s figures."""
    table = Table(title=title)
    for column in ("method", "ms/step", "s/epoch", "peak MiB", "time x det", "memory x det"):
        table.add_column(column, justify="right")
    for label, c in cost.items():
        table.add_row(label, f"{c['ms_step']:.1f}", f"{c['s_epoch']:.1f}", f"{c['peak_mib']:.1f}",
                      f"{c['time_ratio']:.2f}", f"{c['memory_ratio']:.2f}")
    return table
