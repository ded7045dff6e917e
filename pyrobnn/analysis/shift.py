r"""Covariate shift: a classifier's predictive metrics on corrupted test images, per corruption and severity.

Each corruption of :mod:`pyrobnn.data.corruptions` (CIFAR-10-C, Hendrycks & Dietterich 2019; the
Gaussian blend and salt-and-pepper of Trinh et al. 2022) is applied to the clean test images at each
severity, and the posterior predictive (:func:`pyrobnn.infer.predict.predict`) is scored by accuracy, NLL,
ECE and Brier (:func:`pyrobnn.analysis.metrics.classification_metrics`) together with the mean
uncertainty split per example (Depeweg et al. 2018)

.. math::
    \underbrace{\mathbb H\big[\bar p\big]}_{\text{total}}
    = \underbrace{\mathbb E_{q(w)} \mathbb H\big[p(y \mid x, w)\big]}_{\text{aleatoric}}
    + \underbrace{\mathbb I[y; w \mid x]}_{\text{epistemic}},

so that a model's uncertainty on clean and shifted inputs can be compared: a well-behaved Bayesian
model's epistemic part grows with the severity (paper 004, Fig. 8) while its ECE stays low (Ovadia et
al. 2019, "Can you trust your model's uncertainty?").
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Mapping, Sequence

import torch

from pyrobnn.analysis.metrics import classification_metrics
from pyrobnn.analysis.plots import figure, save_png
from pyrobnn.checks import check_labels, choice, positive_int
from pyrobnn.data.corruptions import CIFAR10_C, CORRUPTIONS, SEVERITIES, check_images, corrupt
from pyrobnn.infer.predict import passes, predict

__all__ = ["METRICS", "evaluate_corruptions", "plot_metric_vs_severity"]

METRICS = ("accuracy", "nll", "ece", "brier", "total", "aleatoric", "epistemic")
"""The entries of each record: the four metrics, then the mean total, aleatoric and epistemic uncertainty (nats)."""


def evaluate_corruptions(model, guide, x: torch.Tensor, y: torch.Tensor, corruptions: Sequence[str] = CIFAR10_C,
                         severities: Sequence[int] = SEVERITIES, num_samples: int = 100,
                         transform: Callable[[torch.Tensor], torch.Tensor] | None = None, seed: int = 0,
                         n_bins: int = 15, progress: bool = False, **predict_kwargs) -> dict:
    """Predictive metrics of ``(model, guide)`` on the clean images ``x`` (N, C, H, W) in [0, 1] and on each
    corruption at each severity.

    :param corruptions: names in :data:`pyrobnn.data.corruptions.CORRUPTIONS` (default: the 14 CIFAR-10-C
        types generated in code).
    :param severities: severities in 1..5 to evaluate.
    :param num_samples: posterior samples per prediction (:func:`~pyrobnn.infer.predict.predict`).
    :param transform: applied to the clean and to every corrupted batch before the network, e.g. the
        normalisation ``ImageAugment(...).normalize`` (corruptions act on images in [0, 1]).
    :param seed: the corruption seed; the same at every severity, so severities differ only in strength.
    :param n_bins: ECE bins.
    :param progress: show a bar over the clean set and the (corruption, severity) pairs.
    :param predict_kwargs: passed to :func:`~pyrobnn.infer.predict.predict` (``batch_size``, ``mc_dropout``, ...).
    :returns: a JSON-ready dict, each record holding :data:`METRICS`:
        ``clean``: the record on clean images; ``corruptions[name][severity]``: per corruption and
        severity; ``severities[severity]``: mean over the corruptions at that severity; ``mean``: mean
        over every (corruption, severity) pair.
    """
    if getattr(model, "task", None) != "classification":
        raise ValueError("evaluate_corruptions needs a classifier (model.task == 'classification')")
    if isinstance(corruptions, str):
        corruptions = (corruptions,)
    corruptions = tuple(choice("corruption name", name, CORRUPTIONS) for name in corruptions)
    severities = tuple(severities)
    if not corruptions or not severities:
        raise ValueError("corruptions and severities must not be empty (e.g. corruptions=('fog',), severities=(3,))")
    if transform is not None and not callable(transform):
        raise TypeError(f"transform must be a callable (images -> network inputs) or None, got {transform!r}")
    positive_int("num_samples", num_samples)
    check_images(x)
    check_labels(y, None, "y", num_examples=x.shape[0])
    for name in corruptions:  # every bad name, severity or image batch fails here, before any prediction
        for severity in severities:
            CORRUPTIONS[name].check(x[:1], severity)
    severities = tuple(int(severity) for severity in severities)  # JSON-ready keys

    def record(images):
        inputs = transform(images) if transform is not None else images
        pred = predict(model, guide, inputs, num_samples=num_samples, **predict_kwargs)
        labels = y.to(pred["probs"].device)
        summary = classification_metrics(pred["probs"], labels, n_bins)
        summary.update({key: float(pred[key].mean()) for key in ("total", "aleatoric", "epistemic")})
        return summary

    with passes(1 + len(corruptions) * len(severities), progress) as advance:
        result = {"clean": advance(record(x)), "corruptions": {}}
        for name in corruptions:
            result["corruptions"][name] = {severity: advance(record(corrupt(x, name, severity, seed)))
                                           for severity in severities}
    per_name = result["corruptions"].values()
    result["severities"] = {severity: _mean([records[severity] for records in per_name]) for severity in severities}
    result["mean"] = _mean([r for records in per_name for r in records.values()])
    return result


def _mean(records: Sequence[Mapping[str, float]]) -> dict[str, float]:
    return {key: sum(r[key] for r in records) / len(records) for key in METRICS}


def plot_metric_vs_severity(results: Mapping, path: str | os.PathLike, metric: str = "accuracy",
                            title: str | None = None) -> Path:
    """Save a PNG of ``metric`` (a key of :data:`METRICS`) against severity, 0 standing for the clean images,
    averaged over the corruptions; one line per entry of ``results`` (label -> :func:`evaluate_corruptions`
    result), or a single line for one result. Returns the path (written atomically)."""
    choice("metric", metric, METRICS)
    if "clean" in results and "severities" in results:
        results = {"model": results}
    fig = figure((5, 4))
    ax = fig.subplots()
    for label, result in results.items():
        levels = sorted(result["severities"], key=int)
        ax.plot([0, *map(int, levels)], [result["clean"][metric], *(result["severities"][s][metric] for s in levels)],
                marker="o", label=str(label))
    ax.set_xlabel("severity (0 = clean)")
    ax.set_ylabel(metric)
    ax.set_title(title or f"{metric} under corruption (mean over corruptions)")
    ax.legend()
    fig.tight_layout()
    return save_png(fig, path)
