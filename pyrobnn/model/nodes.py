r"""Node latents: multiplicative noise on the units of a layer (implicit BNNs).

Trinh, Kaski & Heinonen (2020), "Scalable Bayesian neural networks by layer-wise input augmentation",
put the posterior on a few latent variables per layer instead of on the weights (their eq. 1):

.. math:: f_l(x) = \mathrm{act}\big(U_l (z_l \circ f_{l-1}) + b_l\big), \qquad z_l \sim \mathcal N(1, s^2),

one :math:`z` per input feature of a Linear layer and per input channel of a convolution, while
:math:`U_l, b_l` stay point estimates. With a :class:`~pyrobnn.model.priors.NodePrior`,
:func:`pyrobnn.model.conversion.bayesian` gives every selected ``nn.Linear`` / ``nn.ConvNd`` layer

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
:class:`~pyrobnn.handlers.node_draws.NodeDraws` value instead of one sample: every row of the batch draws
its own :math:`z` from one component (see :mod:`pyrobnn.handlers.node_draws`), so K components cost one pass; under
:func:`~pyrobnn.handlers.vdp` the product propagates the mixture's mean and variance.
"""

from __future__ import annotations

import torch
from torch import nn

from pyrobnn.model.priors import NodePrior

__all__ = ["NODE_LAYERS", "node_latents", "register_node_hooks"]

NODE_LAYERS: tuple[type, ...] = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
"""The layers a :class:`~pyrobnn.model.priors.NodePrior` puts node latents on."""


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
