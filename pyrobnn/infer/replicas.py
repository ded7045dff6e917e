r"""Train R networks of one architecture at once, as one stacked network: the grid points of a hyper-parameter
search, the members of a deep ensemble.

A small network's SVI step costs the dispatch of its operations, not their arithmetic (UCI regression's 13-50-1
network at batches of 128: ``benchmarks/uci_speed.py``), so R of them trained one after another cost R times the
overhead. :func:`fit_replicas` records one replica's step, its loss terms and the gradient of its loss, as one graph
of ATen operations (:func:`~pyrobnn.infer.svi.record_gradient`) and vectorises it over a leading replica dimension
of every parameter and buffer with :func:`torch.func.vmap` (``randomness="different"``: each replica draws its own
noise). One step then updates all R replicas: for replica :math:`r` with parameters :math:`\phi_r`,

.. math:: \nabla_{\phi_r} \sum_{s} \mathcal L_s(\phi_s) = \nabla_{\phi_r} \mathcal L_r(\phi_r),

so the stacked gradient is each replica's own, and an element-wise optimiser (Adam, SGD, their weight decay) makes
each replica's own update: every replica trains as :func:`~pyrobnn.infer.svi.fit` trains it with the same seed (the
same batches in the same order, the same β and learning-rate schedules), up to its random draws.

Replicas may differ in the values of their tensors (initial weights, a likelihood's noise scale, a buffer), not in
what the step computes: the same modules, parameter and buffer shapes, and Python hyper-parameters (a dropout rate
held as a number) as the first replica, whose graph all of them run.
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import Callable, Sequence

import pyro
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from pyrobnn.checkpoint import rng_state, set_rng_state
from pyrobnn.device import resolve_device
from pyrobnn.guides.base import SiteGuide
from pyrobnn.handlers import ESTIMATORS
from pyrobnn.handlers.node_draws import check_components
from pyrobnn.handlers.particles import ParticlesUnsupported
from pyrobnn.infer.optim import Optim, make_scheduler, per_example_rate, trained_parameters
from pyrobnn.infer.schedules import Constant
from pyrobnn.infer.svi import (
    History,
    TrainingDiverged,
    _check_data,
    _settle,
    _update,
    batch,
    built_optimizer,
    checked_fit_options,
    epoch_batches,
    fit,
    record_gradient,
    script_replay,
    warm_up,
)
from pyrobnn.model.bayesian_network import BayesianNetwork

__all__ = ["fit_replicas", "module_tensors"]


def module_tensors(model, guide) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``(parameters, buffers)`` of a model and its guide, each tensor once: what a replica's step reads."""
    buffers = list({id(b): b for b in (*guide.buffers(), *model.buffers())}.values())
    return trained_parameters(model, guide), buffers


def _layout(model, guide) -> list:
    params, buffers = module_tensors(model, guide)
    return [type(model), type(guide), *((t.shape, t.dtype, t.requires_grad) for t in (*params, *buffers))]


class _StackedStep:
    """The recorded step of replica 0, vectorised over the replica dimension and replayed as TorchScript; one graph
    per batch shape (the last batch of an epoch may be smaller)."""

    def __init__(self, pairs, tensors, elbo, estimator, num_particles, precision):
        self.pairs, self.tensors = pairs, tensors  # tensors[i]: replica 0's i-th parameter or buffer
        self.options = (elbo, estimator, num_particles, precision)
        self.graphs: dict = {}

    def __call__(self, x, y, beta: torch.Tensor, stacked: Sequence[torch.Tensor]):
        key = (x.shape, y.shape, self.pairs[0][0].training)
        if key not in self.graphs:
            self.graphs[key] = self._record(x, y, beta, stacked)
        replay, trained = self.graphs[key]
        with torch.no_grad():
            loss, nll, kl, *gradients = replay(x, y, beta, *stacked)
        return loss, nll, kl, [(stacked[i], gradient) for i, gradient in zip(trained, gradients)]

    def _record(self, x, y, beta, stacked):
        model, guide = self.pairs[0]
        args = (model, guide, x, y, self.options[0], beta, *self.options[1:])
        state = rng_state()
        try:
            graph, trained = record_gradient(args, (x, y, beta, *self.tensors))
            batched = torch.func.vmap(graph, in_dims=(None, None, None) + (0,) * len(stacked),
                                      randomness="different")
            inputs = (x, y, beta, *stacked)
            with torch.no_grad():
                flat = make_fx(batched)(*inputs)
            return script_replay(flat, inputs), trained
        except (ParticlesUnsupported, torch.OutOfMemoryError):
            raise
        except Exception as error:  # a value read on the host, an operation vmap cannot batch, an error of the
            raise _Unrecorded() from error  # model (which the eager fallback raises again)
        finally:
            set_rng_state(state)


class _Unrecorded(Exception):
    """The stacked step cannot be recorded: the replicas train one after another."""


def fit_replicas(
    pairs: Sequence[tuple],
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
    precision: str = "fp32",
    seed: int = 0,
    device: str | torch.device = "auto",
) -> list[History]:
    r"""Train every ``(model, guide)`` of ``pairs`` on ``(x, y)`` by SVI, as :func:`~pyrobnn.infer.svi.fit` trains
    one (same arguments and meaning), all R of them in one stacked step (the module's docstring): the i-th
    :class:`~pyrobnn.infer.svi.History` is the i-th pair's, and each pair's modules hold its trained values when it
    returns. The pairs share the batches, the β schedule and the optimiser's settings (``optimizer(*pairs[0])``,
    applied to the stacked parameters); each draws its own noise. Without a recorded step (a model whose Python
    reads a tensor's value), the pairs train one after another with ``fit(compile="trace")``.

    :raises ValueError: when the pairs differ in their modules' types or their tensors' shapes.
    :raises TrainingDiverged: when a replica's loss becomes NaN/inf (its index and the step are named).
    """
    pairs = [tuple(pair) for pair in pairs]
    if not pairs:
        raise ValueError("pairs: give at least one (model, guide)")
    epochs, batch_size, num_particles = checked_fit_options(x, epochs, batch_size, num_particles, optimizer, estimator,
                                                            elbo, num_data, precision)
    for i, (model, guide) in enumerate(pairs):
        if not isinstance(model, BayesianNetwork) or not isinstance(guide, SiteGuide):
            raise ValueError(f"pairs[{i}]: fit_replicas trains a BayesianNetwork with a pyrobnn guide (SiteGuide), "
                             "which claim their own parameters in Pyro's param store; an autoguide's replicas would "
                             "share one entry per name: train them one by one with fit")
    layout = _layout(*pairs[0])
    for i, pair in enumerate(pairs[1:], 1):
        if _layout(*pair) != layout:
            raise ValueError(f"pairs[{i}] is not a replica of pairs[0]: stacked training needs the same model and "
                             "guide types and the same parameter and buffer shapes")
    fallback = dict(epochs=epochs, batch_size=batch_size, optimizer=optimizer, beta=beta, estimator=estimator,
                    num_particles=num_particles, elbo=elbo, num_data=num_data, precision=precision, seed=seed,
                    device=device, compile="trace", progress=False)
    if len(pairs) == 1:
        return [fit(*pairs[0], x, y, **fallback)]
    model, guide = pairs[0]
    if ESTIMATORS[estimator].stochastic:
        check_components(guide.num_components, batch_size, num_particles, x.shape[0])
    device = resolve_device(device)
    for m, g in pairs:
        m.to(device)
        g.to(device)
        m.num_data = x.shape[0] if num_data is None else num_data
        m.train()
    _check_data(model, guide, x, y, "training data")
    optim, warmup_steps = built_optimizer(optimizer, model, guide)
    pyro.set_rng_seed(seed)

    steps = math.ceil(x.shape[0] / batch_size)
    with pyro.validation_enabled(False), _unshared_storage([g for _, g in pairs]):
        first = torch.arange(min(batch_size, x.shape[0]))
        for m, g in pairs:  # a guide's first call may move its parameters (NormalGuide): before they are read
            _settle((m, g, x[first].to(device), y[first].to(device), elbo, 1.0, estimator, num_particles,
                     precision))
        replicas = [module_tensors(m, g) for m, g in pairs]
        tensors = [*replicas[0][0], *replicas[0][1]]
        stacked = [torch.stack([[*p, *b][i].detach() for p, b in replicas]).requires_grad_(t.requires_grad)
                   for i, t in enumerate(tensors)]
        position = {id(t): i for i, t in enumerate(tensors)}
        for group in optim.param_groups:  # the optimiser's settings, applied to the stacked parameters
            group["params"] = [stacked[position[id(p)]] for p in group["params"]]
        scheduler = make_scheduler(optim, getattr(optimizer, "schedule", None))
        step_of = _StackedStep(pairs, tensors, elbo, estimator, num_particles, precision)
        histories = [History() for _ in pairs]
        try:
            for epoch in range(epochs):
                record = _epoch(epoch, x, y, device, step_of, stacked, optim, beta, seed, batch_size, steps,
                                warmup_steps)
                scheduler.step()
                for i, history in enumerate(histories):
                    history.epochs.append({key: value[i] if isinstance(value, list) else value
                                           for key, value in record.items()})
        except _Unrecorded:  # recorded in the first epoch: the pairs' own tensors are untouched
            return [fit(m, g, x, y, **fallback) for m, g in pairs]
        except BaseException:
            _unstack(replicas, stacked)  # the last good values (a diverged step is not applied)
            raise
    _unstack(replicas, stacked)
    return histories


@contextlib.contextmanager
def _unshared_storage(guides):
    """The guides' parameters read one by one, not through one flat storage that the stacked tensors do not share
    (:attr:`~pyrobnn.guides.base.SiteGuide.shared_storage`)."""
    shared = [g for g in guides if getattr(g, "shared_storage", False)]
    for g in shared:
        g.shared_storage = False
    try:
        yield
    finally:
        for g in shared:
            del g.shared_storage


def _unstack(replicas, stacked) -> None:
    """Each replica's slice of the stacked tensors, copied into its modules' own tensors."""
    with torch.no_grad():
        for r, (params, buffers) in enumerate(replicas):
            for i, t in enumerate((*params, *buffers)):
                t.copy_(stacked[i][r])


def _epoch(epoch, x, y, device, step_of, stacked, optim, beta, seed, batch_size, steps, warmup_steps) -> dict:
    """One pass over the data for all replicas; the epoch's record with one value per replica (lists)."""
    tick = time.perf_counter()
    rates = [group["lr"] for group in optim.param_groups]
    warming = epoch * steps < warmup_steps
    totals, betas = None, 0.0
    num_data = step_of.pairs[0][0].num_data
    for step, idx in enumerate(epoch_batches(x.shape[0], batch_size, seed, epoch)):  # fit's batches
        xb, yb = batch(x, y, idx, device)
        b = beta(epoch, step, steps)
        if warming:
            warm_up(optim, rates, (epoch * steps + step + 1) / warmup_steps)
        loss, nll, kl, gradients = step_of(xb, yb, torch.tensor(float(b), dtype=xb.dtype, device=device), stacked)
        _update(optim, loss.sum(), gradients)
        values = torch.stack([loss, nll, kl]).double().cpu()  # one device-to-host copy per step
        if not torch.isfinite(values[0]).all():
            r = int((~torch.isfinite(values[0])).nonzero()[0])
            raise TrainingDiverged(
                f"replica {r}: loss became {values[0, r].item()} at epoch {epoch + 1}, step {step + 1} (beta={b:g}, "
                f"lr={per_example_rate(optim.param_groups[0]):g}); training stopped. Lower the learning rate or "
                "init_rho, or check the inputs for NaN.")
        totals = values if totals is None else totals + values
        betas += b
    if warming:
        warm_up(optim, rates, 1.0)
    loss, nll, kl = (totals / steps).tolist()
    return {"epoch": epoch + 1, "loss": [v / num_data for v in loss], "nll": [v / num_data for v in nll], "kl": kl,
            "beta": betas / steps, "lr": per_example_rate(optim.param_groups[0]),
            "seconds": time.perf_counter() - tick}
