r"""Node latents: multiplicative noise on the units of a layer (implicit BNNs).

Trinh, Kaski & Heinonen (2020), "Scalable Bayesian neural networks by layer-wise input augmentation",
put the posterior on a few latent variables per layer instead of on the weights (their eq. 1):

.. math:: f_l(x) = \mathrm{act}\big(U_l (z_l \circ f_{l-1}) + b_l\big), \qquad z_l \sim \mathcal N(1, s^2),

one :math:`z` per input feature of a Linear layer and per input channel of a convolution, while
:math:`U_l, b_l` stay point estimates. With a :class:`~pyrobnn.priors.NodePrior`,
:func:`pyrobnn.conversion.bayesian` gives every selected ``nn.Linear`` / ``nn.ConvNd`` layer

- a latent site ``<layer>.nodes`` (a :class:`~pyro.nn.PyroSample` attribute ``nodes``), listed by
  ``model.sites()`` like a weight, so every guide covers it by name;
- a forward hook that applies it: ``x * z`` on the input (mode ``"in"``), or ``z * output`` on the output
  (mode ``"out"``: :math:`z \circ (Ux + b)`, the node-BNN of Trinh, Heinonen, Acerbi & Kaski 2022);
- optionally (``NodePrior(bias=True)``, mode ``"in"``) a latent ``<layer>.bias_nodes`` on the bias,
  :math:`U(z \circ x) + b \circ z_b`, as the authors' code.

A latent has the shape that broadcasts against its tensor: ``(features,)`` for a Linear layer,
``(channels, 1, ..., 1)`` for a convolution (one value per channel, shared over the positions), so a
hook is one plain product and any guide works. The weights keep their names (``state_dict`` unchanged)
and stay ``nn.Parameter`` s, trained by the optimiser.

Under an estimator handler (:mod:`pyrobnn.handlers`) a node site whose posterior is an
:class:`~pyrobnn.distributions.EqualMixtureNormal` (:class:`~pyrobnn.guides.MixtureNodeGuide`) gets a
:class:`NodeDraws` value instead of one sample: every row of the batch draws its own :math:`z` from one
component (see :class:`NodeDraws`), so K components cost one pass; under
:func:`~pyrobnn.handlers.vdp` the product propagates the mixture's mean and variance.
"""

from __future__ import annotations

import torch
from torch import nn

from .distribution_tensor import DistributionTensor
from .distributions import EqualMixtureNormal
from .handlers.estimator_messenger import lazy_value
from .moments import Moments
from .priors import NodePrior

__all__ = ["NODE_LAYERS", "NodeDraws", "node_latents", "register_node_hooks", "row_components"]

NODE_LAYERS: tuple[type, ...] = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
"""The layers a :class:`~pyrobnn.priors.NodePrior` puts node latents on."""


def _unit_shape(layer: nn.Module, side: str) -> torch.Size:
    """The shape of one value per input (``side="in"``) or output unit of ``layer``: ``(features,)`` for a
    Linear layer, ``(channels, 1, ..., 1)`` for a convolution (shared over the positions)."""
    if isinstance(layer, nn.Linear):
        return torch.Size((layer.in_features if side == "in" else layer.out_features,))
    channels = layer.in_channels if side == "in" else layer.out_channels
    return torch.Size((channels,) + (1,) * (layer.weight.dim() - 2))


def node_latents(layer: nn.Module, prior: NodePrior) -> dict[str, torch.Tensor]:
    """The node latents ``prior`` puts on ``layer``: ``{attribute: reference}``, the reference (ones, the prior
    mean) carrying the latent's shape, dtype and device."""
    if not isinstance(layer, NODE_LAYERS):
        raise TypeError(f"node latents go on {[t.__name__ for t in NODE_LAYERS]}, not {type(layer).__name__}")
    like = dict(dtype=layer.weight.dtype, device=layer.weight.device)
    latents = {"nodes": torch.ones(_unit_shape(layer, prior.mode), **like)}
    if prior.bias and layer.bias is not None:
        latents["bias_nodes"] = torch.ones(_unit_shape(layer, "out"), **like)
    return latents


class _InputNodes:
    """Forward pre-hook of mode ``"in"``: the layer sees ``x * z``."""

    def __call__(self, layer, args):
        return (args[0] * layer.nodes,) + tuple(args[1:])


class _OutputNodes:
    """Forward hook of mode ``"out"``: the layer returns ``output * z``."""

    def __call__(self, layer, args, output):
        return output * layer.nodes


class _BiasNodes:
    r"""Forward hook of the bias latent: :math:`U(z \circ x) + b` becomes :math:`U(z \circ x) + b \circ z_b`,
    computed as ``output + b * z_b - b`` with ``b`` broadcast to the output rows (so that under an estimator
    handler every row draws its own :math:`z_b`)."""

    def __call__(self, layer, args, output):
        bias = layer.bias.view(_unit_shape(layer, "out"))
        scaled = bias.expand(output.shape) * layer.bias_nodes
        return torch.add(torch.add(output, scaled), bias, alpha=-1)


def register_node_hooks(layer: nn.Module, prior: NodePrior) -> None:
    """Make ``layer`` apply the node latents of :func:`node_latents` (its ``nodes``/``bias_nodes`` sites)."""
    if prior.mode == "in":
        layer.register_forward_pre_hook(_InputNodes())
    else:
        layer.register_forward_hook(_OutputNodes())
    if prior.bias and layer.bias is not None:
        layer.register_forward_hook(_BiasNodes())


# -- lazy draws under the estimator handlers ---------------------------------------------------


def row_components(rows: int, num_components: int, particles=None, device=None) -> torch.Tensor:
    """The mixture component of each of ``rows`` rows: row ``r`` uses ``r mod K``; under S vectorized
    particles (rows ``s·B + b``, particle-major, :mod:`pyrobnn.particles`) it uses ``(b + s) mod K``, so that
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


_PRODUCTS = frozenset({torch.mul, torch.Tensor.mul, torch.Tensor.__mul__, torch.Tensor.__rmul__})


class NodeDraws(DistributionTensor):
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
    - :func:`~pyrobnn.handlers.vdp`: the product's moments (:mod:`pyrobnn.moments`) with the mixture's
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
                        "a layer's input or output (x * z, as pyrobnn.nodes' hooks do)")


@lazy_value(EqualMixtureNormal)
def _node_draws(fn, estimator) -> NodeDraws:
    return NodeDraws(fn, estimator)
