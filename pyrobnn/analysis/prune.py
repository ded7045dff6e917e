r"""Sparsity and pruning of a trained posterior.

A mask is a dict ``{site name: bool tensor}``, True where a weight is kept.

- :func:`snr_masks`: keep :math:`|\mu|/\sigma \ge \lambda` (Graves 2011 eq. 19; :math:`\lambda = 0.83`);
- :func:`log_alpha_masks`: keep :math:`\log\alpha \le 3` (Molchanov et al. 2017: binary dropout
  rate above 0.95 means the weight carries no signal);
- :func:`random_masks`: the same number of weights removed per layer, at random positions
  (the control of the sparse-VD comparison, after Molchanov et al. 2017);
- :func:`magnitude_masks`: global L1 (magnitude) pruning of the posterior means to a fraction
  (VDP++ self-compression);
- :func:`apply_masks`: turns removed weights of a guide into point masses at zero;
- :func:`sparsity`: per-layer and total fraction removed;
- :func:`magnitude_prune_module`: the same global L1 rule on the weights of a plain ``nn.Module``
  (the deterministic baseline);
- :func:`pruning_curve`: accuracy (or any metrics) against the fraction pruned, VDP++ Fig. 2.
"""

from __future__ import annotations

import copy
import math
from typing import Callable, Sequence

import torch
from torch import nn

from pyrobnn.guides.additive_dropout import PRUNED_LOG_ALPHA
from pyrobnn.guides.base import SiteGuide

__all__ = ["principled_masks", "snr_masks", "log_alpha_masks", "random_masks", "magnitude_masks", "apply_masks",
           "sparsity", "magnitude_prune_module", "pruning_curve", "record_sparsity", "METHODS"]


def _weights(guide, include_biases: bool):
    """The sites the family models (a network's weights; a noise scale of a model written by hand is none)."""
    names = [n for n in guide.family_names if include_biases or not n.endswith("bias")]
    if not names:
        raise ValueError("the guide has no Bayesian weights to prune")
    return names


@torch.no_grad()
def snr_masks(guide, threshold: float = 0.83, include_biases: bool = False) -> dict[str, torch.Tensor]:
    """Keep weights whose signal-to-noise ratio :math:`|\\mu|/\\sigma` is at least ``threshold``."""
    if not (isinstance(threshold, (int, float)) and math.isfinite(threshold) and threshold >= 0):
        raise ValueError(f"threshold (signal-to-noise lambda) must be a finite number >= 0, got {threshold!r}")
    masks = {}
    for name in _weights(guide, include_biases):
        loc, scale = guide.loc_scale(name)
        masks[name] = loc.abs() >= threshold * scale
    return masks


@torch.no_grad()
def log_alpha_masks(guide, threshold: float = PRUNED_LOG_ALPHA,
                    include_biases: bool = False) -> dict[str, torch.Tensor]:
    """Keep weights with :math:`\\log\\alpha \\le` ``threshold`` (3: dropout rate 0.95)."""
    if not (isinstance(threshold, (int, float)) and math.isfinite(threshold)):
        raise ValueError(f"threshold (log alpha) must be a finite number, got {threshold!r}")
    masks = {}
    for name in _weights(guide, include_biases):
        loc, _ = guide.loc_scale(name)
        masks[name] = (guide.log_alpha(name) <= threshold).expand_as(loc).clone()
    return masks


@torch.no_grad()
def random_masks(masks: dict[str, torch.Tensor], seed: int = 0) -> dict[str, torch.Tensor]:
    """Masks that remove, in each layer, as many weights as ``masks`` does, at random positions."""
    generator = torch.Generator().manual_seed(seed)
    out = {}
    for name, keep in masks.items():
        removed = int((~keep).sum())
        order = torch.randperm(keep.numel(), generator=generator)
        flat = torch.ones(keep.numel(), dtype=torch.bool)
        flat[order[:removed]] = False
        out[name] = flat.view(keep.shape).to(keep.device)
    return out


def _check_fraction(fraction) -> None:
    if not (isinstance(fraction, (int, float)) and 0.0 <= fraction <= 1.0):
        raise ValueError(f"fraction (of weights to prune) must lie in [0, 1], got {fraction!r}")


def _global_l1_masks(magnitudes: dict[str, torch.Tensor], fraction: float) -> dict[str, torch.Tensor]:
    """Keep-masks removing the ``fraction`` of entries (over all tensors) with the smallest magnitude."""
    flat = torch.cat([m.reshape(-1).cpu() for m in magnitudes.values()])
    removed = int(round(fraction * flat.numel()))
    keep_flat = torch.ones(flat.numel(), dtype=torch.bool)
    keep_flat[torch.argsort(flat, stable=True)[:removed]] = False
    masks, start = {}, 0
    for name, m in magnitudes.items():
        masks[name] = keep_flat[start:start + m.numel()].view(m.shape).to(m.device)
        start += m.numel()
    return masks


@torch.no_grad()
def magnitude_masks(guide, fraction: float, include_biases: bool = False) -> dict[str, torch.Tensor]:
    """Global L1 pruning: remove the ``fraction`` of weights (over all layers) with the smallest :math:`|\\mu|`."""
    _check_fraction(fraction)
    names = _weights(guide, include_biases)
    return _global_l1_masks({name: guide.loc_scale(name)[0].abs() for name in names}, fraction)


def apply_masks(guide, masks: dict[str, torch.Tensor]) -> None:
    """Remove the masked-out weights from the guide in place (mean 0, vanishing variance)."""
    unknown = set(masks) - set(guide.family_names)
    if unknown:
        raise ValueError(f"masks name sites the guide does not have: {sorted(unknown)}")
    for name, keep in masks.items():
        guide.prune_(name, keep)


def sparsity(masks: dict[str, torch.Tensor]) -> dict[str, float]:
    """Fraction of weights removed per site, and ``"total"`` over all of them."""
    out = {name: float((~keep).float().mean()) for name, keep in masks.items()}
    total = sum(int(keep.numel()) for keep in masks.values())
    out["total"] = sum(float((~keep).sum()) for keep in masks.values()) / max(total, 1)
    return out


METHODS = {"snr": snr_masks, "log-alpha": log_alpha_masks, "magnitude": magnitude_masks}
"""Pruning rules selectable by name (``pyrobnn prune --method``)."""


def principled_masks(guide, threshold: float | None = None) -> dict[str, torch.Tensor]:
    """The guide's own rule (``guide.pruning_rule``: SNR for Normal guides, log alpha for
    variational dropout) at ``threshold`` (default: 0.83 and 3)."""
    rule = METHODS[guide.pruning_rule]
    return rule(guide) if threshold is None else rule(guide, threshold)


def record_sparsity(guide, threshold: float | None = None) -> Callable[[int, dict], None]:
    """A :func:`~pyrobnn.infer.svi.fit` callback: after each epoch, ``record["sparsity"]`` is the fraction of
    weights the guide's principled rule (:func:`principled_masks`) removes, ``record["layer_sparsity"]``
    the fraction per site."""

    def callback(epoch: int, record: dict) -> None:
        removed = sparsity(principled_masks(guide, threshold))
        record["sparsity"] = removed.pop("total")
        record["layer_sparsity"] = removed

    return callback


def _module_weights(net: nn.Module) -> dict[str, torch.Tensor]:
    """The weight tensors of ``net`` that global pruning considers: named ``*weight`` with
    ``dim >= 2`` (linear and convolution kernels, not normalisation scales or biases)."""
    weights = {name: p for name, p in net.named_parameters() if name.endswith("weight") and p.dim() >= 2}
    if not weights:
        raise ValueError("net has no weight tensors (parameters named '*weight' with dim >= 2) to prune")
    return weights


@torch.no_grad()
def _module_masks(net: nn.Module, fraction: float) -> dict[str, torch.Tensor]:
    _check_fraction(fraction)
    return _global_l1_masks({name: w.abs() for name, w in _module_weights(net).items()}, fraction)


@torch.no_grad()
def magnitude_prune_module(net: nn.Module, fraction: float) -> nn.Module:
    """A deep copy of the plain network ``net`` with the ``fraction`` of its weights of smallest
    :math:`|w|`, ranked globally over all weight tensors (dim >= 2), set to zero; ``net`` is untouched."""
    return _prune_module(net, fraction)[0]


@torch.no_grad()
def _prune_module(net: nn.Module, fraction: float) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    pruned = copy.deepcopy(net)
    masks = _module_masks(pruned, fraction)
    for name, weight in _module_weights(pruned).items():
        weight.mul_(masks[name])
    return pruned, masks


FRACTIONS = (0.0, 0.5, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99)
"""Default pruning fractions of :func:`pruning_curve` (VDP++, Fig. 2)."""


def pruning_curve(evaluate_fn: Callable, guide, fractions: Sequence[float] = FRACTIONS,
                  include_biases: bool = False) -> list[dict[str, float]]:
    """Self-compression (VDP++, Fig. 2): metrics after global L1 unstructured pruning.

    For each ``fraction`` f, a deep copy of ``guide`` loses the f smallest :math:`|\\mu|` of its
    weights (:func:`magnitude_masks` + :func:`apply_masks`), and ``evaluate_fn(pruned)`` is recorded:
    a float (stored as ``"accuracy"``) or a dict of metrics. ``guide`` may also be a plain
    ``nn.Module`` (the deterministic baseline): it is pruned by :func:`magnitude_prune_module`, and
    ``evaluate_fn`` receives the pruned module. The original is left untouched.

    :returns: one dict per fraction: ``fraction``, ``sparsity`` (the fraction of the considered
        weights actually removed) and the metrics.
    """
    if isinstance(fractions, (int, float)):
        fractions = (fractions,)
    if len(fractions) == 0:
        raise ValueError("fractions must be a non-empty sequence of numbers in [0, 1]")
    for fraction in fractions:
        _check_fraction(fraction)
    if not callable(evaluate_fn):
        raise TypeError(f"evaluate_fn must be callable (pruned guide or module -> accuracy or dict), "
                        f"got {evaluate_fn!r}")
    if not isinstance(guide, nn.Module):
        raise TypeError(f"guide must be a pyrobnn SiteGuide or a plain nn.Module, got {type(guide).__name__}")

    rows = []
    for fraction in fractions:
        if isinstance(guide, SiteGuide):
            pruned = copy.deepcopy(guide)
            masks = magnitude_masks(pruned, fraction, include_biases)
            apply_masks(pruned, masks)
        else:
            pruned, masks = _prune_module(guide, fraction)
        metrics = evaluate_fn(pruned)
        if not isinstance(metrics, dict):
            metrics = {"accuracy": float(metrics)}
        rows.append({"fraction": float(fraction), "sparsity": sparsity(masks)["total"], **metrics})
    return rows
