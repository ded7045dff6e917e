r"""The pure pieces of Hamiltonian Monte Carlo and NUTS, batched over C chains.

Every function here takes and returns tensors whose first dimension is the chain (a state is ``(C, D)``,
a per-chain scalar ``(C,)``), so :mod:`pyrobnn.infer.batched_nuts` advances C chains with one call each:

- :func:`leapfrog`: the velocity Verlet integrator of Hamilton's equations (Neal 2011, eq. 5.18-5.20);
- :func:`kinetic_energy` and :func:`is_turning`: the Euclidean kinetic energy with a diagonal inverse mass
  matrix, and the generalised No-U-Turn criterion (Betancourt 2017, appendix A.4.2);
- :func:`checkpoint_range`: which stored momenta the iterative U-turn check of leaf ``n`` compares against
  (Phan, Pradhan & Jankowiak 2019, the iterative tree building NumPyro uses);
- :func:`extend_subtree`: one leaf of a subtree: a leapfrog step, its energy error, divergence, the uniform
  progressive (multinomial) sampling of the subtree's proposal, and the U-turn checks it closes, as one pure
  function of tensors (so it can be traced into one graph);
- :class:`DualAveraging`: Nesterov's dual averaging of the log step size (Hoffman & Gelman 2014, section 3.2);
- :class:`WelfordVariance` and :func:`adaptation_windows`: the running variance of the draws that becomes the
  diagonal inverse mass matrix, and Stan's warm-up windows (Stan Reference Manual, "HMC algorithm parameters").
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch

__all__ = ["leapfrog", "kinetic_energy", "is_turning", "checkpoint_range", "checkpoint_turning", "Subtree",
           "extend_subtree",
           "DualAveraging", "WelfordVariance", "Window", "adaptation_windows"]

PotentialAndGrad = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
"""``z (C, D) -> (U(z) (C,), dU/dz (C, D))``: the potential energy of every chain and its gradient."""


def leapfrog(z: torch.Tensor, r: torch.Tensor, grad: torch.Tensor, step: torch.Tensor, half_step: torch.Tensor,
             potential_and_grad: PotentialAndGrad):
    r"""One velocity Verlet step of every chain (Neal 2011, eq. 5.18-5.20):

    .. math:: r_{1/2} = r - \tfrac{\epsilon}{2}\nabla U(z), \quad z' = z + \epsilon M^{-1} r_{1/2}, \quad
              r' = r_{1/2} - \tfrac{\epsilon}{2}\nabla U(z').

    :param step: :math:`\epsilon M^{-1}` per chain and coordinate, ``(C, D)`` (signed: negative runs backwards
        in time; zero freezes a chain).
    :param half_step: :math:`\epsilon / 2` per chain, ``(C, 1)``.
    :returns: ``(z', r', U(z'), ∇U(z'))``.
    """
    r = torch.addcmul(r, grad, half_step, value=-1.0)
    z = torch.addcmul(z, step, r)
    potential, grad = potential_and_grad(z)
    r = torch.addcmul(r, grad, half_step, value=-1.0)
    return z, r, potential, grad


def kinetic_energy(r: torch.Tensor, inverse_mass: torch.Tensor) -> torch.Tensor:
    r""":math:`K(r) = \tfrac12 r^\top M^{-1} r` over the last dimension, :math:`M^{-1}` diagonal (``inverse_mass``)."""
    return 0.5 * torch.linalg.vecdot(inverse_mass * r, r)


def is_turning(velocity_left: torch.Tensor, velocity_right: torch.Tensor, r_left: torch.Tensor,
               r_right: torch.Tensor, r_sum: torch.Tensor) -> torch.Tensor:
    r"""Whether a trajectory with end momenta :math:`r_-, r_+` (velocities :math:`M^{-1} r_\pm`) and momentum
    sum :math:`\rho` makes a U-turn, by the generalised criterion of Betancourt (2017, appendix A.4.2) with
    Stan's correction that leaves out the end points themselves:

    .. math:: \tilde\rho = \rho - \tfrac12 (r_- + r_+), \qquad
              \text{turning} \iff (M^{-1} r_-)^\top \tilde\rho \le 0 \;\lor\; (M^{-1} r_+)^\top \tilde\rho \le 0.

    Symmetric in the two ends, so a tree grown backwards in time needs no reordering. Reduces the last
    dimension; any leading dimensions broadcast.
    """
    rho = r_sum - 0.5 * (r_left + r_right)
    return (torch.linalg.vecdot(velocity_left, rho) <= 0) | (torch.linalg.vecdot(velocity_right, rho) <= 0)


def checkpoint_range(leaf: int) -> tuple[int, int]:
    """The stored momenta ``[low, high]`` (inclusive) that leaf ``leaf`` (0-based, within a subtree) closes
    balanced sub-trajectories with, in the iterative NUTS of Phan, Pradhan & Jankowiak (2019).

    An even leaf starts new sub-trajectories: it is stored at checkpoint ``high`` (the number of set bits of
    ``leaf >> 1``). An odd leaf closes as many balanced sub-trajectories as ``leaf`` has trailing one bits; the
    U-turn check runs between it and checkpoints ``low .. high``. For an even leaf ``low = high + 1`` (nothing
    to check).
    """
    high = bin(leaf >> 1).count("1")
    trailing_ones = bin((~leaf & (leaf + 1)) - 1).count("1")
    return high - trailing_ones + 1, high


class Subtree(NamedTuple):
    r"""The state of the subtree every chain is building, each ``(C, ...)``.

    ``leaf``: the last leaf, :math:`(z, r, \nabla U)` stacked ``(C, 3, D)``; ``proposal``: the leaf sampled so
    far, likewise, with its potential ``proposal_potential``; ``log_weight``: :math:`\log\sum e^{-\Delta H}` over
    the subtree's leaves; ``r_sum``: the sum of their momenta; ``checkpoint_r``, ``checkpoint_p`` ``(C, K, D)``
    and ``checkpoint_a`` ``(C, K)``: what the iterative U-turn check keeps of the even leaves that open balanced
    sub-trajectories (:func:`extend_subtree`); ``sum_accept``, ``num_steps``: the acceptance statistics and
    leapfrog steps so far; ``turning``, ``diverging``: whether it stopped, and why; ``active``: whether it grows.
    """

    leaf: torch.Tensor
    proposal: torch.Tensor
    proposal_potential: torch.Tensor
    log_weight: torch.Tensor
    r_sum: torch.Tensor
    sum_accept: torch.Tensor
    num_steps: torch.Tensor
    turning: torch.Tensor
    diverging: torch.Tensor
    active: torch.Tensor


def checkpoint_turning(checkpoint_r: torch.Tensor, checkpoint_p: torch.Tensor, checkpoint_a: torch.Tensor,
                       velocity: torch.Tensor, v_dot_r: torch.Tensor, r_sum: torch.Tensor,
                       inverse_mass: torch.Tensor) -> torch.Tensor:
    r"""Whether the balanced sub-trajectory from each stored checkpoint :math:`j` to the current leaf makes a U-turn,
    ``(C, K)``: :func:`is_turning` reduced to dot products with what was stored at leaf :math:`j`
    (:func:`extend_subtree`), for a leaf of momentum :math:`r`, velocity :math:`v = M^{-1} r` (``velocity``,
    :math:`v^\top r` ``v_dot_r``) and momentum sum :math:`\rho` (``r_sum``), :math:`w = M^{-1}\rho`:

    .. math:: (M^{-1} r_j)^\top\tilde\rho_j = r_j^\top (w - v/2) + a_j \le 0 \;\lor\;
              v^\top\tilde\rho_j = v^\top\rho - v^\top r / 2 + P_j^\top v \le 0.
    """
    w = inverse_mass * r_sum
    left = torch.bmm(checkpoint_r, (w - 0.5 * velocity)[:, :, None])[..., 0] + checkpoint_a
    right = torch.bmm(checkpoint_p, velocity[:, :, None])[..., 0] + (torch.linalg.vecdot(velocity, r_sum)
                                                                      - 0.5 * v_dot_r)[:, None]
    return (left <= 0) | (right <= 0)


def extend_subtree(tree: Subtree, checkpoint_r: torch.Tensor, checkpoint_p: torch.Tensor,
                   checkpoint_a: torch.Tensor, check: torch.Tensor, first: torch.Tensor, uniform: torch.Tensor,
                   step: torch.Tensor, half_step: torch.Tensor, inverse_mass: torch.Tensor, energy0: torch.Tensor,
                   max_delta_energy: float, potential_and_grad: PotentialAndGrad):
    r"""Add one leaf to every active chain's subtree; a pure function of tensors (no Python branch on their
    values), so one traced graph serves every leaf.

    The leaf is one :func:`leapfrog` step from the last one (chains no longer ``active`` take a zero step and
    change nothing). With :math:`\Delta H = H(z', r') - H_0` its weight is :math:`e^{-\Delta H}`; it diverges when
    :math:`\Delta H` exceeds ``max_delta_energy``; its acceptance statistic is :math:`\min(1, e^{-\Delta H})`. The
    subtree's proposal moves to it with probability :math:`e^{-\Delta H} / \sum_{\text{leaves}} e^{-\Delta H}`
    (uniform progressive sampling, Betancourt 2017, A.3.1; the first leaf, ``first``, is the proposal).

    The U-turn checks (Phan, Pradhan & Jankowiak 2019): the leaf closes the balanced sub-trajectories that start
    at the stored checkpoints ``check`` (``(K,)`` bool, :func:`checkpoint_range`). For the sub-trajectory from
    leaf :math:`j` to this leaf, :math:`\rho_j = \rho - R_j + r_j` (:math:`R_j` the momentum sum at leaf
    :math:`j`), and :func:`is_turning`'s two products reduce to dot products with what was stored at leaf
    :math:`j`: ``checkpoint_r`` :math:`= r_j`, ``checkpoint_p`` :math:`= P_j = r_j / 2 - R_j` and ``checkpoint_a``
    :math:`= a_j = (M^{-1} r_j)^\top P_j`, with :math:`v = M^{-1} r`, :math:`w = M^{-1}\rho`:

    .. math:: (M^{-1} r_j)^\top\tilde\rho_j = r_j^\top (w - v/2) + a_j, \qquad
              v^\top\tilde\rho_j = v^\top\rho - v^\top r / 2 + P_j^\top v,

    two batched matrix-vector products over the K checkpoints.

    :returns: ``(tree, p, a)``: the new :class:`Subtree`, and :math:`P, a` of this leaf (stored by the caller
        when the leaf is even).
    """
    active_f = tree.active.to(step.dtype)[:, None]
    z, r, grad = tree.leaf.unbind(1)
    z, r, potential, grad = leapfrog(z, r, grad, step * active_f, half_step * active_f, potential_and_grad)
    leaf = torch.stack([z, r, grad], 1)
    velocity = inverse_mass * r
    v_dot_r = torch.linalg.vecdot(velocity, r)
    delta = torch.nan_to_num(potential + 0.5 * v_dot_r - energy0, nan=math.inf)
    diverged = delta > max_delta_energy
    counted = active_f[:, 0]
    sum_accept = torch.addcmul(tree.sum_accept, torch.exp(-delta).clamp(max=1.0), counted)
    num_steps = tree.num_steps + counted
    log_weight = torch.where(first, -delta, torch.logaddexp(tree.log_weight, -delta))
    move = tree.active & (first | (uniform < torch.exp(-delta - log_weight)))
    proposal = torch.where(move[:, None, None], leaf, tree.proposal)
    proposal_potential = torch.where(move, potential, tree.proposal_potential)
    log_weight = torch.where(tree.active, log_weight, tree.log_weight)
    r_sum = torch.where(first, r, torch.addcmul(tree.r_sum, r, active_f))
    turned = (checkpoint_turning(checkpoint_r, checkpoint_p, checkpoint_a, velocity, v_dot_r, r_sum, inverse_mass)
              & check).any(-1)
    turning = tree.turning | (tree.active & turned)
    diverging = tree.diverging | (tree.active & diverged)
    active = tree.active & ~turned & ~diverged
    p = 0.5 * r - r_sum
    tree = Subtree(leaf, proposal, proposal_potential, log_weight, r_sum, sum_accept, num_steps, turning, diverging,
                   active)
    return tree, p, torch.linalg.vecdot(velocity, p)


class DualAveraging:
    r"""Dual averaging of :math:`x = \log\epsilon` towards a target acceptance statistic, one per chain
    (Nesterov 2009; Hoffman & Gelman 2014, eq. 5-6): after :math:`t` updates with statistics
    :math:`g_i = \delta - \alpha_i` (target minus achieved acceptance),

    .. math:: \bar g_t = \Big(1 - \frac1{t + t_0}\Big)\bar g_{t-1} + \frac{g_t}{t + t_0}, \quad
              x_t = \mu - \frac{\sqrt t}{\gamma}\bar g_t, \quad
              \bar x_t = t^{-\kappa} x_t + (1 - t^{-\kappa})\bar x_{t-1},

    with :math:`\mu = \log(10\,\epsilon_0)`. :math:`x_t` is the step size used during warm-up, :math:`\bar x_t`
    the one kept after it.

    :param prox_center: :math:`\mu`, one per chain, ``(C,)``.
    """

    def __init__(self, prox_center: torch.Tensor, t0: float = 10.0, kappa: float = 0.75, gamma: float = 0.05):
        self.prox_center, self.t0, self.kappa, self.gamma = prox_center, t0, kappa, gamma
        self.t = 0
        self.g_avg = torch.zeros_like(prox_center)
        self.x = torch.zeros_like(prox_center)
        self.x_avg = torch.zeros_like(prox_center)

    def update(self, statistic: torch.Tensor) -> torch.Tensor:
        """Take one statistic :math:`g_t` per chain; returns :math:`x_t`."""
        self.t += 1
        t = self.t
        self.g_avg = (1 - 1 / (t + self.t0)) * self.g_avg + statistic / (t + self.t0)
        self.x = self.prox_center - math.sqrt(t) / self.gamma * self.g_avg
        weight = t ** -self.kappa
        self.x_avg = (1 - weight) * self.x_avg + weight * self.x
        return self.x


class WelfordVariance:
    r"""The running per-coordinate variance of draws ``(C, D)``, one estimate per chain (Welford 1962), with
    Stan's regularisation towards a small constant when it becomes a diagonal inverse mass matrix:

    .. math:: \hat\sigma^2 = \frac{n}{n + 5}\,s^2 + 10^{-3}\,\frac{5}{n + 5}.
    """

    def __init__(self, like: torch.Tensor):
        self.like = like
        self.reset()

    def reset(self) -> None:
        self.n = 0
        self.mean = torch.zeros_like(self.like)
        self.m2 = torch.zeros_like(self.like)

    def update(self, z: torch.Tensor) -> None:
        self.n += 1
        delta = z - self.mean
        self.mean = self.mean + delta / self.n
        self.m2 = torch.addcmul(self.m2, delta, z - self.mean)

    def variance(self, regularize: bool = True) -> torch.Tensor:
        """The sample variance :math:`s^2` (``n - 1`` in the denominator), regularised as Stan does."""
        if self.n < 2:
            raise ValueError(f"the variance needs at least 2 draws, got {self.n}")
        variance = self.m2 / (self.n - 1)
        if regularize:
            variance = (self.n / (self.n + 5.0)) * variance + 1e-3 * (5.0 / (self.n + 5.0))
        return variance


class Window(NamedTuple):
    """Warm-up iterations ``start .. end`` (inclusive)."""

    start: int
    end: int


def adaptation_windows(num_warmup: int, start_buffer: int = 75, first_window: int = 25,
                       end_buffer: int = 50) -> list[Window]:
    """Stan's warm-up schedule: a fast start buffer (step size only), slow windows that double in length (the
    variance of the draws of each becomes the inverse mass matrix at its end, and the step size is searched
    again), and a fast end buffer (step size only). The last slow window stretches to the end buffer when the
    next doubling would not fit. Below 150 iterations the three parts take 15 % / 75 % / 10 %; below 20 the
    whole warm-up is one window (no mass matrix adaptation). The slow windows are ``windows[1:-1]``.
    """
    if num_warmup < 20:
        return [Window(0, num_warmup - 1)] if num_warmup > 0 else []
    if start_buffer + first_window + end_buffer > num_warmup:
        start_buffer, end_buffer = int(0.15 * num_warmup), int(0.1 * num_warmup)
        first_window = num_warmup - start_buffer - end_buffer
    windows = [Window(0, start_buffer - 1)]
    slow_end = num_warmup - end_buffer
    start, size = start_buffer, first_window
    while start < slow_end:
        if start + 3 * size > slow_end:  # the next window (twice as long) would not fit: take the rest now
            size = slow_end - start
        windows.append(Window(start, start + size - 1))
        start, size = start + size, 2 * size
    windows.append(Window(slow_end, num_warmup - 1))
    return windows
