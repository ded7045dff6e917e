r"""The training loop: minibatch SVI on the annealed ELBO, with validation, checkpoints and resume.

One step on minibatch :math:`i` of epoch :math:`e` minimises

.. math:: -\frac{N}{B}\sum_{b}\log p(y_b|x_b,w) + \beta_{e,i}\,\mathrm{KL}(q\|p),
          \quad w \sim q \ (\text{``num\_particles``} \text{ samples})

with one ``torch.optim`` optimiser over every parameter of
the guide and the model's deterministic parameters. It is the loop a Pyro
user would write around :class:`pyro.infer.SVI`, with what a long run needs:
a β schedule (:mod:`pyrobnn.infer.schedules`, applied by
:func:`~pyrobnn.handlers.kl_annealing`), the optimiser with its learning-rate
schedule and warm-up as one object (:mod:`pyrobnn.infer.optim`), per-epoch
callbacks (validation, sparsity: :mod:`pyrobnn.analysis`), a rich progress bar, an atomic checkpoint of the last
completed epoch that restores parameters, optimiser, scheduler, epoch and every RNG (a resumed run
continues exactly as the uninterrupted one), and a stop with a clear message
when the loss becomes NaN/inf (the checkpoint of the last good epoch is written).
The checkpoint is written at most every ``checkpoint_every`` seconds, at the end, and when training stops; in
between, the last completed epoch's state is kept in memory (:class:`_CheckpointWriter`), so runs of many short
epochs (UCI: 400 epochs of 4 steps) do not spend their time writing files.

The optimiser holds the guide's and the model's own ``nn.Parameter`` s, so the
loop does not depend on Pyro's global parameter store.
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import pyro
import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from torch.fx.experimental.proxy_tensor import make_fx

from pyrobnn.checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state
from pyrobnn.checks import check_labels, choice, nonnegative, nonnegative_int, positive_int
from pyrobnn.device import device_of, resolve_device
from pyrobnn.guides.base import SiteGuide, direct_parameters
from pyrobnn.handlers import ESTIMATORS, kl_annealing
from pyrobnn.handlers import estimator as estimator_handler
from pyrobnn.handlers.node_draws import check_components
from pyrobnn.handlers.particles import ParticlesUnsupported, mismatched_rows_unsupported
from pyrobnn.infer.elbo import ELBOTerms, MeanFieldELBO
from pyrobnn.infer.optim import Optim, make_scheduler, per_example_rate, trained_parameters
from pyrobnn.infer.predict import PROTOTYPE_ROWS, predictive_outputs
from pyrobnn.infer.schedules import Constant
from pyrobnn.model.protocol import network_model

__all__ = ["fit", "svi_step", "compiled_terms", "TRACE", "check_objective", "TrainingDiverged", "History", "Callback",
           "PRECISIONS"]

PRECISIONS = ("fp32", "bf16")
"""Arithmetic of the network's matmuls and convolutions: float32, or bfloat16 under ``torch.autocast`` (the
KL, the guide's parameters and the log-likelihood stay in float32)."""


def _precision(precision: str, device: torch.device):
    if choice("precision", precision, PRECISIONS) == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)

Callback = Callable[[int, dict], None]
"""Called after each epoch with ``(epoch, record)``; it may add entries to the record (e.g.
:func:`pyrobnn.analysis.prune.record_sparsity`). A callback with a ``setup(model, guide)`` method (e.g.
:class:`pyrobnn.analysis.evaluate.Validation`) has it called once before the first epoch."""


class TrainingDiverged(FloatingPointError):
    """The loss became NaN or infinite; training stopped and the last good checkpoint was kept."""


@dataclass
class History:
    """Per-epoch records (``loss``, ``nll``, ``kl``, ``beta``, ``lr``, ``seconds``, ``val_*``)."""

    epochs: list[dict] = field(default_factory=list)

    def __getitem__(self, key: str) -> list:
        return [record.get(key) for record in self.epochs]

    @property
    def last(self) -> dict:
        return self.epochs[-1] if self.epochs else {}


def check_objective(estimator: str, num_particles: int, elbo=None) -> None:
    """The estimator is a key of :data:`~pyrobnn.handlers.ESTIMATORS`, and an explicit ``elbo`` (which draws its
    own particles in a loop) comes with one vectorized particle: the rules of :func:`svi_step` and :func:`fit`."""
    choice("estimator", estimator, ESTIMATORS)
    if elbo is not None and num_particles > 1:
        raise ValueError("pass num_particles to the elbo (it loops) or to svi_step/fit (one vectorized pass), "
                         "not both: got elbo= and num_particles > 1")


def svi_step(model, guide, optim: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, *,
             elbo=None, beta: float = 1.0, estimator: str = "sample", num_particles: int = 1,
             precision: str = "fp32", compile: bool | str = False):
    """One gradient step on the β-annealed negative ELBO of a minibatch; returns its
    :class:`~pyrobnn.infer.elbo.ELBOTerms`.

    ``estimator`` (a key of :data:`pyrobnn.handlers.ESTIMATORS`) and ``num_particles`` choose the
    Monte-Carlo estimator; the particles run in one vectorized pass, or in a loop when the network
    uses a Bayesian parameter outside a Linear/Conv layer. An explicit ``elbo`` draws its own
    particles (its ``num_particles``), so it is refused together with ``num_particles > 1``.
    ``precision="bf16"`` runs the network under ``torch.autocast`` (see :data:`PRECISIONS`).
    ``compile`` records the loss terms and their gradient once per batch shape as one graph of ATen operations and
    replays it (:class:`_RecordedStep`): ``"trace"`` (:data:`TRACE`) replays it as recorded (the eager numbers
    without the per-step Python), True or the name of a ``torch.compile`` backend compiles it (one graph, no
    breaks at Pyro's sites). The returned terms are then not differentiable (the gradient is already taken). The
    update is skipped (and the terms returned) when the loss is not finite. A pyrobnn guide reads its parameters
    without ``pyro.param`` messages here (:func:`~pyrobnn.guides.base.direct_parameters`): ``optim`` already holds
    them, and the messages are a large part of a small network's step.
    """
    check_objective(estimator, num_particles, elbo)
    args = (model, guide, x, y, elbo, beta, estimator, num_particles, precision)
    if compile:  # one recorder per guide, backend and estimator: a fallback concerns that model only
        step = _COMPILED.setdefault(guide, {}).get((compile, estimator))
        if step is None:
            step = _COMPILED[guide][compile, estimator] = _RecordedStep(compile)
        terms, gradients = step(*args)
    else:
        terms, gradients = _terms(*args), None
    _update(optim, terms.loss, gradients)
    return terms


_COMPILED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def compiled_terms(backend: bool | str = True) -> Callable:
    """The loss terms of :func:`svi_step`, ``terms(model, guide, x, y, elbo, beta, estimator, num_particles,
    precision)``, computed under ``torch.compile`` (``backend``: True for inductor, or a backend's name, e.g.
    ``"aot_eager"``), for the steps of one training run; the gradient then comes from the compiled backward. A
    plain SVI script gets the same with ``torch.compile`` around its loss::

        loss_fn = torch.compile(lambda x, y: MeanFieldELBO().differentiable_loss(model, guide, x, y))

    Pyro's effect handlers run in Python between compiled regions (graph breaks), which bounds the gain
    (``benchmarks/suite.py`` measures it). Where compiling fails (an operation or platform ``torch.compile`` does
    not support) it warns once and the step runs eagerly. ``backend="trace"`` (:data:`TRACE`) records the terms
    with ``torch.jit.trace`` instead and replays the recording (:class:`_Traced`)."""
    backend = "inductor" if backend is True else backend
    if not isinstance(backend, str):
        raise ValueError(f"compile must be True, False or the name of a torch.compile backend (or {TRACE!r}), got "
                         f"{backend!r}")
    if backend == TRACE:
        return _Traced()
    compiled, fell_back = torch.compile(_terms, backend=backend), []

    def terms(*args):
        if fell_back:
            return _terms(*args)
        try:
            return compiled(*args)
        except (ParticlesUnsupported, torch.OutOfMemoryError):
            raise
        except Exception as error:  # an error of the model itself is raised again by the eager step
            result = _terms(*args)
            fell_back.append(error)
            _warn_compile_failed(backend, error)
            return result

    return terms


def _first_line(error: Exception) -> str:
    """``Type: the first line of the message`` (at most 200 characters of it)."""
    return f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:200]}"


def _warn_compile_failed(backend, error: Exception) -> None:
    """The one warning of a step whose ``torch.compile`` backend failed: it trains eagerly from now on."""
    warnings.warn(f"torch.compile (backend {backend!r}) failed on this model, training eagerly instead: "
                  f"{_first_line(error)}", RuntimeWarning, stacklevel=4)


TRACE = "trace"
"""``compile=TRACE``: the step's operations recorded once by ``torch.jit.trace`` and replayed (:class:`_Traced`)."""

MAX_TRACES = 8
"""Recordings one run keeps (one per batch shape, training mode and parameter storage), then eagerly."""


class _Traced:
    r"""The loss terms of :func:`svi_step` as a TorchScript graph: the first step of each batch shape records every
    tensor operation of the ELBO (:func:`torch.jit.trace`, the parameters as the graph's inputs) and later steps
    replay the graph, so Pyro's effect handlers, the guide's and model's Python and the tensor subclasses of the
    estimators run once per shape instead of once per step. On a small network (UCI regression: 13-50-1,
    batches of 128) that Python is most of a step (``benchmarks/uci_speed.py``).

    The replay runs the same operations in the same order without TorchScript's optimisations, the random draws
    included (each draws anew from the global generator), so a seed gives the eager step's numbers; the recording
    runs once more than the step it records, so the random state is restored after it. What a graph cannot follow
    is Python state read at recording time: the graph is recorded again when the batch shape, the training
    mode, ``num_data`` or a parameter's storage changes (at most :data:`MAX_TRACES` per run, then eagerly; β is an
    input of the graph, so a warm-up schedule replays one graph), and a
    model whose Python reads tensor *values* to choose what to compute (a data-dependent branch) must not be
    traced. Where recording fails it warns once and the run trains eagerly."""

    def __init__(self):
        self.graphs: dict = {}
        self.failed: Exception | None = None
        self.parameters: dict = {}  # (model, guide) ids -> their parameters, the graphs' inputs

    def __call__(self, model, guide, x, y, elbo, beta, estimator, num_particles, precision):
        args = (model, guide, x, y, elbo, beta, estimator, num_particles, precision)
        key, inputs = _recording_key(self.parameters, *args)
        graph = self.graphs.get(key)
        if graph is None and (self.failed is not None or len(self.graphs) >= MAX_TRACES):
            return _terms(*args)
        if graph is None:
            graph = self.graphs[key] = self._record(args, inputs)
            if graph is None:
                return _terms(*args)
        with torch.jit.optimized_execution(False):
            loss, nll, kl = graph(*inputs)
        return ELBOTerms(loss, nll, kl)

    def _record(self, args, inputs):
        """The graph of the step's terms, recorded on ``inputs`` (x, y, β as a tensor, the parameters)."""
        model, guide, x, y, elbo, beta, estimator, num_particles, precision = args
        rows = x.shape[0]

        def step(x, y, beta, *_params):  # the parameters are read from the modules: the same tensors as the inputs
            terms = _terms(model, guide, x, y, elbo, beta, estimator, num_particles, precision, rows)
            return terms.loss, terms.nll, torch.as_tensor(terms.kl).to(terms.nll)

        state = rng_state()
        try:
            with _quiet_tracing():
                return torch.jit.trace(step, inputs, check_trace=False)
        except (ParticlesUnsupported, torch.OutOfMemoryError):
            raise
        except Exception as error:  # an error of the model itself is raised again by the eager step
            self.failed = error
            warnings.warn(f"compile={TRACE!r}: torch.jit.trace failed on this model, training eagerly instead: "
                          f"{_first_line(error)}", RuntimeWarning, stacklevel=4)
            return None
        finally:
            set_rng_state(state)


def _recording_key(parameters: dict, model, guide, x, y, elbo, beta, estimator, num_particles, precision):
    """What a recorded step depends on beyond its inputs, and its inputs: x, y, β as a tensor and the trained
    parameters (cached in ``parameters`` by model and guide)."""
    params = parameters.get((id(model), id(guide)))
    if params is None:
        params = parameters[id(model), id(guide)] = trained_parameters(model, guide)
    key = (x.shape, x.dtype, x.device, y.shape, y.dtype, model.training, model.num_data,
           tuple(p.data_ptr() for p in params), id(elbo), estimator, num_particles, precision)
    return key, (x, y, torch.tensor(float(beta), dtype=x.dtype, device=x.device), *params)


def _settle(args) -> None:
    """One eager pass of the terms without gradients, the random state restored after it."""
    state = rng_state()
    try:
        with torch.no_grad():
            _terms(*args)
    finally:
        set_rng_state(state)


@contextlib.contextmanager
def _quiet_tracing():
    """Warnings of a recording that say nothing about the model: shapes read as Python values, deprecations."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", "`torch.jit.trace(_method)?` is deprecated", FutureWarning)
        yield


class _RecordedStep:
    r"""The step of :func:`svi_step` with ``compile``: the loss terms *and* the gradient of the loss with respect to
    every trained parameter, recorded as one graph of ATen operations and replayed, so that a step runs neither
    Pyro's effect handlers nor the model's Python nor autograd's bookkeeping.

    The recording is :func:`torch.fx.experimental.proxy_tensor.make_fx` of the eager terms followed by
    ``torch.autograd.grad`` (it traces through autograd, the estimators' tensor subclasses and custom autograd
    functions alike), once per batch shape and whatever else :class:`_Traced` keys its graphs on. The graph is
    then replayed

    - ``compile=TRACE``: as a TorchScript recording of it (:func:`torch.jit.trace`), without autograd: the eager
      step's operations and random draws, so a seed gives the eager numbers;
    - ``compile=True`` or a backend's name: compiled by ``torch.compile`` as one graph, with no graph breaks at
      Pyro's sites (inductor fuses the elementwise work over all weights, and draws its random numbers with its own
      generator, seeded from torch's).

    Where the gradient cannot be recorded (a model whose Python reads a tensor's value, e.g. Pyro's argument
    validation), the step falls back to :func:`compiled_terms` (the terms alone, differentiated by autograd); where
    the backend cannot compile the graph, it warns once and trains eagerly."""

    def __init__(self, backend: bool | str):
        self.backend = backend
        self.fallback = compiled_terms(backend)
        self.graphs: dict = {}
        self.parameters: dict = {}
        self.failed: Exception | None = None  # why the gradient is not recorded (the fallback runs)

    def __call__(self, model, guide, x, y, elbo, beta, estimator, num_particles, precision):
        """``(terms, [(parameter, gradient), ...])``; ``(differentiable terms, None)`` from the fallback."""
        args = (model, guide, x, y, elbo, beta, estimator, num_particles, precision)
        if self.failed is not None:
            return self.fallback(*args), None
        nonnegative("beta (KL weight)", beta)  # the graph's β is a tensor input, never read while recording
        key, inputs = _recording_key(self.parameters, *args)
        recorded = self.graphs.get(key)
        if recorded is None:
            if len(self.graphs) >= MAX_TRACES:
                return _terms(*args), None
            if not self.graphs:  # a guide's first call may move its parameters (a NormalGuide packs them into one
                _settle(args)  # storage): one eager pass first, so that the recording reads where they stay
                key, inputs = _recording_key(self.parameters, *args)
            recorded = self._record(args, inputs)
            if recorded is None:
                return self.fallback(*args), None
            self.graphs[key] = recorded
        replay, trained = recorded
        try:
            with torch.no_grad():
                loss, nll, kl, *gradients = replay(*inputs)
        except (ParticlesUnsupported, torch.OutOfMemoryError):
            raise
        except Exception as error:  # the backend cannot compile the graph (compiling happens at its first call)
            if self.backend == TRACE:
                raise
            self.failed, self.fallback = error, _terms
            _warn_compile_failed(self.backend, error)
            return _terms(*args), None
        params = inputs[3:]
        return ELBOTerms(loss, nll, kl), [(params[i], gradient) for i, gradient in zip(trained, gradients)]

    def _record(self, args, inputs):
        """``(replay, trained)``: the replay of the graph of the step's terms and of the loss's gradient with
        respect to the parameters ``inputs[3:][i]`` for ``i`` in ``trained`` (those that require and receive a
        gradient), or None where it cannot be recorded (:attr:`failed` says why)."""
        state = rng_state()
        try:
            graph, trained = record_gradient(args, inputs)
            set_rng_state(state)
            if self.backend == TRACE:
                replay = script_replay(graph, inputs)
            else:
                inductor = self.backend in (True, "inductor")
                replay = torch.compile(graph, backend="inductor" if inductor else self.backend, dynamic=False,
                                       options={"fallback_random": True} if inductor else None)
            return replay, trained
        except (ParticlesUnsupported, torch.OutOfMemoryError):
            raise
        except Exception as error:  # the fallback records the terms alone (and raises an error of the model)
            self.failed = error
            return None
        finally:
            set_rng_state(state)


def record_gradient(args, inputs) -> tuple[torch.fx.GraphModule, tuple[int, ...]]:
    """The step's terms and the loss's gradient as one graph of ATen operations (:func:`make_fx`), recorded on
    ``inputs`` = ``(x, y, β as a tensor, *tensors)``, where ``tensors`` are the model's and guide's own parameters
    and buffers (the very tensors the modules hold, so the recording follows them as inputs, not constants):
    ``(graph, trained)``, the graph returning ``(loss, nll, kl, *gradients)``, one gradient for each
    ``tensors[i]``, ``i`` in ``trained`` (those that require and receive a gradient). It draws random numbers
    (the caller restores the random state) and raises what the model raises, or what the recording cannot follow
    (a value read on the host)."""
    model, guide, x, y, elbo, beta, estimator, num_particles, precision = args
    rows, tensors = x.shape[0], inputs[3:]
    wrt = [i for i, t in enumerate(tensors) if t.requires_grad]
    trained = []

    def step(x, y, beta, *tensors):
        terms = _terms(model, guide, x, y, elbo, beta, estimator, num_particles, precision, rows,
                       validate_beta=False)
        gradients = torch.autograd.grad(terms.loss, [tensors[i] for i in wrt], allow_unused=True)
        trained[:] = [i for i, gradient in zip(wrt, gradients) if gradient is not None]
        return (terms.loss.detach(), terms.nll.detach(), torch.as_tensor(terms.kl).to(terms.nll).detach(),
                *(gradient for gradient in gradients if gradient is not None))

    with _quiet_tracing(), _shared_metadata_mode():
        graph = make_fx(step)(*inputs)
    return graph, tuple(trained)


def script_replay(graph: torch.fx.GraphModule, inputs) -> Callable:
    """``graph`` recorded by :func:`torch.jit.trace` on ``inputs`` and replayed without TorchScript's
    optimisations: the same operations in the same order, random draws included (:data:`TRACE`)."""
    with _quiet_tracing(), torch.no_grad():
        traced = torch.jit.trace(graph, inputs, check_trace=False)

    def replay(*inputs):
        with torch.jit.optimized_execution(False):
            return traced(*inputs)

    return replay


def _shared_metadata_mode():
    """One fake-tensor mode for the metadata of every node ``make_fx`` records: without one it builds a mode per
    recorded operation, each capturing a Python stack (most of a recording's time)."""
    try:
        from torch._guards import TracingContext, tracing
        from torch._subclasses.fake_tensor import FakeTensorMode
    except ImportError:  # another torch: the per-node modes
        return contextlib.nullcontext()
    return tracing(TracingContext(FakeTensorMode(allow_fallback_kernels=True)))


def _terms(model, guide, x, y, elbo, beta, estimator, num_particles, precision, rows=None, validate_beta=True):
    """The step's :class:`ELBOTerms`; ``rows``: the batch size as a Python int (``x.shape[0]``, which a trace
    records as a tensor); ``validate_beta=False``: β was checked by the caller (a graph's input)."""
    elbo = elbo if elbo is not None else MeanFieldELBO()
    arithmetic = _precision(precision, x.device)
    rows = x.shape[0] if rows is None else rows
    warn = estimator != "sample" or num_particles > 1  # the default, one weight sample, is no choice to report
    try:
        with arithmetic, kl_annealing(beta=beta, validate=validate_beta), direct_parameters(), \
                estimator_handler(estimator, num_particles, rows, warn=warn) as handler, \
                mismatched_rows_unsupported(handler.particles):
            terms = elbo.terms(model, guide, x, y)
    except ParticlesUnsupported:
        with arithmetic, kl_annealing(beta=beta, validate=validate_beta), direct_parameters(), \
                estimator_handler(estimator, 1, rows, warn=warn):
            terms = MeanFieldELBO(num_particles=num_particles).terms(model, guide, x, y)
    return terms


def _update(optim: torch.optim.Optimizer, loss: torch.Tensor, gradients=None) -> None:
    """``optim`` steps on ``loss``'s gradient, unless the loss is not finite; ``gradients``
    (``[(parameter, gradient), ...]``, from a recorded step) are that gradient, already computed (parameters not
    listed get none). A fused optimiser (as :func:`~pyrobnn.infer.optim.make_optimizer` makes) is told so on the
    device (``found_inf``, as ``torch.amp.GradScaler`` does), so the step costs no device-to-host synchronisation;
    another reads the loss."""
    fused = getattr(optim, "_step_supports_amp_scaling", False)
    if not fused and not torch.isfinite(loss):
        return
    optim.zero_grad(set_to_none=True)
    if gradients is None:
        loss.backward()
    else:
        for parameter, gradient in gradients:  # a fused optimiser reads a gradient as laid out like its parameter
            parameter.grad = gradient if gradient.stride() == parameter.stride() else gradient.contiguous()
    if not fused:
        optim.step()
        return
    optim.found_inf = torch.isnan(loss.detach() * 0).float()  # inf * 0 and nan * 0 are nan
    try:
        optim.step()
    finally:
        del optim.found_inf


def _check_data(model, guide, x: torch.Tensor, y: torch.Tensor, what: str, transform=None) -> None:
    """Shape and label checks done once on the whole dataset, not on every step."""
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"{what}: x has {x.shape[0]} examples but y has {y.shape[0]}")
    first = x[:1] if transform is None else transform(x[:1].to(device_of(guide, model)))
    model.check_input(first)
    if model.task == "classification":
        with pyro.poutine.block():
            num_classes = predictive_outputs(model, guide, first, num_samples=1, vectorized=False).shape[-1]
        check_labels(y, num_classes, f"{what} labels")


def prepared_for_training(model, guide, x: torch.Tensor, y: torch.Tensor, device, transform=None):
    """The model as :class:`~pyrobnn.model.protocol.NetworkModel` (a Pyro model written by hand is traced on the
    first rows of the data) with the guide's parameters made, so the optimiser can be built: a pyrobnn guide or
    a Pyro autoguide that has not yet met the model runs once on those rows (hidden from every handler), as
    ``pyro.infer.SVI`` would on its first step."""
    model = network_model(model)
    unready = (isinstance(guide, SiteGuide) and not guide.ready) or getattr(guide, "prototype_trace", False) is None
    if not unready and getattr(model, "traced", True):
        return model
    first, targets = x[:PROTOTYPE_ROWS].to(device), y[:PROTOTYPE_ROWS].to(device)
    first = first if transform is None else transform(first)
    model = network_model(model, first, targets)
    if isinstance(guide, SiteGuide):
        guide.set_up(first, targets)
    elif unready:  # an autoguide before its first call
        with pyro.poutine.block():
            guide(first, targets)
    return model


def checked_fit_options(x, epochs, batch_size, num_particles, optimizer, estimator, elbo, num_data,
                        precision) -> tuple[int, int, int]:
    """The checks of :func:`fit`'s options that hold for any training on ``x``, before anything runs:
    ``(epochs, batch_size, num_particles)``, each a positive int."""
    epochs = positive_int("epochs", epochs)
    batch_size = positive_int("batch_size", batch_size)
    num_particles = positive_int("num_particles", num_particles)
    if not callable(optimizer):
        raise TypeError(f"optimizer must be an optimizer factory (model, guide) -> torch.optim.Optimizer, e.g. "
                        f"pyrobnn.infer.optim.Optim(lr=1e-3), got {optimizer!r}")
    check_objective(estimator, num_particles, elbo)
    if num_data is not None and (not isinstance(num_data, int) or num_data < x.shape[0]):
        raise ValueError(f"num_data must be an int >= len(x) = {x.shape[0]} (the full training-set size), "
                         f"got {num_data!r}")
    choice("precision", precision, PRECISIONS)
    return epochs, batch_size, num_particles


def built_optimizer(optimizer, model, guide) -> tuple[torch.optim.Optimizer, int]:
    """``optimizer(model, guide)``, checked, and the optimiser steps of its warm-up."""
    optim = optimizer(model, guide)
    if not isinstance(optim, torch.optim.Optimizer):
        raise TypeError(f"optimizer(model, guide) must return a torch.optim.Optimizer, got {type(optim).__name__}")
    return optim, nonnegative_int("warmup_steps of the optimizer", getattr(optimizer, "warmup_steps", 0))


def epoch_batches(rows: int, batch_size: int, seed: int, epoch: int) -> tuple[torch.Tensor, ...]:
    """The row indices of epoch ``epoch``'s batches: a permutation seeded by ``seed`` and the epoch."""
    order = torch.randperm(rows, generator=torch.Generator().manual_seed(seed * 100003 + epoch))
    return order.split(batch_size)


def batch(x: torch.Tensor, y: torch.Tensor, idx: torch.Tensor, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``idx`` of ``x`` and ``y`` on ``device`` (data kept on the device is sliced there)."""
    return (x[idx.to(x.device)].to(device, non_blocking=True), y[idx.to(y.device)].to(device, non_blocking=True))


def warm_up(optim: torch.optim.Optimizer, rates: list[float], fraction: float) -> None:
    """Each group's learning rate at ``min(1, fraction)`` of its scheduled rate ``rates[i]``."""
    for group, rate in zip(optim.param_groups, rates):
        group["lr"] = rate * min(1.0, fraction)


def fit(
    model,
    guide,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int = 10,
    batch_size: int = 128,
    optimizer: Callable[..., torch.optim.Optimizer] = Optim(),
    beta: Callable[[int, int, int], float] = Constant(1.0),
    estimator: str = "sample",
    num_particles: int = 1,
    elbo=None,
    num_data: int | None = None,
    transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
    precision: str = "fp32",
    compile: bool | str = False,
    seed: int = 0,
    device: str | torch.device = "auto",
    checkpoint: str | Path | None = None,
    checkpoint_every: float = 60.0,
    resume: bool = False,
    config: Optional[dict] = None,
    progress: bool = True,
    on_epoch_end: Callback | Sequence[Callback] | None = None,
) -> History:
    r"""Train ``guide`` (and the model's deterministic parameters) on ``(x, y)`` by SVI.

    :param model: a :class:`~pyrobnn.BayesianNetwork` (its ``num_data`` is set to ``num_data``).
    :param guide: a pyrobnn guide built on ``model`` (e.g. :class:`~pyrobnn.NormalGuide`).
    :param x, y: training inputs and targets (tensors, e.g. uint8 images; moved to the device batch by batch,
        so data already on the device stays there).
    :param epochs: number of passes over the data.
    :param batch_size: minibatch size B; the likelihood is scaled by N/B.
    :param optimizer: an optimizer factory ``(model, guide) -> torch.optim.Optimizer`` that may carry its
        ``schedule`` (a learning-rate multiplier per epoch) and ``warmup_steps``: :class:`~pyrobnn.infer.optim.Optim`
        (Adam or SGD, default ``Optim()``: Adam at 1e-3), :class:`~pyrobnn.infer.optim.TwoGroupSGD`, or any callable.
    :param beta: KL-weight schedule ``beta(epoch, step, steps_per_epoch)``, see :mod:`pyrobnn.infer.schedules`.
    :param estimator: a key of :data:`pyrobnn.handlers.ESTIMATORS`: ``"sample"`` (weight sampling),
        ``"local"`` (local reparameterization), ``"flipout"`` or ``"vdp"`` (VDP++ moments).
    :param num_particles: posterior samples per step, drawn in one vectorized pass (Blundell et al. use 5).
    :param elbo: the ELBO (default :class:`~pyrobnn.MeanFieldELBO`); it draws its own particles, so
        ``num_particles`` must then be 1.
    :param num_data: the training-set size N that scales the likelihood (default ``len(x)``; under data-parallel
        training each process passes its shard and the full N, see :mod:`pyrobnn.infer.distributed`).
    :param transform: applied to every training batch on the device (augmentation, uint8 to float:
        :class:`pyrobnn.data.augment.ImageAugment`).
    :param precision: ``"fp32"`` or ``"bf16"`` (the network under ``torch.autocast``; KL and log-likelihood in fp32).
    :param compile: record each step's loss and gradient once per batch shape as one graph and replay it
        (:class:`_RecordedStep`): ``"trace"`` replays the recording (:data:`TRACE`), the eager step's numbers
        without its per-step Python, for small networks whose steps that Python dominates; True (inductor) or a
        backend's name compiles it with ``torch.compile``, falling back to eager steps with one warning where the
        backend cannot compile it.
    :param seed: seeds parameter noise and the data order (``pyro.set_rng_seed``).
    :param device: ``"auto"``, ``"cpu"`` or ``"cuda"``; model, guide and batches follow it.
    :param checkpoint: file written atomically with the state after an epoch (parameters, optimiser, scheduler,
        epoch, history, RNG): the last completed epoch's, written at most every ``checkpoint_every`` seconds, after
        the last epoch, and whenever training stops early (a NaN loss, an exception, Ctrl-C).
    :param checkpoint_every: seconds between checkpoint writes; 0 writes after every epoch. In between, the state
        of the last completed epoch is kept in memory (one copy of the parameters and the optimiser's state).
    :param resume: continue from ``checkpoint`` if it exists.
    :param config: extra metadata stored in the checkpoint (how to rebuild model and guide).
    :param on_epoch_end: callback(s) ``(epoch, record)`` after each epoch, before the checkpoint; they may
        add entries to the record: validation (:class:`pyrobnn.analysis.evaluate.Validation`), sparsity
        (:func:`pyrobnn.analysis.prune.record_sparsity`).
    :returns: the :class:`History` of per-epoch records: ``loss`` and ``nll`` per training example,
        ``kl`` (nats, unweighted), ``beta`` (mean over the epoch), ``lr``, ``seconds``, and what callbacks add.
    :raises TrainingDiverged: when the loss becomes NaN/inf (the checkpoint keeps the last good epoch).
    """
    epochs, batch_size, num_particles = checked_fit_options(x, epochs, batch_size, num_particles, optimizer, estimator,
                                                            elbo, num_data, precision)
    if resume and checkpoint is None:
        raise ValueError("resume=True needs checkpoint=<path of the run to continue>")
    checkpoint_every = nonnegative("checkpoint_every (seconds between checkpoint writes)", checkpoint_every)
    if compile:
        compiled_terms(compile)  # checks the value before anything runs
    if ESTIMATORS[estimator].stochastic:
        check_components(getattr(guide, "num_components", 1), batch_size, num_particles, x.shape[0])
    callbacks = [] if on_epoch_end is None else list(on_epoch_end) if isinstance(on_epoch_end, Sequence) \
        else [on_epoch_end]
    device = resolve_device(device)
    model = network_model(model)
    model.to(device)
    guide.to(device)
    model = prepared_for_training(model, guide, x, y, device, transform)
    _check_data(model, guide, x, y, "training data", transform)
    for callback in callbacks:  # callbacks that read the model (validation) get it once, before training
        if hasattr(callback, "setup"):
            callback.setup(model, guide)
    model.num_data = x.shape[0] if num_data is None else num_data

    optim, warmup_steps = built_optimizer(optimizer, model, guide)
    scheduler = make_scheduler(optim, getattr(optimizer, "schedule", None))
    run = _Run(model, guide, optim, scheduler, History())
    pyro.set_rng_seed(seed)
    start = run.resume(checkpoint, device) if resume and Path(checkpoint).is_file() else 0

    steps = math.ceil(x.shape[0] / batch_size)
    bar = Progress(
        TextColumn("[bold]epoch {task.fields[epoch]}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[stats]}"), TimeElapsedColumn(), disable=not progress, transient=False,
    )
    with bar, pyro.validation_enabled(False):
        task = bar.add_task("train", total=steps * (epochs - start), epoch=start + 1, stats="")

        def advance(epoch, step, loss_per_example):
            bar.update(task, advance=1, epoch=epoch + 1, stats=f"loss {loss_per_example:.4g}/example")

        writer = _CheckpointWriter(checkpoint, checkpoint_every)
        try:
            for epoch in range(start, epochs):
                model.train()
                batches = epoch_batches(x.shape[0], batch_size, seed, epoch)
                record = run.epoch(epoch, batches, x, y, device, beta=beta, elbo=elbo,
                                   estimator=estimator, num_particles=num_particles, checkpoint=checkpoint,
                                   on_step=advance, transform=transform, precision=precision,
                                   warmup_steps=warmup_steps, compile=compile)
                scheduler.step()
                for callback in callbacks:
                    callback(epoch, record)
                run.history.epochs.append(record)
                writer.completed(run.state(epoch, config), last=epoch == epochs - 1)
        finally:
            writer.flush()  # the last completed epoch, also when training stops early
    return run.history


class _CheckpointWriter:
    """Writes the state of the last completed epoch to ``path``: at once when ``every`` seconds have passed since
    the last write (or ``every`` is 0) or the epoch is the last, otherwise on :meth:`flush`. A state waiting to be
    written is a copy (:func:`_detached_copy`), so the steps after it, a diverging one included, cannot change it."""

    def __init__(self, path: str | Path | None, every: float):
        self.path, self.every = path, every
        self.pending: Optional[dict] = None
        self.last_write = time.monotonic()

    def completed(self, state: Callable[[], dict], last: bool) -> None:
        """An epoch has completed; ``state()`` builds its checkpoint (only called when a checkpoint is kept)."""
        if self.path is None:
            return
        if last or time.monotonic() - self.last_write >= self.every:
            self.pending = None
            self._write(state())
        else:  # the history's records do not change once appended: its list is copied, not its records
            self.pending = {key: value if key == "history" else _detached_copy(value) for key, value in state().items()}

    def flush(self) -> None:
        if self.pending is not None:
            state, self.pending = self.pending, None
            self._write(state)

    def _write(self, state: dict) -> None:
        save_checkpoint(self.path, state)
        self.last_write = time.monotonic()


def _detached_copy(state):
    """``state`` with every tensor cloned (on its device) and every dict, list and tuple rebuilt; other values as
    they are."""
    if isinstance(state, torch.Tensor):
        return state.detach().clone()
    if isinstance(state, dict):
        return {key: _detached_copy(value) for key, value in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(_detached_copy(value) for value in state)
    return state


@dataclass
class _Run:
    """What one training run carries between epochs: model, guide, optimiser, scheduler, history."""

    model: torch.nn.Module
    guide: torch.nn.Module
    optim: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    history: History

    def resume(self, checkpoint, device) -> int:
        """Restore a checkpoint written by :meth:`save`; returns the epoch to start from."""
        state = load_checkpoint(checkpoint, map_location=device)
        self.model.load_state_dict(state["model"])
        self.guide.load_state_dict(state["guide"])
        self.optim.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.history.epochs = list(state["history"])
        set_rng_state(state["rng"])
        return state["epoch"] + 1

    def state(self, epoch: int, config: Optional[dict]) -> Callable[[], dict]:
        """The checkpoint after ``epoch`` (read by :meth:`resume`), built when called; its tensors are the live
        ones."""
        return lambda: {
            "model": self.model.state_dict(),
            "guide": self.guide.state_dict(),
            "optimizer": self.optim.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "epoch": epoch,
            "history": list(self.history.epochs),
            "rng": rng_state(),
            "config": config or {},
        }

    def epoch(self, epoch: int, batches, x, y, device, *, beta, elbo, estimator, num_particles, checkpoint,
              on_step, transform=None, precision="fp32", warmup_steps=0, compile=False) -> dict:
        """One pass over ``batches`` (index tensors); returns the epoch's record."""
        tick = time.perf_counter()
        num_data, steps = self.model.num_data, len(batches)
        totals = torch.zeros(4, dtype=torch.float64)  # loss, nll, kl, beta
        rates = [group["lr"] for group in self.optim.param_groups]  # this epoch's scheduled rates
        warming = epoch * steps < warmup_steps  # the warm-up reaches into this epoch
        for step, idx in enumerate(batches):
            xb, yb = batch(x, y, idx, device)
            if transform is not None:
                xb = transform(xb)
            b = beta(epoch, step, steps)
            if warming:  # optimiser steps before this one: epoch * steps + step
                warm_up(self.optim, rates, (epoch * steps + step + 1) / warmup_steps)
            terms = svi_step(self.model, self.guide, self.optim, xb, yb, elbo=elbo, beta=b, estimator=estimator,
                             num_particles=num_particles, precision=precision, compile=compile)
            # one device-to-host copy per step for the logged terms
            values = torch.stack([terms.loss.detach(), terms.nll, torch.as_tensor(terms.kl).to(terms.nll)]).tolist()
            if not math.isfinite(values[0]):
                kept = f" The last good checkpoint is kept at {checkpoint}." if checkpoint else ""
                raise TrainingDiverged(
                    f"loss became {values[0]} at epoch {epoch + 1}, step {step + 1} (beta={b:g}, "
                    f"lr={per_example_rate(self.optim.param_groups[0]):g}); training stopped.{kept} Lower the learning "
                    "rate or init_rho, or check the inputs for NaN."
                )
            totals += torch.tensor(values + [b], dtype=torch.float64)
            on_step(epoch, step, totals[0].item() / ((step + 1) * num_data))
        if warming:
            warm_up(self.optim, rates, 1.0)  # the schedule sees its own rates
        loss, nll, kl, mean_beta = (totals / steps).tolist()
        return {"epoch": epoch + 1, "loss": loss / num_data, "nll": nll / num_data, "kl": kl, "beta": mean_beta,
                "lr": per_example_rate(self.optim.param_groups[0]), "seconds": time.perf_counter() - tick}
