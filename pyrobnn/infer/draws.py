r"""Draws: the one empirical posterior that every sampling or post-hoc method returns.

A deep ensemble (:mod:`pyrobnn.infer.ensemble`), the Laplace approximation (:mod:`pyrobnn.infer.laplace`), SWAG
(:mod:`pyrobnn.infer.swag`), SG-MCMC (:mod:`pyrobnn.infer.sgmcmc`) and NUTS (:mod:`pyrobnn.infer.mcmc`) all end in the
same object, the empirical posterior

.. math:: q(w) = \frac1{RS} \sum_{r=1}^{R} \sum_{s=1}^{S} \delta(w - w_{r,s}),

stored as ``draws`` ``{site: (R, S, ...)}``: R runs (an ensemble's members, chains, MultiSWAG's SWAGs) of S draws each
(a site held at one value in every draw, as the sites a last-layer Laplace approximation keeps at the MAP, is
``(1, 1, ...)``), with the network they are replayed in, the network's own state of each draw where it has one
(``state`` ``{parameter or buffer: (R, S, ...)}``: SWAG's recomputed BatchNorm statistics) and each run's training
history. :meth:`Draws.guide` is the empirical guide that replays them
(:class:`~pyrobnn.guides.PosteriorDraws`, or :class:`~pyrobnn.guides.empirical.StatefulDraws` with state), so
``predict``, ``evaluate`` and ``pyrobnn evaluate`` take any of them alike; :meth:`Draws.save` writes the ``draws.pt``
that :meth:`Draws.load` reads back. Each kind adds what is its own (an ensemble nothing; Laplace its prior precision;
SWAG its moments; SG-MCMC and NUTS their diagnostics) and says so in :meth:`Draws.report` and :meth:`Draws.summary`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import torch

from pyrobnn.checkpoint import load_checkpoint, save_checkpoint
from pyrobnn.checks import one_line
from pyrobnn.guides.empirical import PosteriorDraws, StatefulDraws
from pyrobnn.infer.svi import Histories, History

__all__ = ["Draws"]


@dataclass
class Draws(Histories):
    """Draws ``{site: (runs, draws, ...)}``, the network they are replayed in, the network's own state of each draw
    ``{name: (runs, draws, ...)}`` (empty where it has none) and each run's training history."""

    model: torch.nn.Module
    draws: dict[str, torch.Tensor]
    histories: list[History] = field(default_factory=list)
    state: dict[str, torch.Tensor] = field(default_factory=dict)

    kind: ClassVar[str] = "draws"
    """The ``"kind"`` entry of the ``draws.pt`` this result writes (``ensemble``, ``laplace``, ``swag``, ``sgmcmc``,
    ``mcmc``; :data:`pyrobnn.methods.DRAWS_KINDS`)."""

    description: ClassVar[str] = "posterior draws"
    """What a ``draws.pt`` of this kind holds, as an error message names it."""

    KINDS: ClassVar[dict[str, str]] = {}
    """Every kind of ``draws.pt`` -> what it holds: each subclass's :attr:`kind` and :attr:`description`, entered
    as the subclass is defined."""

    CLASSES: ClassVar[dict[str, type]] = {}
    """Every kind of ``draws.pt`` -> the class that wrote it, which :meth:`load` reads it back as (a reloaded SWAG
    posterior is a :class:`~pyrobnn.infer.swag.SWAGResult`, of kind ``swag``)."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        Draws.KINDS[cls.kind] = cls.description
        Draws.CLASSES[cls.kind] = cls

    def __post_init__(self):
        if not self.draws:
            raise ValueError("draws must name at least one site")
        bad = {name: tuple(value.shape) for name, value in self.draws.items() if value.dim() < 2}
        if bad:
            raise ValueError(f"draws are shaped (runs, draws, ...), got {bad}")
        runs = {tuple(value.shape[:2]) for value in self.draws.values()} - {(1, 1)}
        if len(runs) > 1:
            raise ValueError(f"every site needs the same (runs, draws), or (1, 1) for a site held at one value; got "
                             f"{sorted(runs)}")

    @property
    def runs(self) -> int:
        """R: members, chains or SWAGs."""
        return max(value.shape[0] for value in self.draws.values())

    def __len__(self) -> int:
        """R S, every draw of every run."""
        return max(value.shape[0] * value.shape[1] for value in self.draws.values())

    def flat(self) -> dict[str, torch.Tensor]:
        """``{site: (R S, ...)}``, run-major (``(1, ...)`` for a site held at one value)."""
        return {name: value.flatten(0, 1) for name, value in self.draws.items()}

    def guide(self) -> PosteriorDraws:
        """The empirical guide of every run's draws, run-major (predict with ``num_samples=len(draws)`` to replay each
        once): :class:`~pyrobnn.guides.empirical.StatefulDraws` where the draws carry the network's own state."""
        if not self.state:
            return PosteriorDraws(self.flat())
        return StatefulDraws(self.model, self.flat(), {name: value.flatten(0, 1) for name, value in self.state.items()})

    def report(self) -> dict:
        """What a run's ``metrics.json`` records of these draws under :attr:`kind` (plain numbers)."""
        return {"runs": self.runs, "draws": len(self)}

    def summary(self) -> str:
        """One line saying what the draws are."""
        return f"{len(self)} draws"

    def save(self, path: str | Path, **metadata) -> None:
        """Write the ``draws.pt`` that :meth:`load` reads back: :attr:`kind`, the network's deterministic state, the
        draws and the network's own state of each, :meth:`report` under :attr:`kind` (unless ``metadata`` has it:
        the report a reloaded posterior kept), and ``metadata`` (the command line stores its configuration as
        ``config``); written atomically."""
        save_checkpoint(path, {
            "kind": self.kind, "model": self.model.state_dict(),
            "guide": {}, "epoch": None,  # keys every pyrobnn checkpoint has; draws have neither guide nor epochs
            "draws": _saved(self.draws), **({"state": _saved(self.state)} if self.state else {}),
            **({} if self.kind in metadata else {self.kind: self.report()}), **metadata})

    @staticmethod
    def load(path: str | Path, model: torch.nn.Module, state: dict | None = None) -> "Draws":
        """The draws of the ``draws.pt`` at ``path`` (``state``: the file, already loaded), replayed in ``model``,
        whose deterministic state it loads, as the class of its kind (:data:`CLASSES`; the draws and the network's
        state of each, the kind's own fields at their defaults: its report is the file's); draws that do not fit
        ``model``'s sites are one ``ValueError`` naming the file."""
        state = load_checkpoint(path) if state is None else state
        draws = state.get("draws")
        if (not isinstance(draws, dict) or not draws
                or not all(isinstance(v, torch.Tensor) and v.dim() >= 2 for v in draws.values())):
            raise ValueError(f"checkpoint {path} holds no draws {{site: tensor (runs, draws, ...)}} (it was not "
                             "written by Draws.save, `pyrobnn train` or `pyrobnn mcmc`)")
        sites = {site.name: tuple(site.shape) for site in model.sites()}
        stored = {name: tuple(value.shape[2:]) for name, value in draws.items()}
        if stored != sites or len({tuple(value.shape[:2]) for value in draws.values()} - {(1, 1)}) > 1:
            raise ValueError(f"checkpoint {path}: its draws {stored} do not fit the model's sites {sites} (another "
                             "network or sizes?)")
        try:
            model.load_state_dict(state["model"])
        except (RuntimeError, KeyError, ValueError, TypeError) as error:
            raise ValueError(f"checkpoint {path} does not fit the model: {one_line(error)[:300]}") from None
        own = state.get("state") or {}
        known = {**dict(model.named_parameters()), **dict(model.named_buffers())}
        if any(name not in known or tuple(value.shape[2:]) != tuple(known[name].shape) for name, value in own.items()):
            raise ValueError(f"checkpoint {path}: the network state of its draws does not fit the model (another "
                             "network or sizes?)")
        return Draws.CLASSES.get(state.get("kind"), Draws)(model, dict(draws), state=dict(own))


def _saved(draws: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: value.detach().cpu().contiguous() for name, value in draws.items()}

