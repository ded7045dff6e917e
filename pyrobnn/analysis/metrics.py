"""Predictive metrics for classification and regression, plus a reliability diagram.

All functions are plain torch and run on whatever device their inputs live on (the
out-of-distribution metrics are scikit-learn's, on the host). Scalar metrics come back as Python
floats; per-example and per-bin quantities as tensors. Logarithms are natural (nats). The split of
predictive uncertainty into total, aleatoric and epistemic parts is a property of the predictive
distribution and lives with it: :func:`pyrobnn.model.likelihoods.uncertainty`; here are its means
(:func:`uncertainty_means`), how well it tells out-of-distribution inputs apart
(:func:`ood_detection`, :func:`ood_metrics`), and how well confidence ranks errors (:func:`aurc`).
:func:`classification_report` is all of it for one test set, as ``metrics.json`` records it.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import torch

from pyrobnn.analysis.plots import figure, save_png
from pyrobnn.checks import check_labels, check_probs, positive_int
from pyrobnn.model.likelihoods import uncertainty

__all__ = [
    "UNCERTAINTY",
    "OOD_SCORES",
    "accuracy",
    "aurc",
    "brier",
    "classification_metrics",
    "classification_report",
    "ece",
    "nll",
    "ood_detection",
    "ood_metrics",
    "mixture_log_likelihood",
    "regression_metrics",
    "reliability",
    "reliability_bins",
    "reliability_diagram",
    "uncertainty_means",
]

UNCERTAINTY = ("total", "aleatoric", "epistemic")
"""The parts of a classifier's predictive uncertainty, as :func:`pyrobnn.infer.predict.predict` returns them."""

OOD_SCORES = ("epistemic", "total")
"""The uncertainties that score how out-of-distribution an input is (:func:`ood_metrics`)."""


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


def reliability_bins(probs: torch.Tensor, y: torch.Tensor, n_bins: int = 15) -> dict[str, list]:
    """:func:`reliability`'s ``confidence``, ``accuracy`` and ``count`` per bin as lists (JSON-ready); the bins are
    the ``n_bins`` equal-width intervals of [0, 1], so diagrams of several runs can be pooled and overlaid."""
    bins = reliability(probs, y, n_bins)
    return {key: bins[key].tolist() for key in ("confidence", "accuracy", "count")}


def aurc(probs: torch.Tensor, y: torch.Tensor) -> float:
    r"""Area under the risk-coverage curve of selective prediction by confidence (Geifman & El-Yaniv 2017,
    "Selective classification for deep neural networks"; Geifman et al. 2019, "Bias-reduced uncertainty
    estimation for deep neural classifiers").

    Predictions are kept in order of decreasing confidence :math:`\max_c p_c`; keeping the first :math:`k` of
    :math:`N` (coverage :math:`k/N`) has the selective risk :math:`r_k = \frac1k \sum_{i \le k} 1[\hat y_i \ne
    y_i]`, and :math:`\mathrm{AURC} = \frac1N \sum_{k=1}^N r_k`. Lower is better: at a given accuracy it is
    smallest when every error is less confident than every correct prediction, and it is the error rate (in
    expectation) when confidence is unrelated to errors. Examples of equal confidence cannot be ordered: each of
    them counts their mean error, which is the AURC averaged over every order of the ties.
    """
    _check_classification(probs, y)
    confidence, predicted = probs.max(-1)
    error = (predicted != y).double()
    _, group, size = torch.unique(confidence, return_inverse=True, return_counts=True)
    errors = torch.zeros(len(size), dtype=torch.float64, device=probs.device).index_add_(0, group, error)
    spread = (errors / size)[group][confidence.argsort(descending=True, stable=True)]
    kept = torch.arange(1, len(spread) + 1, dtype=torch.float64, device=probs.device)
    return float((spread.cumsum(0) / kept).mean())


def _uncertainties(pred: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The per-example :data:`UNCERTAINTY` of a prediction; a prediction without them (VDP++ moment propagation:
    ``probs`` only) has its ``total`` alone, the entropy of its probabilities."""
    found = {key: pred[key] for key in UNCERTAINTY if key in pred}
    return found or {"total": uncertainty(pred["probs"].unsqueeze(0))["total"]}


def uncertainty_means(pred: dict[str, torch.Tensor]) -> dict[str, float]:
    r"""Mean total, aleatoric and epistemic uncertainty (nats) of a :func:`~pyrobnn.infer.predict.predict` output:
    :math:`\mathbb H[\bar p] = \mathbb E_{q(w)} \mathbb H[p(y \mid x, w)] + \mathbb I[y; w \mid x]` per example
    (Depeweg et al. 2018), averaged over the examples. A moment-propagated prediction has ``total`` only."""
    return {key: float(value.mean()) for key, value in _uncertainties(pred).items()}


def ood_detection(in_scores: torch.Tensor, out_scores: torch.Tensor) -> dict[str, float]:
    """How well a score tells out-of-distribution inputs (the positive class) from in-distribution ones, higher
    scores meaning "more likely out of distribution" (Hendrycks & Gimpel 2017, "A baseline for detecting
    misclassified and out-of-distribution examples"):

    * ``auroc``: area under the ROC curve, the probability that an OOD input scores above an in-distribution
      one (ties count one half); 0.5 is chance;
    * ``aupr``: area under the precision-recall curve with OOD as positive (average precision);
    * ``fpr95``: the false-positive rate at 95 % true-positive rate, the smallest fraction of in-distribution
      inputs flagged by any threshold that flags at least 95 % of the OOD inputs.

    Computed by scikit-learn (``roc_auc_score``, ``average_precision_score``, ``roc_curve``) on the host.
    """
    from sklearn.metrics import average_precision_score, roc_auc_score, roc_curve

    parts = []
    for name, scores in (("in_scores", in_scores), ("out_scores", out_scores)):
        if not isinstance(scores, torch.Tensor) or scores.dim() != 1 or scores.numel() == 0:
            raise ValueError(f"{name} must be a non-empty 1-d tensor of scores, got "
                             f"{tuple(scores.shape) if isinstance(scores, torch.Tensor) else type(scores).__name__}")
        if not bool(torch.isfinite(scores).all()):
            raise ValueError(f"{name} must be finite")
        parts.append(scores.detach().double().cpu().numpy())
    scores = np.concatenate(parts)
    is_ood = np.concatenate([np.zeros(len(parts[0])), np.ones(len(parts[1]))])
    fpr, tpr, _ = roc_curve(is_ood, scores, drop_intermediate=False)  # every threshold: none skipped at 95 %
    return {"auroc": float(roc_auc_score(is_ood, scores)), "aupr": float(average_precision_score(is_ood, scores)),
            "fpr95": float(fpr[np.searchsorted(tpr, 0.95, side="left")])}


def ood_metrics(pred_in: dict[str, torch.Tensor], pred_out: dict[str, torch.Tensor]) -> dict[str, float]:
    """:func:`ood_detection` by each of :data:`OOD_SCORES` that both predictions have (``auroc_epistemic``,
    ``aupr_epistemic``, ``fpr95_epistemic``, ``auroc_total``, ...), and the mean uncertainties on the
    out-of-distribution inputs (:func:`uncertainty_means`: ``total``, ``aleatoric``, ``epistemic``)."""
    scores_in, scores_out = _uncertainties(pred_in), _uncertainties(pred_out)
    found = {}
    for key in OOD_SCORES:
        if key in scores_in and key in scores_out:
            detection = ood_detection(scores_in[key], scores_out[key])
            found.update({f"{name}_{key}": value for name, value in detection.items()})
    return {**found, **uncertainty_means(pred_out)}


def classification_report(pred: dict[str, torch.Tensor], y: torch.Tensor, n_bins: int = 15) -> dict:
    """A classifier's test report from its :func:`~pyrobnn.infer.predict.predict` (or
    :func:`~pyrobnn.infer.predict.predict_moments`) output: :func:`classification_metrics`, :func:`aurc`, the mean
    uncertainties (:func:`uncertainty_means`) and the ``reliability`` bins (:func:`reliability_bins`)."""
    probs = pred["probs"]
    y = y.to(probs.device)
    return {**classification_metrics(probs, y, n_bins), "aurc": aurc(probs, y), **uncertainty_means(pred),
            "reliability": reliability_bins(probs, y, n_bins)}


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


def mixture_log_likelihood(means: torch.Tensor, scales: torch.Tensor, y: torch.Tensor) -> float:
    r"""Mean log density of targets ``y`` (N, D) under the predictive mixture of S equally weighted Gaussians,

    .. math:: \frac1N \sum_i \log \frac1S \sum_s \prod_d \mathcal N(y_{id};\, \mu_{sid}, \sigma_{sid}^2),

    ``means`` (S, N, D) and ``scales`` broadcasting to them (> 0): the test log-likelihood of the UCI
    regression benchmark (Hernández-Lobato & Adams 2015; Gal & Ghahramani 2016, whose every pass s has the noise
    :math:`\sigma = \tau^{-1/2}`), computed with log-sum-exp.
    """
    if means.dim() != 3 or y.shape != means.shape[1:]:
        raise ValueError(f"means must be (S, N, D) and y (N, D); got means {tuple(means.shape)}, y {tuple(y.shape)}")
    try:
        scales = scales.expand_as(means)
    except RuntimeError:
        raise ValueError(f"scales of shape {tuple(scales.shape)} do not broadcast to means {tuple(means.shape)}"
                         ) from None
    if not bool((scales > 0).all()):
        raise ValueError("scales must be strictly positive everywhere")
    log_density = torch.distributions.Normal(means, scales).log_prob(y).sum(-1)  # (S, N)
    return float((log_density.logsumexp(0) - math.log(means.shape[0])).mean())


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
