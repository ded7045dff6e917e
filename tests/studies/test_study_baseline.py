"""A study's baseline naming some axes only (``method=mcdropout``) is matched within the others: every label's paired
difference against numpy on the label of the same data set, the baselines marked, the CSV's baseline column per
row, one error naming --baseline for an unknown axis or value, a full label unchanged, and the replicates named as
they vary."""

from __future__ import annotations

import csv
import io
import json
import math
import statistics

import numpy as np
import pytest
from rich.console import Console

from pyrobnn.__main__ import main
from pyrobnn.studies import Study, rebuild_report
from pyrobnn.studies.aggregate import aggregate
from pyrobnn.studies.baseline import resolve_baseline
from pyrobnn.studies.cache import write_study
from pyrobnn.studies.report import summary_table, write_report

T_975_2 = 4.302652729911275
"""t_{0.975, 2}: the two-sided 95 % quantile of Student's t with 2 degrees of freedom (a printed table)."""

DATASETS = ("uci-boston", "uci-concrete")
METHODS = ("mcdropout", "bbb")
SPLITS = 3
RMSE = {(dataset, method): np.random.default_rng(index).uniform(1.0, 6.0, SPLITS)
        for index, (dataset, method) in enumerate((d, m) for d in DATASETS for m in METHODS)}
"""Each label's RMSE on splits 0..2."""


def label(dataset: str, method: str) -> str:
    return f"dataset={dataset} method={method}"


def cell(dataset, method, split, seed=0, rmse=None):
    value = RMSE[dataset, method][split] if rmse is None else rmse
    return {"key": f"{dataset}-{method}-{split}", "label": label(dataset, method),
            "axes": {"dataset": dataset, "method": method}, "seed": seed, "split": split, "status": "done",
            "error": None, "command": f"pyrobnn train --dataset {dataset} --method {method} --split {split}",
            "metrics": {"rmse": float(value), "log_likelihood": -float(value)}, "train_seconds": 1.0,
            "peak_memory_gb": None}


@pytest.fixture
def records():
    """Two data sets x two methods x three splits (seed 0 everywhere, as the UCI studies run)."""
    return [cell(d, m, s) for d in DATASETS for m in METHODS for s in range(SPLITS)]


def expected(values, reference) -> tuple[float, float, float]:
    """The paired difference's mean and 95 % interval, by numpy and statistics."""
    d = np.asarray(values) - np.asarray(reference)
    half = T_975_2 * statistics.stdev(d.tolist()) / math.sqrt(len(d))
    return float(np.mean(d)), float(np.mean(d)) - half, float(np.mean(d)) + half


def check_difference(found: dict, values, reference) -> None:
    mean, low, high = expected(values, reference)
    assert found["n"] == SPLITS
    assert found["mean"] == pytest.approx(mean, abs=1e-12)  # the t quantile: scipy's against a printed table
    assert (found["low"], found["high"]) == (pytest.approx(low, rel=1e-9), pytest.approx(high, rel=1e-9))


# ----------------------------------------------------------------------------- aggregation


@pytest.mark.parametrize("baseline, reference", [("method=mcdropout", "mcdropout"), ("method=bbb", "bbb")])
def test_a_baseline_of_some_axes_is_matched_within_each_data_set(records, baseline, reference):
    summary = aggregate(records, baseline)
    assert summary["baseline"] == baseline and summary["baseline_within"] == ["dataset"]
    entries = {entry["label"]: entry for entry in summary["labels"]}
    for dataset in DATASETS:
        for method in METHODS:
            entry = entries[label(dataset, method)]
            assert entry["baseline"] == label(dataset, reference)  # the same data set, never another
            if method == reference:
                assert entry["difference"] is None
            else:
                check_difference(entry["difference"]["rmse"], RMSE[dataset, method], RMSE[dataset, reference])


def test_a_full_label_is_one_baseline_for_every_label_in_any_order_of_its_pairs(records):
    full = label("uci-boston", "mcdropout")
    summary = aggregate(records, full)
    assert summary["baseline"] == full and summary["baseline_within"] == []
    reversed_pairs = aggregate(records, "method=mcdropout dataset=uci-boston")
    for entry, same in zip(summary["labels"], reversed_pairs["labels"]):
        assert entry["baseline"] == same["baseline"] == full
        assert entry["difference"] == same["difference"]
    concrete = next(entry for entry in summary["labels"] if entry["label"] == label("uci-concrete", "bbb"))
    check_difference(concrete["difference"]["rmse"], RMSE["uci-concrete", "bbb"], RMSE["uci-boston", "mcdropout"])
    assert [entry["difference"] is None for entry in summary["labels"]] == [True, False, False, False]


def test_a_label_whose_baseline_has_not_run_has_no_difference(records):
    records = [r for r in records if r["label"] != label("uci-concrete", "mcdropout")]
    entries = {entry["label"]: entry for entry in aggregate(records, "method=mcdropout")["labels"]}
    assert entries[label("uci-concrete", "bbb")]["baseline"] is None
    assert entries[label("uci-concrete", "bbb")]["difference"] is None
    assert entries[label("uci-boston", "bbb")]["difference"]["rmse"]["n"] == SPLITS


def test_values_with_spaces_are_read_by_axis_name():
    labels = {f"hidden={h} method={m}": {"hidden": h, "method": m} for h in ("800 800", "50") for m in METHODS}
    found = resolve_baseline("hidden=800 800", labels)
    assert found.axes == {"hidden": "800 800"} and found.within == ("method",)
    assert found.of["hidden=50 method=bbb"] == "hidden=800 800 method=bbb"


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize("baseline, named", [
    ("optimizer=adam", "names 'optimizer', not an axis"),
    ("method=laplace", "gives method=laplace, not a value of axis 'method'"),
    ("dataset=uci-boston method=laplace", "not a value of axis 'method'"),
    ("mcdropout", "is not a label of the study, nor NAME=VALUE"),
    ("method=bbb method=mcdropout", "gives axis 'method' twice"),
])
def test_a_baseline_that_matches_no_label_is_one_error_naming_it_and_the_fix(records, baseline, named, tmp_path):
    study = Study(base=["--hidden", "50"], vary={"dataset": list(DATASETS), "method": list(METHODS)}, splits=3,
                  baseline=baseline)
    for raising in (study.resolved_baseline, lambda: write_report(records, tmp_path / "s", baseline=baseline)):
        with pytest.raises(ValueError) as error:
            raising()
        message = str(error.value)
        assert message.startswith(f"--baseline {baseline!r} ") and named in message
        assert "dataset: uci-boston, uci-concrete; method: mcdropout, bbb" in message  # the fix lists the axes
        assert repr(label("uci-boston", "mcdropout")) in message  # and the labels
    assert not (tmp_path / "s").exists()


# ----------------------------------------------------------------------------- the report


def test_the_report_says_what_each_row_is_compared_with(records, tmp_path):
    screen = io.StringIO()
    write_report(records, tmp_path, baseline="method=mcdropout", console=Console(file=screen, width=250))
    printed = screen.getvalue()
    markdown = (tmp_path / "summary.md").read_text()
    rows = list(csv.DictReader(io.StringIO((tmp_path / "summary.csv").read_text())))
    summary = json.loads((tmp_path / "summary.json").read_text())

    compared = "the label with the same dataset and method=mcdropout"
    assert f"paired difference to {compared}" in " ".join(printed.split())  # the caption, however wrapped
    assert printed.count("(baseline)") == 2 * len(summary["main_metrics"])  # each data set's mcdropout, per column
    assert "## Paired differences to the baseline `method=mcdropout`" in markdown
    assert f"Each label is compared with {compared}" in markdown
    assert "| label | baseline | rmse |" in markdown
    assert (f"| {label('uci-concrete', 'bbb')} | {label('uci-concrete', 'mcdropout')} |" in markdown)
    for row in rows:
        dataset = row["label"].split()[0].removeprefix("dataset=")
        assert row["baseline"] == label(dataset, "mcdropout")
        if row["label"].endswith("bbb") and row["metric"] == "rmse":
            mean, low, high = expected(RMSE[dataset, "bbb"], RMSE[dataset, "mcdropout"])
            assert float(row["difference"]) == pytest.approx(mean, abs=1e-12)
            assert float(row["ci_low"]) == pytest.approx(low, rel=1e-9)
        elif row["label"].endswith("mcdropout"):
            assert row["difference"] == ""
    assert [entry["baseline"] for entry in summary["labels"]] == [label(d, "mcdropout") for d in DATASETS
                                                                  for _ in METHODS]


def test_a_full_label_reports_as_before(records, tmp_path):
    full = label("uci-boston", "mcdropout")
    screen = io.StringIO()
    write_report(records, tmp_path, baseline=full, console=Console(file=screen, width=250))
    markdown = (tmp_path / "summary.md").read_text()
    rows = list(csv.DictReader(io.StringIO((tmp_path / "summary.csv").read_text())))
    assert f"paired difference to {full!r}" in " ".join(screen.getvalue().split())
    assert screen.getvalue().count("(baseline)") == len(json.loads((tmp_path / "summary.json").read_text())
                                                        ["main_metrics"])
    assert f"## Paired differences to the baseline `{full}`" in markdown and "| label | rmse |" in markdown
    assert {row["baseline"] for row in rows} == {full}


@pytest.mark.parametrize("unit, replicates", [
    (lambda split: {"seed": 0, "split": split}, "splits"),
    (lambda split: {"seed": split, "split": None}, "seeds"),
    (lambda split: {"seed": split, "split": split}, "seeds and splits"),
    (lambda split: {"seed": None, "split": None} if split == 0 else None, "cells"),
])
def test_the_caption_names_the_replicates_that_vary(records, unit, replicates):
    kept = [{**r, **unit(r["split"])} for r in records if unit(r["split"]) is not None]
    caption = str(summary_table(aggregate(kept, "method=mcdropout"), ["rmse"]).caption)
    assert caption.startswith(f"mean ± standard error over {replicates}; ")


# ----------------------------------------------------------------------------- study and rebuild


def test_the_report_rebuilds_with_a_baseline_of_some_axes_and_refuses_an_unknown_one(tmp_path, capsys):
    study = Study(base=["--dataset", "two-moons", "--train-size", "60", "--test-size", "40", "--epochs", "1"],
                  vary={"hidden": ["8", "16"], "method": list(METHODS)}, seeds=3, baseline="method=mcdropout")
    assert study.resolved_baseline() == "method=mcdropout"  # as given
    out = tmp_path / "study"
    cells = study.cells()
    write_study(out, study.to_dict(), study.resolved_baseline(), cells)
    for index, found in enumerate(cells):  # each cell's results, as `pyrobnn train` writes them
        found.directory(out).mkdir(parents=True)
        (found.directory(out) / "metrics.json").write_text(json.dumps({"test": {"rmse": 1.0 + index ** 2 / 10}}))
    with pytest.raises(SystemExit) as exit_:
        main(["study", "report", str(out), "--baseline", "hidden=32"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --baseline 'hidden=32' ") and "hidden: 8, 16" in err[0], err
    assert not (out / "summary.md").exists()

    rebuild_report(out, console=Console(file=io.StringIO()))  # study.json's baseline, as given
    entries = {entry["label"]: entry for entry in json.loads((out / "summary.json").read_text())["labels"]}
    assert json.loads((out / "study.json").read_text())["baseline"] == "method=mcdropout"
    rmse = {found.label: [] for found in cells}
    for index, found in enumerate(cells):
        rmse[found.label].append(1.0 + index ** 2 / 10)
    for hidden in ("8", "16"):
        difference = entries[f"hidden={hidden} method=bbb"]["difference"]["rmse"]
        mean, low, high = expected(rmse[f"hidden={hidden} method=bbb"], rmse[f"hidden={hidden} method=mcdropout"])
        assert difference["mean"] == pytest.approx(mean, abs=1e-12) and difference["low"] == pytest.approx(low)
