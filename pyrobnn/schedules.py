r"""KL-weight (β) schedules for the annealed ELBO.

A schedule is a callable ``schedule(epoch, step, steps_per_epoch) -> β`` with
0-based ``epoch`` and ``step``. β multiplies the KL term of an ELBO whose
likelihood is already scaled to the full dataset (N/B), so β = 1 is the exact
ELBO; see :func:`pyrobnn.handlers.kl_annealing`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Constant", "LinearWarmup", "Geometric", "geometric_weights", "SCHEDULES"]


def _check_nonneg_int(name, value):
    if not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")


@dataclass(frozen=True)
class Constant:
    """β fixed for the whole run (paper 000 uses β = 0.1)."""

    beta: float = 1.0

    def __post_init__(self):
        if not (math.isfinite(self.beta) and self.beta >= 0):
            raise ValueError(f"beta must be a finite number >= 0, got {self.beta!r}")

    def __call__(self, epoch: int, step: int, steps_per_epoch: int) -> float:
        return self.beta


@dataclass(frozen=True)
class LinearWarmup:
    r"""Warm-up then linear annealing by epoch (paper 001; paper 004):

    β = 0 for the first ``warmup`` epochs, then rises linearly to ``final`` over
    ``anneal`` epochs, within each epoch by minibatch:
    :math:`\beta = \mathrm{final}\cdot\min(1, (e - W + i/M) / A)` for :math:`e \ge W`.
    ``anneal = 0`` jumps to ``final`` after the warm-up.
    """

    warmup: int = 0
    anneal: int = 0
    final: float = 1.0

    def __post_init__(self):
        _check_nonneg_int("warmup (epochs with beta = 0)", self.warmup)
        _check_nonneg_int("anneal (epochs of the linear ramp)", self.anneal)
        if not (math.isfinite(self.final) and self.final >= 0):
            raise ValueError(f"final beta must be a finite number >= 0, got {self.final!r}")

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
    if not isinstance(num_batches, int) or num_batches < 1:
        raise ValueError(f"num_batches must be a positive integer, got {num_batches!r}")
    norm = 1.0 - 2.0 ** (-num_batches)
    return [2.0 ** (-i) / norm for i in range(1, num_batches + 1)]


@dataclass(frozen=True)
class Geometric:
    r"""Blundell's per-minibatch KL weights (paper 003): minibatch i of M gets :math:`\pi_i` of the KL.

    Blundell's minibatch cost is :math:`\pi_i \mathrm{KL} - \log p(D_i|w)`. pyrobnn's
    likelihood is scaled by N/B ≈ M, so the equivalent weight here is
    :math:`\beta_i = M \pi_i`: over an epoch the KL is counted exactly once,
    front-loaded on the first minibatches.
    """

    def __call__(self, epoch, step, steps_per_epoch):
        norm = 1.0 - 2.0 ** (-steps_per_epoch)
        return steps_per_epoch * 2.0 ** (-(step + 1)) / norm


SCHEDULES = {"constant": Constant, "linear": LinearWarmup, "geometric": Geometric}
