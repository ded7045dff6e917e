r"""NUTS for C chains in lockstep: one batched leapfrog step of every chain per potential evaluation.

:class:`BatchedNUTS` is the No-U-Turn sampler (Hoffman & Gelman 2014) with multinomial sampling along the
trajectory and the generalised U-turn criterion (Betancourt 2017), its tree built iteratively, without
recursion (Phan, Pradhan & Jankowiak 2019, as NumPyro builds it), for C chains held as one ``(C, D)`` state.
Every chain doubles its trajectory at the same time: at depth d, all chains whose trees are still growing take
the same 2^d leapfrog steps, each one batched call of the potential and its gradient
(:class:`~pyrobnn.infer.potential.BatchedPotential`). A chain whose tree has finished (a U-turn, a divergence,
the maximum depth) or whose new subtree has stopped is masked: its step size is zero for the rest of the
doubling, so it costs nothing beyond its share of the batched pass, and none of its state changes. The leaf
index within a subtree is the same for every chain, so the checkpoints of the iterative U-turn check are
Python integers; the loop reads one flag from the device per leaf on CPU (free there) and per power-of-two
leaf elsewhere, where a read waits for the device.

:func:`sample_chains` runs warm-up as Stan does, per chain: the step size by dual averaging towards the target
acceptance statistic, a diagonal inverse mass matrix from the variance of the draws of each slow window
(:func:`~pyrobnn.infer.hmc_util.adaptation_windows`), and the step size searched again (Hoffman & Gelman 2014,
algorithm 4) at the start and after every window. All random numbers come from one ``torch.Generator``, so a
seed gives the same draws on the same device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from pyrobnn.infer.hmc_util import (
    DualAveraging,
    PotentialAndGrad,
    Subtree,
    WelfordVariance,
    adaptation_windows,
    checkpoint_range,
    checkpoint_turning,
    extend_subtree,
    is_turning,
    kinetic_energy,
    leapfrog,
)
from pyrobnn.infer.recording import build, check_mode, record, replay

__all__ = ["BatchedNUTS", "Transition", "sample_chains", "compiled"]

AUTO_INDUCTOR_LEAVES = 40_000
"""``compile="auto"`` compiles with inductor once the run is projected to take more leaves than this after
the switch (each leaf weighted by its state's size, :data:`AUTO_INDUCTOR_STATE`): on a 2-core CPU inductor
compiles for 4-10 s and saves a few hundred microseconds per leaf of a small state."""

AUTO_INDUCTOR_STATE = 12_000
"""For ``compile="auto"`` a leaf of C chains of D weights counts as :math:`1 + CD/` this many leaves: what
inductor saves per leaf grows with the state it fuses the sampler's elementwise steps over (2-core CPU, C = 2:
340 µs at D = 151, 390 µs at D = 769, 4 ms at D = 66,561, where TorchScript takes 5.7 ms)."""

NARROW_CHECK_STATE = 50_000
"""From this many numbers in the chains' state (C x D) on, a leaf's graph checks the U-turn against one stored
checkpoint, the one every odd leaf closes, and the rarer further ones (a quarter of the leaves) are checked after
it from Python; below it, the graph takes all ``max_tree_depth`` of them at once. The products against the
checkpoints read 2 K C D numbers a leaf: on the 1-256-256-1 network (C D = 133,122, 1 thread, inductor) a leaf takes
0.88 ms against all K = 8 and 0.48 ms against one, where on small states the Python of the further checks would
cost more than the products it saves."""

MAX_DELTA_ENERGY = 1000.0
"""A leapfrog step whose energy error :math:`H(z', r') - H(z_0, r_0)` exceeds this diverges (Stan's and
NumPyro's threshold)."""


def compiled(fn, example: tuple, compile: str):
    """``fn`` (tensors in, a tuple of tensors out) as one graph of ATen operations, forward and backward passes
    included (:func:`~pyrobnn.infer.recording.record` on ``example``), replayed by ``compile``
    (:func:`~pyrobnn.infer.recording.replay`: ``"trace"``, built in milliseconds, or ``"inductor"``, fused kernels,
    seconds to build, then several times faster on small networks, whose cost is the number of operations);
    ``"none"`` returns ``fn`` itself. The graph is checked against ``fn`` on ``example``; a graph that differs
    (control flow on tensor values, frozen by the recording) is refused with a ``RuntimeError``."""
    if compile == "none":
        return fn
    example = tuple(value.clone() for value in example)  # the recording tells inputs apart by identity
    graph = replay(record(fn, example), example, compile)
    expected, got = fn(*example), graph(*example)
    # a fused graph rounds differently: energies are differences of large numbers, so compare on their scale
    scale = 1 + max(float(value.abs().max()) for value in (*example, *expected)
                    if value.is_floating_point() and value.numel() and bool(torch.isfinite(value).all()))
    for a, b in zip(expected, got):
        if not (a.shape == b.shape and (torch.equal(a, b) if a.dtype == torch.bool else torch.allclose(
                a, b, rtol=1e-3, atol=1e-5 * scale, equal_nan=True))):
            raise RuntimeError(f"compile={compile!r}: the recorded graph differs from the eager computation (does "
                               "the network branch on tensor values?); use compile='none'")
    return graph


@dataclass
class Transition:
    """One NUTS transition of every chain: the new state and its statistics, each ``(C,)``."""

    z: torch.Tensor
    potential: torch.Tensor
    grad: torch.Tensor
    accept_prob: torch.Tensor  # mean Metropolis acceptance min(1, exp(-ΔH)) over the trajectory
    num_steps: torch.Tensor  # leapfrog steps taken
    tree_depth: torch.Tensor  # doublings done
    diverging: torch.Tensor
    energy: torch.Tensor  # H(z, r) at the new state


class BatchedNUTS:
    """The NUTS kernel for C chains in lockstep (see the module docstring).

    :param potential_and_grad: ``z (C, D) -> (U (C,), ∇U (C, D))``, one batched evaluation.
    :param max_tree_depth: at most ``2**max_tree_depth - 1`` leapfrog steps per transition.
    :param generator: the source of every random number (momenta, directions, multinomial choices).
    :param compile: how a leaf of the tree (:func:`~pyrobnn.infer.hmc_util.extend_subtree`: a leapfrog step with
        the potential's forward and backward pass, and the sampler's bookkeeping) runs, as one graph (see
        :func:`compiled`): ``"trace"`` (TorchScript, built in milliseconds), ``"inductor"`` (fused kernels,
        built in seconds, several times faster per leaf), ``"auto"`` (``"trace"`` until :meth:`upgrade` is
        called, then ``"inductor"``), or ``"none"`` (from Python, operation by operation: for networks whose
        forward pass branches on the values of tensors, which a trace would freeze). A graph that cannot be
        built follows the executor policy (:func:`~pyrobnn.infer.recording.build`): under ``"auto"`` the next
        simpler way, with a warning; an explicit mode raises :class:`~pyrobnn.infer.recording.ExecutorFailed`.
    """

    def __init__(self, potential_and_grad: PotentialAndGrad, *, max_tree_depth: int = 10,
                 max_delta_energy: float = MAX_DELTA_ENERGY, generator: torch.Generator | None = None,
                 compile: str = "auto"):
        self.potential_and_grad = potential_and_grad
        self.max_tree_depth = max_tree_depth
        self.max_delta_energy = max_delta_energy
        self.generator = generator
        self.compile = check_mode(compile)
        self.leaf_compile = "trace" if self.compile == "auto" else self.compile
        self.leaves = 0  # leaf steps taken (one batched potential evaluation each)
        self.narrow = None  # whether a leaf's graph checks one checkpoint (NARROW_CHECK_STATE), set at the first leaf
        self._leaf = self._potential = self._example = None
        self._upgraded = False
        self._masks = {}

    def _rand(self, like: torch.Tensor, *shape: int) -> torch.Tensor:
        return torch.rand(shape or like.shape, generator=self.generator, dtype=like.dtype, device=like.device)

    def momentum(self, inverse_mass: torch.Tensor) -> torch.Tensor:
        r""":math:`r \sim \mathcal N(0, M)` per chain, :math:`M` diagonal."""
        noise = torch.randn(inverse_mass.shape, generator=self.generator, dtype=inverse_mass.dtype,
                            device=inverse_mass.device)
        return noise * inverse_mass.rsqrt()

    def potential(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The potential and its gradient at ``z`` ``(C, D)``, as one TorchScript graph (a few calls per
        transition at most: building it fast matters more than running it fast)."""
        if self._potential is None:
            self._potential, _ = self._compiled(self.potential_and_grad, (z,),
                                                "none" if self.compile == "none" else "trace")
        return self._potential(z)

    def upgrade(self) -> None:
        """With ``compile="auto"``: compile the leaf step with inductor from now on (for a run long enough to repay
        seconds of compilation). Does nothing before the first transition, a second time, or with another
        compiler."""
        if self.compile == "auto" and self._example is not None and not self._upgraded:
            self._upgraded = True
            self._leaf, self.leaf_compile = self._compiled(self._extend, self._example, "inductor")

    def _compiled(self, fn, example: tuple, compiler: str):
        """``(graph, compiler)``: ``fn`` as a ``compiler`` graph, built by the one executor policy
        (:func:`~pyrobnn.infer.recording.build`): under ``compile="auto"`` a graph that cannot be built falls back
        to the next simpler one (``"trace"``, then ``"none"``) with one warning; an explicit mode raises
        :class:`~pyrobnn.infer.recording.ExecutorFailed`."""
        return build(lambda mode: compiled(fn, example, mode), compiler, self.compile, "the NUTS leapfrog step")

    def _extend(self, *args):
        tree, rest = Subtree(*args[:len(Subtree._fields)]), args[len(Subtree._fields):]
        tree, p, a = extend_subtree(tree, *rest, max_delta_energy=self.max_delta_energy,
                                    potential_and_grad=self.potential_and_grad)
        return (*tree, p, a)

    def _check_mask(self, low: int, high: int, like: torch.Tensor) -> torch.Tensor:
        if (low, high) not in self._masks:
            mask = torch.zeros(self.max_tree_depth, dtype=torch.bool, device=like.device)
            mask[low:high + 1] = True
            self._masks[low, high] = mask
        return self._masks[low, high]

    def _leaf_checks(self, low: int, high: int, checkpoints: tuple, like: torch.Tensor) -> tuple:
        """What the graph of a leaf closing checkpoints ``low .. high`` (:func:`checkpoint_range`) checks the U-turn
        against: every checkpoint and the mask of those it closes, or, when :attr:`narrow`, the one it closes last
        (``high``; unchecked for an even leaf, which closes none) and a one-entry mask."""
        if not self.narrow:
            return (*checkpoints, self._check_mask(low, high, like))
        # contiguous copies (2 C D + C numbers): a compiled graph reads its inputs with the strides it was built for
        return (*(buffer[:, high:high + 1].contiguous() for buffer in checkpoints),
                self._first(low <= high, like).reshape(1))

    def _further_checks(self, low: int, high: int, tree: Subtree, active: torch.Tensor, checkpoints: tuple,
                        inverse_mass: torch.Tensor) -> Subtree:
        """With :attr:`narrow`: the U-turn checks of a leaf against its checkpoints ``low .. high - 1``, which its
        graph left out, as :func:`~pyrobnn.infer.hmc_util.extend_subtree` makes them (``active``: the chains that
        grew this leaf)."""
        if low >= high:
            return tree
        r = tree.leaf[:, 1]
        velocity = inverse_mass * r
        turned = checkpoint_turning(*(buffer[:, low:high] for buffer in checkpoints), velocity,
                                    torch.linalg.vecdot(velocity, r), tree.r_sum, inverse_mass).any(-1)
        return tree._replace(turning=tree.turning | (active & turned), active=tree.active & ~turned)

    def transition(self, z: torch.Tensor, potential: torch.Tensor, grad: torch.Tensor, step_size: torch.Tensor,
                   inverse_mass: torch.Tensor) -> Transition:
        """One NUTS transition of every chain from ``z`` ``(C, D)`` (with its potential ``(C,)`` and gradient),
        step sizes ``(C,)`` and diagonal inverse mass matrices ``(C, D)``."""
        chains, dim = z.shape
        r = self.momentum(inverse_mass)
        energy0 = potential + kinetic_energy(r, inverse_mass)
        # the tree: its two ends and its proposal, each (z, r, grad) stacked as (C, 3, D)
        left = right = proposal = torch.stack([z, r, grad], 1)
        proposal_potential = potential
        log_weight = torch.zeros_like(potential)  # log of the sum over the trajectory of exp(-ΔH)
        r_sum = r
        turning = torch.zeros(chains, dtype=torch.bool, device=z.device)
        diverging = torch.zeros_like(turning)
        depth = torch.zeros(chains, dtype=torch.long, device=z.device)
        sum_accept = torch.zeros_like(potential)
        num_steps = torch.zeros_like(potential)
        checkpoints = (z.new_zeros(chains, self.max_tree_depth, dim), z.new_zeros(chains, self.max_tree_depth, dim),
                       z.new_zeros(chains, self.max_tree_depth))
        growing = ~turning
        for d in range(self.max_tree_depth):
            if d > 0:
                growing = ~(turning | diverging)
                if not bool(growing.any()):  # one read per doubling
                    break
            going_right = self._rand(potential) < 0.5
            signed_step = torch.where(going_right, step_size, -step_size) * growing
            sub = self._subtree(torch.where(going_right[:, None, None], right, left), 2 ** d, signed_step, growing,
                                energy0, inverse_mass, checkpoints)
            sum_accept = sum_accept + sub.sum_accept
            num_steps = num_steps + sub.num_steps
            # biased progressive sampling (Betancourt 2017, A.3.2): move to the new subtree with probability
            # min(1, w_new / w_old), never into a subtree that turned or diverged
            move_prob = torch.exp(sub.log_weight - log_weight).clamp(max=1.0)
            move = growing & ~sub.turning & ~sub.diverging & (self._rand(potential) < move_prob)
            proposal = torch.where(move[:, None, None], sub.proposal, proposal)
            proposal_potential = torch.where(move, sub.proposal_potential, proposal_potential)
            log_weight = torch.where(growing, torch.logaddexp(log_weight, sub.log_weight), log_weight)
            right = torch.where((growing & going_right)[:, None, None], sub.leaf, right)
            left = torch.where((growing & ~going_right)[:, None, None], sub.leaf, left)
            r_sum = torch.addcmul(r_sum, sub.r_sum, growing[:, None].to(r_sum.dtype))
            r_left, r_right = left[:, 1], right[:, 1]
            whole_turning = is_turning(inverse_mass * r_left, inverse_mass * r_right, r_left, r_right, r_sum)
            turning = turning | (growing & (sub.turning | whole_turning))
            diverging = diverging | sub.diverging
            depth = depth + growing.long()
        z, r, grad = proposal.unbind(1)
        return Transition(z, proposal_potential, grad, sum_accept / num_steps, num_steps, depth, diverging,
                          proposal_potential + kinetic_energy(r, inverse_mass))

    def _subtree(self, leaf, num_leaves, signed_step, growing, energy0, inverse_mass, checkpoints) -> Subtree:
        """``num_leaves`` leapfrog steps from ``leaf`` (C, 3, D) for the ``growing`` chains: the subtree built
        iteratively, one :func:`~pyrobnn.infer.hmc_util.extend_subtree` per leaf."""
        step = signed_step[:, None] * inverse_mass
        half_step = 0.5 * signed_step[:, None]
        uniforms = self._rand(energy0, num_leaves, energy0.shape[0])
        zeros, no = torch.zeros_like(energy0), torch.zeros_like(growing)
        tree = Subtree(leaf, leaf, zeros, zeros, leaf[:, 1].contiguous(), zeros, zeros, no, no, growing)
        if self._leaf is None:
            self.narrow = leaf[:, 0].numel() >= NARROW_CHECK_STATE
            self._example = tuple(value.clone() for value in (
                *tree, *self._leaf_checks(*checkpoint_range(0), checkpoints, leaf), self._first(True, leaf),
                uniforms[0], step, half_step, inverse_mass, energy0))
            self._leaf, self.leaf_compile = self._compiled(self._extend, self._example, self.leaf_compile)
        check_every_leaf = leaf.device.type == "cpu"
        for i in range(num_leaves):
            low, high = checkpoint_range(i)
            active = tree.active
            *fields, p, a = self._leaf(*tree, *self._leaf_checks(low, high, checkpoints, leaf),
                                       self._first(i == 0, leaf), uniforms[i], step, half_step, inverse_mass, energy0)
            self.leaves += 1
            tree = Subtree(*fields)
            if self.narrow:
                tree = self._further_checks(low, high, tree, active, checkpoints, inverse_mass)
            if i % 2 == 0:  # leaf i opens balanced sub-trajectories: keep what their U-turn checks need
                for buffer, value in zip(checkpoints, (tree.leaf[:, 1], p, a)):
                    buffer[:, high] = value
            if i + 1 < num_leaves and (check_every_leaf or (i + 1) & i == 0) and not bool(tree.active.any()):
                break
        return tree

    def _first(self, first: bool, like: torch.Tensor) -> torch.Tensor:
        if first not in self._masks:
            self._masks[first] = torch.tensor(first, device=like.device)
        return self._masks[first]

    def find_step_size(self, z: torch.Tensor, potential: torch.Tensor, grad: torch.Tensor, step_size: torch.Tensor,
                       inverse_mass: torch.Tensor, max_rounds: int = 100) -> torch.Tensor:
        r"""A reasonable first step size per chain (Hoffman & Gelman 2014, algorithm 4): double (or halve) it
        while one leapfrog step from ``z`` with fresh momentum is accepted with probability above (or below)
        0.8, and stop at the first step size where that flips."""
        target = math.log(0.8)
        direction = torch.zeros_like(step_size)
        last = torch.zeros_like(step_size)
        searching = torch.ones_like(step_size, dtype=torch.bool)
        tiny, huge = torch.finfo(step_size.dtype).tiny, torch.finfo(step_size.dtype).max
        for _ in range(max_rounds):
            step_size = torch.where(searching, step_size * torch.pow(2.0, direction), step_size).clamp(tiny, huge)
            r = self.momentum(inverse_mass)
            eps = (step_size * searching)[:, None]
            _, r_new, potential_new, _ = leapfrog(z, r, grad, eps * inverse_mass, 0.5 * eps, self.potential)
            delta = potential_new + kinetic_energy(r_new, inverse_mass) - potential - kinetic_energy(r, inverse_mass)
            new_direction = torch.where(target < -delta, 1.0, -1.0).to(step_size.dtype)
            last, direction = torch.where(searching, direction, last), torch.where(searching, new_direction, direction)
            at_limit = ((step_size <= tiny) & (direction < 0)) | ((step_size >= huge) & (direction > 0))
            searching = searching & ((last == 0) | (direction == last)) & ~at_limit
            if not bool(searching.any()):
                break
        return step_size


def sample_chains(potential_and_grad: PotentialAndGrad, init: torch.Tensor, *, num_samples: int, warmup: int,
                  target_accept: float = 0.8, max_tree_depth: int = 10, generator: torch.Generator | None = None,
                  progress: bool = False, max_delta_energy: float = MAX_DELTA_ENERGY,
                  compile: str = "auto") -> tuple[torch.Tensor, dict]:
    """Run C chains of NUTS from ``init`` ``(C, D)``: ``warmup`` adapting iterations (discarded), then
    ``num_samples`` kept.

    :param compile: see :class:`BatchedNUTS`. With ``"auto"`` the leaf step starts as a TorchScript graph; after
        16, 32, 64, ... iterations the leaves still to come are projected from those taken so far, and once
        they exceed :data:`AUTO_INDUCTOR_LEAVES` (weighted by the state's size, :data:`AUTO_INDUCTOR_STATE`) the step
        is compiled with inductor. The decision depends on counts and sizes only, so the same seed gives the same
        draws.
    :returns: ``(draws, stats)``: draws ``(C, num_samples, D)``; ``stats`` holds per draw ``(C, num_samples)``
        ``accept_prob``, ``num_steps``, ``tree_depth``, ``diverging``, ``energy``, and per chain ``step_size``
        ``(C,)``, ``inverse_mass`` ``(C, D)``, ``warmup_divergences`` ``(C,)``; and ``leaves`` (batched leapfrog
        steps taken, warm-up included) and ``compile`` (the leaf step's executor at the end).
    """
    kernel = BatchedNUTS(potential_and_grad, max_tree_depth=max_tree_depth, max_delta_energy=max_delta_energy,
                         generator=generator, compile=compile)
    z = init.detach().clone()
    chains, dim = z.shape
    potential, grad = kernel.potential(z)
    bad = ~(torch.isfinite(potential) & torch.isfinite(grad).all(-1))
    if bool(bad.any()):
        raise RuntimeError(f"the potential energy or its gradient is not finite at the initial weights of chain(s) "
                           f"{bad.nonzero().flatten().tolist()}: start from finite weights with a finite likelihood")
    inverse_mass = torch.ones_like(z)
    step_size = kernel.find_step_size(z, potential, grad, torch.ones_like(potential), inverse_mass)
    averaging = DualAveraging(torch.log(10 * step_size))
    windows = adaptation_windows(warmup)
    window = 0
    variance = WelfordVariance(z)
    names = ("accept_prob", "num_steps", "tree_depth", "diverging", "energy")
    record = {name: [] for name in names}
    draws = z.new_empty(num_samples, chains, dim)
    warmup_divergences = torch.zeros(chains, dtype=torch.long, device=z.device)
    bar = _progress(warmup + num_samples, chains, progress)
    total = warmup + num_samples
    for t in range(total):
        if t >= 16 and t & (t - 1) == 0 and \
                kernel.leaves / t * (total - t) * (1 + z.numel() / AUTO_INDUCTOR_STATE) > AUTO_INDUCTOR_LEAVES:
            kernel.upgrade()
        step = kernel.transition(z, potential, grad, step_size, inverse_mass)
        z, potential, grad = step.z, step.potential, step.grad
        if t < warmup:
            warmup_divergences += step.diverging.long()
            log_step = averaging.update(target_accept - step.accept_prob)
            step_size = torch.exp(averaging.x_avg if t == warmup - 1 else log_step).clamp(
                torch.finfo(z.dtype).tiny, torch.finfo(z.dtype).max)
            slow = 0 < window < len(windows) - 1
            if slow:
                variance.update(z)
            if t == windows[window].end:
                if slow:
                    inverse_mass = variance.variance()
                    variance.reset()
                    step_size = kernel.find_step_size(z, potential, grad, step_size, inverse_mass)
                    averaging = DualAveraging(torch.log(10 * step_size))
                window += 1
        else:
            draws[t - warmup] = z
            for name in names:
                record[name].append(getattr(step, name))
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    stats = {name: torch.stack(values, 1) if values else z.new_empty(chains, 0) for name, values in record.items()}
    stats.update(step_size=step_size, inverse_mass=inverse_mass, warmup_divergences=warmup_divergences,
                 leaves=kernel.leaves, compile=kernel.leaf_compile)
    return draws.transpose(0, 1), stats


def _progress(total: int, chains: int, show: bool):
    if not show:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=f"NUTS, {chains} chains in one batch", unit="it")
