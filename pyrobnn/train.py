r"""The training loop: minibatch SVI on the annealed ELBO, with validation, checkpoints and resume.

One step on minibatch :math:`i` of epoch :math:`e` minimises

.. math:: -\frac{N}{B}\sum_{b}\log p(y_b|x_b,w) + \beta_{e,i}\,\mathrm{KL}(q\|p),
          \quad w \sim q \ (\text{``num\_particles``} \text{ samples})

with one ``torch.optim`` optimiser over every parameter of
the guide and the model's deterministic parameters. It is the loop a Pyro
user would write around :class:`pyro.infer.SVI`, with what a long run needs:
a β schedule (:mod:`pyrobnn.schedules`, applied by
:func:`~pyrobnn.handlers.kl_annealing`), a learning-rate schedule, validation
each epoch, a rich progress bar, an atomic checkpoint after every epoch that
restores parameters, optimiser, scheduler, epoch and every RNG (a resumed run
continues exactly as the uninterrupted one), and a stop with a clear message
when the loss becomes NaN/inf (the last good checkpoint is kept).

The optimiser holds the guide's and the model's own ``nn.Parameter`` s, so the
loop does not depend on Pyro's global parameter store.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import pyro
import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state
from .checks import check_labels, choice, positive_int
from .device import device_of, resolve_device
from .elbo import MeanFieldELBO
from .handlers import ESTIMATORS, kl_annealing
from .handlers import estimator as estimator_handler
from .particles import ParticlesUnsupported
from .predict import evaluate, predictive_outputs
from .schedules import Constant

__all__ = ["fit", "svi_step", "make_optimizer", "TrainingDiverged", "History", "Callback", "PRECISIONS"]

PRECISIONS = ("fp32", "bf16")
"""Arithmetic of the network's matmuls and convolutions: float32, or bfloat16 under ``torch.autocast`` (the
KL, the guide's parameters and the log-likelihood stay in float32)."""


def _precision(precision: str, device: torch.device):
    if choice("precision", precision, PRECISIONS) == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)

Callback = Callable[[int, dict], None]
"""Called after each epoch with ``(epoch, record)``; it may add entries to the record (e.g.
:func:`pyrobnn.analysis.prune.record_sparsity`)."""


def _constant_lr(epoch: int) -> float:
    return 1.0


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


def svi_step(model, guide, optim: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, *,
             elbo=None, beta: float = 1.0, estimator: str = "sample", num_particles: int = 1,
             precision: str = "fp32"):
    """One gradient step on the β-annealed negative ELBO of a minibatch; returns its :class:`~pyrobnn.elbo.ELBOTerms`.

    ``estimator`` (a key of :data:`pyrobnn.handlers.ESTIMATORS`) and ``num_particles`` choose the
    Monte-Carlo estimator; the particles run in one vectorized pass, or in a loop when the network
    uses a Bayesian parameter outside a Linear/Conv layer. An explicit ``elbo`` draws its own
    particles (its ``num_particles``), so it is refused together with ``num_particles > 1``.
    ``precision="bf16"`` runs the network under ``torch.autocast`` (see :data:`PRECISIONS`).
    The update is skipped (and the terms returned) when the loss is not finite.
    """
    if elbo is not None and num_particles > 1:
        raise ValueError("pass num_particles to the elbo (it loops) or to svi_step/fit (one vectorized pass), "
                         "not both: got elbo= and num_particles > 1")
    elbo = elbo if elbo is not None else MeanFieldELBO()
    arithmetic = _precision(precision, x.device)
    try:
        with arithmetic, kl_annealing(beta=beta), estimator_handler(estimator, num_particles, x.shape[0]):
            terms = elbo.terms(model, guide, x, y)
    except ParticlesUnsupported:
        with arithmetic, kl_annealing(beta=beta), estimator_handler(estimator, 1, x.shape[0]):
            terms = MeanFieldELBO(num_particles=num_particles).terms(model, guide, x, y)
    if torch.isfinite(terms.loss):
        optim.zero_grad(set_to_none=True)
        terms.loss.backward()
        optim.step()
    return terms


def make_optimizer(params, name: str = "adam", lr: float = 1e-3, weight_decay: float = 0.0):
    """``torch.optim.Adam`` (or SGD with momentum 0.9) over ``params``, fused into one kernel where
    the device supports it (CPU and CUDA): one update for all parameters instead of one per tensor."""
    params = list(params)
    if name not in ("adam", "sgd"):
        raise ValueError(f"optimizer must be 'adam' or 'sgd', got {name!r}")
    cls, options = (torch.optim.Adam, {}) if name == "adam" else (torch.optim.SGD, {"momentum": 0.9})
    if params:
        try:
            return cls(params, lr=lr, weight_decay=weight_decay, fused=True, **options)
        except (RuntimeError, TypeError, ValueError):
            pass
    return cls(params, lr=lr, weight_decay=weight_decay, **options)


def _check_components(guide, num_examples: int, batch_size: int, estimator: str, num_particles: int) -> None:
    """A guide that gives row r of a batch mixture component r mod K (``guide.num_components``, e.g.
    :class:`~pyrobnn.guides.MixtureNodeGuide`) needs every batch split evenly among the K components."""
    k = getattr(guide, "num_components", 1)
    if k == 1 or estimator == "vdp" or (estimator == "sample" and num_particles == 1) or num_particles % k == 0:
        return
    last = num_examples % batch_size
    if batch_size % k or last % k:
        raise ValueError(f"batch_size ({batch_size}) and the last batch ({last or batch_size} of {num_examples} "
                         f"examples) must be multiples of the guide's {k} mixture components (each row uses one): "
                         f"choose batch_size a multiple of {k} that divides the training set, or num_particles a "
                         f"multiple of {k}")


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


def fit(
    model,
    guide,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int = 10,
    batch_size: int = 128,
    lr: float = 1e-3,
    optimizer: str | Callable[..., torch.optim.Optimizer] = "adam",
    weight_decay: float = 0.0,
    lr_step: int = 0,
    lr_gamma: float = 0.5,
    lr_schedule: Callable[[int], float] | Sequence[Callable[[int], float]] | None = None,
    warmup_steps: int = 0,
    beta: Callable[[int, int, int], float] = Constant(1.0),
    num_particles: int = 1,
    estimator: str = "sample",
    elbo=None,
    num_data: int | None = None,
    transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
    precision: str = "fp32",
    val: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
    val_samples: int = 10,
    seed: int = 0,
    device: str | torch.device = "auto",
    checkpoint: str | Path | None = None,
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
    :param lr: learning rate of ``optimizer`` (``"adam"`` or ``"sgd"``, momentum 0.9).
    :param optimizer: ``"adam"``, ``"sgd"``, or a callable ``(model, guide) -> torch.optim.Optimizer`` for
        parameter groups of their own (``lr`` and ``weight_decay`` then belong to it).
    :param lr_step: multiply the learning rate by ``lr_gamma`` every ``lr_step`` epochs (0: constant;
        Blundell et al. 2015 halve it every 100 epochs).
    :param lr_schedule: instead of ``lr_step``, a multiplier of the initial learning rate per epoch,
        ``lr_schedule(epoch)`` (not applied to parameter groups marked ``"scheduled": False``), or one such
        callable per parameter group (``torch.optim.lr_scheduler.LambdaLR``).
    :param warmup_steps: ramp every group's learning rate linearly from ``1/W`` of its value up to it over the
        first ``W`` optimiser steps of the run (large-rate SGD on freshly initialised networks).
    :param beta: KL-weight schedule ``beta(epoch, step, steps_per_epoch)``, see :mod:`pyrobnn.schedules`.
    :param num_particles: posterior samples per step, drawn in one vectorized pass (Blundell et al. use 5).
    :param estimator: a key of :data:`pyrobnn.handlers.ESTIMATORS`: ``"sample"`` (weight sampling),
        ``"local"`` (local reparameterization), ``"flipout"`` or ``"vdp"`` (VDP++ moments).
    :param elbo: the ELBO (default :class:`~pyrobnn.MeanFieldELBO`); it draws its own particles, so
        ``num_particles`` must then be 1.
    :param num_data: the training-set size N that scales the likelihood (default ``len(x)``; under data-parallel
        training each process passes its shard and the full N, see :mod:`pyrobnn.distributed`).
    :param transform: applied to every training batch on the device (augmentation, uint8 to float:
        :class:`pyrobnn.data.augment.ImageAugment`); validation data is passed ready to use.
    :param precision: ``"fp32"`` or ``"bf16"`` (the network under ``torch.autocast``; KL and log-likelihood in fp32).
    :param val: optional ``(x_val, y_val)`` evaluated after each epoch with ``val_samples`` MC samples.
    :param seed: seeds parameter noise and the data order (``pyro.set_rng_seed``).
    :param device: ``"auto"``, ``"cpu"`` or ``"cuda"``; model, guide and batches follow it.
    :param checkpoint: file written atomically after every epoch (parameters, optimiser, epoch, RNG).
    :param resume: continue from ``checkpoint`` if it exists.
    :param config: extra metadata stored in the checkpoint (how to rebuild model and guide).
    :param on_epoch_end: callback(s) ``(epoch, record)`` after each epoch, before the checkpoint; they may
        add entries to the record (:func:`pyrobnn.analysis.prune.record_sparsity`).
    :returns: the :class:`History` of per-epoch records: ``loss`` and ``nll`` per training example,
        ``kl`` (nats, unweighted), ``beta`` (mean over the epoch), ``lr``, ``seconds``, ``val_*``.
    :raises TrainingDiverged: when the loss becomes NaN/inf (the checkpoint keeps the last good epoch).
    """
    epochs = positive_int("epochs", epochs)
    batch_size = positive_int("batch_size", batch_size)
    num_particles = positive_int("num_particles", num_particles)
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr (learning rate) must be a finite number > 0, got {lr!r}")
    if not isinstance(warmup_steps, int) or warmup_steps < 0:
        raise ValueError(f"warmup_steps must be an integer >= 0 (0: no warm-up), got {warmup_steps!r}")
    if not isinstance(lr_step, int) or lr_step < 0:
        raise ValueError(f"lr_step must be an integer >= 0 (0 keeps lr constant), got {lr_step!r}")
    if resume and checkpoint is None:
        raise ValueError("resume=True needs checkpoint=<path of the run to continue>")
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {sorted(ESTIMATORS)}, got {estimator!r}")
    if elbo is not None and num_particles > 1:
        raise ValueError("pass num_particles to the elbo (it loops) or to fit (one vectorized pass), not both")
    if lr_schedule is not None and lr_step:
        raise ValueError("pass lr_step (step decay) or lr_schedule (a multiplier per epoch), not both")
    if num_data is not None and (not isinstance(num_data, int) or num_data < x.shape[0]):
        raise ValueError(f"num_data must be an int >= len(x) = {x.shape[0]} (the full training-set size), "
                         f"got {num_data!r}")
    choice("precision", precision, PRECISIONS)
    _check_components(guide, x.shape[0], batch_size, estimator, num_particles)
    callbacks = [] if on_epoch_end is None else list(on_epoch_end) if isinstance(on_epoch_end, Sequence) \
        else [on_epoch_end]
    device = resolve_device(device)
    model.to(device)
    guide.to(device)
    _check_data(model, guide, x, y, "training data", transform)
    if val is not None:
        _check_data(model, guide, *val, "validation data")
    model.num_data = x.shape[0] if num_data is None else num_data

    if callable(optimizer):
        optim = optimizer(model, guide)
        if not isinstance(optim, torch.optim.Optimizer):
            raise TypeError(f"optimizer(model, guide) must return a torch.optim.Optimizer, got {type(optim).__name__}")
    else:
        params = list({id(p): p for p in (*guide.parameters(), *model.parameters())}.values())
        optim = make_optimizer(params, optimizer, lr, weight_decay)
    if lr_schedule is not None:
        if callable(lr_schedule):  # groups marked "scheduled": False (e.g. TwoGroupSGD's variational one) keep theirs
            lr_schedule = [lr_schedule if group.get("scheduled", True) else _constant_lr for group in optim.param_groups]
        scheduler = torch.optim.lr_scheduler.LambdaLR(optim, lr_schedule)
    else:
        scheduler = torch.optim.lr_scheduler.StepLR(optim, step_size=lr_step or 1, gamma=lr_gamma if lr_step else 1.0)
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

        for epoch in range(start, epochs):
            model.train()
            order = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed * 100003 + epoch))
            record = run.epoch(epoch, order.split(batch_size), x, y, device, beta=beta, elbo=elbo,
                               estimator=estimator, num_particles=num_particles, checkpoint=checkpoint,
                               on_step=advance, transform=transform, precision=precision, warmup_steps=warmup_steps)
            scheduler.step()
            if val is not None:
                metrics = evaluate(model, guide, *val, num_samples=val_samples)
                record.update({f"val_{k}": v for k, v in metrics.items()})
            for callback in callbacks:
                callback(epoch, record)
            run.history.epochs.append(record)
            if checkpoint is not None:
                run.save(checkpoint, epoch, config)
    return run.history


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

    def save(self, checkpoint, epoch: int, config: Optional[dict]) -> None:
        save_checkpoint(checkpoint, {
            "model": self.model.state_dict(),
            "guide": self.guide.state_dict(),
            "optimizer": self.optim.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "epoch": epoch,
            "history": self.history.epochs,
            "rng": rng_state(),
            "config": config or {},
        })

    def epoch(self, epoch: int, batches, x, y, device, *, beta, elbo, estimator, num_particles, checkpoint,
              on_step, transform=None, precision="fp32", warmup_steps=0) -> dict:
        """One pass over ``batches`` (index tensors); returns the epoch's record."""
        tick = time.perf_counter()
        num_data, steps = self.model.num_data, len(batches)
        totals = torch.zeros(4, dtype=torch.float64)  # loss, nll, kl, beta
        rates = [group["lr"] for group in self.optim.param_groups]  # this epoch's scheduled rates
        warming = epoch * steps < warmup_steps  # the warm-up reaches into this epoch
        for step, idx in enumerate(batches):
            xb = x[idx.to(x.device)].to(device, non_blocking=True)  # data kept on the device is sliced there
            yb = y[idx.to(y.device)].to(device, non_blocking=True)
            if transform is not None:
                xb = transform(xb)
            b = beta(epoch, step, steps)
            if warming:  # optimiser steps before this one: epoch * steps + step
                for group, rate in zip(self.optim.param_groups, rates):
                    group["lr"] = rate * min(1.0, (epoch * steps + step + 1) / warmup_steps)
            terms = svi_step(self.model, self.guide, self.optim, xb, yb, elbo=elbo, beta=b, estimator=estimator,
                             num_particles=num_particles, precision=precision)
            # one device-to-host copy per step for the logged terms
            values = torch.stack([terms.loss.detach(), terms.nll, torch.as_tensor(terms.kl).to(terms.nll)]).tolist()
            if not math.isfinite(values[0]):
                kept = f" The last good checkpoint is kept at {checkpoint}." if checkpoint else ""
                raise TrainingDiverged(
                    f"loss became {values[0]} at epoch {epoch + 1}, step {step + 1} (beta={b:g}, "
                    f"lr={self.optim.param_groups[0]['lr']:g}); training stopped.{kept} Lower the learning "
                    "rate or init_rho, or check the inputs for NaN."
                )
            totals += torch.tensor(values + [b], dtype=torch.float64)
            on_step(epoch, step, totals[0].item() / ((step + 1) * num_data))
        if warming:
            for group, rate in zip(self.optim.param_groups, rates):  # the schedule sees its own rates
                group["lr"] = rate
        loss, nll, kl, mean_beta = (totals / steps).tolist()
        return {"epoch": epoch + 1, "loss": loss / num_data, "nll": nll / num_data, "kl": kl, "beta": mean_beta,
                "lr": self.optim.param_groups[0]["lr"], "seconds": time.perf_counter() - tick}
