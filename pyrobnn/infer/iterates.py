r"""The iterates of a training run at the ends of its epochs: what SWAG's moments and SG-MCMC's draws are made of.

SWAG (:mod:`pyrobnn.infer.swag`) and the SG-MCMC samplers (:mod:`pyrobnn.infer.sgmcmc`) are optimisers handed to
:func:`~pyrobnn.infer.svi.fit` (or :func:`~pyrobnn.infer.replicas.fit_replicas`) through an optimizer factory: the
optimiser counts its own steps (:class:`EpochEnds`, a step post-hook), and after the last step of an epoch reads the
current values of the tensors it watches. It reads them where the optimiser holds them (:func:`positions`), so
when :func:`~pyrobnn.infer.replicas.fit_replicas` swaps its parameters for stacked ones, ``(R, ...)`` with one row per
replica, the same code reads every replica at once; :func:`current` gives every value a leading replica dimension
(1 for a single network).

:class:`Recorded` wraps an optimizer factory and keeps every optimiser it builds, so the caller of ``fit`` gets back
what they collected.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from pyrobnn.checks import positive_int
from pyrobnn.guides.base import direct_parameters
from pyrobnn.guides.point import point_values
from pyrobnn.infer.optim import schedule_of
from pyrobnn.infer.svi import Checkpoint

__all__ = ["EpochEnds", "Recorded", "site_parameters", "positions", "current", "refuse_resume"]


def site_parameters(guide, method: str) -> dict[str, torch.nn.Parameter]:
    """``{site: parameter}``: the point value of each of the guide's sites (a
    :class:`~pyrobnn.guides.PointGuide`), the parameter itself, in site order. A guide that is no point estimate, or
    a site outside the network's parameters (a constrained latent such as a noise scale of a Pyro model written by
    hand, whose point guide holds it in its unconstrained space) is a ``ValueError`` naming ``method``."""
    point_values(guide)  # a point-estimate guide
    outside = [name for name in guide.site_names if name not in guide.family_names]
    if outside:
        raise ValueError(f"{method} moves the network's parameters, but site {outside[0]!r} is a latent outside "
                         "them (its point guide holds it in an unconstrained space without the Jacobian): fix it "
                         "(pyro.condition) or make it a parameter of the network")
    with direct_parameters():
        return {name: guide.param(name, "locs") for name in guide.site_names}


def positions(optim: torch.optim.Optimizer, tensors: Sequence[torch.Tensor]) -> list[int]:
    """Where each of ``tensors`` stands in the flat list of ``optim``'s parameters (group after group), found by
    identity; a tensor the optimiser does not hold is a ``ValueError``."""
    index = {id(p): i for i, p in enumerate(p for group in optim.param_groups for p in group["params"])}
    missing = [i for i, t in enumerate(tensors) if id(t) not in index]
    if missing:
        raise ValueError(f"the optimiser does not hold tensor {missing[0]} of the {len(tensors)} to collect: build it "
                         "over the guide's and the model's parameters")
    return [index[id(t)] for t in tensors]


def current(optim: torch.optim.Optimizer, where: Sequence[int], shapes: Sequence[torch.Size]) -> list[torch.Tensor]:
    """The values the optimiser holds at ``where`` (:func:`positions`), detached (not copied), each with a leading
    replica dimension: ``(R, *shape)``, R = 1 for a network trained alone."""
    flat = [p for group in optim.param_groups for p in group["params"]]
    return [flat[i].detach().reshape(-1, *shape) for i, shape in zip(where, shapes)]


class EpochEnds:
    """Counts the steps of ``optim`` (a step post-hook) and calls ``at_end(epoch)`` after the last step of every
    epoch of ``steps_per_epoch`` steps (``epoch`` counts the completed epochs, from 1), as
    :func:`~pyrobnn.infer.svi.fit` and :func:`~pyrobnn.infer.replicas.fit_replicas` step: ``ceil(N / B)`` an
    epoch."""

    def __init__(self, optim: torch.optim.Optimizer, steps_per_epoch: int, at_end: Callable[[int], None]):
        self.steps_per_epoch = positive_int("steps_per_epoch", steps_per_epoch)
        self.at_end = at_end
        self.steps = 0
        self.handle = optim.register_step_post_hook(self)

    def __call__(self, optim, args, kwargs) -> None:
        self.steps += 1
        if self.steps % self.steps_per_epoch == 0:
            self.at_end(self.steps // self.steps_per_epoch)


class Recorded:
    """An optimizer factory that keeps every optimiser ``factory`` builds (``made``, in order) and passes on its
    ``schedule`` and ``warmup_steps``: one per :func:`~pyrobnn.infer.svi.fit`, one for all replicas of
    :func:`~pyrobnn.infer.replicas.fit_replicas` (one per replica where it trains them one after another)."""

    def __init__(self, factory: Callable[..., torch.optim.Optimizer]):
        self.factory = factory
        self.made: list[torch.optim.Optimizer] = []
        self.schedule, self.warmup_steps = schedule_of(factory)

    def __call__(self, model, guide) -> torch.optim.Optimizer:
        optim = self.factory(model, guide)
        self.made.append(optim)
        return optim


def refuse_resume(checkpoint, what: str) -> None:
    """A ``ValueError`` when ``checkpoint`` (a :class:`~pyrobnn.infer.svi.Checkpoint`, a path or None) asks to
    resume: ``what`` (e.g. "a SWAG run keeps its moments") is kept in memory, not in the checkpoint."""
    checkpoint = Checkpoint.of(checkpoint)
    if checkpoint is not None and checkpoint.resume:
        raise ValueError(f"{what} in memory, not in its checkpoint: it cannot be resumed (Checkpoint(resume=False))")
