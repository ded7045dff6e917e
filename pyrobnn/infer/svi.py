r"""The training loop: minibatch SVI on the annealed ELBO, with validation, checkpoints and resume.

One step on minibatch :math:`i` of epoch :math:`e` minimises

.. math:: -\frac{N}{B}\sum_{b}\log p(y_b|x_b,w) + \beta_{e,i}\,\mathrm{KL}(q\|p),
          \quad w \sim q \ (\text{the objective's particles})

with one ``torch.optim`` optimiser over every parameter of the guide and the model's deterministic parameters. It
is the loop a Pyro user would write around :class:`pyro.infer.SVI`, with what a long run needs: a β schedule
(:mod:`pyrobnn.infer.schedules`, applied by :func:`~pyrobnn.handlers.kl_annealing`), the optimiser with its
learning-rate schedule and warm-up as one object (:mod:`pyrobnn.infer.optim`), per-epoch callbacks (validation,
sparsity: :mod:`pyrobnn.analysis`), a rich progress bar, an atomic checkpoint of the last completed epoch that
restores parameters, optimiser, scheduler, epoch and every RNG (a resumed run continues exactly as the
uninterrupted one), and a stop with a clear message when the loss becomes NaN/inf (the checkpoint of the last good
epoch is written). The checkpoint is written at most every :attr:`Checkpoint.every` seconds, at the end, and when
training stops; in between, the last completed epoch's state is kept in memory (:class:`_CheckpointWriter`).

Each step is run by the engine of :mod:`pyrobnn.infer.step` (eager, or recorded once and replayed:
``compile``); the same loop trains R replicas at once (:func:`~pyrobnn.infer.replicas.fit_replicas`), its records
then holding one value per replica.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Protocol, Sequence, runtime_checkable

import pyro
import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from pyrobnn.checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state
from pyrobnn.checks import check_labels, nonnegative, nonnegative_int, positive_int, renamed_keywords
from pyrobnn.device import device_of, resolve_device
from pyrobnn.guides.base import SiteGuide
from pyrobnn.handlers.node_draws import check_components
from pyrobnn.infer.elbo import MeanFieldELBO
from pyrobnn.infer.optim import Optim, PerturbingOptimizer, make_scheduler, per_example_rate, schedule_of
from pyrobnn.infer.predict import PROTOTYPE_ROWS, predictive_outputs
from pyrobnn.infer.recording import check_mode
from pyrobnn.infer.schedules import Constant
from pyrobnn.infer.step import Step, objective, optimizer_step, set_gradients, svi_step, update
from pyrobnn.model.protocol import network_model

__all__ = ["fit", "svi_step", "Checkpoint", "TrainingDiverged", "History", "Histories", "Callback", "ModelCallback",
           "train_epochs", "check_data", "checked_fit_options", "built_optimizer", "prepared_for_training", "Run"]

@runtime_checkable
class Callback(Protocol):
    """Called after each epoch with ``(epoch, record)``; it may add entries to the record (e.g.
    :func:`pyrobnn.analysis.prune.record_sparsity`). Any function of ``(epoch, record)`` is one."""

    def __call__(self, epoch: int, record: dict) -> None:
        """After epoch ``epoch`` (from 0), with its ``record``."""


@runtime_checkable
class ModelCallback(Callback, Protocol):
    """A :class:`Callback` that reads the model and guide being trained (:class:`pyrobnn.analysis.evaluate.Validation`):
    :func:`fit` calls its ``setup(model, guide)`` once, before the first epoch."""

    def setup(self, model, guide) -> None:
        """Bind the model and guide being trained (and check what the callback reads against them)."""


class TrainingDiverged(FloatingPointError):
    """The loss became NaN or infinite; training stopped and the last good checkpoint was kept. ``replica``: which of
    the networks trained at once (:func:`~pyrobnn.infer.replicas.fit_replicas`) diverged (None: a network trained
    alone)."""

    def __init__(self, message: str, replica: Optional[int] = None):
        super().__init__(message)
        self.replica = replica


@dataclass
class History:
    """Per-epoch records (``loss``, ``nll``, ``kl``, ``beta``, ``lr``, ``seconds``, ``val_*``), and the executor that
    ran the steps (``compile``: ``"none"``, ``"trace"`` or ``"inductor"``, with ``compile_reason``)."""

    epochs: list[dict] = field(default_factory=list)
    compile: str | None = None
    compile_reason: str | None = None

    def __getitem__(self, key: str) -> list:
        return [record.get(key) for record in self.epochs]

    @property
    def last(self) -> dict:
        return self.epochs[-1] if self.epochs else {}


class Histories:
    """Several training runs' :class:`History` (``histories``: an ensemble's members, SWAG's or SG-MCMC's runs), read
    as one: every record, run after run, and the executor the same rule chose for each."""

    histories: list

    @property
    def epochs(self) -> list[dict]:
        """Every run's per-epoch records, run after run (as :attr:`History.epochs`)."""
        return [record for history in self.histories for record in history.epochs]

    @property
    def compile(self) -> str | None:
        """The executor the runs' steps ran by (:attr:`History.compile` of the first)."""
        return self.histories[0].compile if self.histories else None

    @property
    def compile_reason(self) -> str | None:
        """Why :attr:`compile` was chosen."""
        return self.histories[0].compile_reason if self.histories else None


@dataclass(frozen=True)
class Checkpoint:
    """Where and how :func:`fit` keeps its state: the file ``path`` (written atomically after an epoch: parameters,
    optimiser, scheduler, epoch, history, RNG), at most every ``every`` seconds (0: after every epoch; always after
    the last epoch and whenever training stops early); ``resume``: continue from the file if it exists; ``config``:
    extra metadata stored in it (how to rebuild model and guide)."""

    path: str | Path
    every: float = 60.0
    resume: bool = False
    config: Optional[dict] = None

    @classmethod
    def of(cls, value) -> "Checkpoint | None":
        """``value`` as a :class:`Checkpoint` (a path is one with the defaults), checked; None stays None."""
        if value is None or isinstance(value, Checkpoint):
            checkpoint = value
        elif isinstance(value, (str, Path)):
            checkpoint = cls(value)
        else:
            raise TypeError(f"checkpoint must be a path or a pyrobnn.infer.svi.Checkpoint, got {value!r}")
        if checkpoint is not None:
            nonnegative("checkpoint every (seconds between checkpoint writes)", checkpoint.every)
        return checkpoint


def check_data(model, guide, x: torch.Tensor, y: torch.Tensor, what: str, transform=None) -> None:
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


def checked_fit_options(x, epochs, batch_size, optimizer, elbo, num_data, compile) -> tuple[int, int]:
    """The checks of :func:`fit`'s options that hold for any training on ``x``, before anything runs:
    ``(epochs, batch_size)``, each a positive int."""
    epochs = positive_int("epochs", epochs)
    batch_size = positive_int("batch_size", batch_size)
    if not callable(optimizer):
        raise TypeError(f"optimizer must be an optimizer factory (model, guide) -> torch.optim.Optimizer, e.g. "
                        f"pyrobnn.infer.optim.Optim(lr=1e-3), got {optimizer!r}")
    objective(elbo)
    check_mode(compile)
    if num_data is not None and (not isinstance(num_data, int) or num_data < x.shape[0]):
        raise ValueError(f"num_data must be an int >= len(x) = {x.shape[0]} (the full training-set size), "
                         f"got {num_data!r}")
    return epochs, batch_size


def built_optimizer(optimizer, model, guide) -> tuple[torch.optim.Optimizer, int]:
    """``optimizer(model, guide)``, checked, and the optimiser steps of its warm-up."""
    optim = optimizer(model, guide)
    if not isinstance(optim, torch.optim.Optimizer):
        raise TypeError(f"optimizer(model, guide) must return a torch.optim.Optimizer, got {type(optim).__name__}")
    return optim, nonnegative_int("warmup_steps of the optimizer", schedule_of(optimizer)[1])


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


class _CheckpointWriter:
    """Writes the state of the last completed epoch to the checkpoint's file: at once when ``every`` seconds have
    passed since the last write (or ``every`` is 0) or the epoch is the last, otherwise on :meth:`flush`. A state
    waiting to be written is a copy (:func:`_detached_copy`), so the steps after it, a diverging one included, cannot
    change it."""

    def __init__(self, checkpoint: Checkpoint | None):
        self.checkpoint = checkpoint
        self.pending: Optional[dict] = None
        self.last_write = time.monotonic()

    def completed(self, state: Callable[[], dict], last: bool) -> None:
        """An epoch has completed; ``state()`` builds its checkpoint (only called when a checkpoint is kept)."""
        if self.checkpoint is None:
            return
        if last or time.monotonic() - self.last_write >= self.checkpoint.every:
            self.pending = None
            self._write(state())
        else:  # the history's records do not change once appended: its list is copied, not its records
            self.pending = {key: value if key == "history" else _detached_copy(value) for key, value in state().items()}

    def flush(self) -> None:
        if self.pending is not None:
            state, self.pending = self.pending, None
            self._write(state)

    def _write(self, state: dict) -> None:
        save_checkpoint(self.checkpoint.path, state)
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
    elbo=None,
    num_data: int | None = None,
    transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
    compile: str = "auto",
    seed: int = 0,
    device: str | torch.device = "auto",
    checkpoint: "Checkpoint | str | Path | None" = None,
    progress: bool = True,
    on_epoch_end: Callback | Sequence[Callback] | None = None,
    **renamed,
) -> History:
    r"""Train ``guide`` (and the model's deterministic parameters) on ``(x, y)`` by SVI.

    :param model: a model of a network (:class:`~pyrobnn.BayesianNetwork`, or a Pyro model written by hand; its
        ``num_data`` is set to ``num_data``).
    :param guide: a guide of the model (a pyrobnn guide, or a Pyro autoguide).
    :param x, y: training inputs and targets (tensors, e.g. uint8 images; moved to the device batch by batch,
        so data already on the device stays there).
    :param epochs: number of passes over the data.
    :param batch_size: minibatch size B; the likelihood is scaled by N/B.
    :param optimizer: an optimizer factory ``(model, guide) -> torch.optim.Optimizer`` that may carry its
        ``schedule`` (a learning-rate multiplier per epoch) and ``warmup_steps``: :class:`~pyrobnn.infer.optim.Optim`
        (Adam or SGD, default ``Optim()``: Adam at 1e-3), :class:`~pyrobnn.infer.optim.TwoGroupSGD`, or any callable.
    :param beta: KL-weight schedule ``beta(epoch, step, steps_per_epoch)``, see :mod:`pyrobnn.infer.schedules`.
    :param elbo: the objective, a :class:`~pyrobnn.infer.elbo.MeanFieldELBO` with its estimator, particles and
        precision (default ``MeanFieldELBO(estimator="sample")``: one weight sample a step; Blundell et al.'s five in
        one vectorized pass: ``MeanFieldELBO(5, vectorize_particles=True, estimator="sample")``).
    :param num_data: the training-set size N that scales the likelihood (default ``len(x)``; under data-parallel
        training each process passes its shard and the full N, see :mod:`pyrobnn.infer.distributed`).
    :param transform: applied to every training batch on the device (augmentation, uint8 to float:
        :class:`pyrobnn.data.augment.ImageAugment`).
    :param compile: how each step runs (:data:`~pyrobnn.infer.recording.COMPILE_MODES`): ``"auto"`` chooses by device
        and run length (:func:`~pyrobnn.infer.recording.auto_mode`; recorded in :attr:`History.compile`), ``"none"``
        eagerly, ``"trace"`` recorded and replayed, ``"inductor"`` recorded and compiled.
    :param seed: seeds parameter noise and the data order (``pyro.set_rng_seed``).
    :param device: ``"auto"``, ``"cpu"`` or ``"cuda"``; model, guide and batches follow it.
    :param checkpoint: a path or a :class:`Checkpoint` (how often it is written, resume, metadata).
    :param on_epoch_end: callback(s) ``(epoch, record)`` after each epoch, before the checkpoint; they may
        add entries to the record: validation (:class:`pyrobnn.analysis.evaluate.Validation`), sparsity
        (:func:`pyrobnn.analysis.prune.record_sparsity`).
    :param renamed: the keywords of the last release, each with a ``DeprecationWarning`` (removed in 0.2):
        ``estimator``, ``num_particles`` and ``precision`` (now ``elbo=MeanFieldELBO(num_particles,
        vectorize_particles=True, estimator=..., precision=...)``).
    :returns: the :class:`History` of per-epoch records: ``loss`` and ``nll`` per training example,
        ``kl`` (nats, unweighted), ``beta`` (mean over the epoch), ``lr``, ``seconds``, and what callbacks add.
    :raises TrainingDiverged: when the loss becomes NaN/inf (the checkpoint keeps the last good epoch).

    Example: five epochs of Bayes by Backprop on 32 examples, the loss falling.

    >>> import pyro, torch
    >>> from torch import nn
    >>> from pyrobnn import BayesianNetwork, NormalGuide, fit
    >>> pyro.clear_param_store(); pyro.set_rng_seed(0)
    >>> x, y = torch.randn(32, 4), torch.randint(0, 3, (32,))
    >>> model = BayesianNetwork(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)))
    >>> guide = NormalGuide(model)
    >>> history = fit(model, guide, x, y, epochs=5, batch_size=16, progress=False)
    >>> len(history.epochs), sorted(history.last)
    (5, ['beta', 'epoch', 'kl', 'loss', 'lr', 'nll', 'seconds'])
    >>> history["loss"][-1] < history["loss"][0], model.num_data  # N = len(x) scales the likelihood
    (True, 32)
    """
    elbo = _renamed_objective(elbo, renamed)
    epochs, batch_size = checked_fit_options(x, epochs, batch_size, optimizer, elbo, num_data, compile)
    checkpoint = Checkpoint.of(checkpoint)
    if elbo.stochastic:
        check_components(getattr(guide, "num_components", 1), batch_size, elbo.num_particles if
                         elbo.vectorize_particles else 1, x.shape[0])
    callbacks = [] if on_epoch_end is None else list(on_epoch_end) if isinstance(on_epoch_end, Sequence) \
        else [on_epoch_end]
    device = resolve_device(device)
    model = network_model(model)
    model.to(device)
    guide.to(device)
    model = prepared_for_training(model, guide, x, y, device, transform)
    check_data(model, guide, x, y, "training data", transform)
    for callback in callbacks:  # callbacks that read the model (validation) get it once, before training
        if isinstance(callback, ModelCallback):
            callback.setup(model, guide)
    model.num_data = x.shape[0] if num_data is None else num_data

    optim, warmup_steps = built_optimizer(optimizer, model, guide)
    scheduler = make_scheduler(optim, schedule_of(optimizer)[0])
    steps = math.ceil(x.shape[0] / batch_size)
    step = Step(model, guide, elbo, compile, steps=epochs * steps, device=device)
    run = Run(model, guide, optim, scheduler, History())  # train_epochs records the executor that ran
    pyro.set_rng_seed(seed)
    start = run.resume(checkpoint, device) if checkpoint is not None and checkpoint.resume \
        and Path(checkpoint.path).is_file() else 0
    return train_epochs(run, step, x, y, range(start, epochs), batch_size, seed, device, beta=beta,
                        transform=transform, warmup_steps=warmup_steps, checkpoint=checkpoint, progress=progress,
                        callbacks=callbacks)


RENAMED_FIT_KEYWORDS = {"estimator": "elbo=MeanFieldELBO(estimator=...)",
                        "num_particles": "elbo=MeanFieldELBO(num_particles, vectorize_particles=True)",
                        "precision": "elbo=MeanFieldELBO(precision=...)"}
""":func:`fit`'s keywords of the last release -> what replaced them (the objective's settings moved to its ELBO)."""


def _renamed_objective(elbo, renamed: dict):
    """:func:`fit`'s objective, from the keywords of the last release (:data:`RENAMED_FIT_KEYWORDS`) where they are
    given, each with a ``DeprecationWarning``."""
    renamed_keywords("fit", renamed, RENAMED_FIT_KEYWORDS)
    if not renamed:
        return objective(elbo)
    if elbo is not None:
        raise ValueError(f"fit: {', '.join(sorted(renamed))} and elbo= both set the objective; pass only "
                         "elbo=MeanFieldELBO(num_particles, vectorize_particles=True, estimator=..., precision=...)")
    particles = positive_int("num_particles", renamed.get("num_particles", 1))
    return MeanFieldELBO(particles, vectorize_particles=particles > 1, estimator=renamed.get("estimator", "sample"),
                         precision=renamed.get("precision", "fp32"))


def train_epochs(run: "Run", step: Step, x, y, epochs: range, batch_size: int, seed: int, device, *, beta,
                 transform=None, warmup_steps: int = 0, checkpoint: Checkpoint | None = None, progress: bool = False,
                 callbacks: Sequence[Callback] = ()) -> History:
    """The loop of :func:`fit` (and of :func:`~pyrobnn.infer.replicas.fit_replicas`, whose step trains R replicas:
    its records hold a list of R values where a replica's differ): each epoch's batches through ``step``, the
    scheduler, the callbacks, the checkpoint."""
    steps = math.ceil(x.shape[0] / batch_size)
    bar = Progress(
        TextColumn("[bold]epoch {task.fields[epoch]}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[stats]}"), TimeElapsedColumn(), disable=not progress, transient=False,
    )
    with bar, pyro.validation_enabled(False):
        task = bar.add_task("train", total=steps * len(epochs), epoch=epochs.start + 1, stats="")

        def advance(epoch, loss_per_example):
            bar.update(task, advance=1, epoch=epoch + 1, stats=f"loss {loss_per_example:.4g}/example")

        writer = _CheckpointWriter(checkpoint)
        try:
            for epoch in epochs:
                run.model.train()
                record = run.epoch(epoch, step, epoch_batches(x.shape[0], batch_size, seed, epoch), x, y, device,
                                   beta=beta, checkpoint=checkpoint, on_step=advance, transform=transform,
                                   warmup_steps=warmup_steps)
                run.scheduler.step()
                for callback in callbacks:
                    callback(epoch, record)
                run.history.epochs.append(record)
                writer.completed(run.state(epoch, checkpoint), last=epoch == epochs.stop - 1)
        finally:
            writer.flush()  # the last completed epoch, also when training stops early
    run.history.compile, run.history.compile_reason = step.executor, step.reason
    return run.history


@dataclass
class Run:
    """What one training run carries between epochs: model, guide, optimiser, scheduler, history."""

    model: torch.nn.Module
    guide: torch.nn.Module
    optim: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    history: History

    def resume(self, checkpoint: Checkpoint, device) -> int:
        """Restore a checkpoint written by :meth:`state`; returns the epoch to start from."""
        state = load_checkpoint(checkpoint.path, map_location=device)
        self.model.load_state_dict(state["model"])
        self.guide.load_state_dict(state["guide"])
        self.optim.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.history.epochs = list(state["history"])
        set_rng_state(state["rng"])
        return state["epoch"] + 1

    def state(self, epoch: int, checkpoint: Checkpoint | None) -> Callable[[], dict]:
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
            "config": (checkpoint.config if checkpoint is not None else None) or {},
        }

    def epoch(self, epoch: int, step: Step, batches, x, y, device, *, beta, checkpoint, on_step, transform=None,
              warmup_steps=0) -> dict:
        """One pass over ``batches`` (index tensors); returns the epoch's record (a replica's values as lists)."""
        tick = time.perf_counter()
        num_data, steps = self.model.num_data, len(batches)
        totals, betas = None, 0.0  # loss, nll, kl (one column per replica)
        rates = [group["lr"] for group in self.optim.param_groups]  # this epoch's scheduled rates
        warming = epoch * steps < warmup_steps  # the warm-up reaches into this epoch
        for i, idx in enumerate(batches):
            xb, yb = batch(x, y, idx, device)
            if transform is not None:
                xb = transform(xb)
            b = beta(epoch, i, steps)
            if warming:  # optimiser steps before this one: epoch * steps + i
                warm_up(self.optim, rates, (epoch * steps + i + 1) / warmup_steps)
            if isinstance(self.optim, PerturbingOptimizer):  # the loss and its gradient at a draw (IVON)
                with self.optim.sampled_params(train=True):
                    terms, gradients = step(xb, yb, b)
                    stepping = set_gradients(self.optim, terms.loss.sum(), gradients)
                if stepping:
                    optimizer_step(self.optim, terms.loss.sum())
            else:
                terms, gradients = step(xb, yb, b)
                update(self.optim, terms.loss.sum(), gradients)
            # one device-to-host copy per step for the logged terms
            values = torch.stack([terms.loss.detach(), terms.nll, torch.as_tensor(terms.kl).to(terms.nll)]
                                 ).double().cpu().reshape(3, -1)
            if not torch.isfinite(values[0]).all():
                r = int((~torch.isfinite(values[0])).nonzero()[0])
                who = f"replica {r}: " if values.shape[1] > 1 else ""
                kept = f" The last good checkpoint is kept at {checkpoint.path}." if checkpoint else ""
                raise TrainingDiverged(
                    f"{who}loss became {values[0, r].item()} at epoch {epoch + 1}, step {i + 1} (beta={b:g}, "
                    f"lr={per_example_rate(self.optim.param_groups[0]):g}); training stopped.{kept} Lower the "
                    "learning rate or init_rho, or check the inputs for NaN.",
                    replica=r if values.shape[1] > 1 else None)
            totals = values if totals is None else totals + values
            betas += b
            on_step(epoch, totals[0].mean().item() / ((i + 1) * num_data))
        if warming:
            warm_up(self.optim, rates, 1.0)  # the schedule sees its own rates
        loss, nll, kl = ((row / steps).tolist() for row in totals)
        single = len(loss) == 1
        return {"epoch": epoch + 1, "loss": loss[0] / num_data if single else [v / num_data for v in loss],
                "nll": nll[0] / num_data if single else [v / num_data for v in nll], "kl": kl[0] if single else kl,
                "beta": betas / steps, "lr": per_example_rate(self.optim.param_groups[0]),
                "seconds": time.perf_counter() - tick}
