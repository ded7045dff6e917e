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

from pyrobnn._compat import DisableTorchFunctionSubclass, tree_flatten, tree_map
from pyrobnn.handlers.distribution_tensor import DistributionTensor
from pyrobnn.handlers.lazy_value import LAYERS, LazyValue, LazyWeight

__all__ = ["Particles", "ParticleValues", "ParticlesUnsupported", "align_targets", "current_estimator",
           "current_particles", "mismatched_rows_unsupported"]


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


class ParticleValues(LazyValue):
    r"""One latent site's values in S particles (or C chains), ``values`` of shape ``(S,) + shape``, as a tensor
    of the site's shape: the empirical distribution :math:`\frac1S\sum_s \delta(w - w_s)` laid out as the
    particles' rows.

    - A Linear/Conv layer that receives it as its weight applies the S values in one batched call
      (:meth:`Particles.layer`): particle s's rows meet value s.
    - Any other operation that meets it beside a tensor of the S·B particle rows (a noise scale in
      ``Normal(mu, sigma)``) sees each row's particle value, ``(S·B, 1, ..., 1) + shape``, broadcast against that
      tensor; an operation with no such tensor to align it to is refused (:class:`ParticlesUnsupported`).

    A pyrobnn estimator handler gives it to a reparameterized latent whose posterior has no lazy value of its own
    (:mod:`pyrobnn.handlers.families`), :math:`w_s \sim q` drawn S times; the batched NUTS gives every weight its
    C chains' values; :class:`~pyrobnn.guides.PosteriorDraws` its draws. A Monte-Carlo KL scores the S values
    (:meth:`kl_draws`).
    """

    values: torch.Tensor
    particles: Particles

    @staticmethod
    def __new__(cls, values: torch.Tensor, particles: Particles):
        self = cls.wrap(values[0])
        self.values, self.particles = values, particles
        return self

    def kl_draws(self) -> torch.Tensor:
        return self.values

    def moments(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and variance over the particles."""
        return self.values.mean(0), self.values.var(0, unbiased=False)

    def __repr__(self):
        return f"ParticleValues(particles={self.values.shape[0]}, shape={tuple(self.shape)})"

    def rows(self, dims: int) -> torch.Tensor:
        """Each row's particle value, ``(S·B,) + (1,) * k + shape``, broadcastable against a tensor of ``dims``
        dimensions whose first is the S·B rows."""
        count, batch = self.particles.count, self.particles.batch
        shape = self.values.shape[1:]
        if len(shape) > dims - 1:
            raise ParticlesUnsupported(f"a latent of shape {tuple(shape)} with one value per particle cannot be "
                                       f"aligned to a tensor of {dims} dimensions over the particles' rows")
        per_row = self.values.unsqueeze(1).expand((count, batch) + shape).reshape((count * batch,) + shape)
        return per_row.view((count * batch,) + (1,) * (dims - 1 - len(shape)) + shape)

    @classmethod
    def dispatch(cls, func, args, kwargs):
        if func in LAYERS and len(args) > 1 and isinstance(args[1], ParticleValues):
            x, weight, *rest = args
            bias = rest.pop(0) if rest else kwargs.pop("bias", None)
            if isinstance(bias, ParticleValues):
                bias = bias.values
            elif isinstance(bias, LazyWeight):
                bias = bias.particle_samples(weight.particles.count)
            return weight.particles.layer(func, x, weight.values, bias, *rest, **kwargs)
        flat = tree_flatten((args, kwargs))[0]
        particles = next(v.particles for v in flat if isinstance(v, ParticleValues))
        rows = particles.count * particles.batch
        dims = max((v.dim() for v in flat if isinstance(v, torch.Tensor) and not isinstance(v, DistributionTensor)
                    and v.dim() > 0 and v.shape[0] == rows), default=None)
        if dims is None:
            name = getattr(func, "__qualname__", getattr(func, "__name__", repr(func)))
            raise ParticlesUnsupported(f"{name} uses a latent with one value per particle outside a Linear/Conv "
                                       f"layer, with no tensor of the {rows} particle rows to align it to")
        args, kwargs = tree_map(lambda v: v.rows(dims) if isinstance(v, ParticleValues) else v, (args, kwargs))
        with DisableTorchFunctionSubclass():
            return func(*args, **kwargs)


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
