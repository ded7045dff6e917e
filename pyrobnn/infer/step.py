r"""One SVI step, and the one engine that runs it: eagerly, or recorded once and replayed.

A step on minibatch :math:`(x, y)` with KL weight :math:`\beta` computes the terms of the objective (a
:class:`~pyrobnn.infer.elbo.MeanFieldELBO`: its estimator, particles and precision), the gradient of its loss with
respect to every trained parameter, and an optimiser's update. :class:`Step` turns (model, guide, objective, and an
executor of :data:`~pyrobnn.infer.recording.COMPILE_MODES`) into ``step(x, y, beta) -> (terms, gradients)``:

- ``"none"``: the terms computed from Python, differentiable (``gradients`` None: the update differentiates them);
- ``"trace"`` and ``"inductor"``: the terms *and* the loss's gradient recorded as one graph of ATen operations
  (:func:`~pyrobnn.infer.recording.record`: Pyro's handlers, the guide's and model's Python, the estimators' tensor
  subclasses and autograd all run once, at recording) and replayed (:func:`~pyrobnn.infer.recording.replay`), once
  per batch shape and whatever else the graph reads from Python (training mode, ``num_data``, where the parameters
  are stored; at most :data:`MAX_GRAPHS`, then eagerly).

The same engine trains R replicas of one network at once (``replicas``: the grid points of a search, the members
of an ensemble; :func:`~pyrobnn.infer.replicas.fit_replicas`): replica 0's recorded graph vectorised over a leading
replica dimension of every parameter and buffer (:func:`torch.func.vmap`, ``randomness="different"``), recorded
again and replayed. For replica :math:`r`, :math:`\nabla_{\phi_r}\sum_s \mathcal L_s(\phi_s) =
\nabla_{\phi_r}\mathcal L_r(\phi_r)`, so an elementwise optimiser makes each replica's own update.

Under ``"auto"`` on a CPU the step starts recorded (``"trace"``) and times its first replays; when the rest of a run
of known length repays inductor's compilation of the graph (measured on an earlier run of it, or estimated:
:func:`~pyrobnn.infer.recording.inductor_repays`), that graph is compiled from then on. What each executor cost is
kept per graph (:class:`~pyrobnn.infer.recording.ExecutorCosts`). A computation an executor cannot take (a model
whose Python reads a tensor's value, an operation inductor cannot compile) follows the one executor policy
(:func:`~pyrobnn.infer.recording.build`): under ``"auto"`` the next simpler executor, ``inductor`` -> ``trace`` ->
``none``, with one warning saying why; an explicit mode that cannot run raises
:class:`~pyrobnn.infer.recording.ExecutorFailed`, naming the mode and the way out.
"""

from __future__ import annotations

import time
import warnings
import weakref
from typing import NamedTuple, Sequence

import pyro
import torch

from pyrobnn.checkpoint import rng_state, set_rng_state
from pyrobnn.checks import nonnegative
from pyrobnn.guides.base import direct_parameters
from pyrobnn.handlers import kl_annealing
from pyrobnn.handlers.particles import ParticlesUnsupported
from pyrobnn.infer.elbo import ELBOTerms, MeanFieldELBO, Objective
from pyrobnn.infer.optim import kl_step, splits_kl, trained_parameters
from pyrobnn.infer.recording import (
    COSTS,
    PROBE_STEPS,
    ExecutorFailed,
    build,
    check_mode,
    fall_back,
    fingerprint,
    first_line,
    inductor_repays,
    record,
    replay,
    resolve,
)

__all__ = ["Step", "SplitGradients", "svi_step", "update", "set_gradients", "optimizer_step", "loss_terms",
           "objective", "settle", "tensors", "ExecutorFailed", "MAX_GRAPHS"]

MAX_GRAPHS = 8
"""Recordings one step keeps (one per batch shape, training mode and parameter storage), then eagerly."""

PASSTHROUGH = (ParticlesUnsupported, torch.OutOfMemoryError)
"""Errors of the computation itself, not of an executor: they propagate under every mode."""


def objective(elbo=None) -> MeanFieldELBO:
    """The step's objective: ``elbo``, or by default ``MeanFieldELBO(estimator="sample")`` (one weight sample per
    step, under the estimator handler: MC dropout and mixture-node guides draw per example)."""
    if elbo is None:
        return MeanFieldELBO(estimator="sample")
    if not isinstance(elbo, Objective):
        raise TypeError(f"elbo must be a pyrobnn Objective such as MeanFieldELBO (it reports its loss, NLL and KL), "
                        f"got {type(elbo).__name__}")
    return elbo


def loss_terms(model, guide, x, y, elbo, beta) -> ELBOTerms:
    """The objective's :class:`~pyrobnn.infer.elbo.ELBOTerms` on ``(x, y)``, the KL weighted by ``beta``
    (:func:`~pyrobnn.handlers.kl_annealing`), a pyrobnn guide reading its parameters without ``pyro.param``
    messages (:func:`~pyrobnn.guides.base.direct_parameters`: the optimiser holds them already)."""
    with kl_annealing(beta=beta, validate=not torch.is_tensor(beta)), direct_parameters():
        return elbo.terms(model, guide, x, y)


class SplitGradients(NamedTuple):
    """A step's gradient in its two parts, for an optimiser that steps the KL apart
    (:func:`~pyrobnn.infer.optim.splits_kl`): the likelihood's (``data``), which the optimiser steps, and the
    β-weighted KL's (``kl``), which :func:`~pyrobnn.infer.optim.kl_step` steps; each ``[(parameter, gradient)]``."""

    data: list
    kl: list


def update(optim: torch.optim.Optimizer, loss: torch.Tensor, gradients=None) -> None:
    """``optim`` steps on ``loss``'s gradient, unless the loss is not finite; ``gradients``
    (``[(parameter, gradient), ...]``, from a recorded step) are that gradient, already computed (parameters not
    listed get none): :func:`set_gradients`, then :func:`optimizer_step`. :class:`SplitGradients`: the optimiser
    steps their ``data`` part, then :func:`~pyrobnn.infer.optim.kl_step` their ``kl`` part."""
    split = isinstance(gradients, SplitGradients)
    if set_gradients(optim, loss, gradients.data if split else gradients):
        optimizer_step(optim, loss)
        if split:
            kl_step(optim, gradients.kl)


def set_gradients(optim: torch.optim.Optimizer, loss: torch.Tensor, gradients=None) -> bool:
    """The parameters' ``.grad``: ``loss``'s gradient, or ``gradients`` (``[(parameter, gradient), ...]``) where a
    recorded step computed it. False (nothing set) for a loss that is not finite, which an optimiser that is not
    fused does not step on."""
    fused = getattr(optim, "_step_supports_amp_scaling", False)
    if not fused and not torch.isfinite(loss).all():
        return False
    optim.zero_grad(set_to_none=True)
    if gradients is None:
        loss.backward()
    else:
        for parameter, gradient in gradients:  # a fused optimiser reads a gradient as laid out like its parameter
            parameter.grad = gradient if gradient.stride() == parameter.stride() else gradient.contiguous()
    return True


def optimizer_step(optim: torch.optim.Optimizer, loss: torch.Tensor) -> None:
    """``optim.step()`` on the gradients :func:`set_gradients` set. A fused optimiser (as
    :func:`~pyrobnn.infer.optim.make_optimizer` makes) is told whether the loss was finite on the device
    (``found_inf``, as ``torch.amp.GradScaler`` does), so the step costs no device-to-host synchronisation."""
    fused = getattr(optim, "_step_supports_amp_scaling", False)
    if not fused:
        optim.step()
        return
    optim.found_inf = torch.isnan(loss.detach().sum() * 0).float()  # inf * 0 and nan * 0 are nan
    try:
        optim.step()
    finally:
        del optim.found_inf


class _Recording:
    """One recorded graph of a step and how it runs: ``run`` (the replay of executor ``mode``), ``trained`` (which
    tensor inputs receive a gradient), ``calls``, and, while its first :data:`~pyrobnn.infer.recording.PROBE_STEPS`
    replays after the first are timed, ``graph`` and ``key`` (:func:`~pyrobnn.infer.recording.fingerprint`), what
    :class:`~pyrobnn.infer.recording.ExecutorCosts` keeps of it."""

    __slots__ = ("run", "trained", "kl_trained", "mode", "graph", "key", "calls", "seconds", "built_s")

    def __init__(self, run, trained, mode, graph, key, built_s):
        (self.trained, self.kl_trained), self.run, self.mode, self.graph, self.key = trained, run, mode, graph, key
        self.calls, self.seconds, self.built_s = 0, 0.0, built_s

    @property
    def probing(self) -> bool:
        return self.graph is not None


class Step:
    """``Step(model, guide, elbo, compile)(x, y, beta)`` -> ``(terms, gradients)``: one step's
    :class:`~pyrobnn.infer.elbo.ELBOTerms` and the loss's gradient (``[(parameter, gradient), ...]``, or None when
    ``terms.loss`` is to be differentiated), by the executor ``compile`` (see the module docstring). With
    ``split_kl``, the gradient is :class:`SplitGradients`, the likelihood's and the β-weighted KL's apart (an
    optimiser that steps the KL apart, :func:`~pyrobnn.infer.optim.splits_kl`), under every executor.

    :param steps: how many steps the run will take, when known (``"auto"`` compiles a graph with inductor once its
        measured costs say the rest of the run repays it, :func:`~pyrobnn.infer.recording.inductor_repays`).
    :param stacked: the stacked tensors R replicas of ``(model, guide)`` train, ``stacked[i]`` of shape ``(R,) + ``
        the shape of ``tensors(model, guide)[i]``: a stacked step, always recorded (``compile`` ``"trace"``,
        ``"inductor"``, or ``"auto"``); :class:`ExecutorFailed` when the step cannot be recorded.
    """

    def __init__(self, model, guide, elbo=None, compile: str = "auto", *, steps: int | None = None,
                 device: torch.device | None = None, stacked: Sequence[torch.Tensor] | None = None,
                 split_kl: bool = False):
        self.model, self.guide, self.elbo = model, guide, objective(elbo)
        self.split_kl = bool(split_kl)
        self.requested = check_mode(compile)
        self.stacked = stacked
        device = device if device is not None else next(iter(tensors(model, guide)), torch.empty(0)).device
        self.device, self.steps, self.done = device, steps, 0
        self.mode, self.reason = resolve(compile, device, steps)
        if stacked is not None and self.mode == "none" and self.requested == "auto":  # one recording for R replicas
            self.mode, self.reason = "trace", "replicas: one stacked step, recorded"
        if stacked is not None and self.mode == "none":
            raise ValueError("a stacked step of replicas is always recorded: compile must be 'auto', 'trace' or "
                             "'inductor'")
        self.graphs: dict = {}
        self._tensors = None
        self._settled = False
        self._full = False  # MAX_GRAPHS recordings kept (said once)
        self._inductor_refused = False  # under auto, inductor could not compile a graph of this step (said once)

    @property
    def executor(self) -> str:
        """The executor in effect (after any fallback): that of the recording that ran the most steps, e.g.
        ``"trace"``."""
        if not self.graphs or self.mode == "none":
            return self.mode
        return max(self.graphs.values(), key=lambda recording: recording.calls).mode

    def tensors(self) -> list[torch.Tensor]:
        """The parameters and buffers the graph reads as inputs (replica 0's, for a stacked step)."""
        if self._tensors is None:
            self._tensors = tensors(self.model, self.guide)
        return self._tensors

    def __call__(self, x: torch.Tensor, y: torch.Tensor, beta) -> tuple[ELBOTerms, list | None]:
        self.done += 1
        if self.mode == "none":
            return self._eager(x, y, beta)
        nonnegative("beta (KL weight)", beta)  # the graph's β is a tensor input, never read while recording
        if not self._settled:  # a guide's first call may move its parameters (a NormalGuide packs them into one
            self._settled = True  # storage): one eager pass first, so that the recording reads where they stay
            self._settle(x, y)
        inputs = self._inputs(x, y, beta)
        key = self._key(x, y, inputs)
        recording = self.graphs.get(key)
        if recording is None:
            if len(self.graphs) >= MAX_GRAPHS and self.stacked is None:
                if not self._full:
                    self._full = True
                    warnings.warn(f"compile={self.mode!r}: the step keeps {MAX_GRAPHS} recordings (one per batch "
                                  "shape, training mode and parameter storage), so a step of any other runs eagerly",
                                  RuntimeWarning, stacklevel=2)
                return self._eager(x, y, beta)
            recording = self._recorded(inputs)
            if recording is None:  # fell back to eager
                return self._eager(x, y, beta)
            self.graphs[key] = recording
        try:
            with torch.no_grad():
                if recording.probing:
                    loss, nll, kl, prior, *gradients = self._probed(recording, inputs)
                else:
                    loss, nll, kl, prior, *gradients = recording.run(*inputs)
        except PASSTHROUGH:
            raise
        except Exception as error:  # inductor compiles at the graph's first call
            if recording.mode != "inductor":
                raise
            self._fall_back(fall_back("inductor", self.requested, "this step", error), error)
            self.done -= 1
            return self(x, y, beta)
        recording.calls += 1
        params = inputs[3:]
        data = [(params[i], gradient) for i, gradient in zip(recording.trained, gradients)]
        if not self.split_kl:
            return ELBOTerms(loss, nll, kl, prior), data
        kl_part = gradients[len(recording.trained):]
        return ELBOTerms(loss, nll, kl, prior), SplitGradients(data, [(params[i], g) for i, g in
                                                                      zip(recording.kl_trained, kl_part)])

    def _eager(self, x, y, beta) -> tuple[ELBOTerms, SplitGradients | None]:
        """The step from Python: its terms, to be differentiated, or with ``split_kl`` the two gradients taken."""
        terms = loss_terms(self.model, self.guide, x, y, self.elbo, beta)
        if not self.split_kl:
            return terms, None
        params = [t for t in self.tensors() if t.requires_grad]
        data, kl = split_gradients(terms, params)
        return terms, SplitGradients([(p, g) for p, g in zip(params, data) if g is not None],
                                     [(p, g) for p, g in zip(params, kl) if g is not None])

    # -- recording ---------------------------------------------------------------------------
    def _inputs(self, x, y, beta) -> tuple:
        beta = beta if torch.is_tensor(beta) else torch.tensor(float(beta), dtype=x.dtype, device=x.device)
        return (x, y, beta, *(self.stacked if self.stacked is not None else self.tensors()))

    def _key(self, x, y, inputs) -> tuple:
        """What a recording depends on beyond its inputs: shapes, training mode, the data size, where the
        parameters are stored."""
        return (x.shape, x.dtype, x.device, y.shape, y.dtype, self.model.training, self.model.num_data,
                tuple(t.data_ptr() for t in inputs[3:]))

    def _settle(self, x, y) -> None:
        settle(self.model, self.guide, self.elbo, x, y)

    def _recorded(self, inputs) -> _Recording | None:
        """This step's recording, replayed by the executor :func:`~pyrobnn.infer.recording.build` settles on (None:
        eagerly). Recording runs the step once: the random state and every buffer (BatchNorm's running statistics)
        are restored after it."""
        errors = []

        def make(mode):
            if mode == "none":
                if self.stacked is not None:
                    raise ExecutorFailed(f"the stacked step cannot be recorded ({first_line(errors[-1])})")
                return None
            state, kept = rng_state(), _buffers(self.tensors(), self.stacked)
            try:
                graph, trained = self._record(inputs)
                set_rng_state(state)
                tick = time.perf_counter()
                run = replay(graph, inputs, mode)
                return _Recording(run, trained, mode, graph, fingerprint(graph, inputs), time.perf_counter() - tick)
            finally:  # a value read on the host, an operation vmap or the backend cannot take, or an error of the
                set_rng_state(state)  # model itself (the eager step raises it again)
                _restore(kept)

        recording, mode = build(make, self.mode, self.requested, "this step", PASSTHROUGH, errors)
        if mode != self.mode:
            self._fall_back(mode, errors[-1])
        return recording

    def _record(self, inputs):
        """The graph of the terms and of the loss's gradient with respect to every tensor input that requires one:
        ``(graph, (trained, kl_trained))``, the graph returning ``(loss, nll, kl, prior, *gradients)``, one gradient for
        each ``inputs[3:][i]``, ``i`` in ``trained`` (those that receive one); with ``split_kl`` the likelihood's,
        then the β-weighted KL's, one for each ``i`` in ``kl_trained``."""
        model, guide, elbo = self.model, self.guide, self.elbo
        own = self.tensors()
        wrt = [i for i, t in enumerate(own) if t.requires_grad]
        trained, kl_trained, split = [], [], self.split_kl

        def step(x, y, beta, *values):  # the modules read their own tensors: the recording follows them as inputs
            terms = loss_terms(model, guide, x, y, elbo, beta)
            wanted = [values[i] for i in wrt]
            if split:
                gradients, kl_gradients = split_gradients(terms, wanted)
            else:
                gradients, kl_gradients = torch.autograd.grad(terms.loss, wanted, allow_unused=True), ()
            trained[:] = [i for i, gradient in zip(wrt, gradients) if gradient is not None]
            kl_trained[:] = [i for i, gradient in zip(wrt, kl_gradients) if gradient is not None]
            prior = torch.zeros_like(terms.nll) if terms.prior is None else terms.prior.detach().to(terms.nll)
            return (terms.loss.detach(), terms.nll.detach(), torch.as_tensor(terms.kl).to(terms.nll).detach(), prior,
                    *(gradient for gradient in (*gradients, *kl_gradients) if gradient is not None))

        graph = record(step, (*inputs[:3], *own))
        if self.stacked is None:
            return graph, (tuple(trained), tuple(kl_trained))
        batched = torch.func.vmap(graph, in_dims=(None, None, None) + (0,) * len(self.stacked),
                                  randomness="different")
        with torch.no_grad():
            return record(batched, inputs), (tuple(trained), tuple(kl_trained))

    def _probed(self, recording: _Recording, inputs) -> tuple:
        """A replay of a recording whose costs are being measured: the first (which may compile) sets its build
        time, the next :data:`~pyrobnn.infer.recording.PROBE_STEPS` its time a step; then they are kept
        (:class:`~pyrobnn.infer.recording.ExecutorCosts`) and, under ``"auto"`` on a CPU with the run's length
        known, the rest of the run is weighed against inductor's compilation
        (:func:`~pyrobnn.infer.recording.inductor_repays`)."""
        tick = time.perf_counter()
        out = recording.run(*inputs)
        seconds = time.perf_counter() - tick
        if recording.calls == 0:
            recording.built_s += seconds
            if recording.mode == "inductor":
                COSTS.update(recording.key, inductor_s=recording.built_s)
            return out
        recording.seconds += seconds
        if recording.calls < PROBE_STEPS:
            return out
        ms = recording.seconds / PROBE_STEPS * 1e3
        COSTS.update(recording.key, **{f"{recording.mode}_ms": ms})
        graph, recording.graph = recording.graph, None
        if self.requested == "auto" and recording.mode == "trace" and self.steps is not None and \
                self.device.type == "cpu" and not self._inductor_refused:
            share = (recording.calls + 1) / self.done  # of the steps so far, this graph's
            left = int((self.steps - self.done) * share)
            repays, why = inductor_repays(recording.key, len(graph.graph.nodes), ms, left, COSTS)
            if repays:
                self._upgrade(recording, graph, inputs, why)
        return out

    def _upgrade(self, recording: _Recording, graph, inputs, why: str) -> None:
        """Compile ``recording``'s graph with inductor from its next step on (``"auto"``; a graph inductor cannot
        take keeps its replay, after one warning)."""
        state = rng_state()
        try:
            tick = time.perf_counter()
            recording.run = replay(graph, inputs, "inductor")
        except PASSTHROUGH:
            raise
        except Exception as error:  # the graph is recorded again at the next step: the failed compilation may have
            fall_back("inductor", self.requested, "this step", error)  # changed it
            self.graphs = {key: kept for key, kept in self.graphs.items() if kept is not recording}
            self._inductor_refused = True
            return
        finally:
            set_rng_state(state)
        recording.mode, recording.graph, recording.calls = "inductor", graph, -1  # its first call is timed again
        recording.built_s, recording.seconds = time.perf_counter() - tick, 0.0
        self.reason = f"{self.device.type.upper()}: the recorded step, then inductor: {why}"

    def _fall_back(self, mode: str, error: Exception) -> None:
        self.mode, self.reason, self.graphs = mode, f"fell back from {self.mode}: {first_line(error)}", {}


def split_gradients(terms: ELBOTerms, params) -> tuple[tuple, tuple]:
    """``(data, kl)``: the gradients with respect to ``params`` of the likelihood's term (``terms.loss -
    terms.prior``: the KL's path gets exactly zero) and of the β-weighted KL (``terms.prior``); None where a
    parameter gets none."""
    prior = terms.prior
    if prior is None or not prior.requires_grad:
        return torch.autograd.grad(terms.loss, params, allow_unused=True), (None,) * len(params)
    kl = torch.autograd.grad(prior, params, retain_graph=True, allow_unused=True)
    return torch.autograd.grad(terms.loss - prior, params, allow_unused=True), kl


def settle(model, guide, elbo, x, y) -> None:
    """One eager pass of the terms without gradients, the random state and the buffers restored after it (a
    guide's first call may move its parameters: a recording must read them where they stay)."""
    state, kept = rng_state(), _buffers(tensors(model, guide))
    try:
        with torch.no_grad(), pyro.validation_enabled(False):
            loss_terms(model, guide, x, y, objective(elbo), 1.0)
    finally:
        set_rng_state(state)
        _restore(kept)


def _buffers(*groups) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``(tensor, copy)`` of every tensor of ``groups`` that is no trained parameter (buffers a pass updates in
    place, e.g. BatchNorm's running statistics)."""
    return [(t, t.detach().clone()) for group in groups if group is not None for t in group if not t.requires_grad]


def _restore(kept) -> None:
    with torch.no_grad():
        for tensor, copy in kept:
            tensor.copy_(copy)


def tensors(model, guide) -> list[torch.Tensor]:
    """The trained parameters (the guide's, then the model's own) and the buffers of a model and its guide, each
    once: what a step reads."""
    buffers = list({id(b): b for b in (*guide.buffers(), *model.buffers())}.values())
    return [*trained_parameters(model, guide), *buffers]


_STEPS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _settings(elbo) -> tuple:
    """What an objective computes: its type and settings (two equal objectives share a recorded step)."""
    return (type(elbo), elbo.num_particles, elbo.vectorize_particles, getattr(elbo, "estimator", None),
            getattr(elbo, "precision", None))


def svi_step(model, guide, optim: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, *, elbo=None,
             beta: float = 1.0, compile: str = "auto") -> ELBOTerms:
    """One gradient step on the β-annealed negative ELBO of a minibatch; returns its
    :class:`~pyrobnn.infer.elbo.ELBOTerms` (not differentiable when the step was recorded: its gradient is taken).

    ``elbo`` is the objective (default ``MeanFieldELBO(estimator="sample")``: its estimator, particles and precision);
    ``compile`` the executor (:data:`~pyrobnn.infer.recording.COMPILE_MODES`; :class:`Step`, kept per guide,
    objective and mode across calls). The update is skipped (and the terms returned) when the loss is not finite. A
    pyrobnn guide reads its parameters without ``pyro.param`` messages here
    (:func:`~pyrobnn.guides.base.direct_parameters`): ``optim`` already holds them."""
    elbo = objective(elbo)
    split = splits_kl(optim)
    # an objective built anew each call reuses the engine
    key = (id(model), _settings(elbo), compile, *(("kl apart",) if split else ()))
    steps = _STEPS.setdefault(guide, {})
    step = steps.get(key)
    if step is None:
        step = steps[key] = Step(model, guide, elbo, compile, device=x.device, split_kl=split)
    terms, gradients = step(x, y, beta)
    update(optim, terms.loss, gradients)
    return terms
