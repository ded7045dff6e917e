"""Predictive metrics for classification and regression, plus a reliability diagram.

All functions are plain torch and run on whatever device their inputs live on.
Scalar metrics come back as Python floats; per-example and per-bin quantities as tensors.
Logarithms are natural (nats). The split of predictive uncertainty into total, aleatoric and
epistemic parts is a property of the predictive distribution and lives with it:
:func:`pyrobnn.model.likelihoods.uncertainty`.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch

from pyrobnn.analysis.plots import figure, save_png
from pyrobnn.checks import check_labels, check_probs, positive_int

__all__ = [
    "accuracy",
    "brier",
    "classification_metrics",
    "ece",
    "nll",
    "regression_metrics",
    "reliability",
    "reliability_diagram",
]


def _check_classification(probs, y) -> None:
    check_probs(probs)
    check_labels(y, probs.shape[-1], "y", num_examples=probs.shape[0])


# ----------------------------------------------------------------------------- classification


def accuracy(probs: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of examples whose arg-max class equals the label. probs: (N, C), y: (N,)."""
    _check_classification(probs, y)
    return float((probs.argmax(-1) == y).float().mean())


def nll(probs: torch.Tensor, y: torch.Tensor, eps: float = 1e-12) -> float:
    """Mean negative log-likelihood -1/N sum_i log p_i(y_i), with p clamped below at ``eps``."""
    _check_classification(probs, y)
    p_true = probs.gather(-1, y.long().unsqueeze(-1)).squeeze(-1)
    return float(-p_true.clamp_min(eps).log().mean())


def brier(probs: torch.Tensor, y: torch.Tensor) -> float:
    """Multi-class Brier score 1/N sum_i sum_c (p_ic - 1[y_i = c])^2 (Brier 1950).

    0 for perfect one-hot predictions, 1 - 1/C for the uniform prediction, at most 2.
    """
    _check_classification(probs, y)
    onehot = torch.nn.functional.one_hot(y.long(), probs.shape[-1]).to(probs.dtype)
    return float((probs - onehot).pow(2).sum(-1).mean())


def reliability(probs: torch.Tensor, y: torch.Tensor, n_bins: int = 15) -> dict[str, torch.Tensor]:
    """Bin examples by confidence (max probability) into ``n_bins`` equal-width bins on [0, 1].

    Bin b covers (edges[b], edges[b+1]] (the first bin also takes confidence 0).
    Returns tensors on the device of ``probs``:

    * ``edges``      (n_bins + 1,) bin edges
    * ``confidence`` (n_bins,) mean confidence of the examples in each bin (0 where empty)
    * ``accuracy``   (n_bins,) fraction correct in each bin (0 where empty)
    * ``count``      (n_bins,) number of examples in each bin (long)

    This is the one binning used by :func:`ece` and :func:`reliability_diagram`.
    """
    _check_classification(probs, y)
    positive_int("n_bins", n_bins)
    conf, pred = probs.max(-1)
    correct = (pred == y).to(probs.dtype)
    edges = torch.linspace(0, 1, n_bins + 1, dtype=probs.dtype, device=probs.device)
    # right=False: index b with edges[b] < conf <= edges[b+1], i.e. bins (lo, hi].
    idx = torch.bucketize(conf, edges[1:-1].contiguous(), right=False)
    count = torch.zeros(n_bins, dtype=torch.long, device=probs.device).index_add_(0, idx, torch.ones_like(idx))
    conf_sum = torch.zeros(n_bins, dtype=probs.dtype, device=probs.device).index_add_(0, idx, conf)
    acc_sum = torch.zeros(n_bins, dtype=probs.dtype, device=probs.device).index_add_(0, idx, correct)
    denom = count.clamp_min(1).to(probs.dtype)
    return {"edges": edges, "confidence": conf_sum / denom, "accuracy": acc_sum / denom, "count": count}


def _ece_from_bins(bins: dict[str, torch.Tensor]) -> float:
    weight = bins["count"].to(bins["accuracy"].dtype) / bins["count"].sum()
    return float((weight * (bins["accuracy"] - bins["confidence"]).abs()).sum())


def ece(probs: torch.Tensor, y: torch.Tensor, n_bins: int = 15) -> float:
    """Expected calibration error, ECE = sum_b (|B_b| / N) |acc(B_b) - conf(B_b)|.

    Confidence is the max class probability; bins are ``n_bins`` equal-width intervals
    (lo, hi] on [0, 1] (see :func:`reliability`). Naeini et al. 2015; Guo et al. 2017,
    "On calibration of modern neural networks".
    """
    return _ece_from_bins(reliability(probs, y, n_bins))


def classification_metrics(probs: torch.Tensor, y: torch.Tensor, n_bins: int = 15) -> dict[str, float]:
    """``{"accuracy", "nll", "ece", "brier"}`` of predictive-mean probabilities (N, C) against labels (N,)."""
    return {
        "accuracy": accuracy(probs, y),
        "nll": nll(probs, y),
        "ece": ece(probs, y, n_bins),
        "brier": brier(probs, y),
    }


# ----------------------------------------------------------------------------- regression


def regression_metrics(mean: torch.Tensor, std: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """``{"rmse", "nll", "mae"}`` of a Gaussian predictive N(mean, std^2) against targets ``y``.

    ``mean`` and ``y`` have the same shape; ``std`` broadcasts to it and must be > 0.
    nll = mean over all entries of 0.5 log(2 pi) + log std + (y - mean)^2 / (2 std^2).
    """
    for name, t in (("mean", mean), ("std", std), ("y", y)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.dtype.is_floating_point:
            raise ValueError(f"{name} must be floating point, got dtype {t.dtype}")
    if y.shape != mean.shape:
        raise ValueError(f"y must have the shape of mean {tuple(mean.shape)}, got {tuple(y.shape)}")
    if mean.numel() == 0:
        raise ValueError("mean must not be empty")
    try:
        std = std.expand_as(mean)
    except RuntimeError:
        raise ValueError(
            f"std of shape {tuple(std.shape)} does not broadcast to mean {tuple(mean.shape)}"
        ) from None
    if not bool((std > 0).all()):
        raise ValueError("std must be strictly positive everywhere")
    err = y - mean
    nll_ = 0.5 * math.log(2 * math.pi) + std.log() + 0.5 * (err / std).pow(2)
    return {
        "rmse": float(err.pow(2).mean().sqrt()),
        "nll": float(nll_.mean()),
        "mae": float(err.abs().mean()),
    }


# ----------------------------------------------------------------------------- plot


def reliability_diagram(
    probs: torch.Tensor,
    y: torch.Tensor,
    path: str | os.PathLike,
    n_bins: int = 15,
    title: str | None = None,
) -> Path:
    """Save a reliability diagram (PNG) and return its path.

    Top: accuracy per confidence bin (bars) against the diagonal of perfect calibration,
    with the gap to each bin's mean confidence; ECE in the title. Bottom: example count per bin.
    Uses the same bins as :func:`ece`. The file is written atomically (:func:`~pyrobnn.analysis.plots.save_png`),
    parent directories are created.
    """
    bins = {k: v.detach().cpu() for k, v in reliability(probs, y, n_bins).items()}  # validates
    ece_ = _ece_from_bins(bins)
    path = Path(path)
    edges = bins["edges"].double().numpy()
    left, width = edges[:-1], edges[1:] - edges[:-1]
    centers = left + width / 2
    count = bins["count"].numpy()
    filled = count > 0
    acc = bins["accuracy"].double().numpy()
    conf = bins["confidence"].double().numpy()

    fig = figure((5, 6))
    ax, ax_count = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    ax.bar(centers[filled], acc[filled], width=width[filled], color="tab:blue", edgecolor="black",
           linewidth=0.5, label="accuracy")
    gap_bottom = acc[filled]
    ax.bar(centers[filled], conf[filled] - gap_bottom, bottom=gap_bottom, width=width[filled],
           color="tab:red", alpha=0.3, edgecolor="tab:red", hatch="//", linewidth=0.5, label="gap to confidence")
    ax.plot([0, 1], [0, 1], "k--", linewidth=1, label="perfect calibration")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy")
    ax.legend(loc="upper left")
    ax.set_title(f"{title or 'Reliability diagram'} (ECE = {ece_:.4f})")
    ax_count.bar(centers, count, width=width, color="gray", edgecolor="black", linewidth=0.5)
    ax_count.set_xlabel("confidence (max probability)")
    ax_count.set_ylabel("count")
    fig.tight_layout()

    path.parent.mkdir(parents=True, exist_ok=True)
    return save_png(fig, path)
