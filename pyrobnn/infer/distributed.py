r"""Data-parallel SVI over P processes (``torchrun``): every process takes 1/P of the data, gradients are averaged.

Launched as ``torchrun --nproc-per-node=P script.py``, each process joins the group with :func:`setup`
(or :func:`process_group`), takes its shard with :func:`shard`, and wraps its model and guide with
:func:`data_parallel` before calling the unchanged training loop::

    with process_group() as device:                       # gloo on CPU, nccl on GPU LOCAL_RANK
        x, y = shard(x_train, y_train)                    # this process's N/P examples
        model.to(device), guide.to(device)
        data_parallel(model, guide)                       # rank 0's parameters; gradients averaged
        fit(model, guide, x, y, num_data=world_size() * len(x), seed=rank_seed(0), device=device)

**Why the average is the ELBO of the whole batch.** With the model's ``num_data`` set to the global
training-set size N in every process (not the shard's size: ``fit(num_data=...)``), process r minimises
on its local minibatch :math:`\mathcal B_r` of B examples

.. math:: L_r(\phi) = \frac{N}{B} \sum_{n \in \mathcal B_r} -\log p(y_n | x_n, w) + \beta\, \mathrm{KL}(q_\phi \| p).

The gradient is linear, so the average of the P processes' gradients is the gradient of

.. math:: \frac1P \sum_{r=1}^P L_r = \frac{N}{P B} \sum_{n \in \mathcal B_1 \cup \dots \cup \mathcal B_P}
          -\log p(y_n | x_n, w) + \beta\, \mathrm{KL}(q_\phi \| p),

the single-process loss of the concatenated batch of P·B examples with the same N: the likelihood is
scaled by N over the global batch and the KL, present once in every process, is counted once. This is
exact (not only in expectation) when every process uses the same weights w: under the deterministic
VDP++ moments (:func:`~pyrobnn.handlers.vdp`), or for weight sampling (Blundell et al. 2015) with one weight
sample per step and the same seed in every process, since the guide then draws the identical
:math:`w = \mu + \sigma \odot \epsilon` everywhere (``tests/infer/test_distributed.py`` checks both). Summing
instead of averaging, or leaving ``num_data`` at the shard's N/P, would weight the KL P times too much.

**Noise across processes.** Seed every process differently (``fit(seed=rank_seed(seed))``): the average
then stays an unbiased estimate of the same ELBO gradient, with lower variance or the single-process
estimator's own distribution:

- weight sampling: P independent weight samples, each on 1/P of the batch (the same seed gives the
  single-process estimator with one shared sample, used above for the exact check);
- local reparameterization (Kingma et al. 2015) draws noise per example, so independent noise in
  every process is exactly the single-process estimator's distribution (the same seed would reuse one
  process's noise for the examples of the others: correlated, higher variance);
- flipout (Wen et al. 2018): P independent base perturbations instead of one.

**What is synchronised.** :func:`data_parallel` broadcasts rank 0's parameters and buffers (every process
starts from the same network and posterior), then before every step of any optimiser holding one of the
parameters it averages, in one all-reduce per dtype and device, the gradient of every trainable
parameter of the guide and the model (a parameter with no gradient in one process counts as zero there;
one with no gradient anywhere keeps none) and the BatchNorm running statistics (the average of the
running means is the running mean of the global batch; the running variances are averaged, which
omits the spread of the P shard means). Every process then takes the same step and the parameters stay
identical. A BatchNorm layer in training mode normalises by its own shard's statistics, as in DDP.

What stays per process: ``fit``'s logged loss and NLL (of its own shard), validation (each process
evaluates the ``val`` it is given), and checkpoints: give each process its own file
(``checkpoint=f"run.{rank()}.pt"``), which keeps its RNG state, so that ``resume=True`` continues exactly.

Every process must make the same number of steps, which :func:`shard` ensures (equal shares). A process
whose loss becomes NaN skips the step and stops (``TrainingDiverged``) while the others wait in the
all-reduce; ``torchrun`` then ends them all.
"""

from __future__ import annotations

import datetime
import os
from contextlib import contextmanager
from typing import Iterator, Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from pyrobnn._compat import BatchNormBase
from pyrobnn.checks import choice, nonnegative_int, positive

__all__ = [
    "BACKENDS", "setup", "teardown", "process_group", "rank", "world_size", "shard", "rank_seed",
    "data_parallel", "GradientAverager", "max_parameter_difference",
]

BACKENDS = ("gloo", "nccl")
"""Process-group backends: ``gloo`` (CPU tensors), ``nccl`` (one CUDA device per process)."""

_LAUNCH = "torchrun --nproc-per-node=P script.py"


def rank() -> int:
    """This process's index in ``0 .. world_size() - 1`` (0 when not distributed)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def world_size() -> int:
    """The number of processes P (1 when not distributed)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def setup(backend: Optional[str] = None, timeout: Optional[float] = None) -> torch.device:
    """Join the process group that ``torchrun`` describes in the environment (``env://``: ``RANK``,
    ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, ``LOCAL_RANK``) and return this process's device:
    ``cuda:LOCAL_RANK`` (made current) with ``nccl``, the CPU with ``gloo``.

    Without ``torchrun`` (no ``WORLD_SIZE`` in the environment) nothing is joined: the script runs as
    one process on ``cuda`` if present, else the CPU, and the other functions here do nothing.

    :param backend: ``"gloo"`` or ``"nccl"``; default ``nccl`` when CUDA is available, else ``gloo``.
    :param timeout: seconds a collective may wait for the other processes (default: PyTorch's).
    """
    if backend is not None:
        choice("backend", backend, BACKENDS)
    if timeout is not None:
        timeout = datetime.timedelta(seconds=positive("timeout (seconds)", timeout))
    if backend == "nccl" and not torch.cuda.is_available():
        raise ValueError("backend='nccl' needs CUDA GPUs, and none is available here: use backend='gloo' on CPU")
    if "WORLD_SIZE" not in os.environ:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not dist.is_available():
        raise RuntimeError("this PyTorch build has no torch.distributed: data-parallel training is unavailable")
    if dist.is_initialized():
        raise RuntimeError("the process group is already set up: call teardown() before setup() again")
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend, init_method="env://", timeout=timeout,
                            **({"device_id": device} if backend == "nccl" else {}))
    return device


def teardown() -> None:
    """Leave the process group joined by :func:`setup` (nothing if none was joined)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@contextmanager
def process_group(backend: Optional[str] = None, timeout: Optional[float] = None) -> Iterator[torch.device]:
    """:func:`setup` on entry (yielding the device), :func:`teardown` on exit, also after an error."""
    device = setup(backend, timeout)
    try:
        yield device
    finally:
        teardown()


def shard(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """This process's share of ``tensors`` (e.g. ``x, y``): examples ``rank, rank + P, rank + 2P, ...``.

    Every process gets the same number, ``N // P`` (the last ``N mod P`` examples are left out), so all
    make the same number of steps per epoch; the strided choice spreads data sorted by class or source
    evenly. Deterministic: the same on every call. The global size to give the model is
    ``world_size() * len(shard)``.
    """
    if not tensors:
        raise ValueError("shard needs at least one tensor, e.g. shard(x, y)")
    if not all(isinstance(t, torch.Tensor) and t.dim() > 0 for t in tensors):
        raise TypeError(f"shard takes tensors with a first (example) dimension, got "
                        f"{[type(t).__name__ if not isinstance(t, torch.Tensor) else tuple(t.shape) for t in tensors]}")
    sizes = {t.shape[0] for t in tensors}
    if len(sizes) > 1:
        raise ValueError(f"shard: the tensors hold different numbers of examples {[t.shape[0] for t in tensors]}; "
                         "pass x and y of the same length")
    size, count, index = sizes.pop(), world_size(), rank()
    if size < count:
        raise ValueError(f"shard: {size} examples cannot give each of the {count} processes at least one; "
                         "use more data or fewer processes")
    return tuple(t[index: size - size % count: count] for t in tensors)


def rank_seed(seed: int) -> int:
    """The seed of this process, ``seed * P + rank``: distinct for every (seed, rank) at a fixed P, and
    ``seed`` itself in a single process. Pass it to ``fit(seed=...)`` so that the weight noise differs
    between processes (see the module docstring); the data order of each shard changes with it too."""
    return nonnegative_int("seed", seed) * world_size() + rank()


def _trainable(modules: Sequence[nn.Module]) -> list[torch.Tensor]:
    """The distinct trainable parameters of ``modules``, in a fixed order (the same in every process)."""
    unique = {id(p): p for module in modules for p in module.parameters() if p.requires_grad}
    return list(unique.values())


def _running_statistics(modules: Sequence[nn.Module]) -> list[torch.Tensor]:
    """The running means and variances of the BatchNorm/InstanceNorm layers of ``modules``."""
    stats = {}
    for module in modules:
        for layer in module.modules():
            if isinstance(layer, BatchNormBase) and layer.running_mean is not None:
                stats.update({id(t): t for t in (layer.running_mean, layer.running_var)})
    return list(stats.values())


def _each_flat(tensors: Sequence[torch.Tensor], collective) -> None:
    """Apply ``collective`` (in place) to ``tensors`` as one flat buffer per (dtype, device): one
    communication call per group instead of one per tensor, then copy the results back."""
    groups: dict[tuple, list[torch.Tensor]] = {}
    for tensor in tensors:
        groups.setdefault((tensor.dtype, tensor.device), []).append(tensor)
    for group in groups.values():
        flat = torch.cat([t.detach().reshape(-1) for t in group])
        collective(flat)
        for tensor, part in zip(group, flat.split([t.numel() for t in group])):
            tensor.detach().copy_(part.view_as(tensor))


class GradientAverager:
    r"""Keeps the parameters of ``modules`` identical across processes; made by :func:`data_parallel`.

    On creation it broadcasts rank 0's parameters and buffers. Before every ``step()`` of a
    ``torch.optim`` optimiser that holds one of the parameters (a global optimiser step pre-hook, so the
    training loop needs no change) it replaces each gradient :math:`g_r` by :math:`\frac1P\sum_r g_r` and
    averages the BatchNorm running statistics. :meth:`remove` (or leaving its ``with`` block) stops it.
    """

    def __init__(self, modules: Sequence[nn.Module], sync_running_stats: bool = True):
        if not all(isinstance(m, nn.Module) for m in modules):
            raise TypeError(f"data_parallel takes torch.nn.Modules (the model and the guide), got "
                            f"{[type(m).__name__ for m in modules]}")
        self.params = _trainable(modules)
        self.running_stats = _running_statistics(modules) if sync_running_stats else []
        self._ids = {id(p) for p in self.params}
        self._handle = None
        if world_size() == 1:
            return
        buffers = list({id(b): b for m in modules for b in m.buffers()}.values())
        _each_flat([*(p for m in modules for p in m.parameters()), *buffers],
                   lambda flat: dist.broadcast(flat, src=0))
        self._handle = register_optimizer_step_pre_hook(self._before_step)

    def _before_step(self, optimizer: torch.optim.Optimizer, args, kwargs) -> None:
        if any(id(p) in self._ids for group in optimizer.param_groups for p in group["params"]):
            self.average()

    @torch.no_grad()
    def average(self) -> None:
        """Average the gradients (and running statistics) over the processes now; a collective call."""
        count = world_size()
        if count == 1:
            return
        reference = self.params[0] if self.params else None
        has_grad = [] if reference is None else \
            [torch.tensor([p.grad is not None for p in self.params], dtype=reference.dtype, device=reference.device)]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        _each_flat([*grads, *self.running_stats, *has_grad], lambda flat: dist.all_reduce(flat.div_(count)))
        if has_grad:
            for p, grad, present in zip(self.params, grads, has_grad[0].tolist()):
                if present > 0 and p.grad is None:
                    p.grad = grad

    def remove(self) -> None:
        """Stop averaging (the parameters stay as they are)."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def __enter__(self) -> "GradientAverager":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


def data_parallel(model: nn.Module, guide: nn.Module, *, sync_running_stats: bool = True) -> GradientAverager:
    """Make ``model`` and ``guide`` train data-parallel: rank 0's parameters and buffers now, averaged
    gradients (and BatchNorm running statistics) before every optimiser step. Call it after
    :func:`setup` and after moving both to this process's device; the model's ``num_data`` must be the
    global training-set size (``fit(num_data=world_size() * len(x_shard))``), see the module docstring.
    In a single process it does nothing. Returns the :class:`GradientAverager` (``remove()`` stops it)."""
    return GradientAverager([model, guide], sync_running_stats)


@torch.no_grad()
def max_parameter_difference(*modules: nn.Module) -> float:
    """The largest absolute difference between this process's parameters and buffers of ``modules`` and
    rank 0's (0.0 when they are identical, as they stay under :func:`data_parallel`); a collective call."""
    tensors = [t.detach().reshape(-1).double() for m in modules for t in (*m.parameters(), *m.buffers())
               if t.is_floating_point()]
    if world_size() == 1 or not tensors:
        return 0.0
    mine = torch.cat(tensors)
    reference = mine.clone()
    dist.broadcast(reference, src=0)
    difference = (mine - reference).abs().max()
    dist.all_reduce(difference, op=dist.ReduceOp.MAX)
    return difference.item()
