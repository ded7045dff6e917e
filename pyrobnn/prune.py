r"""Sparsity and pruning of a trained posterior.

A mask is a dict ``{site name: bool tensor}``, True where a weight is kept.

- :func:`snr_masks`: keep :math:`|\mu|/\sigma \ge \lambda` (Graves 2011 eq. 19; :math:`\lambda = 0.83`);
- :func:`log_alpha_masks`: keep :math:`\log\alpha \le 3` (Molchanov et al. 2017: binary dropout
  rate above 0.95 means the weight carries no signal);
- :func:`random_masks`: the same number of weights removed per layer, at random positions
  (the control of paper 001, Tables 4.3-4.4);
- :func:`magnitude_masks`: global L1 (magnitude) pruning of the posterior means to a fraction
  (paper 002's self-compression);
- :func:`apply_masks`: turns removed weights of a guide into point masses at zero;
- :func:`sparsity`: per-layer and total fraction removed.
"""

from __future__ import annotations

import math

import torch

__all__ = ["principled_masks", "snr_masks", "log_alpha_masks", "random_masks", "magnitude_masks", "apply_masks", "sparsity",
           "METHODS"]


def _weights(guide, include_biases: bool):
    names = [n for n in guide.site_names if include_biases or not n.endswith("bias")]
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
def log_alpha_masks(guide, threshold: float = 3.0, include_biases: bool = False) -> dict[str, torch.Tensor]:
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


@torch.no_grad()
def magnitude_masks(guide, fraction: float, include_biases: bool = False) -> dict[str, torch.Tensor]:
    """Global L1 pruning: remove the ``fraction`` of weights (over all layers) with the smallest :math:`|\\mu|`."""
    if not (isinstance(fraction, (int, float)) and 0.0 <= fraction <= 1.0):
        raise ValueError(f"fraction (of weights to prune) must lie in [0, 1], got {fraction!r}")
    names = _weights(guide, include_biases)
    locs = {name: guide.loc_scale(name)[0].abs() for name in names}
    flat = torch.cat([loc.reshape(-1).cpu() for loc in locs.values()])
    removed = int(round(fraction * flat.numel()))
    keep_flat = torch.ones(flat.numel(), dtype=torch.bool)
    keep_flat[torch.argsort(flat, stable=True)[:removed]] = False
    masks, start = {}, 0
    for name, loc in locs.items():
        masks[name] = keep_flat[start:start + loc.numel()].view(loc.shape).to(loc.device)
        start += loc.numel()
    return masks


def apply_masks(guide, masks: dict[str, torch.Tensor]) -> None:
    """Remove the masked-out weights from the guide in place (mean 0, vanishing variance)."""
    unknown = set(masks) - set(guide.site_names)
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
