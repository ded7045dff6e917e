"""A study's aggregated report: mean ± standard error against numpy, the paired difference against a hand-computed
Student-t interval, pairing over shared seeds only, failed cells listed and not averaged, and the four formats and
the plots written and consistent with each other."""

from __future__ import annotations

import csv
import io
import json
import math

import numpy as np
import pytest
from rich.console import Console

from pyrobnn.studies.aggregate import (
    aggregate,
    flatten,
    paired_difference,
    paired_ratio,
    pooled_reliability,
    summarize,
)
from pyrobnn.studies.report import mean_se, write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

T_975 = {2: 4.302652729911275, 3: 3.182446305284263, 4: 2.7764451051977987}
"""t_{0.975, df}: the two-sided 95 % quantiles of Student's t (a printed table)."""


def cell(label, seed, metrics, status="done", error=None, split=None, seconds=10.0, memory=0.5):
    return {"key": f"{label}-{seed}", "label": label, "axes": {"method": label}, "seed": seed, "split": split,
            "status": status, "error": error, "command": f"pyrobnn train --method {label} --seed {seed}",
            "metrics": metrics, "train_seconds": seconds, "peak_memory_gb": memory}


def classification(accuracy, ece, auroc=0.9, bins=None):
    return {"accuracy": accuracy, "nll": 1 - accuracy, "ece": ece, "brier": 0.5 - accuracy / 2, "aurc": 0.1,
            "total": 0.3, "aleatoric": 0.2, "epistemic": 0.1,
            "ood": {"dataset": "fashion-mnist", "auroc_epistemic": auroc, "auroc_total": auroc - 0.05},
            "reliability": bins or {"confidence": [0.2, 0.9], "accuracy": [0.1, 0.95], "count": [3, 7]}}


BASE = [0.90, 0.92, 0.91, 0.93]
BETTER = [0.95, 0.96, 0.955, 0.971]  # clearly above the base, seed by seed
NOISY = [0.91, 0.90, 0.93, 0.92]  # as good as the base


@pytest.fixture
def records():
    found = []
    for seed in range(4):
        found.append(cell("bbb", seed, classification(BASE[seed], 0.05 + 0.01 * seed), seconds=10 + seed))
        found.append(cell("ensemble-5", seed, classification(BETTER[seed], 0.02 + 0.005 * seed), seconds=50 + seed))
        found.append(cell("mcdropout", seed, classification(NOISY[seed], 0.04), seconds=8.0))
    found.append(cell("mcdropout", 4, {"accuracy": 123.0}, status="failed", error="RuntimeError: out of | memory"))
    return found


# ----------------------------------------------------------------------------- statistics


def test_mean_and_standard_error_match_numpy():
    values = [0.91, 0.87, 0.95, 0.90, 0.93]
    found = summarize(values)
    assert found.n == 5
    assert found.mean == pytest.approx(np.mean(values), abs=1e-15)
    assert found.std == pytest.approx(np.std(values, ddof=1), abs=1e-15)
    assert found.se == pytest.approx(np.std(values, ddof=1) / np.sqrt(5), abs=1e-15)
    assert summarize([0.5]).se is None


def test_paired_difference_is_the_hand_computed_t_interval_over_shared_seeds():
    values = {(0, None): 0.95, (1, None): 0.96, (2, None): 0.955, (3, None): 0.97, (9, None): 0.0}
    baseline = {(0, None): 0.90, (1, None): 0.92, (2, None): 0.91, (3, None): 0.93, (7, None): 1.0}
    d = [0.05, 0.04, 0.045, 0.04]  # seeds 9 and 7 have no partner
    mean = sum(d) / 4
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 3)
    half = T_975[3] * sd / math.sqrt(4)
    found = paired_difference(values, baseline)
    assert found.n == 4
    assert found.mean == pytest.approx(mean, abs=1e-12)
    assert found.sd == pytest.approx(sd, abs=1e-12)
    assert (found.low, found.high) == (pytest.approx(mean - half, abs=1e-12), pytest.approx(mean + half, abs=1e-12))
    assert found.excludes_zero
    assert paired_difference(values, baseline, level=0.9).high < found.high  # narrower at 90 %


def test_a_difference_within_the_noise_does_not_exclude_zero_and_one_pair_gives_no_interval():
    noisy = paired_difference({(s, None): v for s, v in enumerate(NOISY)}, {(s, None): v for s, v in enumerate(BASE)})
    assert noisy.low < 0 < noisy.high and not noisy.excludes_zero
    single = paired_difference({(0, None): 0.9}, {(0, None): 0.8, (1, None): 0.7})
    assert single.n == 1 and single.mean == pytest.approx(0.1) and single.low is None and not single.excludes_zero
    assert paired_difference({(0, None): 0.9}, {(1, None): 0.8}).n == 0


def test_paired_ratio_is_the_t_interval_of_the_log_ratios_exponentiated():
    values = {(0, None): 0.05, (1, None): 0.04, (2, None): 0.06, (9, None): 0.5}
    baseline = {(0, None): 0.10, (1, None): 0.10, (2, None): 0.11}
    logs = [math.log(0.5), math.log(0.4), math.log(0.06 / 0.11)]
    mean = sum(logs) / 3
    half = T_975[2] * math.sqrt(sum((x - mean) ** 2 for x in logs) / 2) / math.sqrt(3)
    found = paired_ratio(values, baseline)
    assert found.n == 3 and found.ratio == pytest.approx(math.exp(mean), rel=1e-12)
    assert (found.low, found.high) == (pytest.approx(math.exp(mean - half), rel=1e-9),
                                       pytest.approx(math.exp(mean + half), rel=1e-9))
    assert found.excludes_one and found.to_dict()["excludes_one"]
    assert paired_ratio({(0, None): 0.0}, {(0, None): 0.1}) is None  # no log of 0: no ratio
    assert paired_ratio({(0, None): 0.9}, {(0, None): 0.8}).low is None


def test_flatten_keeps_finite_numbers_with_dotted_names():
    nested = {"accuracy": 0.9, "ood": {"dataset": "fashion-mnist", "auroc_total": 0.8}, "flag": True,
              "reliability": {"count": [1, 2]}, "nll": None, "ece": math.inf, "corrupted": {"mean": {"accuracy": 1}}}
    assert flatten(nested) == {"accuracy": 0.9, "ood.auroc_total": 0.8, "corrupted.mean.accuracy": 1.0}


# ----------------------------------------------------------------------------- aggregation


def test_aggregate_per_label_pairs_with_the_baseline_and_lists_failed_cells(records):
    summary = aggregate(records, baseline="bbb")
    labels = {entry["label"]: entry for entry in summary["labels"]}
    assert list(labels) == ["bbb", "ensemble-5", "mcdropout"]
    mcd = labels["mcdropout"]
    assert (mcd["cells"], mcd["failed"]) == (4, 1)
    assert mcd["metrics"]["accuracy"]["mean"] == pytest.approx(np.mean(NOISY))  # the failed cell's 123 is not in
    assert mcd["metrics"]["accuracy"]["n"] == 4
    assert summary["failed"] == [{"key": "mcdropout-4", "label": "mcdropout", "seed": 4, "split": None,
                                  "error": "RuntimeError: out of | memory",
                                  "command": "pyrobnn train --method mcdropout --seed 4"}]
    assert labels["bbb"]["difference"] is None and labels["bbb"]["ratio"] is None
    assert labels["ensemble-5"]["ratio"]["accuracy"]["ratio"] > 1
    assert labels["ensemble-5"]["difference"]["accuracy"]["excludes_zero"]
    assert not labels["mcdropout"]["difference"]["accuracy"]["excludes_zero"]
    seconds = labels["ensemble-5"]["metrics"]["train_seconds"]
    assert seconds["mean"] == pytest.approx(51.5) and "peak_memory_gb" in labels["bbb"]["metrics"]
    assert summary["metrics"][:5] == ["accuracy", "nll", "ece", "brier", "aurc"]
    assert "ood.auroc_epistemic" in summary["metrics"] and not any("reliability" in m for m in summary["metrics"])


def test_splits_pair_like_seeds():
    records = [cell("a", None, {"rmse": 1.0 + s}, split=s) for s in range(3)]
    records += [cell("b", None, {"rmse": 0.5 + s}, split=s) for s in (1, 2, 3)]
    difference = aggregate(records, baseline="a")["labels"][1]["difference"]["rmse"]
    assert difference["n"] == 2 and difference["mean"] == pytest.approx(-0.5)


def test_pooled_reliability_weights_each_bin_by_its_counts(records):
    records = [cell("x", 0, classification(0.9, 0.1, bins={"confidence": [0.2, 0.8], "accuracy": [0.0, 1.0],
                                                           "count": [1, 3]})),
               cell("x", 1, classification(0.9, 0.1, bins={"confidence": [0.4, 0.6], "accuracy": [1.0, 0.5],
                                                           "count": [3, 0]}))]
    pooled = pooled_reliability(records)["x"]
    assert pooled["count"] == [4, 3]
    assert pooled["confidence"] == pytest.approx([(0.2 + 3 * 0.4) / 4, 0.8])
    assert pooled["accuracy"] == pytest.approx([3 / 4, 1.0])


@pytest.mark.parametrize("change, message", [
    (lambda r: r, "baseline 'laplace' is not a label"),
    (lambda r: r + [cell("bbb", 0, classification(0.5, 0.1))], "two done cells with seed=0"),
    (lambda r: r + [{**cell("bbb", 9, {}), "status": "running"}], "has status 'running'"),
    (lambda r: [], "records is empty"),
])
def test_bad_records_are_one_clear_error_and_nothing_is_written(records, change, message, tmp_path):
    baseline = "laplace" if "laplace" in message else "bbb"
    with pytest.raises(ValueError, match=message):
        write_report(change(records), tmp_path / "study", baseline=baseline)
    assert not (tmp_path / "study").exists()


# ----------------------------------------------------------------------------- the four formats


def test_write_report_writes_four_consistent_formats_plots_and_a_table(records, tmp_path):
    out = tmp_path / "study"
    screen = io.StringIO()
    write_report(records, out, baseline="bbb", console=Console(file=screen, width=250))
    for name in ("metrics.png", "accuracy_vs_ece.png", "reliability.png"):
        assert (out / name).read_bytes().startswith(PNG_MAGIC)
    summary = json.loads((out / "summary.json").read_text())
    rows = list(csv.DictReader(io.StringIO((out / "summary.csv").read_text())))
    markdown = (out / "summary.md").read_text()
    printed = screen.getvalue()

    by_label = {entry["label"]: entry for entry in summary["labels"]}
    assert len(rows) == sum(len(entry["metrics"]) for entry in summary["labels"])
    for row in rows:  # CSV == JSON, number for number
        entry = by_label[row["label"]]
        value = entry["metrics"][row["metric"]]
        assert float(row["mean"]) == value["mean"] and int(row["n"]) == value["n"]
        assert (row["se"] == "") == (value["se"] is None) and (row["se"] == "" or float(row["se"]) == value["se"])
        difference = (entry["difference"] or {}).get(row["metric"])
        if difference is None:
            assert row["difference"] == "" and row["ci_low"] == ""
        else:
            assert float(row["ci_low"]) == difference["low"] and float(row["ci_high"]) == difference["high"]
            assert row["excludes_zero"] == str(difference["excludes_zero"])
    accuracy = by_label["ensemble-5"]["metrics"]["accuracy"]
    assert accuracy["mean"] == pytest.approx(np.mean(BETTER))
    assert accuracy["se"] == pytest.approx(np.std(BETTER, ddof=1) / 2)
    shown = mean_se(accuracy)  # the se to two significant digits, the mean to as many decimals
    assert shown == "0.9590 ± 0.0045"
    assert shown in markdown and shown in printed
    assert summary["main_metrics"] == ["accuracy", "nll", "ece", "brier", "aurc", "ood.auroc_epistemic",
                                       "ood.auroc_total", "train_seconds"]
    assert summary["plots"] == ["metrics.png", "accuracy_vs_ece.png", "reliability.png"]
    # the paired difference, marked where its interval excludes zero, in the table and in the Markdown
    difference = by_label["ensemble-5"]["difference"]["accuracy"]
    assert difference["excludes_zero"]
    assert f"+{difference['mean']:.4f}" in printed and " *" in printed
    assert "## Paired differences to the baseline `bbb`" in markdown and "] *" in markdown
    # the failed cell: listed everywhere, its pipe escaped in the Markdown table
    assert "4 done, 1 failed" in printed and "4 done, 1 failed" in markdown
    assert "out of \\| memory" in markdown and "out of | memory" in printed
    assert summary["failed"][0]["key"] == "mcdropout-4"
    assert "13 cells: 12 done, 1 failed" in markdown


def test_regression_study_reports_rmse_and_nll(tmp_path):
    records = [cell(label, s, {"rmse": r + 0.1 * s, "nll": 1.0 + r + 0.01 * s, "mae": r, "log_likelihood": -r})
               for label, r in (("bbb", 1.0), ("nuts", 0.8)) for s in range(3)]
    write_report(records, tmp_path, baseline="bbb", console=Console(file=io.StringIO()))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["main_metrics"] == ["rmse", "log_likelihood", "nll", "train_seconds"]
    assert summary["plots"] == ["metrics.png"]
    nuts = summary["labels"][1]["difference"]["rmse"]
    assert nuts["mean"] == pytest.approx(-0.2) and nuts["high"] - nuts["low"] < 1e-12  # the same difference per seed
    assert nuts["excludes_zero"]


def test_without_a_baseline_there_are_no_differences(records, tmp_path):
    screen = io.StringIO()
    write_report(records, tmp_path, console=Console(file=screen, width=250))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert all(entry["difference"] is None for entry in summary["labels"])
    assert "Paired differences" not in (tmp_path / "summary.md").read_text()


def test_a_figure_published_per_split_is_compared_split_by_split(tmp_path):
    """Gal's code wrote one test log-likelihood per split: the report pairs ours with his split by split (the
    hand-computed t interval over the splits both have) and shows his mean beside ours."""
    from pyrobnn.studies.published import check_published

    ours = [-2.40, -2.50, -2.30, -2.45]
    theirs = [-2.38, -2.41, -2.33, -2.40, -9.0]  # a fifth split that we did not run
    records = [cell("mcdropout", 0, {"rmse": 3.0, "log_likelihood": value}, split=split)
               for split, value in enumerate(ours)]
    published = check_published({"source": "Gal's test_ll_100_xepochs files", "mcdropout": {
        "log_likelihood": theirs, "rmse": 2.9}})
    write_report(records, tmp_path, console=Console(file=io.StringIO()),
                 study={"published": published, "configuration": None})
    figures = {f["ours"]: f for f in json.loads((tmp_path / "summary.json").read_text())["published"]["labels"]
               ["mcdropout"]}
    assert figures["log_likelihood"]["converted"] == pytest.approx(np.mean(theirs))
    d = np.subtract(ours, theirs[:4])
    half = T_975[3] * d.std(ddof=1) / math.sqrt(4)
    paired = figures["log_likelihood"]["paired"]
    assert (paired["n"], paired["mean"]) == (4, pytest.approx(d.mean()))
    assert (paired["low"], paired["high"]) == (pytest.approx(d.mean() - half), pytest.approx(d.mean() + half))
    assert "paired" not in figures["rmse"]  # one number: nothing to pair
    markdown = (tmp_path / "summary.md").read_text()
    assert "5 values, mean" in markdown and f"{d.mean():+.3f}" in markdown
    with pytest.raises(ValueError, match="a list of numbers"):
        check_published({"source": "s", "mcdropout": {"log_likelihood": [-2.4, "x"]}})


@pytest.mark.parametrize("unit", [(0, None), (None, 3), (2, 7), (None, None)])
def test_a_unit_name_reads_back_as_its_unit(unit):
    """The summary keys a label's values by unit name ("seed=0,split=3", "-" for none); the paired comparison with a
    published list reads the unit back from it."""
    from pyrobnn.studies.aggregate import unit_from_name, unit_name

    assert unit_from_name(unit_name(unit)) == unit
