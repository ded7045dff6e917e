r"""SWAG and MultiSWAG (Maddox et al. 2019, "A simple baseline for Bayesian uncertainty in deep learning"; Wilson &
Izmailov 2020): a Gaussian fitted to the SGD iterates.

The network's point weights (a :class:`~pyrobnn.guides.PointGuide`: the MAP objective) train by SGD through
:func:`~pyrobnn.infer.svi.fit`; after each epoch from epoch T (``start``) on, the iterate :math:`\theta_i` (the
Bayesian sites' values and the network's other trained parameters) updates, i = 1..n,

.. math:: \bar\theta_i = \bar\theta_{i-1} + \frac{\theta_i - \bar\theta_{i-1}}{i}, \qquad
          \overline{\theta^2}_i = \overline{\theta^2}_{i-1} + \frac{\theta_i^2 - \overline{\theta^2}_{i-1}}{i},
          \qquad D_{:,i} = \theta_i - \bar\theta_i,

of which D keeps the last K (``rank``) columns (Maddox et al., Algorithm 1: the deviation from the running mean).
With :math:`\sigma^2 = \overline{\theta^2} - \bar\theta^2` (clamped at 1e-30), the posterior is

.. math:: q(\theta) = \mathcal N\Big(\bar\theta,\ \tfrac12\operatorname{diag}(\sigma^2) + \frac{D D^\top}{2(K-1)}\Big),
          \qquad \theta = \bar\theta + \tfrac1{\sqrt2}\,\sigma\odot z_1 + \frac{D z_2}{\sqrt{2(K-1)}},
          \quad z_1 \sim \mathcal N(0, I_d),\ z_2 \sim \mathcal N(0, I_K)

(their ``scale = 0.5``; K the columns D holds, fewer than ``rank`` while fewer iterates were collected).
:func:`fit_swag` returns S draws of it as an empirical posterior (:class:`~pyrobnn.infer.draws.Draws`), so
``predict``, ``evaluate`` and ``pyrobnn evaluate`` take it as they take NUTS draws. Where the network has BatchNorm,
each draw's running statistics are recomputed by one pass over the training data with the draw's weights (the
authors' ``bn_update``), and such draws, which carry the network's own state, replay as
:class:`~pyrobnn.guides.empirical.StatefulDraws`.
MultiSWAG is the equal mixture of M SWAGs trained independently (``members``: seeds ``seed..seed+M-1``, as the
members of a deep ensemble, :func:`~pyrobnn.infer.ensemble.train_members`), S draws each.

The collection is an optimiser's: :class:`SWAGCollector` is an optimizer factory that builds its inner optimiser
(SGD: the method :class:`pyrobnn.methods.SWAG` gives it) and attaches :class:`SWAGMoments`, which updates the moments
after the last step of each epoch (:class:`~pyrobnn.infer.iterates.EpochEnds`), one vector update per epoch: the SGD
epoch costs what it did. The learning rate follows the authors' schedule when given one (:func:`swa_schedule`:
constant, then linear down to the SWA rate over the epochs 0.5 T to 0.9 T, then constant). This module states no
setting of the paper's: the method does (its rank, rates and draws), once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, ClassVar, Optional, Sequence

import torch

from pyrobnn._compat import BatchNormBase
from pyrobnn.checks import deprecated, nonnegative_int, positive, positive_int
from pyrobnn.infer.draws import Draws
from pyrobnn.infer.ensemble import train_members
from pyrobnn.infer.iterates import EpochEnds, Recorded, current, positions, refuse_resume, site_parameters
from pyrobnn.infer.optim import FlatThenLinear, split_parameters
from pyrobnn.infer.predict import prediction_mode
from pyrobnn.infer.svi import History

__all__ = ["SWAGCollector", "SWASchedule", "SWAGMoments", "SWAGResult", "fit_swag", "swa_schedule",
           "recompute_batchnorm", "check_collection", "check_rank", "replicas", "swag_draws"]

SCALE = 0.5
"""The factor of the covariance of the draws (Maddox et al.'s ``scale``)."""


NAMES = {"start": "start", "rank": "rank", "epochs": "epochs"}
"""How :func:`check_collection` names the settings (the command line passes its flags)."""


def check_rank(rank: int, name: str = "rank") -> int:
    """``rank`` K, an integer >= 2 (the low-rank covariance divides by K - 1), else a ``ValueError``."""
    if nonnegative_int(f"{name} (K, the deviations kept)", rank) < 2:
        raise ValueError(f"{name} (K, the deviations kept) must be at least 2: the low-rank covariance D D^T / (K - 1) "
                         f"needs two deviations, got {rank}")
    return rank


def check_collection(start: int, epochs: int, rank: int, names: dict[str, str] = NAMES) -> None:
    """A ``ValueError`` (one line, naming the setting as ``names`` does) unless ``rank`` K >= 2 and the collection
    from epoch ``start`` T on keeps at least two iterates of the ``epochs``: T <= epochs - 2."""
    check_rank(rank, names["rank"])
    start = nonnegative_int(f"{names['start']} (T, the epoch the collection starts from)", start)
    epochs = positive_int(names["epochs"], epochs)
    if start >= epochs:
        raise ValueError(f"{names['start']} {start} is at or after the last epoch ({names['epochs']} {epochs}): SWAG "
                         f"collects the iterates of the epochs after it; pass at most {max(epochs - 2, 0)}")
    if start == epochs - 1:
        raise ValueError(f"{names['start']} {start} leaves one epoch of the {epochs} ({names['epochs']}) to collect: "
                         f"SWAG's variance needs at least two iterates; pass at most {max(epochs - 2, 0)}")


@dataclass(frozen=True)
class SWASchedule:
    """Maddox et al.'s learning-rate multiplier per epoch: 1 for the first half of the ``start`` epochs, then linear
    down to ``ratio`` (the SWA rate over the initial one) at 0.9 ``start``, then ``ratio``
    (:class:`~pyrobnn.infer.optim.FlatThenLinear`); ``ratio`` throughout when ``start`` is 0."""

    start: int
    ratio: float

    def __post_init__(self):
        nonnegative_int("start", self.start)
        positive("ratio (the SWA learning rate over the initial one)", self.ratio)

    def __call__(self, epoch: int) -> float:
        if self.start == 0:
            return self.ratio
        return FlatThenLinear(self.start, 0.5, 0.9, self.ratio)(epoch)


def swa_schedule(start: int, ratio: float) -> SWASchedule:
    """:class:`SWASchedule` from epoch ``start`` T down to ``ratio``."""
    return SWASchedule(start, ratio)


def _state_parameters(model, guide) -> dict[str, torch.Tensor]:
    """``{name: parameter}`` of the model's own trained parameters (BatchNorm's, a learned noise scale's)."""
    network = {id(p) for p in split_parameters(model, guide)[0]}
    return {name: p for name, p in model.named_parameters() if id(p) in network}


def _batchnorms(model) -> list[tuple[str, torch.nn.Module]]:
    return [(name, m) for name, m in model.named_modules() if isinstance(m, BatchNormBase) and m.track_running_stats]


class SWAGMoments:
    r"""The moments of the iterates of ``tensors`` (read where ``optim`` holds them, ``(R, ...)`` for R stacked
    replicas) after each epoch past ``start``: their running mean, mean square and last ``rank`` deviations (the
    module docstring), and :meth:`sample`. ``sites``: which ``names`` are the Bayesian sites."""

    def __init__(self, optim: torch.optim.Optimizer, names: Sequence[str], tensors: Sequence[torch.Tensor],
                 start: int, rank: int, steps_per_epoch: int, sites: Sequence[str] = ()):
        self.names, self.shapes = list(names), [t.shape for t in tensors]
        self.sites = set(sites)  # the names that are Bayesian sites (the others: the network's own parameters)
        self.where = positions(optim, tensors)
        self.optim, self.start, self.rank = optim, start, rank
        self.count = 0
        self.mean: list[torch.Tensor] = []
        self.square: list[torch.Tensor] = []
        self.deviations: list[torch.Tensor] = []  # (rank, R, ...): a ring of the last K columns
        self.ends = EpochEnds(optim, steps_per_epoch, self.at_end)

    def at_end(self, epoch: int) -> None:
        if epoch > self.start:
            self.update(current(self.optim, self.where, self.shapes))

    @torch.no_grad()
    def update(self, values: Sequence[torch.Tensor]) -> None:
        """Add one iterate ``values`` (one ``(R, ...)`` tensor per name)."""
        self.count += 1
        if self.count == 1:
            self.mean = [v.detach().clone().float() for v in values]
            self.square = [v.detach().float() ** 2 for v in values]
            self.deviations = [v.new_zeros((self.rank, *v.shape), dtype=torch.float32) for v in values]
        else:
            for mean, square, v in zip(self.mean, self.square, values):
                mean.add_((v - mean) / self.count)
                square.add_((v.float() ** 2 - square) / self.count)
        column = (self.count - 1) % self.rank
        for deviations, mean, v in zip(self.deviations, self.mean, values):
            deviations[column] = v - mean

    @property
    def columns(self) -> int:
        """K, the deviations held: ``min(count, rank)``."""
        return min(self.count, self.rank)

    def variance(self) -> list[torch.Tensor]:
        """The diagonal :math:`\\sigma^2 = \\overline{\\theta^2} - \\bar\\theta^2`, clamped at 1e-30."""
        return [(square - mean ** 2).clamp_min(1e-30) for mean, square in zip(self.mean, self.square)]

    @torch.no_grad()
    def sample(self, num_samples: int, generator: Optional[torch.Generator] = None,
               scale: float = SCALE) -> list[torch.Tensor]:
        r"""``num_samples`` draws :math:`\bar\theta + \sqrt{s}\,(\sigma\odot z_1 + D z_2/\sqrt{K-1})`, s = ``scale``,
        one ``(R, S, ...)`` tensor per name; :math:`z_2` is shared by all names (one draw of the whole vector)."""
        if self.count < 2:
            raise ValueError(f"SWAG collected {self.count} iterate(s): its variance needs at least two")
        k, replicas = self.columns, self.mean[0].shape[0]
        device = self.mean[0].device
        z2 = torch.randn((replicas, num_samples, k), generator=generator, device=device)
        draws = []
        for mean, variance, deviations in zip(self.mean, self.variance(), self.deviations):
            z1 = torch.randn((replicas, num_samples, *mean.shape[1:]), generator=generator, device=device)
            low_rank = torch.einsum("rsk,kr...->rs...", z2, deviations[:k]) / math.sqrt(k - 1)
            draws.append(mean.unsqueeze(1) + math.sqrt(scale) * (variance.sqrt().unsqueeze(1) * z1 + low_rank))
        return draws


@dataclass(frozen=True)
class SWAGCollector:
    """Optimizer factory: ``optimizer(model, guide)`` (SGD: its ``schedule``, e.g. :func:`swa_schedule`, and
    ``warmup_steps`` carry over) with :class:`SWAGMoments` of the point values of a
    :class:`~pyrobnn.guides.PointGuide`'s sites and the model's own trained parameters as its ``swag``. The method
    with its paper's settings is :class:`pyrobnn.methods.SWAG`.

    :param start: T; the iterates after epochs T+1, T+2, ... are collected.
    :param rank: K, the deviations kept (at least 2).
    :param steps_per_epoch: ``ceil(N / B)``, as ``fit`` takes the batches.
    :param optimizer: the inner optimizer factory.
    """

    start: int
    rank: int
    steps_per_epoch: int
    optimizer: Callable[..., torch.optim.Optimizer]

    def __post_init__(self):
        nonnegative_int("start (T, the epoch the collection starts from)", self.start)
        check_rank(self.rank)
        positive_int("steps_per_epoch", self.steps_per_epoch)

    @property
    def schedule(self):
        return getattr(self.optimizer, "schedule", None)

    @property
    def warmup_steps(self) -> int:
        return getattr(self.optimizer, "warmup_steps", 0)

    def __call__(self, model, guide) -> torch.optim.Optimizer:
        optim = self.optimizer(model, guide)
        sites = site_parameters(guide, "SWAG")
        named = {**sites, **_state_parameters(model, guide)}
        optim.swag = SWAGMoments(optim, list(named), list(named.values()), self.start, self.rank,
                                 self.steps_per_epoch, sites=list(sites))
        return optim


def __getattr__(name: str):
    if name == "SWAG":  # the optimizer factory's name before the method took it (pyrobnn.methods.SWAG)
        deprecated("pyrobnn.infer.swag.SWAG", "pyrobnn.infer.swag.SWAGCollector (the method: pyrobnn.methods.SWAG)")
        return SWAGCollector
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def replicas(recorded: Recorded) -> list[tuple[SWAGMoments, int]]:
    """``(moments, row)`` of every network the optimisers of ``recorded`` (built by :class:`SWAGCollector`) trained,
    in order:
    one per ``fit``, one per stacked replica of :func:`~pyrobnn.infer.replicas.fit_replicas`."""
    return [(optim.swag, row) for optim in recorded.made if optim.swag.count
            for row in range(optim.swag.mean[0].shape[0])]


def swag_draws(model, moments: SWAGMoments, row: int, num_samples: int, generator: Optional[torch.Generator],
               x: torch.Tensor, transform: Optional[Callable] = None) -> tuple[dict, dict]:
    """``(sites, state)``: ``num_samples`` draws of the SWAG of replica ``row`` of ``moments``, ``{site: (S, ...)}``,
    and the network's own state of each, ``{name: (S, ...)}``: its other trained parameters and, where ``model`` has
    BatchNorm, the statistics recomputed for each draw on ``x`` (:func:`recompute_batchnorm`, in ``model``, whose
    own values are restored afterwards)."""
    sampled = dict(zip(moments.names, (value[row] for value in moments.sample(num_samples, generator))))
    sites = {name: value for name, value in sampled.items() if name in moments.sites}
    state = {name: value for name, value in sampled.items() if name not in moments.sites}
    if _batchnorms(model):
        state.update(_statistics(model, sites, state, x, transform))
    return sites, state


@torch.no_grad()
def recompute_batchnorm(model, values: dict[str, torch.Tensor], x: torch.Tensor, batch_size: int = 1000,
                        transform: Optional[Callable[[torch.Tensor], torch.Tensor]] = None) -> None:
    """The running statistics of every BatchNorm of ``model`` recomputed for the sites' ``values`` (the network's
    other parameters as they are): reset, then one pass over ``x`` with the BatchNorm layers in training mode (the
    rest as in prediction: dropout off), each batch weighted by its rows, so the statistics are the averages over
    ``x`` (Maddox et al.'s ``bn_update``). ``transform`` is applied to each batch on the model's device (the
    training augmentation)."""
    layers = [module for _, module in _batchnorms(model)]
    if not layers:
        return
    device = next(iter(values.values())).device
    momenta = [module.momentum for module in layers]
    seen = 0
    try:
        with prediction_mode(model):
            for module in layers:
                module.reset_running_stats()
                module.train()
            for part in x.split(batch_size):
                if len(part) < 2 and seen:  # one row has no batch variance
                    continue
                for module in layers:
                    module.momentum = len(part) / (seen + len(part))
                part = part.to(device)
                model.net_with(values, part if transform is None else transform(part))
                seen += len(part)
    finally:
        for module, momentum in zip(layers, momenta):
            module.momentum = momentum


@dataclass
class SWAGResult(Draws):
    """S draws of each of M SWAGs: ``draws`` ``{site: (M, S, ...)}``, the network they are replayed in (member 0's),
    each member's training history, ``state`` ``{name: (M, S, ...)}`` (the network's other trained parameters and
    BatchNorm statistics of each draw; empty when it has none: then draws replay as
    :class:`~pyrobnn.guides.empirical.StatefulDraws`), each member's :class:`SWAGMoments`, and the collection's start
    T and rank K."""

    moments: list[SWAGMoments] = field(default_factory=list)
    start: int = 0
    rank: int = 0

    kind: ClassVar[str] = "swag"
    description: ClassVar[str] = "SWAG draws written by `pyrobnn train --swag`"

    @property
    def batchnorm(self) -> bool:
        """Whether each draw carries BatchNorm statistics recomputed for it."""
        return any(name.endswith("running_mean") for name in self.state)

    @classmethod
    def of(cls, model, members: Sequence[tuple[SWAGMoments, int]], num_samples: int, seed: int, x: torch.Tensor,
           transform: Optional[Callable] = None, histories: Sequence[History] = (), start: int = 0,
           rank: int = 0) -> "SWAGResult":
        """``num_samples`` draws of each SWAG of ``members`` (``(moments, row)``, :func:`replicas`; member m's drawn
        with seed ``seed + m``), replayed in ``model`` (:func:`swag_draws`)."""
        parts = []
        for m, (moments, row) in enumerate(members):
            generator = torch.Generator(moments.mean[0].device).manual_seed(seed + m)
            parts.append(swag_draws(model, moments, row, num_samples, generator, x, transform))
        draws, state = ({name: torch.stack([part[i][name] for part in parts]) for name in parts[0][i]}
                        for i in (0, 1))
        return cls(model, draws, list(histories), state=state, moments=[moments for moments, _ in members],
                   start=start, rank=rank)

    def report(self) -> dict:
        return {"members": len(self.moments), "draws_per_member": len(self) // self.runs, "start": self.start,
                "rank": self.rank, "collected": [moments.count for moments in self.moments],
                "batchnorm_recomputed": self.batchnorm}

    def summary(self) -> str:
        return (f"{len(self)} draws ({len(self.moments)} x {len(self) // self.runs}) of the Gaussian fitted to "
                f"{self.moments[0].count} iterates, rank {self.moments[0].columns}"
                + (", BatchNorm statistics recomputed for each" if self.batchnorm else ""))


def fit_swag(model, guide, x: torch.Tensor, y: torch.Tensor, *, start: int, rank: int, num_samples: int,
             optimizer: Callable[..., torch.optim.Optimizer], members: int = 1,
             make_member: Optional[Callable[[int], tuple]] = None, epochs: int = 10, batch_size: int = 128,
             seed: int = 0, transform: Optional[Callable] = None, **fit_options) -> SWAGResult:
    """Train by SGD, collect SWAG's moments from epoch ``start`` on and return ``num_samples`` draws of it (of each
    of ``members`` SWAGs: MultiSWAG), as :class:`SWAGResult`.

    :param model, guide: member 0, a :class:`~pyrobnn.BayesianNetwork` and a :class:`~pyrobnn.guides.PointGuide`.
    :param x, y: the training data (also the pass that recomputes each draw's BatchNorm statistics).
    :param start: T; the iterates after epochs T+1..``epochs`` are collected (at least two).
    :param rank: K, the deviations kept (at least 2; :class:`pyrobnn.methods.SWAG` holds Maddox et al.'s).
    :param num_samples: S, the draws of each SWAG.
    :param members: M SWAGs (MultiSWAG), member m >= 1 from ``make_member(m)`` after ``pyro.set_rng_seed(seed + m)``,
        trained with ``seed + m`` (:func:`~pyrobnn.infer.ensemble.train_members`).
    :param optimizer: the inner optimizer factory (SGD; with :func:`swa_schedule` for the authors' rates).
    :param seed: seeds the training and the draws (member m's with ``seed + m``).
    :param transform: applied to every batch, in training and in the BatchNorm pass.
    :param fit_options: the other options of :func:`~pyrobnn.infer.svi.fit` (device, checkpoint, on_epoch_end, ...).
    :raises ValueError: rank below 2, a collection start that leaves fewer than two iterates, a guide that is no
        point estimate, a checkpoint to resume (the moments are not checkpointed), before anything is trained.
    :raises TrainingDiverged: when SGD diverges (the loss becomes NaN or infinite).
    """
    check_collection(start, epochs, rank)
    num_samples, members = positive_int("num_samples", num_samples), positive_int("members (M SWAGs)", members)
    if members > 1 and make_member is None:
        raise ValueError(f"members={members} needs make_member=m -> (model, guide) for members 1..{members - 1}")
    refuse_resume(fit_options.get("checkpoint"), "a SWAG run keeps its moments")
    site_parameters(guide, "SWAG")
    factory = Recorded(SWAGCollector(start, rank, math.ceil(x.shape[0] / positive_int("batch_size", batch_size)),
                                     optimizer))
    pairs, histories = train_members(model, guide, x, y, members=members, make_member=make_member, seed=seed,
                                     epochs=epochs, batch_size=batch_size, optimizer=factory, transform=transform,
                                     **fit_options)
    return SWAGResult.of(model, replicas(factory), num_samples, seed, x, transform, histories, start, rank)


def _statistics(model, sites: dict[str, torch.Tensor], parameters: dict[str, torch.Tensor], x: torch.Tensor,
                transform) -> dict[str, torch.Tensor]:
    """``{buffer: (S, ...)}``: the BatchNorm statistics of each of the S draws (``sites``, and the model's own
    ``parameters``, ``{name: (S, ...)}``), recomputed on ``x`` in ``model`` (:func:`recompute_batchnorm`); the
    model's parameters and statistics are restored afterwards."""
    names = [f"{prefix}.{buffer}" for prefix, module in _batchnorms(model) for buffer, _ in module.named_buffers()]
    own = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    kept = {name: own[name].detach().clone() for name in [*parameters, *names]}
    size = len(next(iter(sites.values())))
    collected: dict[str, list] = {name: [] for name in names}
    try:
        for s in range(size):
            with torch.no_grad():
                for name, value in parameters.items():
                    own[name].copy_(value[s])
            recompute_batchnorm(model, {name: value[s] for name, value in sites.items()}, x, transform=transform)
            for name in names:
                collected[name].append(own[name].detach().clone())
    finally:
        with torch.no_grad():
            for name, value in kept.items():
                own[name].copy_(value)
    return {name: torch.stack(values) for name, values in collected.items()}
