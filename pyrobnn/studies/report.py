"""A study's report: the aggregated cells (:mod:`pyrobnn.studies.aggregate`) as a rich table on the terminal, as
Markdown, CSV and JSON, and as plots.

:func:`write_report` is what the study engine calls when a study finishes and what ``pyrobnn study report``
calls on the cached cells. It writes, into the study's directory, each file atomically
(:func:`pyrobnn.files.atomic_write`):

* ``summary.md``: the configuration that ran (a study file's ``--configuration``), the main metrics per label as
  mean ± standard error with the paper's figure beside ours where the study has ``[published]`` figures (and a table
  of every published figure against ours, naming the source), the paired differences to the baseline (each
  label's own where the baseline names some axes only) with their 95 % Student-t intervals (``*`` where an interval
  excludes zero) and the paired ratios (the geometric mean of label / baseline, its interval from the log ratios),
  every metric, the failed cells;
* ``summary.csv``: one row per label and metric (n, mean, std, se, the label it is compared with, and the paired
  difference with its interval);
* ``summary.json``: :func:`~pyrobnn.studies.aggregate.aggregate`'s summary, with the main metrics and the
  pooled reliability bins;
* ``metrics.png`` (each main metric per label, error bars of one standard error, each cell as a grey dot),
  ``accuracy_vs_ece.png`` and ``reliability.png`` (the labels' reliability diagrams overlaid), for classifiers.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Optional, Sequence

from rich.table import Table
from rich.text import Text

from pyrobnn.analysis.plots import figure, save_png
from pyrobnn.files import atomic_write, write_json
from pyrobnn.studies.aggregate import aggregate, paired_difference, pooled_reliability, unit_from_name, unit_name
from pyrobnn.studies.cache import STUDY_FILE, read_json
from pyrobnn.studies.published import matched_figures

__all__ = ["CALIBRATION_COLUMNS", "CLASSIFICATION_COLUMNS", "REGRESSION_COLUMNS", "FILES", "write_report",
           "main_metrics", "mean_se", "difference_text", "ratio_text", "compared_with", "summary_table",
           "summary_markdown", "summary_csv"]

CALIBRATION_COLUMNS = ("temperature", "conformal_coverage")
"""The main metrics of a study run with ``--calibrate`` (:mod:`pyrobnn.analysis.calibration`), after each task's
calibrated likelihood and its conformal set size or interval width."""

CLASSIFICATION_COLUMNS = ("accuracy", "nll", "ece", "brier", "aurc", "nll_calibrated", "ece_calibrated",
                          *CALIBRATION_COLUMNS, "conformal_set_size", "ood.auroc_epistemic", "ood.auroc_total",
                          "corrupted.mean.accuracy", "ood.shifted.accuracy", "ood.shifted.nll", "ood.shifted.ece",
                          "ood.shifted.brier", "train_seconds")
"""The main metrics of a classification study, those its cells have: the table's and the plot's columns (every
other metric, ``peak_memory_gb`` included, is in ``summary.md``, ``summary.csv`` and ``summary.json``)."""

REGRESSION_COLUMNS = ("rmse", "log_likelihood", "nll", "log_likelihood_calibrated", "nll_calibrated",
                      *CALIBRATION_COLUMNS, "conformal_width", "train_seconds")
"""The main metrics of a regression study: RMSE, the test log-likelihood of the predictive mixture per example,
and ``nll``, the mean negative log density of its moment-matched Gaussian per target (and, with ``--calibrate``,
both after temperature scaling, the temperature and the conformal intervals' coverage and mean width)."""

FILES = ("summary.md", "summary.csv", "summary.json", "metrics.png", "accuracy_vs_ece.png", "reliability.png")
"""What :func:`write_report` writes (the last two for classifiers)."""

LEVEL = 0.95
"""The confidence level of the paired intervals."""


def main_metrics(metrics: Sequence[str]) -> list[str]:
    """The columns of the table among ``metrics``: :data:`CLASSIFICATION_COLUMNS` when the cells report an
    accuracy, :data:`REGRESSION_COLUMNS` when they report an RMSE, else the first eight."""
    chosen = CLASSIFICATION_COLUMNS if "accuracy" in metrics else REGRESSION_COLUMNS if "rmse" in metrics else ()
    return [metric for metric in chosen if metric in metrics] or list(metrics[:8])


def _decimals(spread: Optional[float]) -> Optional[int]:
    """Decimals that show ``spread`` to two significant digits (None when there is no spread)."""
    if spread is None or not math.isfinite(spread) or spread <= 0:
        return None
    return min(8, max(0, 1 - math.floor(math.log10(spread))))


def _number(value: float, spread: Optional[float] = None, sign: bool = False) -> str:
    """``value`` to the precision of ``spread`` (4 significant digits without one)."""
    decimals = _decimals(spread)
    plus = "+" if sign else ""
    return f"{value:{plus}.4g}" if decimals is None else f"{value:{plus}.{decimals}f}"


def mean_se(summary: dict) -> str:
    """``"0.9123 ± 0.0041"`` (the standard error to two significant digits), or the mean alone for one value."""
    if summary["se"] is None:
        return _number(summary["mean"])
    return f"{_number(summary['mean'], summary['se'])} ± {_number(summary['se'], summary['se'])}"


def difference_text(difference: dict, interval: bool = False) -> str:
    """A paired difference: ``"+0.013 ± 0.008 *"`` (the half-width of its interval), or with ``interval``
    ``"+0.013 [+0.005, +0.021] *"``; ``*`` where the interval excludes zero. ``"+0.013 (1 pair)"`` without an
    interval, ``"no pairs"`` without shared seeds."""
    if difference["n"] == 0:
        return "no pairs"
    if difference["low"] is None:
        return f"{_number(difference['mean'], sign=True)} (1 pair)"
    half = (difference["high"] - difference["low"]) / 2
    star = " *" if difference["excludes_zero"] else ""
    if interval:
        low, high = (_number(difference[key], half, sign=True) for key in ("low", "high"))
        return f"{_number(difference['mean'], half, sign=True)} [{low}, {high}]{star}"
    return f"{_number(difference['mean'], half, sign=True)} ± {_number(half, half)}{star}"


def ratio_text(ratio: dict) -> str:
    """A paired ratio: ``"0.52 [0.41, 0.66] *"`` (``*`` where its interval excludes 1), ``"0.52 (1 pair)"`` without
    an interval, ``"no pairs"`` without shared seeds."""
    if ratio["n"] == 0:
        return "no pairs"
    if ratio["low"] is None:
        return f"{ratio['ratio']:.3g} (1 pair)"
    star = " *" if ratio["excludes_one"] else ""
    return f"{ratio['ratio']:.3g} [{ratio['low']:.3g}, {ratio['high']:.3g}]{star}"


def _cells(entry: dict) -> str:
    return f"{entry['cells']} done" + (f", {entry['failed']} failed" if entry["failed"] else "")


def _replicates(summary: dict) -> str:
    """What the cells of a label replicate: ``"seeds"``, ``"splits"``, ``"seeds and splits"`` (the kinds whose
    values differ between cells; those present where none differ), else ``"cells"``."""
    values: dict[str, set] = {}
    for entry in summary["labels"]:
        for unit in entry["units"]:
            for part in unit.split(","):
                kind, equals, value = part.partition("=")
                if equals:
                    values.setdefault(kind, set()).add(value)
    kinds = [kind for kind, found in values.items() if len(found) > 1] or list(values)
    return " and ".join(f"{kind}s" for kind in sorted(kinds)) or "cells"


def _is_baseline(entry: dict) -> bool:
    return entry.get("baseline") == entry["label"]


def compared_with(summary: dict) -> str:
    """What each label is compared with: the baseline label (``'bbb'``), or, for a baseline matched within other
    axes, ``"the label with the same dataset and method=mcdropout"``."""
    within = summary.get("baseline_within") or []
    if within:
        return f"the label with the same {' and '.join(within)} and {summary['baseline']}"
    labels = [entry["label"] for entry in summary["labels"] if _is_baseline(entry)]
    return repr(labels[0] if labels else summary["baseline"])


def _caption(summary: dict) -> str:
    text = f"mean ± standard error over {_replicates(summary)}"
    if summary["baseline"] is not None:
        text += (f"; second line: paired difference to {compared_with(summary)} ± the half-width of its "
                 f"{summary['level']:.0%} Student-t interval, * where it excludes 0")
    return text


def published_by_label(summary: dict) -> dict[str, dict[str, dict]]:
    """``{label: {our metric: its published figure}}`` of ``summary["published"]`` (the most specific key wins)."""
    labels = (summary.get("published") or {}).get("labels", {})
    return {label: {figure["ours"]: figure for figure in found} for label, found in labels.items()}


def _with_published(text: str, figure: Optional[dict], separator: str) -> str:
    return text if figure is None else f"{text}{separator}(published {_number(figure['converted'])})"


def _configuration(summary: dict) -> str:
    return f" (configuration {summary['configuration']})" if summary.get("configuration") else ""


def summary_table(summary: dict, columns: Sequence[str]) -> Table:
    """The rich table of :func:`~pyrobnn.studies.aggregate.aggregate`'s ``summary``: one row per label, one
    column per metric in ``columns`` (mean ± se, and under it the paired difference to the baseline)."""
    published = published_by_label(summary)
    caption = _caption(summary)
    if published:
        caption += f"; published: {summary['published']['source']}"
    table = Table(title="study summary" + _configuration(summary), caption=caption)
    table.add_column("label (cells)")
    for column in columns:
        table.add_column(column, justify="right")
    for entry in summary["labels"]:
        row = [Text(f"{entry['label']}\n{_cells(entry)}")]
        for column in columns:
            metric = entry["metrics"].get(column)
            text = mean_se(metric) if metric is not None else "-"
            text = _with_published(text, published.get(entry["label"], {}).get(column), "\n")
            if entry["difference"] is not None and column in entry["difference"]:
                text += "\n" + difference_text(entry["difference"][column])
            elif _is_baseline(entry) and metric is not None:
                text += "\n(baseline)"
            row.append(Text(text))
        table.add_row(*row)
    return table


def _md_cell(value) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _md_table(header: Sequence[str], rows: Sequence[Sequence]) -> list[str]:
    lines = ["| " + " | ".join(map(_md_cell, header)) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(map(_md_cell, row)) + " |" for row in rows]


def summary_markdown(summary: dict, columns: Sequence[str], plots: Sequence[str] = ()) -> str:
    """``summary.md``: the main table, the paired differences with their intervals, every metric, the failed cells
    and the ``plots`` (file names beside it)."""
    done = sum(entry["cells"] for entry in summary["labels"])
    published = published_by_label(summary)
    lines = ["# Study summary" + _configuration(summary), "",
             f"{done + len(summary['failed'])} cells: {done} done, {len(summary['failed'])} failed (failed cells are "
             f"listed below, not averaged). Each metric is the mean ± standard error over {_replicates(summary)}.", ""]
    if summary.get("configuration"):
        lines += [f"Configuration: `{summary['configuration']}` (the study file's [configurations."
                  f"{summary['configuration']}]).", ""]
    if published:
        lines += [f"Published figures (in parentheses): {summary['published']['source']}.", ""]
    lines += ["## Main metrics", ""]
    lines += _md_table(["label", "cells", *columns],
                       [[entry["label"], _cells(entry),
                         *(_with_published(mean_se(entry["metrics"][c]) if c in entry["metrics"] else "-",
                                           published.get(entry["label"], {}).get(c), " ") for c in columns)]
                        for entry in summary["labels"]])
    if published:
        lines += ["", "## Published figures", "", f"Source: {summary['published']['source']}.", ""]
        rows = []
        for entry in summary["labels"]:
            for figure in summary["published"]["labels"].get(entry["label"], []):
                ours = entry["metrics"].get(figure["ours"])
                value = figure["value"]
                shown = (f"{len(value)} values, mean {_number(figure['mean'])}" if isinstance(value, list)
                         else _number(value))
                rows.append([entry["label"], figure["ours"], mean_se(ours) if ours else "-",
                             _number(figure["converted"]), f"{figure['metric']} = {shown}", figure["key"],
                             difference_text(figure["paired"], interval=True) if "paired" in figure else "-"])
        lines += _md_table(["label", "metric", "ours (mean ± se)", "published", "as published", "key",
                            f"ours − published, paired ({summary['level']:.0%} t)"], rows)
    baseline = summary["baseline"]
    within = summary.get("baseline_within") or []
    if baseline is not None:
        lines += ["", f"## Paired differences to the baseline `{baseline}`", "",
                  f"Each label is compared with {compared_with(summary)}"
                  + (" (its baseline, named in the table)" if within else "") + ": for each seed (or split) "
                  "present for both labels, the difference label − baseline; its mean "
                  f"and {summary['level']:.0%} Student-t interval (mean ± t · sd / √n). `*`: the interval "
                  "excludes 0, the difference is larger than the seed-to-seed noise. Fewer than 2 pairs give no "
                  "interval.", ""]
        compared = [entry for entry in summary["labels"] if entry["difference"] is not None]
        lines += _md_table(["label", *(["baseline"] if within else []), *columns],
                           [[entry["label"], *([entry["baseline"]] if within else []),
                             *(difference_text(entry["difference"][c], interval=True)
                               if c in entry["difference"] else "-" for c in columns)]
                            for entry in compared])
        lines += ["", f"## Paired ratios to the baseline `{baseline}`", "",
                  "For each seed (or split) present for both labels, the ratio label / baseline; their geometric "
                  f"mean and {summary['level']:.0%} interval (the Student-t interval of the log ratios, "
                  "exponentiated). `*`: the interval excludes 1. Metrics with a value at or below 0 have none.", ""]
        lines += _md_table(["label", *(["baseline"] if within else []), *columns],
                           [[entry["label"], *([entry["baseline"]] if within else []),
                             *(ratio_text(entry["ratio"][c]) if c in (entry.get("ratio") or {}) else "-"
                               for c in columns)]
                            for entry in compared])
    lines += ["", "## All metrics", ""]
    rows = []
    for metric in summary["metrics"]:
        for entry in summary["labels"]:
            if metric in entry["metrics"]:
                difference = (entry["difference"] or {}).get(metric)
                shown = "(baseline)" if _is_baseline(entry) else ""
                rows.append([metric, entry["label"], entry["metrics"][metric]["n"], mean_se(entry["metrics"][metric]),
                             shown if difference is None else difference_text(difference, interval=True)])
    header = "" if baseline is None else "difference to its baseline" if within else f"difference to {baseline}"
    lines += _md_table(["metric", "label", "n", "mean ± se", header], rows)
    if summary["failed"]:
        lines += ["", "## Failed cells", ""]
        lines += _md_table(["label", "replicate", "error", "command (replays the cell)", "key"],
                           [[cell["label"], unit_name((cell["seed"], cell["split"])), cell["error"],
                             f"`{cell['command']}`" if cell["command"] else "", cell["key"]]
                            for cell in summary["failed"]])
    if plots:
        lines += ["", "## Plots", "", *(f"![{Path(name).stem}]({name})" for name in plots)]
    return "\n".join(lines) + "\n"


CSV_COLUMNS = ("label", "metric", "cells", "failed", "n", "mean", "std", "se", "baseline", "pairs", "difference",
               "difference_se", "ci_low", "ci_high", "excludes_zero")
"""The columns of ``summary.csv``, one row per label and metric (empty where a value does not exist)."""


def summary_csv(summary: dict) -> str:
    """``summary.csv``: :data:`CSV_COLUMNS`, one row per label and metric."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for metric in summary["metrics"]:
        for entry in summary["labels"]:
            if metric not in entry["metrics"]:
                continue
            value = entry["metrics"][metric]
            difference = (entry["difference"] or {}).get(metric) or {}
            row = [entry["label"], metric, entry["cells"], entry["failed"], value["n"], value["mean"], value["std"],
                   value["se"], entry.get("baseline"), difference.get("n"), difference.get("mean"),
                   difference.get("se"), difference.get("low"), difference.get("high"),
                   difference.get("excludes_zero")]
            writer.writerow(["" if item is None else repr(item) if isinstance(item, float) else item for item in row])
    return buffer.getvalue()


def _plot_metrics(summary: dict, columns: Sequence[str], path: Path) -> Path:
    labels = [entry["label"] for entry in summary["labels"]]
    ncols = min(3, len(columns))
    nrows = math.ceil(len(columns) / ncols)
    fig = figure((4.2 * ncols, 3.6 * nrows))
    axes = list(fig.subplots(nrows, ncols, squeeze=False).flat)
    for ax, metric in zip(axes, columns):
        for i, entry in enumerate(summary["labels"]):
            value = entry["metrics"].get(metric)
            if value is None:
                continue
            cells = list(value["values"].values())
            ax.scatter([i] * len(cells), cells, s=10, color="0.65", zorder=1)
            ax.errorbar(i, value["mean"], yerr=value["se"] or 0.0, fmt="o", capsize=4, color=f"C{i % 10}", zorder=2)
        ax.set_title(metric)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=30, ha="right", fontsize="small")
        ax.set_xlim(-0.5, len(labels) - 0.5)
    for ax in axes[len(columns):]:
        ax.set_visible(False)
    fig.suptitle(f"mean ± standard error over {_replicates(summary)} (grey: each cell)")
    fig.tight_layout()
    return save_png(fig, path)


def _labelled(fig, ax, path: Path, xlabel: str, ylabel: str, title: str) -> Path:
    """Label the axes of a one-panel figure with a legend of the labels, and save it."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return save_png(fig, path)


def _plot_accuracy_vs_ece(summary: dict, path: Path) -> Path:
    fig = figure((5.5, 4.5))
    ax = fig.subplots()
    for i, entry in enumerate(summary["labels"]):
        accuracy, ece = entry["metrics"].get("accuracy"), entry["metrics"].get("ece")
        if accuracy is None or ece is None:
            continue
        ax.errorbar(ece["mean"], accuracy["mean"], xerr=ece["se"] or 0.0, yerr=accuracy["se"] or 0.0, fmt="o",
                    capsize=4, color=f"C{i % 10}", label=entry["label"])
    return _labelled(fig, ax, path, "ECE (lower is better)", "accuracy", "accuracy vs calibration (mean ± se)")


def _plot_reliability(pooled: dict, path: Path) -> Path:
    fig = figure((5.5, 5))
    ax = fig.subplots()
    ax.plot([0, 1], [0, 1], "k--", linewidth=1, label="perfect calibration")
    for i, (label, bins) in enumerate(pooled.items()):
        filled = [b for b, count in enumerate(bins["count"]) if count]
        ax.plot([bins["confidence"][b] for b in filled], [bins["accuracy"][b] for b in filled], marker="o",
                color=f"C{i % 10}", label=label)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    return _labelled(fig, ax, path, "confidence (max probability)", "accuracy",
                     "reliability, bins pooled over the cells of each label")


def _published_summary(study: dict, summary: dict) -> dict:
    """``{"source", "labels": {label: [figures]}}`` of ``study["published"]`` matched to the summary's labels."""
    published = study.get("published") or {}
    if not published:
        return {}
    labels = {}
    for entry in summary["labels"]:
        found = matched_figures(published, entry["label"], entry["axes"])
        for matched in found:
            if "per_replicate" in matched and matched["ours"] in entry["metrics"]:
                matched["paired"] = published_difference(entry["metrics"][matched["ours"]]["values"],
                                                           matched["per_replicate"], summary["level"])
        if found:
            labels[entry["label"]] = found
    return {"source": published["source"], "labels": labels}


def published_difference(ours: dict, published: Sequence[float], level: float) -> dict:
    """The paired difference ours − published (:func:`~pyrobnn.studies.aggregate.paired_difference`, its fields and
    ``excludes_zero``) over the replicates both have: ``ours`` maps a unit's name (``"split=3"``, ``"seed=0"``,
    ``"seed=0,split=3"``) to our value, ``published[i]`` is replicate i's (split i where the units have splits, else
    seed i)."""
    theirs = {}
    for name in ours:
        seed, split = unit_from_name(name)
        index = split if split is not None else seed
        if index is not None and 0 <= index < len(published):
            theirs[name] = published[index]
    return paired_difference(ours, theirs, level).to_dict()


def write_report(records: list[dict], out: Path, baseline: str | None = None, console=None,
                 study: Optional[dict] = None) -> None:
    """Aggregate a study's cell records (:func:`~pyrobnn.studies.aggregate.aggregate`), print the summary table on
    ``console`` (default: pyrobnn's), and write :data:`FILES` into the directory ``out``.

    :param records: one dict per cell, done or failed (the format of :mod:`pyrobnn.studies.aggregate`).
    :param baseline: the label every other label is compared with (paired over seeds or splits), or ``name=value``
        pairs of some axes, each label then compared with the label of its other axes' values
        (:mod:`pyrobnn.studies.baseline`); None: no differences.
    :param study: the study as :meth:`~pyrobnn.studies.spec.Study.to_dict` gives it, for its ``published`` figures
        and ``configuration`` (default: ``out/study.json``'s).
    :raises ValueError: no records, a malformed record, a baseline that matches no label; nothing is written
        then.
    """
    from pyrobnn.cli.report import console as terminal

    console = console or terminal
    out = Path(out)
    summary = aggregate(records, baseline, LEVEL)
    study = (read_json(out / STUDY_FILE) or {}) if study is None else study
    summary.update(configuration=study.get("configuration"), published=_published_summary(study, summary))
    columns = main_metrics(summary["metrics"])
    pooled = pooled_reliability(records)
    plots = []
    if columns:
        plots.append(_plot_metrics(summary, columns, out / "metrics.png"))
    if any("accuracy" in e["metrics"] and "ece" in e["metrics"] for e in summary["labels"]):
        plots.append(_plot_accuracy_vs_ece(summary, out / "accuracy_vs_ece.png"))
    if pooled:
        plots.append(_plot_reliability(pooled, out / "reliability.png"))
    names = [plot.name for plot in plots]
    atomic_write(out / "summary.md", summary_markdown(summary, columns, names))
    atomic_write(out / "summary.csv", summary_csv(summary))
    write_json(out / "summary.json", {**summary, "main_metrics": columns, "reliability": pooled, "plots": names})
    console.print(summary_table(summary, columns))
    for cell in summary["failed"]:
        console.print(Text(f"failed: {cell['label']} {unit_name((cell['seed'], cell['split']))}: {cell['error']}"
                           + (f" (replay: {cell['command']})" if cell["command"] else "")), soft_wrap=True)
    console.print(Text(f"wrote {out}/" + ", ".join(["summary.md", "summary.csv", "summary.json", *names])),
                  soft_wrap=True)

