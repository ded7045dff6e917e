r"""Stochastic-gradient MCMC: SGLD (Welling & Teh 2011), SGHMC (Chen, Fox & Guestrin 2014) and cyclical SGHMC
(Zhang et al. 2020), as an optimiser that :func:`~pyrobnn.infer.svi.fit` steps.

**The target.** With a point-estimate guide (:class:`~pyrobnn.guides.PointGuide`) and β = 1, ``fit``'s loss on a
minibatch of B of the N training examples is

.. math:: \tilde U(\theta) = -\frac NB \sum_{b} \log p(y_b \mid x_b, \theta) - \log p(\theta),

an unbiased estimate of the negative log joint :math:`U(\theta) = -\sum_n \log p(y_n|x_n,\theta) - \log p(\theta)`
(the MAP objective; :class:`~pyrobnn.infer.elbo.MeanFieldELBO` of a point mass). The samplers draw from the
tempered posterior :math:`p_T(\theta) \propto \exp(-U(\theta)/T)`, T = ``temperature`` (1: the posterior; T < 1 the
"cold posterior" of Wenzel et al. 2020).

**The dynamics.** SGHMC discretises :math:`d\theta = v\,dt`, :math:`dv = -\nabla U\,dt - \gamma v\,dt +
\sqrt{2\gamma T}\,dW` (Chen et al. 2014, eq. 15, in its momentum form, with :math:`\hat B = 0`):

.. math:: v_{k+1} = (1-\alpha)\, v_k - \epsilon_k \nabla\tilde U(\theta_k) + \sqrt{2\alpha\epsilon_k T}\;\xi_k,
          \qquad \theta_{k+1} = \theta_k + v_{k+1}, \qquad \xi_k \sim \mathcal N(0, I),

with step size :math:`\epsilon` (their η) and friction :math:`\alpha` (their :math:`\epsilon M^{-1}C`; ``momentum``
= 1 - α). α = 1 is SGLD, the Euler-Maruyama step of the Langevin diffusion
:math:`d\theta = -\nabla U\,dt + \sqrt{2T}\,dW`: :math:`\theta_{k+1} = \theta_k - \epsilon\nabla\tilde U(\theta_k) +
\sqrt{2\epsilon T}\,\xi_k`. As ε → 0 both leave :math:`p_T` invariant (the minibatch gradient's noise adds a bias of
order ε).

**The units.** ``lr`` is per example, as :class:`~pyrobnn.infer.optim.Optim` takes SGD's rate and as papers state it
(for the mean loss :math:`\bar U = U/N`): a step of ``lr`` on :math:`\bar U` is a step of ε = ``lr``/N on U, so the
sampler runs at ε = ``lr``/N (:func:`~pyrobnn.infer.optim.summed_loss_rates`), and its noise is
:math:`\sqrt{2\alpha\,\mathrm{lr}\,T/N}`, as in Zhang et al.'s code (``(2 lr alpha T / datasize) ** .5``). The classic
bug is the noise :math:`\sqrt{2\alpha\,\mathrm{lr}\,T}` of the mean loss's step: it samples
:math:`\exp(-\bar U/T) = p(\theta|D)^{1/N}`, a posterior N times too wide in variance.

**Cycles.** With ``cycles`` M > 0 the step size follows Zhang et al.'s cosine schedule (their eq. 1) over the K
steps of the run, :math:`\epsilon_k = \frac{\epsilon_0}{2}\left[\cos\frac{\pi\,\mathrm{mod}(k-1, \lceil K/M\rceil)}
{\lceil K/M\rceil} + 1\right]` (:class:`StepSchedule`); in each cycle the first ``exploration`` fraction β of its
steps, :math:`r(k) = \mathrm{mod}(k-1, \lceil K/M\rceil)/\lceil K/M\rceil < \beta`, runs without noise (SGD with
momentum: the exploration stage), the rest with it (the sampling stage). Without cycles the step size is constant
and the noise always on; the first ``exploration`` fraction of the run is the burn-in.

**Draws.** At the end of every epoch that ends past the exploration fraction of its cycle (the fraction of the cycle
its last step completes, :math:`(\mathrm{mod}(k-1, L)+1)/L > \beta`: a cycle's last step always; without cycles, the
epochs after the burn-in), the sampler keeps the current weights (:class:`DrawCollector`): :func:`fit_sgmcmc`
returns them as the empirical posterior (:class:`SGMCMCResult`, a :class:`~pyrobnn.infer.draws.Draws`). Several
chains run as one stacked network (:func:`~pyrobnn.infer.replicas.fit_replicas`): the sampler is element-wise, so
the stacked step moves each chain by its own gradient and its own noise.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Callable, ClassVar, Optional, Sequence

import pyro
import torch

from pyrobnn.checks import choice, deprecated, in_range, nonnegative, nonnegative_int, positive, positive_int
from pyrobnn.infer.draws import Draws
from pyrobnn.infer.ensemble import refuse_trained_state
from pyrobnn.infer.iterates import EpochEnds, Recorded, current, positions, refuse_resume, site_parameters
from pyrobnn.infer.mcmc import chain_diagnostics
from pyrobnn.infer.optim import summed_loss_group
from pyrobnn.infer.replicas import fit_replicas
from pyrobnn.infer.schedules import Constant
from pyrobnn.infer.svi import History, fit

__all__ = ["SGHMC", "SGMCMCOptimizer", "SGMCMC_SAMPLERS", "StepSchedule", "DrawCollector", "SGMCMCResult", "fit_sgmcmc",
           "sampler_options"]

SGMCMC_SAMPLERS: dict[str, dict] = {
    "sgld": dict(friction=1.0, cycles=0, exploration=0.5),
    "sghmc": dict(friction=0.1, cycles=0, exploration=0.5),
    "csghmc": dict(friction=0.9, cycles=4, exploration=0.9),
}
"""The samplers by name and their settings: SGLD (no momentum, noise throughout, the first half of the run burnt in),
SGHMC (momentum 0.9), and cyclical SGHMC as Zhang et al.'s code runs it on CIFAR-10 (``alpha = 0.9``, 4 cycles,
noise in the last 10 % of each: 5 of its 50 epochs)."""


def sampler_options(name: str, **overrides) -> dict:
    """The settings of sampler ``name`` (:data:`SGMCMC_SAMPLERS`), with the ``overrides`` that are not None."""
    options = dict(SGMCMC_SAMPLERS[choice("sampler", name, SGMCMC_SAMPLERS)])
    options.update({key: value for key, value in overrides.items() if value is not None})
    return options


@dataclass(frozen=True)
class StepSchedule:
    r"""The step-size multiplier and the stage of each step k = 1..K of a run of ``total`` = K steps.

    ``cycles`` = M > 0: Zhang et al.'s cosine cycles of :math:`L = \lceil K/M\rceil` steps,
    :math:`r(k) = \mathrm{mod}(k-1, L)/L`, multiplier :math:`\frac12[\cos(\pi r(k)) + 1]`, noise where
    :math:`r(k) \ge` ``exploration`` β, and a draw after step k where the part of its cycle done by then,
    :math:`(\mathrm{mod}(k-1, L) + 1)/L`, exceeds β (after the last step of every cycle). ``cycles`` = 0: one
    "cycle" of the whole run at a constant rate, noise at every step, draws after the first β of the run (the
    burn-in)."""

    total: int
    cycles: int = 0
    exploration: float = 0.5

    def __post_init__(self):
        positive_int("total (steps of the run)", self.total)
        nonnegative_int("cycles (0: a constant step size)", self.cycles)
        in_range("exploration (the fraction of each cycle before its draws)", self.exploration, 0, 1, "[)")

    @property
    def length(self) -> int:
        """L, the steps of a cycle."""
        return math.ceil(self.total / self.cycles) if self.cycles else self.total

    def position(self, k: int) -> float:
        """r(k), where step k (from 1) lies in its cycle, in [0, 1)."""
        return ((k - 1) % self.length) / self.length

    def rate(self, k: int) -> float:
        """The multiplier of the step size at step k."""
        return 0.5 * (math.cos(math.pi * self.position(k)) + 1.0) if self.cycles else 1.0

    def noisy(self, k: int) -> bool:
        """Whether step k injects noise (every step without cycles; the sampling stage with them)."""
        return not self.cycles or self.position(k) >= self.exploration

    def collects(self, k: int) -> bool:
        """Whether a draw is kept after step k (when it ends an epoch): the part of its cycle done exceeds the
        exploration."""
        return ((k - 1) % self.length + 1) / self.length > self.exploration

    def draws(self, epochs: int, steps_per_epoch: int) -> int:
        """How many draws a run of ``epochs`` of ``steps_per_epoch`` steps keeps."""
        return sum(self.collects(e * steps_per_epoch) for e in range(1, epochs + 1))


def _add_noise(tensors: Sequence[torch.Tensor], std: float) -> None:
    """``tensors += std * N(0, I)``: one draw of normal numbers per device and dtype, split over the tensors."""
    groups: dict = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t)
    for (device, dtype), group in groups.items():
        sizes = [t.numel() for t in group]
        flat = torch.randn(sum(sizes), device=device, dtype=dtype)
        torch._foreach_add_(group, [piece.view_as(t) for piece, t in zip(flat.split(sizes), group)], alpha=std)


class SGHMC(torch.optim.Optimizer):
    r"""The SGHMC step of the module docstring (SGLD at ``friction`` = 1) as a ``torch.optim.Optimizer``, element-wise
    (a stacked replica's rows each get their own noise).

    It is torch's SGD with momentum 1 - α (no dampening, no Nesterov; fused where the device allows), which it holds
    as ``sgd`` and shares its parameter groups and state with, at step size ε on the gradient plus Gaussian noise:
    with torch's buffer :math:`b = -v/\epsilon`,

    .. math:: b_{k+1} = (1-\alpha)\,\frac{\epsilon_{k-1}}{\epsilon_k}\,b_k + \nabla\tilde U(\theta_k)
              + \sqrt{2\alpha T/\epsilon_k}\;\xi_k, \qquad \theta_{k+1} = \theta_k - \epsilon_k b_{k+1},

    which is the module docstring's step (:math:`\epsilon_k \sqrt{2\alpha T/\epsilon_k} = \sqrt{2\alpha\epsilon_k T}`);
    the buffer is rescaled by :math:`\epsilon_{k-1}/\epsilon_k` where the step size changes (the cycles), so that the
    velocity v, not torch's buffer, carries over, as in Zhang et al.'s code.

    :param params: the parameters (or groups).
    :param lr: ε on the loss ``fit`` minimises (the summed negative log joint; :class:`SGMCMCOptimizer` turns the
        per-example rate into it).
    :param friction: α in (0, 1]: the momentum is 1 - α (1: SGLD, no momentum).
    :param temperature: T >= 0 (0: no noise, SGD with momentum).
    :param schedule: the step-size multiplier and the noise of each step (:class:`StepSchedule`); None: constant,
        noise at every step. It multiplies the group's rate (which an epoch schedule may set) for the step.
    """

    def __init__(self, params, lr: float, friction: float = 1.0, temperature: float = 1.0,
                 schedule: Optional[StepSchedule] = None):
        positive("lr (the step size)", lr)
        in_range("friction (alpha: 1 - the momentum; 1 is SGLD)", friction, 0, 1, "(]")
        nonnegative("temperature", temperature)
        super().__init__(params, dict(lr=lr, momentum=1.0 - friction, temperature=temperature))
        try:  # the same group dicts: what is set on ours (fit_replicas' stacked parameters) is set on its
            self.sgd = torch.optim.SGD(self.param_groups, lr=lr, fused=True)
        except (RuntimeError, TypeError, ValueError):  # a device without the fused kernel
            self.sgd = torch.optim.SGD(self.param_groups, lr=lr)
        self.state = self.sgd.state
        self._step_supports_amp_scaling = getattr(self.sgd, "_step_supports_amp_scaling", False)
        self.schedule = schedule
        self.steps = 0

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], torch.Tensor]] = None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.steps += 1
        rate, noisy = (1.0, True) if self.schedule is None else (self.schedule.rate(self.steps),
                                                                 self.schedule.noisy(self.steps))
        scheduled = [group["lr"] for group in self.param_groups]
        found_inf = getattr(self, "found_inf", None)  # a non-finite loss, told on the device (svi._update)
        try:
            for group, lr in zip(self.param_groups, scheduled):
                group["lr"] = lr * rate
                previous = group.get("previous_lr", group["lr"])
                if previous != group["lr"] and group["momentum"]:  # the velocity -lr b carries over
                    buffers = [self.state[p]["momentum_buffer"] for p in group["params"]
                               if self.state[p].get("momentum_buffer") is not None]
                    if buffers:
                        torch._foreach_mul_(buffers, previous / group["lr"])
                group["previous_lr"] = group["lr"]
                if noisy and group["temperature"] > 0:
                    grads = [p.grad for p in group["params"] if p.grad is not None]
                    _add_noise(grads, math.sqrt(2.0 * (1.0 - group["momentum"]) * group["temperature"] / group["lr"]))
            if found_inf is not None:
                self.sgd.found_inf = found_inf
            self.sgd.step()
        finally:
            self.sgd.__dict__.pop("found_inf", None)
            for group, lr in zip(self.param_groups, scheduled):
                group["lr"] = lr
        return loss


class DrawCollector:
    """The draws an optimiser keeps: after the last step of each epoch where ``schedule.collects``, the current
    values of ``tensors`` (read where the optimiser holds them, so a stacked replica's rows are its chains),
    ``draws[i][j]`` the i-th draw of the j-th site, shaped ``(chains, ...)``."""

    def __init__(self, optim: torch.optim.Optimizer, names: Sequence[str], tensors: Sequence[torch.Tensor],
                 schedule: StepSchedule, steps_per_epoch: int):
        self.names, self.shapes = list(names), [t.shape for t in tensors]
        self.where = positions(optim, tensors)
        self.schedule, self.optim = schedule, optim
        self.draws: list[list[torch.Tensor]] = []
        self.epochs: list[int] = []
        self.ends = EpochEnds(optim, steps_per_epoch, self.at_end)

    def at_end(self, epoch: int) -> None:
        if self.schedule.collects(epoch * self.ends.steps_per_epoch):
            self.draws.append([value.clone() for value in current(self.optim, self.where, self.shapes)])
            self.epochs.append(epoch)

    def stacked(self) -> dict[str, torch.Tensor]:
        """``{site: (chains, draws, ...)}``."""
        return {name: torch.stack([draw[j] for draw in self.draws], dim=1) for j, name in enumerate(self.names)}


@dataclass(frozen=True)
class SGMCMCOptimizer:
    """Optimizer factory ``(model, guide) -> SGHMC`` over the point values of a :class:`~pyrobnn.guides.PointGuide`'s
    sites, with a :class:`DrawCollector` as its ``collector``: the sampler of the module docstring, handed to
    :func:`~pyrobnn.infer.svi.fit` or :func:`~pyrobnn.infer.replicas.fit_replicas` (:func:`fit_sgmcmc` does both).
    The method with its papers' settings is :class:`pyrobnn.methods.SGMCMC` (:data:`SGMCMC_SAMPLERS`).

    :param lr: the per-example step size (ε = lr / N on ``fit``'s summed loss, N = ``model.num_data``).
    :param friction: α (1: SGLD; 0.1: momentum 0.9).
    :param temperature: T (1: the posterior).
    :param cycles: M cosine cycles of the step size (0: constant).
    :param exploration: the fraction of each cycle (of the run without cycles: the burn-in) before draws are kept;
        with cycles it runs without noise.
    :param epochs, steps_per_epoch: the run's length, which the schedule and the draws follow (``ceil(N / B)`` steps
        an epoch, as ``fit`` takes them).
    """

    lr: float
    friction: float
    temperature: float
    cycles: int
    exploration: float
    epochs: int
    steps_per_epoch: int

    def __post_init__(self):
        positive("lr (the per-example step size)", self.lr)
        in_range("friction (alpha: 1 - the momentum; 1 is SGLD)", self.friction, 0, 1, "(]")
        nonnegative("temperature", self.temperature)
        positive_int("steps_per_epoch", self.steps_per_epoch)
        positive_int("epochs", self.epochs)
        schedule = self.schedule_of_steps()  # checks cycles and exploration
        if not schedule.draws(self.epochs, self.steps_per_epoch):
            raise ValueError(f"no epoch of the {self.epochs} ({self.steps_per_epoch} steps each) ends past the "
                             f"exploration of its cycle (cycles {self.cycles}, exploration {self.exploration:g}), so "
                             "no draw would be kept: lower the exploration fraction, or pick cycles that end with "
                             "epochs")

    def schedule_of_steps(self) -> StepSchedule:
        return StepSchedule(self.epochs * self.steps_per_epoch, self.cycles, self.exploration)

    def __call__(self, model, guide) -> SGHMC:
        refuse_trained_state(model, "each draw would need its own")
        sites = site_parameters(guide, "SG-MCMC")
        group = summed_loss_group("sgd", self.lr, 0.0, getattr(model, "num_data", None))
        schedule = self.schedule_of_steps()
        optim = SGHMC([{"params": list(sites.values()), "rate_scale": group["rate_scale"]}], lr=group["lr"],
                      friction=self.friction, temperature=self.temperature, schedule=schedule)
        optim.collector = DrawCollector(optim, list(sites), list(sites.values()), schedule, self.steps_per_epoch)
        return optim


@dataclass
class SGMCMCResult(Draws):
    """The draws ``{site: (chains, draws, ...)}`` (chain-major), the network they are replayed in (chain 0's), each
    chain's training history, the epochs after which the draws were kept, and the sampler's settings (``lr``,
    ``friction``, ``temperature``, ``cycles``, ``exploration``)."""

    draw_epochs: list[int] = field(default_factory=list)
    settings: dict = field(default_factory=dict)

    kind: ClassVar[str] = "sgmcmc"
    description: ClassVar[str] = "SG-MCMC draws written by `pyrobnn train --sgmcmc`"

    @property
    def chains(self) -> int:
        return self.runs

    def diagnostics(self) -> dict[str, dict[str, float]]:
        """Split R-hat and bulk ESS per site (:func:`~pyrobnn.infer.mcmc.chain_diagnostics`)."""
        return chain_diagnostics(self.draws)

    @classmethod
    def of(cls, model, recorded: Recorded, histories: Sequence[History] = (), settings: Optional[dict] = None
           ) -> "SGMCMCResult":
        """The draws of the samplers ``recorded`` built (one per ``fit``; one for all stacked chains), chains in
        order."""
        collectors = [optim.collector for optim in recorded.made if optim.steps]  # not a stacked try given up
        parts = [collector.stacked() for collector in collectors]
        draws = {name: torch.cat([part[name] for part in parts]) for name in parts[0]}
        return cls(model, draws, list(histories), draw_epochs=list(collectors[0].epochs), settings=dict(settings or {}))

    def chains_of(self, rows: Sequence[int]) -> "SGMCMCResult":
        """The draws of the chains ``rows`` alone (a grid point's, of a stack of several)."""
        return dataclasses.replace(self, draws={name: value[list(rows)] for name, value in self.draws.items()})

    def report(self) -> dict:
        """The settings, the chains, the epochs of the draws, and the worst split R-hat and smallest bulk ESS over
        the sites (``None`` where they cannot be computed: R-hat needs 4 draws a chain)."""
        diagnostics = self.diagnostics()
        r_hat = max(d["r_hat_max"] for d in diagnostics.values())
        ess = min(d["ess_min"] for d in diagnostics.values())
        return {**self.settings, "chains": self.chains, "draw_epochs": self.draw_epochs,
                "r_hat_max": r_hat if math.isfinite(r_hat) else None,
                "ess_min": ess if len(self.draw_epochs) >= 4 else None}

    def summary(self) -> str:
        ess = self.report()["ess_min"]
        return (f"{len(self)} draws ({self.chains} chain(s) x {len(self.draw_epochs)}, after epochs "
                f"{self.draw_epochs[0]}-{self.draw_epochs[-1]})"
                + (f", smallest ESS {ess:.1f}" if ess is not None else ""))


def __getattr__(name: str):
    if name == "SGMCMC":  # the optimizer factory's name before the method took it (pyrobnn.methods.SGMCMC)
        deprecated("pyrobnn.infer.sgmcmc.SGMCMC",
                   "pyrobnn.infer.sgmcmc.SGMCMCOptimizer (the method: pyrobnn.methods.SGMCMC)")
        return SGMCMCOptimizer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_REPLICA_OPTIONS = ("elbo", "num_data", "compile", "device")
"""Options of :func:`~pyrobnn.infer.svi.fit` that :func:`~pyrobnn.infer.replicas.fit_replicas` takes too."""


def fit_sgmcmc(model, guide, x: torch.Tensor, y: torch.Tensor, *, lr: float, friction: float, temperature: float,
               cycles: int, exploration: float, chains: int = 1,
               make_chain: Optional[Callable[[int], tuple]] = None, epochs: int = 10, batch_size: int = 128,
               seed: int = 0, beta=Constant(1.0), **fit_options) -> SGMCMCResult:
    """Sample the posterior of ``model`` by SG-MCMC (the module docstring), starting from ``guide``'s point values,
    and return the draws (:class:`SGMCMCResult`).

    :param model, guide: chain 0, a :class:`~pyrobnn.BayesianNetwork` with a :class:`~pyrobnn.guides.PointGuide`
        (its values are the chain's state), without trained deterministic state (BatchNorm, a learned noise scale).
    :param x, y: the training data.
    :param lr, friction, temperature, cycles, exploration: the sampler (:class:`SGMCMCOptimizer`;
        :data:`SGMCMC_SAMPLERS` names SGLD, SGHMC and cyclical SGHMC).
    :param chains: C; chains 1..C-1 are ``make_chain(c)`` (after ``pyro.set_rng_seed(seed + c)``: their own
        initialisation), and all C run as one stacked network (:func:`~pyrobnn.infer.replicas.fit_replicas`: the same
        batches, each its own noise), which takes no ``transform``, callbacks or checkpoint.
    :param epochs, batch_size, seed: as for :func:`~pyrobnn.infer.svi.fit`.
    :param beta: must be 1: the potential is the log joint (a tempered posterior is ``temperature``).
    :param fit_options: the other options of :func:`~pyrobnn.infer.svi.fit` (device, transform, on_epoch_end,
        checkpoint, ...).
    :raises ValueError: bad settings, a run that would keep no draw, a guide that is no point estimate, trained
        deterministic state, a checkpoint to resume (the draws are not checkpointed), before anything is trained.
    :raises TrainingDiverged: when the step size makes the chain diverge (the loss becomes NaN or infinite).
    """
    epochs, batch_size = positive_int("epochs", epochs), positive_int("batch_size", batch_size)
    chains = positive_int("chains", chains)
    refuse_resume(fit_options.get("checkpoint"), "an SG-MCMC run keeps its draws")
    if beta != Constant(1.0):
        raise ValueError(f"SG-MCMC samples the posterior, whose potential is the log joint (beta = 1), got beta "
                         f"{beta!r}: a tempered posterior is temperature=T")
    if chains > 1 and make_chain is None:
        raise ValueError(f"chains={chains} needs make_chain=c -> (model, guide) for chains 1..{chains - 1}")
    refuse_trained_state(model, "each draw would need its own")
    site_parameters(guide, "SG-MCMC")
    settings = {"friction": friction, "cycles": cycles, "exploration": exploration, "temperature": temperature}
    sampler = Recorded(SGMCMCOptimizer(lr, friction, temperature, cycles, exploration, epochs,
                              math.ceil(x.shape[0] / batch_size)))
    if chains == 1:
        history = fit(model, guide, x, y, epochs=epochs, batch_size=batch_size, optimizer=sampler, seed=seed,
                      **fit_options)
        return SGMCMCResult.of(model, sampler, [history], settings)
    unsupported = [name for name in ("transform", "on_epoch_end", "checkpoint") if fit_options.get(name)]
    if unsupported:
        raise ValueError(f"chains={chains} run as one stacked network (fit_replicas), which takes no "
                         f"{', '.join(unsupported)}: sample one chain at a time for them")
    pairs = [(model, guide)]
    for c in range(1, chains):
        pyro.set_rng_seed(seed + c)
        pairs.append(tuple(make_chain(c)))
    histories = fit_replicas(pairs, x, y, epochs=epochs, batch_size=batch_size, optimizer=sampler, seed=seed,
                             **{k: v for k, v in fit_options.items() if k in _REPLICA_OPTIONS})
    return SGMCMCResult.of(model, sampler, histories, settings)
