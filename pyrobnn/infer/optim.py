r"""Optimisers as objects: the optimiser, its learning-rate schedule and warm-up, given to ``fit`` as one.

An *optimizer factory* is a callable ``(model, guide) -> torch.optim.Optimizer`` that may carry
``schedule`` (a multiplier of each group's initial rate per epoch, ``torch.optim.lr_scheduler.LambdaLR``)
and ``warmup_steps`` (a linear per-step ramp over the first optimiser steps). :class:`Optim` is the plain
one (Adam or SGD over every parameter of the guide and the model); :class:`TwoGroupSGD` the two parameter
groups of implicit BNNs. Both take the per-example learning rate and weight decay that papers state (for the mean
loss over the training examples) and turn them into those of pyrobnn's summed ELBO (:func:`summed_loss_rates`).
Schedules: :class:`StepDecay` (Blundell et al. 2015 halve the rate every 100 epochs)
and :class:`FlatThenLinear` (Trinh et al. 2020).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Protocol, Sequence, Union, runtime_checkable

import torch

from pyrobnn.checks import choice, finite, in_range, nonnegative, nonnegative_int, positive, positive_int

__all__ = ["OPTIMIZERS", "Optim", "GuideRateOptim", "TwoGroupSGD", "StepDecay", "FlatThenLinear", "make_optimizer",
           "make_scheduler", "summed_loss_rates", "summed_loss_group", "split_parameters", "trained_parameters",
           "per_example_rate", "SCALE_INVARIANT", "Schedule", "OptimizerFactory", "ScheduledFactory", "WarmedUpFactory",
           "schedule_of", "splits_kl", "kl_step",
           "PerturbingOptimizer"]

Schedule = Union[Callable[[int], float], Sequence[Callable[[int], float]]]
"""A learning-rate multiplier per epoch, ``schedule(epoch)``, or one such callable per parameter group."""


@runtime_checkable
class OptimizerFactory(Protocol):
    """``(model, guide) -> torch.optim.Optimizer``: what :func:`~pyrobnn.infer.svi.fit` builds its optimiser with
    (:class:`Optim`, :class:`TwoGroupSGD`, SWAG's and SG-MCMC's collectors, or any such callable)."""

    def __call__(self, model, guide) -> torch.optim.Optimizer:
        """The optimiser over the parameters of ``model`` and ``guide`` that training changes."""


@runtime_checkable
class ScheduledFactory(OptimizerFactory, Protocol):
    """An optimizer factory that carries its learning-rate ``schedule`` (a multiplier per epoch, or one per parameter
    group; None: constant), as :class:`Optim` does."""

    schedule: Optional[Schedule]


@runtime_checkable
class WarmedUpFactory(OptimizerFactory, Protocol):
    """An optimizer factory that carries ``warmup_steps``, a linear ramp of the rate over the first optimiser steps
    (0: none), as :class:`Optim` does."""

    warmup_steps: int


def schedule_of(factory: OptimizerFactory) -> tuple[Optional[Schedule], int]:
    """``(schedule, warmup_steps)`` of an optimizer factory: what it carries (:class:`ScheduledFactory`,
    :class:`WarmedUpFactory`), else a constant rate without warm-up."""
    return (factory.schedule if isinstance(factory, ScheduledFactory) else None,
            factory.warmup_steps if isinstance(factory, WarmedUpFactory) else 0)


@runtime_checkable
class PerturbingOptimizer(Protocol):
    """An optimiser whose step is taken at perturbed parameters: the loss and its gradient are computed inside
    ``sampled_params(train=True)``, which moves the parameters to a draw around their mean and, on leaving, restores
    the mean and keeps the gradient at the draw (IVON, Shen et al. 2024: ``ivon.IVON``); the training loop
    (:meth:`~pyrobnn.infer.svi.Run.epoch`) then steps it."""

    def sampled_params(self, train: bool = False):
        """A context manager: the parameters at a draw inside, at their mean after."""

OPTIMIZERS: dict[str, tuple[type, dict]] = {
    "adam": (torch.optim.Adam, {}),
    "sgd": (torch.optim.SGD, {"momentum": 0.9, "nesterov": True}),
}
"""Optimisers by name (``--optimizer``): the class and its fixed options (SGD with Nesterov momentum 0.9, the
recipe of the papers)."""

SCALE_INVARIANT = frozenset({"adam"})
"""The :data:`OPTIMIZERS` whose step does not change when the loss is multiplied by a constant (up to ``eps``)."""


def summed_loss_rates(name: str, lr: float, weight_decay: float, num_data) -> tuple[float, float]:
    r"""The learning rate and weight decay on pyrobnn's loss that give the updates of the per-example ``lr`` and
    ``weight_decay`` papers state, which are for the mean loss over the N training examples.

    pyrobnn's loss, the negative ELBO, is the sum :math:`L(\theta) = N \bar L(\theta)` of the mean
    :math:`\bar L` (the minibatch likelihood is scaled by N/B). With an L2 weight decay :math:`\lambda` added to
    the gradient, :math:`\nabla L + N\lambda\theta = N(\nabla\bar L + \lambda\theta)`, so

    - SGD (momentum included, its buffer being linear in the gradient): rate :math:`\eta / N` and weight decay
      :math:`N\lambda`, since :math:`\theta - \tfrac{\eta}{N} N(\nabla\bar L + \lambda\theta)` is the
      mean-loss step;
    - Adam (scale-invariant, :data:`SCALE_INVARIANT`: :math:`m/\sqrt v` does not change when the gradient is
      multiplied by N; its ``eps`` acts as ``eps / N`` on the mean): rate :math:`\eta` and weight decay
      :math:`N\lambda`.

    :param name: a key of :data:`OPTIMIZERS`.
    :param num_data: N, the model's ``num_data`` (``fit`` sets it); needed unless the optimiser is scale-invariant
        and there is no weight decay.
    :returns: ``(lr, weight_decay)`` for the summed loss.
    :raises ValueError: when N is needed and is not a positive int.
    """
    choice("optimizer", name, OPTIMIZERS)
    if name in SCALE_INVARIANT and weight_decay == 0:
        return lr, weight_decay
    if not isinstance(num_data, int) or isinstance(num_data, bool) or num_data < 1:
        raise ValueError(f"the per-example learning rate and weight decay of {name} are scaled by the training-set "
                         f"size: build the model with num_data=N (fit sets it), got num_data={num_data!r}")
    return (lr if name in SCALE_INVARIANT else lr / num_data), weight_decay * num_data


def summed_loss_group(name: str, lr: float, weight_decay: float, num_data) -> dict:
    """The options of a parameter group on the summed ELBO for the per-example ``lr`` and ``weight_decay``
    (:func:`summed_loss_rates`): ``{"lr", "weight_decay", "rate_scale"}``, ``rate_scale`` being the per-example
    rate over the group's (:func:`per_example_rate`)."""
    summed_lr, summed_weight_decay = summed_loss_rates(name, lr, weight_decay, num_data)
    return {"lr": summed_lr, "weight_decay": summed_weight_decay, "rate_scale": lr / summed_lr}


def trained_parameters(model, guide) -> list[torch.Tensor]:
    """Every parameter SVI trains, each once: the guide's, then the model's own; a frozen one (``requires_grad``
    False: a pretrained backbone) is a constant."""
    return list({id(p): p for p in (*guide.parameters(), *model.parameters()) if p.requires_grad}.values())


def split_parameters(model, guide) -> tuple[list, list]:
    """``(network, variational)``: the model's own parameters that the guide does not hold (weights under a node
    prior, biases, BatchNorm, a learned noise scale), each once, and the guide's; frozen ones (``requires_grad``
    False) are constants, in neither."""
    variational = [p for p in guide.parameters() if p.requires_grad]
    ids = {id(p) for p in variational}
    return [p for p in dict.fromkeys(model.parameters()) if p.requires_grad and id(p) not in ids], variational


def make_optimizer(params, name: str = "adam", lr: float = 1e-3, weight_decay: float = 0.0,
                   rate_scale: float = 1.0, kl_lr: Optional[float] = None) -> torch.optim.Optimizer:
    """:data:`OPTIMIZERS` ``[name]`` over ``params``, fused into one kernel where the device supports it (CPU and
    CUDA): one update for all parameters instead of one per tensor. ``lr`` and ``weight_decay`` are passed as
    they are (the loss's own units); :class:`Optim` takes per-example ones. ``rate_scale`` (the per-example rate
    over ``lr``) is kept in every group for :func:`per_example_rate`; ``kl_lr`` (the loss's units), where given,
    marks every group's KL as stepped apart (:func:`kl_step`)."""
    params = list(params)
    cls, options = OPTIMIZERS[choice("optimizer", name, OPTIMIZERS)]
    optim = None
    if params:
        try:
            optim = cls(params, lr=lr, weight_decay=weight_decay, fused=True, **options)
        except (RuntimeError, TypeError, ValueError):
            pass
    if optim is None:
        optim = cls(params, lr=lr, weight_decay=weight_decay, **options)
    for group in optim.param_groups:
        group.setdefault("rate_scale", rate_scale)
        if kl_lr is not None:
            group.setdefault("kl_lr", kl_lr)
    return optim


def splits_kl(optim: torch.optim.Optimizer) -> bool:
    """Whether ``optim`` steps the likelihood's gradient alone, the KL's being stepped apart by :func:`kl_step`
    (a group carries ``"kl_lr"``: :class:`Optim` with ``kl_lr``)."""
    return any(group.get("kl_lr") is not None for group in optim.param_groups)


def kl_step(optim: torch.optim.Optimizer, gradients) -> None:
    r"""The KL's own step: plain SGD, :math:`\theta \leftarrow \theta - \eta_{KL}\, \nabla_\theta\, \beta
    \mathrm{KL}`, on ``gradients`` (``[(parameter, gradient)]``, the β-weighted KL's), in every group of ``optim``
    that carries ``"kl_lr"`` (:math:`\eta_{KL}` on the summed ELBO), times the group's learning rate over its
    initial one (the schedule and warm-up of the likelihood's rate apply to it too, as BLoB's second scheduler
    and AdamW's decay :math:`\eta\lambda` follow theirs)."""
    found = {id(parameter): gradient for parameter, gradient in gradients}
    with torch.no_grad():
        for group in optim.param_groups:
            rate = group.get("kl_lr")
            pairs = [(p, found[id(p)]) for p in group["params"] if id(p) in found] if rate else []
            if pairs:
                scale = group["lr"] / group.get("initial_lr", group["lr"])
                torch._foreach_add_([p for p, _ in pairs], [g for _, g in pairs], alpha=-rate * scale)


def per_example_rate(group: dict) -> float:
    """A parameter group's current learning rate in the per-example units the optimiser was given (the rate on the
    summed loss times its ``rate_scale``, N for SGD; groups without one are taken as they are)."""
    return group["lr"] * group.get("rate_scale", 1.0)


def _check_schedule(schedule, warmup_steps) -> None:
    if schedule is not None and not callable(schedule) and not (
            isinstance(schedule, Sequence) and all(callable(s) for s in schedule)):
        raise TypeError(f"schedule must be a callable epoch -> multiplier or a sequence of them, got {schedule!r}")
    nonnegative_int("warmup_steps (0: no warm-up)", warmup_steps)


def _constant(epoch: int) -> float:
    return 1.0


def make_scheduler(optim: torch.optim.Optimizer, schedule: Optional[Schedule]):
    """``LambdaLR`` of ``schedule`` over ``optim``'s groups; a single callable is not applied to groups marked
    ``"scheduled": False`` (e.g. :class:`TwoGroupSGD`'s variational one). ``None``: a constant rate."""
    if schedule is None:
        schedule = _constant
    if callable(schedule):
        schedule = [schedule if group.get("scheduled", True) else _constant for group in optim.param_groups]
    return torch.optim.lr_scheduler.LambdaLR(optim, list(schedule))


@dataclass(frozen=True)
class Optim:
    r"""Adam (or SGD with Nesterov momentum 0.9) over the guide's and the model's parameters, with its schedule.

    ``lr`` and ``weight_decay`` are per example, as papers state them (for the mean loss over the training
    examples): the optimiser gets those of the summed ELBO, :func:`summed_loss_rates` with N = ``model.num_data``
    (``fit`` sets it), so ``Optim("sgd", 0.05, 5e-4)`` is the paper's SGD at 0.05 with weight decay 5e-4.

    :param name: a key of :data:`OPTIMIZERS`.
    :param lr: the per-example learning rate.
    :param weight_decay: the per-example L2 penalty on every parameter.
    :param schedule: a multiplier of the rate per epoch (:class:`StepDecay`, :class:`FlatThenLinear`, any
        callable), or None for a constant rate.
    :param warmup_steps: ramp the rate linearly from ``1/W`` of its value over the first ``W`` optimiser steps.
    :param kl_lr: the KL stepped apart from the likelihood: plain SGD at this per-example rate on the β-weighted KL
        (:func:`kl_step`; on the summed ELBO ``kl_lr / N``, following ``lr``'s schedule and warm-up), the optimiser
        ``name`` stepping the likelihood's gradient alone; None: the KL is part of the loss the optimiser steps.
        Adam is scale-free: a parameter the data give no gradient (LoRA's :math:`A` while :math:`B = 0`) would take
        full-rate steps from the prior's gradient alone. BLoB (Wang et al. 2024) steps its KL by SGD so; under MAP
        with a Gaussian prior :math:`\mathcal N(0, s^2)` the step is decoupled weight decay (Loshchilov & Hutter
        2019, AdamW), each weight multiplied by :math:`1 - \beta\,\mathrm{kl\_lr} / (N s^2)`.
    """

    name: str = "adam"
    lr: float = 1e-3
    weight_decay: float = 0.0
    schedule: Optional[Schedule] = None
    warmup_steps: int = 0
    kl_lr: Optional[float] = None

    def __post_init__(self):
        choice("optimizer", self.name, OPTIMIZERS)
        positive("lr (learning rate)", self.lr)
        nonnegative("weight_decay", self.weight_decay)
        _check_schedule(self.schedule, self.warmup_steps)
        if self.kl_lr is not None:
            nonnegative("kl_lr (the KL's own SGD rate; None: the KL in the loss)", self.kl_lr)

    def __call__(self, model, guide) -> torch.optim.Optimizer:
        return make_optimizer(trained_parameters(model, guide), self.name, **self.group(model))

    def group(self, model) -> dict:
        """``{"lr", "weight_decay", "rate_scale"}`` on the summed ELBO of ``model`` (:func:`summed_loss_group`), and
        ``"kl_lr"`` on it where the KL is stepped apart."""
        num_data = getattr(model, "num_data", None)
        options = summed_loss_group(self.name, self.lr, self.weight_decay, num_data)
        if self.kl_lr is not None:
            options["kl_lr"] = summed_loss_rates("sgd", self.kl_lr, 0.0, num_data)[0]
        return options



@dataclass(frozen=True)
class GuideRateOptim(Optim):
    """:class:`Optim` with the guide's parameters at ``factor`` times the learning rate and the network's at the rate
    (the implicit BNN's large rate on its mixture, Trinh et al. 2020; ``--variational-lr-factor``)."""

    factor: float = 1.0

    def __post_init__(self):
        super().__post_init__()
        positive("factor (the guide's learning rate over the network's)", self.factor)

    def __call__(self, model, guide) -> torch.optim.Optimizer:
        network, variational = split_parameters(model, guide)
        options = self.group(model)  # per example -> the summed ELBO's
        groups = [{"params": network}, {"params": variational, "lr": options["lr"] * self.factor}]
        return make_optimizer([group for group in groups if group["params"]], self.name, **options)

@dataclass(frozen=True)
class StepDecay:
    """Multiply the learning rate by ``gamma`` every ``step`` epochs (Blundell et al. 2015: 0.5 every 100)."""

    step: int
    gamma: float = 0.5

    def __post_init__(self):
        positive_int("step (epochs between decays)", self.step)
        positive("gamma (the decay factor)", self.gamma)

    def __call__(self, epoch: int) -> float:
        return self.gamma ** (epoch // self.step)


@dataclass(frozen=True)
class TwoGroupSGD:
    r"""Optimizer factory ``(model, guide) -> torch.optim.SGD`` with the two parameter groups of implicit BNNs
    (Trinh, Kaski & Heinonen 2020, sec. 3.3 and Table 2):

    - ``"deterministic"``: the network's own parameters (weights :math:`U`, biases, BatchNorm, a learned
      noise scale), SGD with Nesterov momentum and weight decay, learning rate :math:`\lambda_0` (0.05 VGG-16,
      0.1 WRN-28-10), the group ``schedule`` applies to;
    - ``"variational"``: the guide's parameters, plain SGD at the constant large rate :math:`\lambda_1` (1.2 to
      4.8 in the paper, about 0.2·K), no weight decay, ``"scheduled": False``.

    Rates and weight decay are those of the paper, whose loss is the mean over the training examples:
    pyrobnn's ELBO sums over the N examples (the minibatch likelihood is scaled by N/B), so the factory divides
    the rates by N = ``model.num_data`` and multiplies the weight decay by N (:func:`summed_loss_rates`), which
    gives the same updates.
    ``fit(optimizer=TwoGroupSGD(...))`` sets ``num_data`` before calling it.
    """

    lr: float = 0.05
    variational_lr: float = 1.2
    weight_decay: float = 5e-4
    momentum: float = 0.9
    variational_momentum: float = 0.0
    schedule: Optional[Schedule] = None
    warmup_steps: int = 0

    def __post_init__(self):
        positive("lr (the deterministic weights' learning rate)", self.lr)
        positive("variational_lr (the variational parameters' learning rate)", self.variational_lr)
        nonnegative("weight_decay", self.weight_decay)
        in_range("momentum", self.momentum, 0, 1, "[)")
        in_range("variational_momentum", self.variational_momentum, 0, 1, "[)")
        _check_schedule(self.schedule, self.warmup_steps)

    def __call__(self, model, guide) -> torch.optim.SGD:
        num_data = getattr(model, "num_data", None)
        deterministic, variational = split_parameters(model, guide)
        deterministic_options = summed_loss_group("sgd", self.lr, self.weight_decay, num_data)
        groups = [
            {"params": deterministic, **deterministic_options, "momentum": self.momentum,
             "nesterov": self.momentum > 0, "group": "deterministic", "scheduled": True},
            {"params": variational, **summed_loss_group("sgd", self.variational_lr, 0.0, num_data),
             "momentum": self.variational_momentum, "nesterov": False, "group": "variational", "scheduled": False},
        ]
        return torch.optim.SGD([g for g in groups if g["params"]], lr=deterministic_options["lr"])


@dataclass(frozen=True)
class FlatThenLinear:
    r"""Learning-rate multiplier per epoch: 1 until ``start`` of the run, then linear down to ``final`` at
    ``end``, then ``final`` (Trinh et al. 2020, sec. 3.3: from epoch 150 to 270 of 300 down to 0.01·λ0,
    i.e. ``start=0.5, end=0.9``). With :class:`TwoGroupSGD` it applies to the ``"deterministic"`` group only
    (``param_group["scheduled"]``).
    """

    epochs: int
    start: float = 0.5
    end: float = 0.9
    final: float = 0.01

    def __post_init__(self):
        positive_int("epochs", self.epochs)
        in_range("start (fraction of the run before the decay)", self.start, 0, 1)
        in_range("end (fraction of the run where the decay stops)", self.end, 0, 1)
        if self.end < self.start:
            raise ValueError(f"end ({self.end}) must not come before start ({self.start})")
        finite("final (the last multiplier)", self.final)

    def __call__(self, epoch: int) -> float:
        t = epoch / self.epochs
        if t <= self.start:
            return 1.0
        if t >= self.end:
            return self.final
        return 1.0 - (1.0 - self.final) * (t - self.start) / (self.end - self.start)
