r"""A study's cells summarised per label: mean ± standard error over seeds (or splits), and each label's paired
difference to a baseline label with a Student-t confidence interval.

Pure functions over the cell records the study engine keeps, one dict per cell::

    {"key": str, "label": str, "axes": {name: value}, "seed": int | None, "split": int | None,
     "status": "done" | "failed", "error": str | None, "command": str,
     "metrics": <metrics.json's "test" dict, with its "training" and "posterior">, "train_seconds": float,
     "peak_memory_gb": float | None}

Every finite numeric scalar of a done cell's ``metrics`` is a metric (nested dicts flattened with dots:
``ood.auroc_epistemic``, ``corrupted.mean.accuracy``), and so are ``train_seconds`` and ``peak_memory_gb``.
A cell's *unit* is its ``(seed, split)``: the replicate it stands for. Failed cells are listed, never averaged.

For a label whose cells give a metric the values :math:`x_1, \dots, x_n` (one per unit),

.. math::
    \bar x = \frac1n \sum_i x_i, \qquad s = \sqrt{\frac{1}{n-1} \sum_i (x_i - \bar x)^2}, \qquad
    \mathrm{se} = s / \sqrt n .

Against a baseline label with values :math:`b_i` on the same units (only units present in both count), the
paired differences :math:`d_i = x_i - b_i` remove what a unit shares between methods (its seed's data subset,
initialisation and test draws), and

.. math::
    \bar d \pm t_{1 - \alpha/2,\, n-1} \, s_d / \sqrt n

is the :math:`1 - \alpha` Student-t interval of the mean difference (the paired t-test, Student 1908); it
*excludes zero* when the difference is larger than the seed-to-seed noise at that level. Fewer than 2 pairs give
no interval. Where both labels' values are positive, the paired *ratio* is the same interval on the log scale,

.. math::
    \exp\Big(\overline{\log(x_i / b_i)} \pm t_{1 - \alpha/2,\, n-1} \, s_{\log} / \sqrt n\Big),

the geometric mean of :math:`x_i / b_i` (a method's ECE as a fraction of the baseline's), which *excludes one* when
the ratio is larger than the noise. A baseline that names some axes only (``method=mcdropout``) gives each label
its own baseline, the label with the same values on the other axes (:mod:`pyrobnn.studies.baseline`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Iterable, Mapping, Optional, Sequence

from pyrobnn.studies.baseline import resolve_baseline

__all__ = ["STATUSES", "Summary", "Difference", "is_number", "flatten", "cell_metrics", "unit_of", "unit_name",
           "unit_from_name", "summarize", "paired_difference", "paired_ratio", "aggregate", "pooled_reliability"]

STATUSES = ("done", "failed")
"""The states of a finished cell."""

EXTRA_METRICS = ("train_seconds", "peak_memory_gb")
"""Entries of a cell record, beside its ``metrics``, that are aggregated as metrics."""


@dataclass(frozen=True)
class Summary:
    """One label's metric over its units: ``n`` values, their ``mean``, standard deviation ``std`` (ddof 1) and
    standard error ``se = std / sqrt(n)`` (``None`` for a single value)."""

    n: int
    mean: float
    std: Optional[float]
    se: Optional[float]


@dataclass(frozen=True)
class Difference:
    """The paired difference label - baseline over ``n`` shared units: its ``mean``, the standard deviation ``sd``
    of the differences, ``se = sd / sqrt(n)`` and the ``level`` Student-t interval ``[low, high]`` (``None`` with
    fewer than 2 pairs)."""

    n: int
    mean: Optional[float]
    sd: Optional[float]
    se: Optional[float]
    low: Optional[float]
    high: Optional[float]
    level: float

    @property
    def excludes_zero(self) -> bool:
        """Whether the interval exists and lies entirely above or below zero."""
        return self.low is not None and (self.low > 0 or self.high < 0)

    def to_dict(self) -> dict:
        return {**asdict(self), "excludes_zero": self.excludes_zero}


@dataclass(frozen=True)
class Ratio:
    """The paired ratio label / baseline over ``n`` shared units: the geometric mean ``ratio`` of the ratios and its
    ``level`` interval ``[low, high]`` (the paired Student-t interval of the log ratios, exponentiated; ``None``
    with fewer than 2 pairs)."""

    n: int
    ratio: Optional[float]
    low: Optional[float]
    high: Optional[float]
    level: float

    @property
    def excludes_one(self) -> bool:
        """Whether the interval exists and lies entirely above or below one."""
        return self.low is not None and (self.low > 1 or self.high < 1)

    def to_dict(self) -> dict:
        return {**asdict(self), "excludes_one": self.excludes_one}


def is_number(value) -> bool:
    """Whether ``value`` is a finite int or float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def flatten(metrics: Mapping, prefix: str = "") -> dict[str, float]:
    """The finite numeric scalars of a nested dict as ``{dotted.name: float}``, in order (lists, strings, ``None``
    and non-finite values are left out)."""
    found = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            found.update(flatten(value, name + "."))
        elif is_number(value):
            found[name] = float(value)
    return found


def cell_metrics(record: Mapping) -> dict[str, float]:
    """A done cell's metrics: :func:`flatten` of its ``metrics``, then its ``train_seconds`` and ``peak_memory_gb``
    where they are numbers."""
    found = flatten(record.get("metrics") or {})
    found.update({key: float(record[key]) for key in EXTRA_METRICS if is_number(record.get(key))})
    return found


def unit_of(record: Mapping) -> tuple:
    """The replicate a cell stands for, ``(seed, split)``: cells of two labels with the same unit are paired."""
    return record.get("seed"), record.get("split")


def unit_name(unit: tuple) -> str:
    """``"seed=0"``, ``"split=3"``, ``"seed=0,split=3"`` or ``"-"``."""
    return ",".join(f"{name}={value}" for name, value in zip(("seed", "split"), unit) if value is not None) or "-"


def unit_from_name(name: str) -> tuple:
    """The unit ``(seed, split)`` of a :func:`unit_name` (the summary keys values by name): its inverse."""
    parts = dict(part.split("=") for part in name.split(",")) if name != "-" else {}
    return tuple(int(parts[field]) if field in parts else None for field in ("seed", "split"))


def summarize(values: Sequence[float]) -> Summary:
    """Mean, standard deviation (ddof 1) and standard error of ``values`` (at least one)."""
    n = len(values)
    if n == 0:
        raise ValueError("summarize needs at least one value")
    mean = math.fsum(values) / n
    if n < 2:
        return Summary(n, mean, None, None)
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    return Summary(n, mean, std, std / math.sqrt(n))


def paired_difference(values: Mapping, baseline: Mapping, level: float = 0.95) -> Difference:
    """The paired difference ``values[u] - baseline[u]`` over the units ``u`` present in both mappings, with its
    ``level`` Student-t interval :math:`\\bar d \\pm t_{(1+level)/2,\\, n-1} s_d / \\sqrt n` (scipy.stats.t); no
    interval with fewer than 2 pairs, no mean with none."""
    from scipy.stats import t

    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), e.g. 0.95; got {level!r}")
    shared = [unit for unit in values if unit in baseline]
    differences = [values[unit] - baseline[unit] for unit in shared]
    if not differences:
        return Difference(0, None, None, None, None, None, level)
    summary = summarize(differences)
    if summary.n < 2:
        return Difference(1, summary.mean, None, None, None, None, level)
    half = float(t.ppf((1 + level) / 2, summary.n - 1)) * summary.se
    return Difference(summary.n, summary.mean, summary.std, summary.se, summary.mean - half, summary.mean + half,
                      level)


def paired_ratio(values: Mapping, baseline: Mapping, level: float = 0.95) -> Optional[Ratio]:
    """The paired ratio ``values[u] / baseline[u]`` over the shared units: :func:`paired_difference` of the logs,
    exponentiated (:class:`Ratio`); None where a shared value is not positive (no ratio on the log scale)."""
    shared = [unit for unit in values if unit in baseline]
    if any(values[unit] <= 0 or baseline[unit] <= 0 for unit in shared):
        return None
    logs = paired_difference({unit: math.log(values[unit]) for unit in shared},
                             {unit: math.log(baseline[unit]) for unit in shared}, level)
    if logs.mean is None:
        return Ratio(0, None, None, None, level)
    return Ratio(logs.n, math.exp(logs.mean), None if logs.low is None else math.exp(logs.low),
                 None if logs.high is None else math.exp(logs.high), level)


def _check(records: Sequence[Mapping]) -> None:
    if not records:
        raise ValueError("records is empty: a study report needs at least one cell")
    for i, record in enumerate(records):
        if not isinstance(record, Mapping) or not isinstance(record.get("label"), str):
            raise ValueError(f"records[{i}] must be a study cell record, a dict with a str 'label'; got "
                             f"{record!r:.200}")
        if record.get("status") not in STATUSES:
            raise ValueError(f"records[{i}] (label {record['label']!r}) has status {record.get('status')!r}; "
                             f"a finished cell is one of {STATUSES}")


def _labels(records: Iterable[Mapping]) -> list[str]:
    return list(dict.fromkeys(record["label"] for record in records))


def _values_by_label(records: Sequence[Mapping]) -> dict[str, dict[str, dict[tuple, float]]]:
    """``{label: {metric: {unit: value}}}`` of the done cells; a label with two done cells of one unit is an
    error (its replicates could not be paired)."""
    values: dict[str, dict[str, dict[tuple, float]]] = {label: {} for label in _labels(records)}
    seen: dict[str, set] = {label: set() for label in values}
    for record in records:
        if record["status"] != "done":
            continue
        label, unit = record["label"], unit_of(record)
        if unit in seen[label]:
            raise ValueError(f"records: label {label!r} has two done cells with {unit_name(unit)}; each label needs "
                             "one cell per seed (or split) to pair them")
        seen[label].add(unit)
        for metric, value in cell_metrics(record).items():
            values[label].setdefault(metric, {})[unit] = value
    return values


def aggregate(records: Sequence[Mapping], baseline: Optional[str] = None, level: float = 0.95) -> dict:
    """The JSON-ready summary of a study's cell records.

    :param baseline: a label, or ``name=value`` pairs of some axes matched within the others
        (:func:`~pyrobnn.studies.baseline.resolve_baseline`); None: no differences.
    :returns: ``{"baseline" (as given), "baseline_within" (the axes it is matched within; empty for one baseline),
        "level", "metrics": [every metric, in order of appearance], "labels": [...], "failed": [...]}``; each label
        (in order of appearance) is ``{"label", "axes", "cells" (done), "failed" (count), "units", "metrics":
        {metric: Summary fields + "values" {unit: value}}, "baseline" (the label it is compared with: itself for a
        baseline, None without one), "difference": {metric: Difference fields + "excludes_zero"}, "ratio": {metric:
        Ratio fields + "excludes_one"} (the metrics whose values are positive)}`` (``difference`` and ``ratio`` are
        ``None`` for a baseline itself or without one); each failed cell is ``{"key", "label",
        "seed", "split", "error", "command"}``.
    :raises ValueError: an empty or malformed record list, a baseline that matches no label, two done cells of
        one label and unit.
    """
    _check(records)
    labels = _labels(records)
    axes = {label: dict(next(r for r in records if r["label"] == label).get("axes") or {}) for label in labels}
    compared = None if baseline is None else resolve_baseline(baseline, axes)
    values = _values_by_label(records)
    metrics = list(dict.fromkeys(metric for per_label in values.values() for metric in per_label))
    entries = []
    for label in labels:
        cells = [record for record in records if record["label"] == label]
        done = [record for record in cells if record["status"] == "done"]
        entry = {
            "label": label,
            "axes": axes[label],
            "cells": len(done),
            "failed": len(cells) - len(done),
            "units": [unit_name(unit_of(record)) for record in done],
            "metrics": {metric: {**asdict(summarize(list(by_unit.values()))),
                                 "values": {unit_name(unit): value for unit, value in by_unit.items()}}
                        for metric, by_unit in values[label].items()},
            "baseline": None if compared is None else compared.of[label],
            "difference": None,
            "ratio": None,
        }
        reference = entry["baseline"]
        if reference is not None and reference != label:
            entry["difference"] = {metric: paired_difference(by_unit, values[reference].get(metric, {}),
                                                             level).to_dict()
                                   for metric, by_unit in values[label].items()}
            ratios = {metric: paired_ratio(by_unit, values[reference].get(metric, {}), level)
                      for metric, by_unit in values[label].items()}
            entry["ratio"] = {metric: ratio.to_dict() for metric, ratio in ratios.items() if ratio is not None}
        entries.append(entry)
    failed = [{"key": record.get("key"), "label": record["label"], "seed": record.get("seed"),
               "split": record.get("split"), "error": record.get("error"), "command": record.get("command")}
              for record in records if record["status"] == "failed"]
    return {"baseline": baseline, "baseline_within": list(compared.within) if compared else [], "level": level,
            "metrics": metrics, "labels": entries, "failed": failed}


def pooled_reliability(records: Sequence[Mapping]) -> dict[str, dict[str, list]]:
    """Each label's reliability bins pooled over its done cells (``metrics["reliability"]`` of
    :func:`~pyrobnn.analysis.metrics.reliability_bins`): the counts added, the mean confidence and accuracy of each
    bin weighted by its counts. Labels without bins, or whose cells disagree on the number of bins, are left
    out."""
    pooled = {}
    for label in _labels(records):
        bins = [(record.get("metrics") or {}).get("reliability") for record in records
                if record["label"] == label and record["status"] == "done"]
        if not bins or not all(isinstance(b, Mapping) for b in bins) or len({len(b["count"]) for b in bins}) != 1:
            continue
        count = [sum(b["count"][i] for b in bins) for i in range(len(bins[0]["count"]))]
        pooled[label] = {"count": count, **{
            key: [math.fsum(b[key][i] * b["count"][i] for b in bins) / count[i] if count[i] else 0.0
                  for i in range(len(count))]
            for key in ("confidence", "accuracy")}}
    return pooled
