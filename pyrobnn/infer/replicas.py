r"""Train R networks of one architecture at once, as one stacked network: the grid points of a hyper-parameter
search, the members of a deep ensemble.

A small network's SVI step costs the dispatch of its operations, not their arithmetic (UCI regression's 13-50-1
network at batches of 128: ``benchmarks/uci_speed.py``), so R of them trained one after another cost R times the
overhead. :func:`fit_replicas` runs the stacked step of :class:`~pyrobnn.infer.step.Step`: one replica's step, its
loss terms and the gradient of its loss, recorded as one graph of ATen operations and vectorised over a leading
replica dimension of every parameter and buffer with :func:`torch.func.vmap` (``randomness="different"``: each
replica draws its own noise), in :func:`~pyrobnn.infer.svi.fit`'s own loop. One step then updates all R replicas:
for replica :math:`r` with parameters :math:`\phi_r`,

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
from typing import Callable, Sequence

import pyro
import torch

from pyrobnn.device import resolve_device
from pyrobnn.guides.base import SiteGuide
from pyrobnn.handlers.node_draws import check_components
from pyrobnn.infer.optim import Optim, make_scheduler, schedule_of, splits_kl
from pyrobnn.infer.recording import check_mode
from pyrobnn.infer.schedules import Constant
from pyrobnn.infer.step import ExecutorFailed, Step, objective, settle, tensors
from pyrobnn.infer.svi import (
    History,
    Run,
    TrainingDiverged,
    built_optimizer,
    check_data,
    checked_fit_options,
    fit,
    train_epochs,
)
from pyrobnn.model.bayesian_network import BayesianNetwork

__all__ = ["fit_replicas"]


def _layout(model, guide) -> list:
    return [type(model), type(guide), *((t.shape, t.dtype, t.requires_grad) for t in tensors(model, guide))]


def fit_replicas(
    pairs: Sequence[tuple],
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int = 10,
    batch_size: int = 128,
    optimizer: Callable[..., torch.optim.Optimizer] = Optim(),
    beta: Callable[[int, int, int], float] = Constant(1.0),
    elbo=None,
    num_data: int | None = None,
    compile: str = "auto",
    seed: int = 0,
    device: str | torch.device = "auto",
) -> list[History]:
    r"""Train every ``(model, guide)`` of ``pairs`` on ``(x, y)`` by SVI, as :func:`~pyrobnn.infer.svi.fit` trains
    one (same arguments and meaning), all R of them in one stacked step (the module's docstring): the i-th
    :class:`~pyrobnn.infer.svi.History` is the i-th pair's, and each pair's modules hold its trained values when it
    returns. The pairs share the batches, the β schedule and the optimiser's settings (``optimizer(*pairs[0])``,
    applied to the stacked parameters); each draws its own noise. Without a recorded step (``compile="none"``, or a
    model whose Python reads a tensor's value), the pairs train one after another with ``fit``.

    :raises ValueError: when the pairs differ in their modules' types or their tensors' shapes.
    :raises TrainingDiverged: when a replica's loss becomes NaN/inf (its index and the step are named).
    """
    pairs = [tuple(pair) for pair in pairs]
    if not pairs:
        raise ValueError("pairs: give at least one (model, guide)")
    elbo = objective(elbo)
    epochs, batch_size = checked_fit_options(x, epochs, batch_size, optimizer, elbo, num_data, compile)
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
    alone = dict(epochs=epochs, batch_size=batch_size, optimizer=optimizer, beta=beta, elbo=elbo, num_data=num_data,
                 seed=seed, device=device, compile=compile, progress=False)
    if len(pairs) == 1 or check_mode(compile) == "none":
        return _one_by_one(pairs, x, y, alone)
    model, guide = pairs[0]
    if elbo.stochastic:
        check_components(guide.num_components, batch_size, elbo.num_particles if elbo.vectorize_particles else 1,
                         x.shape[0])
    device = resolve_device(device)
    for m, g in pairs:
        m.to(device)
        g.to(device)
        m.num_data = x.shape[0] if num_data is None else num_data
        m.train()
    check_data(model, guide, x, y, "training data")
    optim, warmup_steps = built_optimizer(optimizer, model, guide)
    pyro.set_rng_seed(seed)
    with pyro.validation_enabled(False), _unshared_storage([g for _, g in pairs]):
        first = torch.arange(min(batch_size, x.shape[0]))
        for m, g in pairs:  # a guide's first call may move its parameters (NormalGuide): before they are read
            settle(m, g, elbo, x[first].to(device), y[first].to(device))
        replicas = [tensors(m, g) for m, g in pairs]
        stacked = [torch.stack([replica[i].detach() for replica in replicas]).requires_grad_(t.requires_grad)
                   for i, t in enumerate(replicas[0])]
        position = {id(t): i for i, t in enumerate(replicas[0])}
        for group in optim.param_groups:  # the optimiser's settings, applied to the stacked parameters
            group["params"] = [stacked[position[id(p)]] for p in group["params"]]
        scheduler = make_scheduler(optim, schedule_of(optimizer)[0])
        step = Step(model, guide, elbo, compile, steps=epochs * math.ceil(x.shape[0] / batch_size), device=device,
                    stacked=stacked, split_kl=splits_kl(optim))
        run = Run(model, guide, optim, scheduler, History())
        try:
            history = train_epochs(run, step, x, y, range(epochs), batch_size, seed, device, beta=beta,
                                   warmup_steps=warmup_steps)
        except ExecutorFailed:  # recorded at the first step: the pairs' own tensors are untouched
            return _one_by_one(pairs, x, y, alone)
        except BaseException:
            _unstack(replicas, stacked)  # the last good values (a diverged step is not applied)
            raise
    _unstack(replicas, stacked)
    return [History([{key: value[i] if isinstance(value, list) else value for key, value in record.items()}
                     for record in history.epochs], compile=history.compile, compile_reason=history.compile_reason)
            for i in range(len(pairs))]


def _one_by_one(pairs, x, y, options: dict) -> list[History]:
    """Each pair trained alone by :func:`~pyrobnn.infer.svi.fit`; a divergence names the pair as its replica."""
    histories = []
    for i, (model, guide) in enumerate(pairs):
        try:
            histories.append(fit(model, guide, x, y, **options))
        except TrainingDiverged as error:
            raise TrainingDiverged(str(error) if len(pairs) == 1 else f"replica {i}: {error}", replica=i) from None
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
        for r, values in enumerate(replicas):
            for i, t in enumerate(values):
                t.copy_(stacked[i][r])
