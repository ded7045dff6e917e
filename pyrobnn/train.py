r"""The training loop: minibatch SVI on the annealed ELBO, with validation, checkpoints and resume.

One step on minibatch :math:`i` of epoch :math:`e` minimises

.. math:: -\frac{N}{B}\sum_{b}\log p(y_b|x_b,w) + \beta_{e,i}\,\mathrm{KL}(q\|p),
          \quad w \sim q \ (\text{``num\_particles``} \text{ samples})

(SPEC section 2) with one ``torch.optim`` optimiser over every parameter of
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
from typing import Callable, Optional

import pyro
import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .checks import positive_int
from .device import resolve_device
from .checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state
from .elbo import MeanFieldELBO
from .gaussian_weight import ParticlesUnsupported
from .handlers import flipout, kl_annealing, local_reparameterization, vdp, weight_sampling
from .predict import evaluate, predictive_outputs
from .analysis.prune import principled_masks, sparsity
from .schedules import Constant

__all__ = ["fit", "svi_step", "estimator_handler", "ESTIMATORS", "make_optimizer", "resolve_device", "TrainingDiverged", "History"]


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


ESTIMATORS = ("sample", "local", "flipout", "vdp")
"""Gradient estimators: weight sampling, local reparameterization (particles vectorized), flipout,
and VDP++ moment propagation (deterministic, no particles)."""


def estimator_handler(estimator: str, num_particles: int, batch_size: int):
    """The handler that makes ``estimator``, all ``num_particles`` particles in one pass.

    ``"sample"`` draws weights (:func:`~pyrobnn.handlers.weight_sampling`); ``"local"`` samples
    pre-activations (:func:`~pyrobnn.handlers.local_reparameterization`); ``"flipout"`` shares one
    perturbation per batch and particle, with per-example signs (:func:`~pyrobnn.handlers.flipout`);
    ``"vdp"`` propagates means and variances instead of sampling (VDP++, paper 002; the likelihood
    scores the output moments, so it has no particles).
    """
    if estimator == "sample":  # one particle needs no handler: the guide's sample is the weight
        return weight_sampling(num_particles=num_particles, batch_size=batch_size) if num_particles > 1 \
            else contextlib.nullcontext()
    if estimator == "local":
        return local_reparameterization(num_particles=num_particles, batch_size=batch_size)
    if estimator == "flipout":
        return flipout(num_particles=num_particles, batch_size=batch_size)
    if estimator == "vdp":
        return vdp()
    raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")


def svi_step(model, guide, optim: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, *,
             elbo=None, beta: float = 1.0, estimator: str = "sample", num_particles: int = 1):
    """One gradient step on the β-annealed negative ELBO of a minibatch; returns its :class:`~pyrobnn.elbo.ELBOTerms`.

    ``estimator`` and ``num_particles`` choose the Monte-Carlo estimator (see :func:`estimator_handler`);
    the particles run in one vectorized pass, or in a loop when the network uses a Bayesian
    parameter outside a Linear/Conv layer. An explicit ``elbo`` keeps its own (looped) ``num_particles``.
    The update is skipped (and the terms returned) when the loss is not finite.
    """
    particles = 1 if elbo is not None or estimator == "vdp" else num_particles
    elbo = elbo if elbo is not None else MeanFieldELBO()
    try:
        with kl_annealing(beta=beta), estimator_handler(estimator, particles, x.shape[0]):
            terms = elbo.terms(model, guide, x, y)
    except ParticlesUnsupported:
        with kl_annealing(beta=beta), estimator_handler(estimator, 1, x.shape[0]):
            terms = MeanFieldELBO(num_particles=particles).terms(model, guide, x, y)
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


def _check_data(model, guide, x: torch.Tensor, y: torch.Tensor, what: str) -> None:
    """Shape and label checks done once on the whole dataset, not on every step."""
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"{what}: x has {x.shape[0]} examples but y has {y.shape[0]}")
    model.check_input(x[:1])
    if model.task == "classification":
        with pyro.poutine.block():
            num_classes = predictive_outputs(model, guide, x[:1], num_samples=1, vectorized=False).shape[-1]
        if y.dtype.is_floating_point:
            raise ValueError(f"{what}: labels must be integer class indices, got {y.dtype}")
        low, high = int(y.min()), int(y.max())
        if low < 0 or high >= num_classes:
            raise ValueError(
                f"{what}: label {low if low < 0 else high} is out of range for a network with "
                f"{num_classes} outputs (labels must lie in [0, {num_classes - 1}])"
            )


def fit(
    model,
    guide,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int = 10,
    batch_size: int = 128,
    lr: float = 1e-3,
    optimizer: str = "adam",
    weight_decay: float = 0.0,
    lr_step: int = 0,
    lr_gamma: float = 0.5,
    beta: Callable[[int, int, int], float] = Constant(1.0),
    num_particles: int = 1,
    estimator: str = "sample",
    elbo=None,
    val: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
    val_samples: int = 10,
    seed: int = 0,
    device: str | torch.device = "auto",
    checkpoint: str | Path | None = None,
    resume: bool = False,
    config: Optional[dict] = None,
    progress: bool = True,
    on_epoch_end: Optional[Callable[[int, dict], None]] = None,
) -> History:
    r"""Train ``guide`` (and the model's deterministic parameters) on ``(x, y)`` by SVI.

    :param model: a :class:`~pyrobnn.BayesianNetwork` (its ``num_data`` is set to ``len(x)``).
    :param guide: a pyrobnn guide built on ``model`` (e.g. :class:`~pyrobnn.NormalGuide`).
    :param x, y: training inputs and targets (tensors; moved to the device batch by batch).
    :param epochs: number of passes over the data.
    :param batch_size: minibatch size B; the likelihood is scaled by N/B.
    :param lr: learning rate of ``optimizer`` (``"adam"`` or ``"sgd"``, momentum 0.9).
    :param lr_step: multiply the learning rate by ``lr_gamma`` every ``lr_step`` epochs (0: constant;
        paper 003 halves it every 100 epochs).
    :param beta: KL-weight schedule ``beta(epoch, step, steps_per_epoch)``, see :mod:`pyrobnn.schedules`.
    :param num_particles: posterior samples per step (paper 003 uses 5).
    :param estimator: ``"sample"`` (weight sampling), ``"local"`` (local reparameterization, particles
        in one pass) or ``"flipout"``; see :func:`estimator_handler`.
    :param elbo: the ELBO (default :class:`~pyrobnn.MeanFieldELBO`).
    :param val: optional ``(x_val, y_val)`` evaluated after each epoch with ``val_samples`` MC samples.
    :param seed: seeds parameter noise and the data order (``pyro.set_rng_seed``).
    :param device: ``"auto"``, ``"cpu"`` or ``"cuda"``; model, guide and batches follow it.
    :param checkpoint: file written atomically after every epoch (parameters, optimiser, epoch, RNG).
    :param resume: continue from ``checkpoint`` if it exists.
    :param config: extra metadata stored in the checkpoint (how to rebuild model and guide).
    :param on_epoch_end: callback ``(epoch, record)`` after each epoch.
    :returns: the :class:`History` of per-epoch records.
    :raises TrainingDiverged: when the loss becomes NaN/inf (the checkpoint keeps the last good epoch).
    """
    epochs = positive_int("epochs", epochs)
    batch_size = positive_int("batch_size", batch_size)
    num_particles = positive_int("num_particles", num_particles)
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr (learning rate) must be a finite number > 0, got {lr!r}")
    if not isinstance(lr_step, int) or lr_step < 0:
        raise ValueError(f"lr_step must be an integer >= 0 (0 keeps lr constant), got {lr_step!r}")
    if resume and checkpoint is None:
        raise ValueError("resume=True needs checkpoint=<path of the run to continue>")
    device = resolve_device(device)
    model.to(device)
    guide.to(device)
    _check_data(model, guide, x, y, "training data")
    if val is not None:
        _check_data(model, guide, *val, "validation data")
    num_data = x.shape[0]
    model.num_data = num_data
    estimator_handler(estimator, num_particles, batch_size)  # validates the name

    params = list({id(p): p for p in (*guide.parameters(), *model.parameters())}.values())
    optim = make_optimizer(params, optimizer, lr, weight_decay)
    scheduler = torch.optim.lr_scheduler.StepLR(optim, step_size=lr_step or 1, gamma=lr_gamma if lr_step else 1.0)

    history, start = History(), 0
    pyro.set_rng_seed(seed)
    if resume and Path(checkpoint).is_file():
        state = load_checkpoint(checkpoint, map_location=device)
        model.load_state_dict(state["model"])
        guide.load_state_dict(state["guide"])
        optim.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        history.epochs = list(state["history"])
        start = state["epoch"] + 1
        set_rng_state(state["rng"])

    steps = math.ceil(num_data / batch_size)
    order_rng = torch.Generator()
    bar = Progress(
        TextColumn("[bold]epoch {task.fields[epoch]}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[stats]}"), TimeElapsedColumn(), disable=not progress, transient=False,
    )
    with bar, pyro.validation_enabled(False):
        task = bar.add_task("train", total=steps * (epochs - start), epoch=start + 1, stats="")
        for epoch in range(start, epochs):
            model.train()
            tick = time.perf_counter()
            order_rng.manual_seed(seed * 100003 + epoch)  # data order depends on (seed, epoch) only
            order = torch.randperm(num_data, generator=order_rng)
            total_loss = total_nll = total_kl = 0.0
            for step in range(steps):
                idx = order[step * batch_size:(step + 1) * batch_size]
                xb, yb = x[idx].to(device, non_blocking=True), y[idx].to(device, non_blocking=True)
                b = beta(epoch, step, steps)
                terms = svi_step(model, guide, optim, xb, yb, elbo=elbo, beta=b, estimator=estimator,
                                 num_particles=num_particles)
                # one device-to-host copy per step for the three logged terms
                loss, nll, kl = torch.stack([terms.loss.detach(), terms.nll, torch.as_tensor(terms.kl).to(
                    terms.nll)]).tolist()
                if not math.isfinite(loss):
                    kept = f" The last good checkpoint is kept at {checkpoint}." if checkpoint else ""
                    raise TrainingDiverged(
                        f"loss became {loss} at epoch {epoch + 1}, step {step + 1} (beta={b:g}, "
                        f"lr={optim.param_groups[0]['lr']:g}); training stopped.{kept} Lower the learning "
                        "rate or init_rho, or check the inputs for NaN."
                    )
                total_loss += loss
                total_nll += nll
                total_kl += kl
                bar.update(task, advance=1, epoch=epoch + 1,
                           stats=f"loss {total_loss / (step + 1):.4g}  beta {b:.3g}")
            record = {
                "epoch": epoch + 1,
                "loss": total_loss / steps,
                "nll": total_nll / steps,
                "kl": total_kl / steps,
                "beta": b,
                "lr": optim.param_groups[0]["lr"],
                "seconds": time.perf_counter() - tick,
            }
            scheduler.step()
            if getattr(guide, "site_names", None) and hasattr(guide, "pruning_rule"):
                try:
                    removed = sparsity(principled_masks(guide))
                    record["sparsity"] = removed.pop("total")
                    record["layer_sparsity"] = list(removed.values())
                except (TypeError, ValueError):  # no Normal-family posterior / no weights
                    pass
            if val is not None:
                metrics = evaluate(model, guide, *val, num_samples=val_samples)
                record.update({f"val_{k}": v for k, v in metrics.items()})
            history.epochs.append(record)
            shown = "  ".join(f"{k} {v:.4g}" for k, v in record.items() if k in ("nll", "kl", "sparsity", "val_accuracy", "val_nll", "val_rmse"))
            bar.update(task, stats=shown)
            if checkpoint is not None:
                save_checkpoint(checkpoint, {
                    "model": model.state_dict(),
                    "guide": guide.state_dict(),
                    "optimizer": optim.state_dict(),
                    "scheduler": scheduler.state_dict(),
                    "epoch": epoch,
                    "history": history.epochs,
                    "rng": rng_state(),
                    "config": config or {},
                })
            if on_epoch_end is not None:
                on_epoch_end(epoch, record)
    return history
