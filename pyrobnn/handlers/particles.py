r"""Vectorized Monte Carlo: S particles of a network in one pass, particle-major.

An estimator handler with ``num_particles`` S > 1 (:func:`~pyrobnn.handlers.weight_sampling`,
:func:`~pyrobnn.handlers.local_reparameterization`, :func:`~pyrobnn.handlers.flipout`) makes every
Bayesian Linear/Conv layer run S independent draws at once. The convention, kept in this module
only:

- the first Bayesian layer receives the B-row input shared by all particles and returns S·B rows,
  particle-major (rows ``s·B .. s·B + B - 1`` are particle s);
- every later layer receives and returns S·B rows;
- the targets of the observation are repeated to S·B rows by the same handler
  (:func:`align_targets`, an effect the model calls), so the likelihood, scaled by
  :math:`N / (S B)`, averages the ELBO over the particles;
- :meth:`Particles.split` views an S·B-row output as ``(S, B, ...)``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from pyro.poutine.runtime import effectful

__all__ = ["Particles", "ParticlesUnsupported", "align_targets", "current_estimator", "current_particles",
           "mismatched_rows_unsupported"]


class ParticlesUnsupported(RuntimeError):
    """A network uses a Bayesian parameter outside a Linear/Conv layer under vectorized particles."""


@dataclass(frozen=True)
class Particles:
    """``count`` particles of a ``batch``-row input, laid out particle-major."""

    batch: int
    count: int

    def is_first(self, x: torch.Tensor) -> bool:
        """Whether ``x`` is the B-row input shared by all particles (else it has S·B rows)."""
        if x.shape[0] not in (self.batch, self.batch * self.count):
            raise ValueError(
                f"a layer received {x.shape[0]} rows under {self.count} vectorized particles with "
                f"batch_size={self.batch}: pass batch_size=<rows of the input> (expected {self.batch}, "
                f"or {self.batch * self.count} after the first layer)"
            )
        return x.shape[0] == self.batch

    def stacked(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` as ``(S, B, ...)``: the shared input expanded, or the S·B rows viewed."""
        if self.is_first(x):
            return x.expand((self.count,) + x.shape)
        return x.view((self.count, self.batch) + x.shape[1:])

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` with S·B rows: the shared input repeated for every particle (particle-major), or ``x`` itself."""
        return self.stacked(x).flatten(0, 1) if self.is_first(x) else x

    def layer(self, op, x: torch.Tensor, w: torch.Tensor, b, *rest, **kwargs) -> torch.Tensor:
        """``op(x_s, w[s], b_s)`` for every particle s in one call (``op`` is ``F.linear`` or ``F.convNd``):
        a batched matrix product, or a grouped convolution over the particles' stacked channels.
        ``w`` is ``(S,) + weight shape``; ``b`` is ``(S, out)``, one shared ``(out,)`` or None."""
        x = self.stacked(x)
        if op is F.linear:  # (S, B, ..., in) @ (S, 1, in, out)
            w = w.transpose(-1, -2).view((self.count,) + (1,) * (x.dim() - 3) + w.shape[-1:] + w.shape[-2:-1])
            out = torch.matmul(x, w)
            if b is not None:
                out = out + b.view((-1,) + (1,) * (out.dim() - 2) + b.shape[-1:])
            return out.flatten(0, 1)
        options = dict(zip(("stride", "padding", "dilation", "groups"), rest), **kwargs)
        groups = options.pop("groups", 1)
        stacked = x.transpose(0, 1).flatten(1, 2)  # (B, S*C, ...)
        out = op(stacked, w.flatten(0, 1), None, groups=self.count * groups, **options)
        out = out.view((self.batch, self.count) + w.shape[1:2] + out.shape[2:]).transpose(0, 1)  # (S, B, out, ...)
        if b is not None:
            out = out + b.reshape((self.count if b.dim() > 1 else 1, 1, -1) + (1,) * (out.dim() - 3))
        return out.flatten(0, 1)

    def split(self, out: torch.Tensor) -> torch.Tensor:
        """An S·B-row output viewed as ``(S, B, ...)``."""
        if out.shape[0] != self.count * self.batch:
            raise ValueError(
                f"expected {self.count} x {self.batch} rows from the network under vectorized particles, got "
                f"{out.shape[0]}: its first Bayesian layer is not a Linear/Conv layer fed by the input batch"
            )
        return out.view((self.count, self.batch) + out.shape[1:])

    def repeat(self, y: torch.Tensor) -> torch.Tensor:
        """Targets of the B examples repeated for every particle (S·B rows, particle-major)."""
        return y.repeat((self.count,) + (1,) * (y.dim() - 1))


@effectful(type="align_targets")
def align_targets(y: torch.Tensor | None) -> torch.Tensor | None:
    """The targets as the network's output rows lay them out: ``y`` itself, or repeated for every
    particle when a handler runs S particles in one pass (it answers this effect)."""
    return y


@effectful(type="current_estimator")
def current_estimator():
    """The estimator handler around the call (:mod:`pyrobnn.handlers`), or None: a plain Pyro run."""
    return None


@effectful(type="current_particles")
def current_particles() -> Particles | None:
    """The :class:`Particles` of the estimator handler around the call, or None (no handler, or one particle)."""
    return None


@contextlib.contextmanager
def mismatched_rows_unsupported(particles: Particles | None):
    """Turn the shape error of a network that combines the shared B-row input with S·B particle rows (a residual
    around the first Bayesian layer) into :class:`ParticlesUnsupported`, so the caller can loop over the
    particles instead; every other error, an out-of-memory error above all, passes unchanged."""
    try:
        yield
    except ParticlesUnsupported:
        raise
    except RuntimeError as error:
        if particles is None or isinstance(error, torch.OutOfMemoryError) or "size of tensor" not in str(error):
            raise
        raise ParticlesUnsupported(
            f"the network combines tensors of {particles.batch} and {particles.count * particles.batch} rows under "
            f"{particles.count} vectorized particles (a residual around its first Bayesian layer?): {error}"
        ) from error
