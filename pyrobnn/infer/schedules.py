r"""KL-weight (β) schedules for the annealed ELBO.

A schedule is a callable ``schedule(epoch, step, steps_per_epoch) -> β`` with
0-based ``epoch`` and ``step``. β multiplies the KL term of an ELBO whose
likelihood is already scaled to the full dataset (N/B), so β = 1 is the exact
ELBO; see :func:`pyrobnn.handlers.kl_annealing`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pyrobnn.checks import nonnegative, nonnegative_int, positive_int

__all__ = ["Constant", "LinearWarmup", "Geometric", "KLCycles", "geometric_weights", "for_data", "SCHEDULES"]


@dataclass(frozen=True)
class Constant:
    """β fixed for the whole run (Rahman's CIFAR-10 comparison of Bayes by Backprop and MC dropout
    uses β = 0.1)."""

    beta: float = 1.0

    def __post_init__(self):
        nonnegative("beta (the KL weight)", self.beta)

    def __call__(self, epoch: int, step: int, steps_per_epoch: int) -> float:
        return self.beta


@dataclass(frozen=True)
class LinearWarmup:
    r"""Warm-up then linear annealing, by epoch.

    β = 0 for the first ``warmup`` epochs :math:`W`, then rises linearly to ``final`` over
    ``anneal`` epochs :math:`A`, within each epoch by minibatch:
    :math:`\beta = \mathrm{final}\cdot\min(1, (e - W + i/M) / A)` for :math:`e \ge W`.
    ``anneal = 0`` jumps to ``final`` after the warm-up. Published settings: :math:`W = 150`,
    :math:`A = 250` for regression with variational dense and variational-dropout layers;
    :math:`W = 0`, :math:`A = 200` of 300 epochs for implicit BNNs.
    """

    warmup: int = 0
    anneal: int = 0
    final: float = 1.0

    def __post_init__(self):
        nonnegative_int("warmup (epochs with beta = 0)", self.warmup)
        nonnegative_int("anneal (epochs of the linear ramp)", self.anneal)
        nonnegative("final (beta after the ramp)", self.final)

    def __call__(self, epoch, step, steps_per_epoch):
        if epoch < self.warmup:
            return 0.0
        if self.anneal == 0:
            return self.final
        progress = (epoch - self.warmup + (step + 1) / steps_per_epoch) / self.anneal
        return self.final * min(1.0, progress)


def geometric_weights(num_batches: int) -> list[float]:
    r"""Blundell et al. (2015, eq. 9): :math:`\pi_i = 2^{M-i} / (2^M - 1)`, i = 1..M; they sum to 1.

    Computed as :math:`2^{-i} / (1 - 2^{-M})` so that large M does not overflow.
    """
    positive_int("num_batches (minibatches per epoch)", num_batches)
    norm = 1.0 - 2.0 ** (-num_batches)
    return [2.0 ** (-i) / norm for i in range(1, num_batches + 1)]


@dataclass(frozen=True)
class Geometric:
    r"""Per-minibatch KL weights of Blundell et al. (2015): minibatch i of M gets :math:`\pi_i` of the KL.

    Blundell's minibatch cost is :math:`\pi_i \mathrm{KL} - \log p(D_i|w)`. pyrobnn's
    likelihood is scaled by N/B ≈ M, so the equivalent weight here is
    :math:`\beta_i = M \pi_i`: over an epoch the KL is counted exactly once,
    front-loaded on the first minibatches.
    """

    def __call__(self, epoch, step, steps_per_epoch):
        norm = 1.0 - 2.0 ** (-steps_per_epoch)
        return steps_per_epoch * 2.0 ** (-(step + 1)) / norm


@dataclass(frozen=True)
class KLCycles:
    r"""BLoB's KL re-weighting as its code runs it (Wang et al. 2024, its options ``--bayes-klreweighting`` and
    ``--bayes-datasetrescaling``, :math:`\gamma = 8`): cycles of :math:`M = \lfloor 100\, N^{\pi/\gamma} / B \rfloor`
    steps over the whole run, not the epoch, step :math:`i = 1..M` of a cycle weighing
    :math:`\pi_i = 2^i / (2^{M+1} - 1)` (back-loaded, summing to about 1 a cycle).

    BLoB steps :math:`\pi_i \mathrm{KL}` by SGD at its KL rate; in pyrobnn's units (the summed ELBO, over an epoch of
    :math:`S` steps :math:`\sumeta = S` counting the KL once) :math:`eta = S \pi_i`, so a KL stepped apart at
    the per-example rate :math:`\eta` (:class:`~pyrobnn.infer.optim.Optim`'s ``kl_lr``) takes BLoB's step at its
    KL rate :math:`\eta / B`. It reads the training-set size N (:func:`for_data`, which
    :func:`~pyrobnn.infer.svi.fit` applies); B is :math:`N / S`."""

    GAMMA = 8.0
    SCALE = 100.0

    def for_data(self, num_data: int) -> "_BoundKLCycles":
        """The schedule for a training set of ``num_data`` examples."""
        return _BoundKLCycles(positive_int("num_data (the training-set size)", num_data))

    def cycle(self, num_data: int, steps_per_epoch: int) -> int:
        """M, the steps of a cycle, for N = ``num_data`` and S = ``steps_per_epoch`` (B = N / S)."""
        return max(1, int(self.SCALE * num_data ** (math.pi / self.GAMMA) * steps_per_epoch / num_data))

    def __call__(self, epoch, step, steps_per_epoch):
        raise ValueError("KLCycles reads the training-set size: use KLCycles().for_data(N) (fit does)")


@dataclass(frozen=True)
class _BoundKLCycles(KLCycles):
    num_data: int = 1

    def __call__(self, epoch, step, steps_per_epoch):
        cycle = self.cycle(self.num_data, steps_per_epoch)
        i = (epoch * steps_per_epoch + step) % cycle + 1
        return steps_per_epoch * 2.0 ** (i - cycle - 1) / (1.0 - 2.0 ** (-(cycle + 1)))


def for_data(schedule, num_data: int):
    """``schedule`` for a training set of ``num_data`` examples: its ``for_data(num_data)`` where it reads the size
    (:class:`KLCycles`), else itself."""
    bind = getattr(schedule, "for_data", None)
    return schedule if bind is None else bind(num_data)


SCHEDULES = {"constant": Constant, "linear": LinearWarmup, "geometric": Geometric, "kl-cycles": KLCycles}
"""The β schedules by name (``--beta NAME``)."""
