r"""Node draws: the lazy value of a mixture node latent under an estimator handler (implicit BNNs).

A node latent (:mod:`pyrobnn.model.nodes`) whose posterior is an
:class:`~pyrobnn.distributions.EqualMixtureNormal` (:class:`~pyrobnn.guides.MixtureNodeGuide`) gets a
:class:`NodeDraws` value under an estimator handler instead of one sample: every row of the batch draws its
own :math:`z` from one component (:func:`row_components`), so K components cost one pass (Trinh, Kaski &
Heinonen 2020, Algorithm 1); under :func:`~pyrobnn.handlers.vdp` the product propagates the mixture's mean
and variance. :func:`row_components` is the one home of the rule "the rows must split evenly among the K
components".
"""

from __future__ import annotations

import torch

from pyrobnn.distributions import EqualMixtureNormal
from pyrobnn.handlers.lazy_value import LazyValue
from pyrobnn.handlers.moments import Moments

__all__ = ["NodeDraws", "row_components", "check_components"]



def row_components(rows: int, num_components: int, particles=None, device=None) -> torch.Tensor:
    """The mixture component of each of ``rows`` rows: row ``r`` uses ``r mod K``; under S vectorized
    particles (rows ``s·B + b``, particle-major, :mod:`pyrobnn.handlers.particles`) it uses ``(b + s) mod K``, so that
    S = K·T draws of an example cover every component T times.

    The rows must split evenly among the K components: ``rows`` a multiple of K, or under particles the batch
    B or the particle count S a multiple of K. Otherwise ``ValueError``.
    """
    k = num_components
    if particles is None:
        if rows % k:
            raise ValueError(
                f"a batch of {rows} rows under a mixture of K = {k} node components: row r uses component r mod K, "
                f"so the rows must be a multiple of K; use a batch size that is a multiple of {k} (dropping an "
                f"incomplete last batch), or num_particles a multiple of {k}"
            )
        return torch.arange(rows, device=device) % k
    batch, count = particles.batch, particles.count
    if batch % k and count % k:
        raise ValueError(
            f"{count} particles of a batch of {batch} rows under a mixture of K = {k} node components: row "
            f"s*B + b uses component (b + s) mod K, so the batch size or the number of particles (num_samples "
            f"in prediction) must be a multiple of K = {k}"
        )
    index = torch.arange(rows, device=device)
    return (index % batch + index // batch) % k


def check_components(num_components: int, batch_size: int, num_particles: int = 1,
                     num_examples: int | None = None) -> None:
    """Check before training that every batch of a run splits evenly among the K mixture components
    (:func:`row_components`): batches of ``batch_size`` rows (and the last one, of ``num_examples %
    batch_size``) must be multiples of K, unless the ``num_particles`` are. ``ValueError`` otherwise."""
    k = num_components
    if k == 1 or num_particles % k == 0:
        return
    last = num_examples % batch_size if num_examples else 0
    if batch_size % k or last % k:
        raise ValueError(f"batch_size ({batch_size}) and the last batch ({last or batch_size} of {num_examples} "
                         f"examples) must be multiples of the guide's {k} mixture components (each row uses one): "
                         f"choose batch_size a multiple of {k} that divides the training set, or num_particles a "
                         f"multiple of {k}")


_PRODUCTS = frozenset({torch.mul, torch.Tensor.mul, torch.Tensor.__mul__, torch.Tensor.__rmul__})


class NodeDraws(LazyValue):
    r"""The value an estimator handler gives a node site with a mixture posterior
    :math:`q(z) = \frac1K\sum_k\mathcal N(\mu_k, \sigma_k^2)`: a tensor of the latent's shape that multiplies
    a layer's rows (``x * z``, as the hooks do) by the handler's rule:

    - sampling estimators (weight sampling with particles, local reparameterization, flipout): row
      :math:`r` of ``x`` gets its own draw :math:`z_r = \mu_{k_r} + \sigma_{k_r}\epsilon_r` from component
      :math:`k_r` = :func:`row_components` (:math:`r \bmod K`; under S particles, whose first node layer
      expands the shared input to S·B rows, :math:`(b + s) \bmod K`). A row keeps its component in every
      layer (the K components act as K sub-networks, as in the authors' code, Algorithm 1); the noise is
      fresh per layer. The likelihood term then averages over the components exactly when the rows split
      evenly among them, which :func:`row_components` requires;
    - :func:`~pyrobnn.handlers.vdp`: the product's moments (:mod:`pyrobnn.handlers.moments`) with the mixture's
      mean :math:`\bar\mu` and variance :math:`\frac1K\sum_k\sigma_k^2 + \frac1K\sum_k(\mu_k - \bar\mu)^2`.

    Any other operation on it raises ``TypeError``: a node latent only multiplies a layer's units.
    """

    posterior: EqualMixtureNormal

    @staticmethod
    def __new__(cls, posterior: EqualMixtureNormal, estimator):
        self = cls.wrap(posterior.locs[0])
        self.posterior, self.estimator = posterior, estimator
        return self

    def moments(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.posterior.mean, self.posterior.variance

    def kl_draws(self) -> torch.Tensor:
        """Draws of the latent for a Monte-Carlo KL: one per particle, or one."""
        particles = self.estimator.particles
        return self.posterior.rsample((particles.count if particles is not None else 1,))

    def multiply(self, x: torch.Tensor) -> torch.Tensor:
        """``x * z`` with one draw of ``z`` per row of ``x`` (see the class docstring)."""
        if not self.estimator.stochastic:
            return Moments.dispatch(torch.mul, (x, self), {})
        event = self.posterior.event_shape
        if x.dim() < 1 + len(event):
            raise ValueError(f"node latents of shape {tuple(event)} multiply batched inputs (rows first), got a "
                             f"tensor of shape {tuple(x.shape)}")
        particles = self.estimator.particles
        if particles is not None:
            x = particles.rows(x)
        rows = x.shape[0]
        components = row_components(rows, self.posterior.num_components, particles, x.device)
        draws = self.posterior.component_draws(components)
        return x * draws.view((rows,) + (1,) * (x.dim() - 1 - len(event)) + event)

    def __repr__(self):
        return f"NodeDraws(shape={tuple(self.shape)}, K={self.posterior.num_components}, " \
               f"estimator={type(self.estimator).__name__})"

    @classmethod
    def dispatch(cls, func, args, kwargs):
        if func in _PRODUCTS and len(args) == 2 and not kwargs:
            z, x = (args[1], args[0]) if isinstance(args[1], NodeDraws) else args
            if not isinstance(x, NodeDraws):
                return z.multiply(x)
        name = getattr(func, "__qualname__", getattr(func, "__name__", repr(func)))
        raise TypeError(f"{name} on a node latent: under an estimator handler a mixture node latent only multiplies "
                        "a layer's input or output (x * z, as pyrobnn.model.nodes' hooks do)")
