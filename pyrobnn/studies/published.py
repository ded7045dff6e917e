"""A paper's figures beside a study's: the ``[published]`` table of a study file, matched to the study's labels.

::

    [published]
    source = "Rahmanto (paper 003), Table 2: test accuracy after 300 epochs"
    "hidden=400 method=bbb" = { accuracy = 0.9807 }
    "method=mcdropout" = { error = 0.3282, ece = 0.05 }   # every label with method=mcdropout

Each key but ``source`` names the rows a figure belongs to: a label of the study (without its seed or split), or
part of one, a ``name=value`` pair of an axis (several, space-separated, in the axes' order) or an axis's value
alone. Its value maps a metric, as the paper names it (:data:`PUBLISHED_METRICS`), to a number; ``error`` is
``1 - accuracy``, fractions as our metrics are (1.93 % is 0.0193). The report shows each figure, converted to our
metric, beside our mean ± standard error, and names the source.

Where the paper's code published its figure per replicate (Gal's ``test_ll_*.txt``: one test log-likelihood per
split of the UCI benchmark), the value may be that list, in replicate order (split 0, 1, ...; or seed 0, 1, ...
for a study without splits)::

    "dataset=uci-wine" = { log_likelihood = [-0.928, -0.910, ...] }

Its mean stands for it in the tables, and the report adds the paired difference ours − published over the
replicates both have, with its 95 % Student-t interval: the same splits make the comparison paired, so the
split-to-split spread that both standard errors carry cancels.
"""

from __future__ import annotations

import itertools
import math
from typing import Callable, Mapping, Sequence

from pyrobnn.studies.aggregate import is_number

__all__ = ["PUBLISHED_METRICS", "check_published", "figures", "label_keys", "matched_figures", "unmatched_keys"]


def _same(value: float) -> float:
    return value


def _complement(value: float) -> float:
    return 1.0 - value


PUBLISHED_METRICS: dict[str, tuple[str, Callable[[float], float]]] = {
    "accuracy": ("accuracy", _same),
    "error": ("accuracy", _complement),
    "nll": ("nll", _same),
    "ece": ("ece", _same),
    "brier": ("brier", _same),
    "rmse": ("rmse", _same),
    "log_likelihood": ("log_likelihood", _same),
    "corrupted.accuracy": ("corrupted.mean.accuracy", _same),
    "corrupted.error": ("corrupted.mean.accuracy", _complement),
    "corrupted.ece": ("corrupted.mean.ece", _same),
    "corrupted.nll": ("corrupted.mean.nll", _same),
}
"""A published metric's name -> (the study's metric it is compared with, the conversion to it): ``error`` is
``1 - accuracy``; ``corrupted.*`` is the mean over the corruptions and severities of ``--corruptions``."""


def check_published(published, where: str = "[published]") -> dict:
    """``published`` checked, as ``{"source": str, key: {metric: float, or a list of floats per replicate}, ...}``
    (``{}`` for none); a :class:`ValueError` names a missing source, an unknown metric or a value that is neither a
    number nor a non-empty list of numbers."""
    if not published:
        return {}
    if not isinstance(published, Mapping):
        raise ValueError(f"{where} must be a table: source = \"paper, table\" and label = {{metric = value}}")
    figures = dict(published)
    source = figures.pop("source", None)
    if not isinstance(source, str) or not source.strip():
        raise ValueError(f"{where} needs a source: source = \"the paper, its table or figure\"")
    checked = {}
    for key, metrics in figures.items():
        if not isinstance(metrics, Mapping) or not metrics:
            raise ValueError(f"{where} {key!r}: give its figures as {{metric = value}}, e.g. {{accuracy = 0.98}}; "
                             f"got {metrics!r}")
        for metric, value in metrics.items():
            if metric not in PUBLISHED_METRICS:
                raise ValueError(f"{where} {key!r}: unknown metric {metric!r}; choose one of "
                                 f"{', '.join(PUBLISHED_METRICS)}")
            values = value if isinstance(value, (list, tuple)) and value else [value]
            if not all(is_number(v) for v in values):
                raise ValueError(f"{where} {key!r} {metric}: {value!r} is not a number, or a list of numbers (one "
                                 "per split or seed)")
        checked[str(key)] = {metric: [float(v) for v in value] if isinstance(value, (list, tuple)) else float(value)
                             for metric, value in metrics.items()}
    return {"source": source, **checked}


def figures(published: Mapping) -> dict[str, dict[str, float | list[float]]]:
    """``{key: {metric: value}}`` of a checked ``published`` (every entry but its source; a value per replicate
    is a list)."""
    return {key: metrics for key, metrics in (published or {}).items() if key != "source"}


def label_keys(axes: Mapping[str, str]) -> set[str]:
    """The keys that name a label of axes ``axes``: every ``name=value`` subset in axis order, and each value
    alone (``{"hidden": "400", "method": "bbb"}`` -> ``hidden=400``, ``method=bbb``, ``hidden=400 method=bbb``,
    ``400``, ``bbb``)."""
    pairs = [f"{name}={value}" for name, value in axes.items()]
    subsets = {" ".join(chosen) for size in range(1, len(pairs) + 1) for chosen in itertools.combinations(pairs, size)}
    return subsets | set(axes.values())


def known_keys(axes_of_labels: Sequence[Mapping[str, str]], name: str) -> set[str]:
    """Every key that names a label of a study (:func:`label_keys`; a study without axes has only its ``name``)."""
    return set().union(*(label_keys(axes) for axes in axes_of_labels)) if any(axes_of_labels) else {name}


def unmatched_keys(published: Mapping, axes_of_labels: Sequence[Mapping[str, str]], name: str) -> list[str]:
    """The keys of ``published`` that name no label (a study without axes has only its ``name``)."""
    known = known_keys(axes_of_labels, name)
    return [key for key in figures(published) if key not in known]


def matched_figures(published: Mapping, label: str, axes: Mapping[str, str]) -> list[dict]:
    """The published figures of ``label``: ``{"key", "metric" (as published), "value", "ours" (our metric's name),
    "converted" (the value as our metric; the mean of a list)}``, and for a list its ``"mean"`` (as published) and
    ``"per_replicate"`` (each value as our metric), the most specific key last (it wins in the tables)."""
    keys = label_keys(axes) | {label}
    found = []
    for key, metrics in sorted(figures(published).items(), key=lambda item: len(item[0])):
        if key in keys:
            for metric, value in metrics.items():
                ours, convert = PUBLISHED_METRICS[metric]
                figure = {"key": key, "metric": metric, "value": value, "ours": ours}
                if isinstance(value, list):
                    mean = math.fsum(value) / len(value)
                    figure.update(mean=mean, converted=convert(mean), per_replicate=[convert(v) for v in value])
                else:
                    figure["converted"] = convert(value)
                found.append(figure)
    return found
