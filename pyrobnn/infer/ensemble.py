r"""Deep ensembles (Lakshminarayanan, Pritzel & Blundell 2017): M point estimates as an empirical posterior.

:func:`fit_ensemble` is called as :func:`~pyrobnn.infer.svi.fit` is, on member 0's model and guide, and builds member
:math:`m \ge 1` by ``make_member(m)`` after ``pyro.set_rng_seed(seed + m)`` (its own initialisation); member m
trains with ``seed + m`` (its own data order), as a MAP fit (:class:`~pyrobnn.guides.PointGuide`). The ensemble
predicts with the uniform mixture of its members,

.. math:: p(y \mid x) = \frac1M \sum_{m=1}^M p(y \mid x, w_m),

which is the predictive of the empirical posterior :math:`q(w) = \frac1M \sum_m \delta(w - w_m)`: a
:class:`~pyrobnn.infer.draws.Draws` of M runs of one draw each, the object that holds NUTS draws, so
``predict(model, result.guide(), x, num_samples=M)`` and ``evaluate`` need nothing new.

Only the Bayesian sites are replayed, so members must not differ anywhere else: a network with trained
deterministic state (BatchNorm, weights under a node prior, a learned noise scale) is refused before anything is
trained (its sites could be made Bayesian with ``include=``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ClassVar, Sequence

import pyro
import torch

from pyrobnn._compat import BatchNormBase
from pyrobnn.checks import positive_int
from pyrobnn.guides.point import point_values
from pyrobnn.infer.draws import Draws
from pyrobnn.infer.svi import Callback, Checkpoint, History, fit

__all__ = ["EnsembleResult", "fit_ensemble", "member_checkpoint", "train_members", "trained_state",
           "refuse_trained_state"]


@dataclass
class EnsembleResult(Draws):
    """The members' point values as draws ``{site: (M, 1, ...)}`` (M runs of one draw), the network they are replayed
    in (member 0's), and each member's training history (its records carry ``"member"``)."""

    kind: ClassVar[str] = "ensemble"
    description: ClassVar[str] = "the members of a deep ensemble written by `pyrobnn train --ensemble`"

    @classmethod
    def of(cls, model: torch.nn.Module, guides: Sequence, histories: Sequence[History] = ()) -> "EnsembleResult":
        """The ensemble of trained point-estimate ``guides`` (one per member, in order; :func:`point_values` of
        each), replayed in ``model``."""
        values = [point_values(guide) for guide in guides]
        return cls(model, {name: torch.stack([member[name] for member in values]).unsqueeze(1) for name in values[0]},
                   list(histories))

    def report(self) -> dict:
        return {"members": self.runs}

    def summary(self) -> str:
        return f"{self.runs} members"


def trained_state(model) -> list[str]:
    """Names of the model's state that training changes outside its Bayesian sites: deterministic parameters (not the
    frozen ones, which no training changes) and BatchNorm running statistics."""
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    names += [f"{name}.running_mean" for name, module in model.named_modules()
              if isinstance(module, BatchNormBase) and module.track_running_stats]
    return names


def member_checkpoint(checkpoint: str | Path, member: int) -> Path:
    """Member ``member``'s checkpoint: ``checkpoint`` itself for member 0, ``<stem>-member<m><suffix>`` beside it
    for the others (``checkpoint.pt``, ``checkpoint-member1.pt``, ...)."""
    path = Path(checkpoint)
    return path if member == 0 else path.with_name(f"{path.stem}-member{member}{path.suffix}")


def _tag(member: int) -> Callback:
    def tag(epoch: int, record: dict) -> None:
        record["member"] = member
    return tag


def fit_ensemble(model, guide, x: torch.Tensor, y: torch.Tensor, *, members: int,
                 make_member: Callable[[int], tuple], seed: int = 0,
                 checkpoint: "Checkpoint | str | Path | None" = None,
                 on_epoch_end: Callback | Sequence[Callback] | None = None, **fit_options) -> EnsembleResult:
    """Train a deep ensemble of ``members`` MAP fits, as :func:`~pyrobnn.infer.svi.fit` trains one, and return their
    empirical posterior (:class:`EnsembleResult`).

    :param model, guide: member 0, a :class:`~pyrobnn.BayesianNetwork` and a point-estimate guide on it
        (:class:`~pyrobnn.guides.PointGuide`), initialised after ``pyro.set_rng_seed(seed)`` for reproducible members.
    :param x, y: the training data, as for :func:`~pyrobnn.infer.svi.fit`.
    :param members: M.
    :param make_member: ``m -> (model, guide)`` of member m >= 1, called after ``pyro.set_rng_seed(seed + m)`` (its
        own initialisation); the same network and guide as member 0.
    :param seed: member m trains with ``seed + m`` (its own data order and noise).
    :param checkpoint: a path or a :class:`~pyrobnn.infer.svi.Checkpoint`: member m's is :func:`member_checkpoint`
        (written as :func:`~pyrobnn.infer.svi.fit` writes one); with ``resume`` each member continues from its own (a
        finished member trains no further).
    :param on_epoch_end: callbacks of every member's :func:`fit`, after one that sets the record's ``"member"``.
    :param fit_options: the other options of :func:`~pyrobnn.infer.svi.fit` (epochs, optimizer, device, ...).
    :raises ValueError: a guide that is no point estimate, or a network with trained deterministic state
        (:func:`trained_state`), before anything is trained.
    """
    members = positive_int("members (M, the ensemble's size)", members)
    point_values(guide)  # a point-estimate guide, checked before anything is trained
    refuse_trained_state(model, "each ensemble member would need its own")
    pairs, histories = train_members(model, guide, x, y, members=members, make_member=make_member, seed=seed,
                                     checkpoint=checkpoint, on_epoch_end=on_epoch_end, **fit_options)
    return EnsembleResult.of(model, [member_guide for _, member_guide in pairs], histories)


def refuse_trained_state(model, why: str) -> None:
    """A ``ValueError`` for a network with trained deterministic state (:func:`trained_state`), of which ``why``
    (e.g. "each ensemble member would need its own"), since an empirical posterior replays only the Bayesian
    sites."""
    state = trained_state(model)
    if state:
        raise ValueError(
            f"the network has trained deterministic state ({', '.join(state[:3])}{', ...' if len(state) > 3 else ''})"
            f" of which {why}, but an empirical posterior replays only the Bayesian sites: use a network without "
            "BatchNorm or a learned noise scale (or make those parameters Bayesian)")


def train_members(model, guide, x: torch.Tensor, y: torch.Tensor, *, members: int,
                  make_member: Callable[[int], tuple], seed: int = 0,
                  checkpoint: "Checkpoint | str | Path | None" = None,
                  on_epoch_end: Callback | Sequence[Callback] | None = None,
                  **fit_options) -> tuple[list[tuple], list[History]]:
    """Train ``members`` networks one after another with :func:`~pyrobnn.infer.svi.fit`, as :func:`fit_ensemble`
    does (the same arguments; member m from ``make_member(m)`` after ``pyro.set_rng_seed(seed + m)``, trained with
    ``seed + m``, its checkpoint :func:`member_checkpoint`, its records tagged ``"member"``), whatever their guide
    and optimiser: ``([(model, guide) of each member], [its History])``."""
    checkpoint = Checkpoint.of(checkpoint)
    callbacks = [] if on_epoch_end is None else list(on_epoch_end) if isinstance(on_epoch_end, Sequence) \
        else [on_epoch_end]
    pairs, histories = [], []
    for m in range(members):
        if m > 0:
            pyro.set_rng_seed(seed + m)
            member, member_guide = make_member(m)
        else:
            member, member_guide = model, guide
        own = None if checkpoint is None else dataclasses.replace(checkpoint,
                                                                  path=member_checkpoint(checkpoint.path, m))
        history = fit(member, member_guide, x, y, seed=seed + m, checkpoint=own, on_epoch_end=[_tag(m), *callbacks],
                      **fit_options)
        histories.append(history)
        pairs.append((member, member_guide))
    return pairs, histories
