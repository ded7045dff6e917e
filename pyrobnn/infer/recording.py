r"""Recording a computation as one graph of ATen operations, and replaying it: the executors of a step.

Every fast path of pyrobnn is the same two moves. :func:`record` runs a function once on example tensors under
:func:`torch.fx.experimental.proxy_tensor.make_fx`, which follows it through Pyro's effect handlers, the estimators'
tensor subclasses, custom autograd functions and ``torch.autograd.grad`` alike, and keeps only the ATen operations it
reached: a graph with no Python in it. :func:`replay` then runs that graph without the Python that produced it:

- ``"trace"``: a TorchScript recording of the graph, replayed without TorchScript's optimisations: the same
  operations in the same order, random draws included, so a seed gives the eager numbers (built in milliseconds);
- ``"inductor"``: the graph compiled by TorchInductor into fused kernels (seconds to build; then the elementwise work
  over all weights is a few kernels), its random numbers drawn with torch's generator (``fallback_random``), so it
  too gives the eager draws.

One vocabulary names the executor everywhere (``fit``, ``fit_replicas``, ``svi_step``, ``sample_posterior``, the
command line's ``--compile`` and the studies): :data:`COMPILE_MODES`, ``"auto"`` (the default) choosing by
:func:`auto_mode`. A graph is a function of its inputs' shapes and of Python values read while recording; callers
key their graphs on what they read (batch shape, training mode, ...).
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Callable

import pyro
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from pyrobnn._compat import FakeTensorMode, TracingContext, inductor_compile, tracing
from pyrobnn.checks import choice

__all__ = ["COMPILE_MODES", "LADDER", "simpler", "record", "replay", "check_mode", "auto_mode", "is_convolutional",
           "resolve", "first_line"]

COMPILE_MODES = ("auto", "none", "trace", "inductor")
"""How a step (or a NUTS leapfrog leaf) runs: ``"none"``: eagerly, from Python; ``"trace"``: recorded once and
replayed as recorded; ``"inductor"``: recorded once and compiled by TorchInductor; ``"auto"``: chosen per device
and run by :func:`auto_mode`."""

LADDER = ("inductor", "trace", "none")
"""The explicit modes, each simpler than the one before. Under ``"auto"`` an executor that cannot take a computation
falls back to the next one down (:func:`simpler`), with one warning saying why; an explicit mode that cannot run is
an error."""


def simpler(mode: str) -> str:
    """The executor a computation falls back to when ``mode`` cannot take it (:data:`LADDER`; ``"none"`` stays)."""
    return LADDER[min(LADDER.index(mode) + 1, len(LADDER) - 1)]

RECORD_STEPS_CPU = 100
"""On a CPU, ``"auto"`` runs a run of fewer steps eagerly: on the 784-400-10 MLP at batch 128 recording the step
costs 0.26 s more set-up and replaying it saves 2.65 ms a step (12.3 against 14.95 ms), even after 99 steps
(``benchmarks/recording_cost.py``, RESULTS.md "Fast by default")."""

INDUCTOR_STEPS_CPU = 3000
"""On a CPU, ``"auto"`` compiles with inductor a run of at least this many steps (``benchmarks/epoch.py``: inductor
compiles a small network's step in 3-7 s on 2 cores and saves about 1 ms a step over the recorded one on the
784-400-10 MLP), and replays the recording otherwise."""


def check_mode(compile) -> str:
    """``compile`` checked against :data:`COMPILE_MODES` (one line naming the choices otherwise)."""
    if not isinstance(compile, str):
        raise ValueError(f"compile must be one of {COMPILE_MODES} (how a step runs), got {compile!r}")
    return choice("compile", compile, COMPILE_MODES)


def auto_mode(device: torch.device, steps: int | None = None, convolutional: bool = False) -> tuple[str, str]:
    """The executor ``"auto"`` picks, and why, for a run of ``steps`` steps (None: not known) on ``device``, of a
    network with (``convolutional``) or without convolutions.

    The rule, from ``benchmarks/suite.py`` and ``benchmarks/epoch.py`` on this project's 2-core CPU (RESULTS.md,
    "Fast by default"): the recorded step (``"trace"``) is faster than the eager one per step, but its recording
    costs 0.3-0.5 s, repaid after about :data:`RECORD_STEPS_CPU` steps; TorchScript's tracer cannot replay a
    convolution's gradient (``aten.convolution_backward`` takes a list of booleans it has no type for), so a
    convolutional network runs eagerly; inductor's fused step costs seconds of compilation per batch shape, repaid
    after :data:`INDUCTOR_STEPS_CPU` steps. On a GPU, where the recorded step replays each operation with host work
    of its own, the compiled graph (``"inductor"``) is the fast mode."""
    where = device.type.upper()
    if device.type == "cuda":
        return "inductor", "CUDA: the compiled graph (kernels fused, launches few)"
    if steps is not None and steps >= INDUCTOR_STEPS_CPU:
        return "inductor", f"{where}: {steps} steps repay inductor's compilation"
    if steps is not None and steps < RECORD_STEPS_CPU:
        return "none", f"{where}: {steps} steps do not repay a recording"
    if convolutional:
        return "none", f"{where}: the recorded step cannot replay a convolution's gradient"
    return "trace", f"{where}: the recorded step" + ("" if steps is None else f" ({steps} steps)")


def is_convolutional(*modules: torch.nn.Module) -> bool:
    """Whether any of ``modules`` holds a convolution (:func:`auto_mode` runs it eagerly on a CPU)."""
    return any(isinstance(m, torch.nn.modules.conv._ConvNd) for module in modules for m in module.modules())


def resolve(compile: str, device: torch.device, steps: int | None = None,
            convolutional: bool = False) -> tuple[str, str]:
    """``(executor, why)``: ``compile`` itself when explicit, else what :func:`auto_mode` picks."""
    mode = check_mode(compile)
    return auto_mode(device, steps, convolutional) if mode == "auto" else (mode, "asked for")


@contextlib.contextmanager
def _quiet():
    """Warnings of a recording that say nothing about the computation: shapes read as Python values,
    deprecations of ``torch.jit``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", "`torch.jit.trace(_method)?` is deprecated", FutureWarning)
        yield


def _shared_metadata_mode():
    """One fake-tensor mode for the metadata of every node ``make_fx`` records: without one it builds a mode per
    recorded operation, each capturing a Python stack (most of a recording's time)."""
    if TracingContext is None:  # another torch: the per-node modes
        return contextlib.nullcontext()
    return tracing(TracingContext(FakeTensorMode(allow_fallback_kernels=True)))


def record(fn: Callable, inputs) -> torch.fx.GraphModule:
    """``fn`` (tensors in, a tuple of tensors out) as one graph of ATen operations, recorded by running it once on
    ``inputs``, with Pyro's argument validation off (its checks read values on the host, which a graph cannot hold,
    and compute nothing). It draws what ``fn`` draws (callers restore the random state) and raises what ``fn``
    raises, or what the recording cannot follow (a tensor's value read on the host: a data-dependent branch)."""
    with _quiet(), _shared_metadata_mode(), pyro.validation_enabled(False):
        return make_fx(fn)(*inputs)


def replay(graph: torch.fx.GraphModule, inputs, mode: str) -> Callable:
    """``graph`` as a callable of ``inputs``-shaped tensors, run by executor ``mode`` (``"trace"`` or
    ``"inductor"``, see the module docstring)."""
    if mode == "trace":
        with _quiet(), torch.no_grad():
            traced = torch.jit.trace(graph, tuple(inputs), check_trace=False)

        def run(*args):
            with torch.jit.optimized_execution(False):
                return traced(*args)

        return run
    if mode == "inductor":
        return inductor_compile(graph, list(inputs), options={"fallback_random": True})
    raise ValueError(f"replay: mode must be 'trace' or 'inductor', got {mode!r}")


def first_line(error: Exception) -> str:
    """``Type: the first line of the message`` (at most 200 characters of it), for a fallback's one warning."""
    return f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:200]}"
