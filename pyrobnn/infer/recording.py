r"""Recording a computation as one graph of ATen operations, replaying it, and the one policy that picks and builds
the executor of a step.

Every fast path of pyrobnn is the same two moves. :func:`record` runs a function once on example tensors under
:func:`torch.fx.experimental.proxy_tensor.make_fx`, which follows it through Pyro's effect handlers, the estimators'
tensor subclasses, custom autograd functions and ``torch.autograd.grad`` alike, and keeps only the ATen operations it
reached: a graph with no Python in it. :func:`replay` then runs that graph without the Python that produced it:

- ``"trace"``: a TorchScript recording of the graph, replayed without TorchScript's optimisations: the same
  operations in the same order, random draws included, so a seed gives the eager numbers (built in milliseconds).
  A graph with an operation whose arguments TorchScript's tracer has no type for (the list of booleans of
  ``aten.convolution_backward`` and of the normalisations' backward passes, see :func:`replay`), and one the tracer
  refuses otherwise, is replayed by the FX graph's own generated Python, operation by operation;
- ``"inductor"``: the graph compiled by TorchInductor into fused kernels (seconds to build on a first run, read from
  inductor's on-disk cache on a later one; then the elementwise work over all weights is a few kernels), its random
  numbers drawn with torch's generator (``fallback_random``), so it too gives the eager draws.

One vocabulary names the executor everywhere (``fit``, ``fit_replicas``, ``svi_step``, ``sample_posterior``, the
command line's ``--compile`` and the studies): :data:`COMPILE_MODES`, ``"auto"`` (the default) choosing by
:func:`auto_mode` and, once a graph's costs are measured, :func:`inductor_repays`. One policy builds it
(:func:`build`, for the SVI step and the batched NUTS alike): under ``"auto"`` an executor that cannot take a
computation falls back to the next simpler one with one warning saying why; an explicit mode that cannot run raises
:class:`ExecutorFailed`, whose one line names the mode and the way out. A graph is a function of its inputs' shapes
and of Python values read while recording; callers key their graphs on what they read (batch shape, training mode,
...).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import warnings
from typing import Callable, TypeVar

import pyro
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from pyrobnn._compat import FakeTensorMode, TracingContext, inductor_cache_dir, inductor_compile, tracing
from pyrobnn.checks import choice

__all__ = ["COMPILE_MODES", "LADDER", "ExecutorFailed", "simpler", "build", "fall_back", "record", "replay",
           "check_mode", "auto_mode", "is_convolutional", "resolve", "first_line", "inductor_repays", "fingerprint",
           "ExecutorCosts", "RECORD_STEPS_CPU"]

T = TypeVar("T")

COMPILE_MODES = ("auto", "none", "trace", "inductor")
"""How a step (or a NUTS leapfrog leaf) runs: ``"none"``: eagerly, from Python; ``"trace"``: recorded once and
replayed as recorded; ``"inductor"``: recorded once and compiled by TorchInductor; ``"auto"``: chosen per device
and run by :func:`auto_mode`."""

LADDER = ("inductor", "trace", "none")
"""The explicit modes, each simpler than the one before: what ``"auto"`` falls back along (:func:`build`)."""


class ExecutorFailed(RuntimeError):
    """An explicit executor (``compile="trace"`` or ``"inductor"``) cannot run a computation; the message names the
    mode, why, and the way out (``compile="auto"`` or ``"none"``)."""


def simpler(mode: str) -> str:
    """The executor a computation falls back to when ``mode`` cannot take it (:data:`LADDER`; ``"none"`` stays)."""
    return LADDER[min(LADDER.index(mode) + 1, len(LADDER) - 1)]


def first_line(error: Exception) -> str:
    """``Type: the first line of the message`` (at most 200 characters of it), for a fallback's one warning."""
    return f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:200]}"


def fall_back(mode: str, requested: str, what: str, error: Exception, stacklevel: int = 3) -> str:
    """The executor policy when executor ``mode`` cannot build or run ``what`` (``"this step"``, ``"the NUTS leaf"``)
    because of ``error``: under ``requested == "auto"``, one warning and the next simpler executor (:func:`simpler`);
    for an explicit mode, :class:`ExecutorFailed` naming the mode and the way out."""
    if requested != "auto":
        raise ExecutorFailed(f"compile={mode!r} cannot run {what} ({first_line(error)}); use compile='auto' (the "
                             "fastest executor that runs it) or compile='none' (eager)") from error
    down = simpler(mode)
    warnings.warn(f"compile='auto': the {mode} executor cannot take {what}, so it runs {down} ({first_line(error)})",
                  RuntimeWarning, stacklevel=stacklevel)
    return down


def build(make: Callable[[str], T], mode: str, requested: str, what: str,
          passthrough: tuple[type[BaseException], ...] = (), errors: list | None = None) -> tuple[T, str]:
    """``(make(executor), executor)``: ``what`` built by ``mode``, or, when ``make`` raises, by the executor
    :func:`fall_back` names (``"auto"``), down to ``"none"``, for which ``make`` must build the eager computation;
    an explicit ``requested`` mode that cannot build raises :class:`ExecutorFailed`. Errors of ``passthrough`` types
    are the computation's own (out of memory, a model that cannot run at all) and propagate as they are; the others
    are appended to ``errors`` when given."""
    while True:
        try:
            return make(mode), mode
        except passthrough:
            raise
        except Exception as error:  # how a recording or a compiler refuses: of many types
            if mode == "none":
                raise
            if errors is not None:
                errors.append(error)
            mode = fall_back(mode, requested, what, error, stacklevel=4)


RECORD_STEPS_CPU = 100
"""On a CPU, ``"auto"`` runs a run of fewer steps eagerly: on the 784-400-10 MLP at batch 128 recording the step
costs 0.26 s more set-up and replaying it saves 2.65 ms a step (12.3 against 14.95 ms), even after 99 steps
(``benchmarks/recording_cost.py``, RESULTS.md "Fast by default")."""

PROBE_STEPS = 10
"""Under ``"auto"`` on a CPU, replays of a recorded step timed before :func:`inductor_repays` decides whether the
rest of the run repays inductor's compilation of it."""

INDUCTOR_STEP_FRACTION = 0.8
"""Before inductor has compiled a graph, its step is estimated at this fraction of the measured recorded step: the
median of ``benchmarks/suite.py``'s rows on the 2-core CPU (0.62-1.06 on LeNet-5, 0.74-0.85 on the MLP)."""

INDUCTOR_SECONDS = (15.0, 0.05)
"""Before inductor has compiled a graph on this machine, its compilation is estimated at ``a + b * nodes`` seconds
(2-core CPU: 27 s for the MLP's 221 operations, 28-50 s for LeNet-5's 455, with an empty cache)."""

MARGIN = 1.2
"""``"auto"`` compiles when the projected saving exceeds the compilation by this factor (the estimates are rough)."""


def check_mode(compile) -> str:
    """``compile`` checked against :data:`COMPILE_MODES` (one line naming the choices otherwise)."""
    if not isinstance(compile, str):
        raise ValueError(f"compile must be one of {COMPILE_MODES} (how a step runs), got {compile!r}")
    return choice("compile", compile, COMPILE_MODES)


def auto_mode(device: torch.device, steps: int | None = None) -> tuple[str, str]:
    """The executor ``"auto"`` starts with, and why, for a run of ``steps`` steps (None: not known) on ``device``.

    On a GPU, where the recorded step replays each operation with host work of its own, the compiled graph
    (``"inductor"``). On a CPU (``benchmarks/suite.py``, RESULTS.md "Fast by default"): a run of fewer than
    :data:`RECORD_STEPS_CPU` steps eagerly (the recording is not repaid); otherwise the recorded step (``"trace"``),
    which, once :data:`PROBE_STEPS` replays are timed, moves to inductor when :func:`inductor_repays` says the rest
    of the run repays its compilation, measured for this graph on an earlier run or estimated from its size."""
    where = device.type.upper()
    if device.type == "cuda":
        return "inductor", "CUDA: the compiled graph (kernels fused, launches few)"
    if steps is not None and steps < RECORD_STEPS_CPU:
        return "none", f"{where}: {steps} steps do not repay a recording"
    if steps is None:
        return "trace", f"{where}: the recorded step"
    return "trace", f"{where}: the recorded step, compiled by inductor once measured to repay it over {steps} steps"


def is_convolutional(*modules: torch.nn.Module) -> bool:
    """Whether any of ``modules`` holds a convolution."""
    return any(isinstance(m, torch.nn.modules.conv._ConvNd) for module in modules for m in module.modules())


def resolve(compile: str, device: torch.device, steps: int | None = None) -> tuple[str, str]:
    """``(executor, why)``: ``compile`` itself when explicit, else what :func:`auto_mode` starts with."""
    mode = check_mode(compile)
    return auto_mode(device, steps) if mode == "auto" else (mode, "asked for")


# -- recording and replaying ---------------------------------------------------------------------------------------

@contextlib.contextmanager
def _quiet():
    """Warnings of a recording that say nothing about the computation: shapes read as Python values,
    deprecations of ``torch.jit``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", "`torch.jit.(trace|script)(_method)?` is deprecated", FutureWarning)
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
        replayed = _pruned(graph)
        if any(node.op == "call_function" and _untypeable(node) for node in replayed.graph.nodes):
            # TorchScript's tracer has no type for these (a convolution's gradient). Calling each through a scripted
            # function that holds its arguments typed them, but once a second such graph was traced (a last partial
            # batch records its own) the first one's next call failed inside TorchScript's interpreter (torch 2.14:
            # "stack.size() >= inst.N" INTERNAL ASSERT, or a segmentation fault; LeNet-5 on CIFAR-10, 5,000
            # examples, 2 epochs, benchmarks/epoch.py). The FX graph's own Python replays them safely.
            return replayed
        try:
            with _quiet(), torch.no_grad():
                traced = torch.jit.trace(replayed, tuple(inputs), check_trace=False)
        except RuntimeError:  # an argument of a kind the tracer has no type for
            return replayed

        def run(*args):
            with torch.jit.optimized_execution(False):
                return traced(*args)

        return run
    if mode == "inductor":
        with torch.enable_grad():  # under no_grad inductor loses track of the graph's shapes (KeyError: s25)
            return inductor_compile(graph, list(inputs), options={"fallback_random": True})
    raise ValueError(f"replay: mode must be 'trace' or 'inductor', got {mode!r}")


def _pruned(graph: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of ``graph`` without the operations nothing reads (random draws stay: they move the generator), its
    tensor attributes (the parameters a recording read as constants) shared with ``graph``, not copied."""
    copy = torch.fx.Graph()
    copy.output(copy.graph_copy(graph.graph, {}))
    module = torch.fx.GraphModule(graph, copy)
    module.graph.eliminate_dead_code()
    module.recompile()
    return module


def _untypeable(node: torch.fx.Node) -> bool:
    """Whether ``node`` calls an ATen operation with a list of booleans, which TorchScript's tracer cannot type."""
    return isinstance(node.target, torch._ops.OpOverload) and any(
        isinstance(a, (list, tuple)) and any(isinstance(v, bool) for v in a) for a in (*node.args,
                                                                                        *node.kwargs.values()))


# -- what inductor costs, measured -------------------------------------------------------------------------------

def fingerprint(graph: torch.fx.GraphModule, inputs) -> str:
    """A name of ``graph`` run on ``inputs``-shaped tensors, the same in every process for the same computation:
    a hash of its code, of its inputs' and constants' shapes, dtypes and strides, of the device and torch's version
    (what inductor's cache keys on, less its settings)."""
    constants = [getattr(graph, n.target) for n in graph.graph.nodes if n.op == "get_attr"]
    described = [(tuple(t.shape), str(t.dtype), tuple(t.stride()), t.device.type) for t in (*inputs, *constants)
                 if torch.is_tensor(t)]
    return hashlib.sha256(repr((graph.code, described, torch.__version__)).encode()).hexdigest()[:24]


class ExecutorCosts:
    """What each executor cost on a graph, measured on this machine: ``{fingerprint: {"trace_ms": ..,
    "inductor_ms": .., "inductor_s": ..}}`` (ms a step, and seconds of inductor's compilation, the last measured),
    a JSON file in inductor's cache folder: emptying that cache forgets them, as it forgets the compiled graphs, so
    a compilation measured here is one a later run reads back from that cache. Unreadable or unwritable files are
    ignored (the estimates stand in)."""

    NAME = "pyrobnn_executor_costs.json"

    def __init__(self, path: str | None = None):
        self._path = path

    @property
    def path(self) -> str:
        """The file: ``path`` when given, else :data:`NAME` in inductor's cache folder as it is now."""
        return self._path if self._path is not None else os.path.join(inductor_cache_dir(), self.NAME)

    def read(self) -> dict:
        try:
            with open(self.path) as file:
                costs = json.load(file)
        except (OSError, ValueError):
            return {}
        return costs if isinstance(costs, dict) else {}

    def get(self, key: str) -> dict:
        entry = self.read().get(key)
        return entry if isinstance(entry, dict) else {}

    def update(self, key: str, **figures: float) -> None:
        """Merge ``figures`` into the entry of ``key`` (written whole, then renamed: a reader never sees half)."""
        try:
            costs = self.read()
            costs[key] = {**(costs.get(key) if isinstance(costs.get(key), dict) else {}),
                          **{k: round(float(v), 4) for k, v in figures.items()}}
            temporary = f"{self.path}.{os.getpid()}"
            with open(temporary, "w") as file:
                json.dump(costs, file)
            os.replace(temporary, self.path)
        except OSError:
            pass


COSTS = ExecutorCosts()
"""The measured costs every executor reads and writes."""


def inductor_repays(key: str, nodes: int, trace_ms: float, steps_left: int,
                    costs: ExecutorCosts = COSTS) -> tuple[bool, str]:
    """Whether compiling the graph ``key`` (of ``nodes`` operations) with inductor repays over ``steps_left`` more
    steps, its recorded step measured at ``trace_ms``, and why: its compilation is the last one measured for this
    graph (a later run reads it from inductor's cache), or estimated from its size (:data:`INDUCTOR_SECONDS`); its
    step is the one measured, or :data:`INDUCTOR_STEP_FRACTION` of the recorded one; it repays when
    ``steps_left * saving > MARGIN * compilation``."""
    known = costs.get(key)
    seconds = known.get("inductor_s")
    seconds_said = f"{seconds:.1f} s measured" if seconds is not None else ""
    if seconds is None:
        seconds = INDUCTOR_SECONDS[0] + INDUCTOR_SECONDS[1] * nodes
        seconds_said = f"{seconds:.0f} s estimated"
    step = known.get("inductor_ms")
    step_said = "measured" if step is not None else "estimated"
    if step is None:
        step = INDUCTOR_STEP_FRACTION * trace_ms
    saving = steps_left * (trace_ms - step) / 1e3
    repays = saving > MARGIN * seconds
    why = (f"{steps_left} steps at {trace_ms:.2f} ms recorded against {step:.2f} ms compiled ({step_said}) "
           f"{'repay' if repays else 'do not repay'} inductor's {seconds_said}")
    return repays, why
