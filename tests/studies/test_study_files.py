"""The study files in ``studies/``: each runs at a CI size (a few training examples, one epoch, one seed), every cell
to a test report; a study file named after an example lists that example's methods, one value each."""

from __future__ import annotations

import ast
import io
import math
import sys
from pathlib import Path

import pytest
from rich.console import Console

from pyrobnn.studies import load_study

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from tests.support import ROOT

STUDY_FILES = sorted((ROOT / "studies").glob("*.toml"))
RUN_BY_TEST_UCI = {"uci", "uci_quick"}
"""Study files whose every method ``tests/data/test_uci.py`` runs at CI size through the study engine (on Yacht): here
they would run again on all five data sets (35 and 10 cells, 3 of the suite's minutes on 2 cores)."""
TINY = ["--train-size", "64", "--test-size", "16", "--epochs", "2", "--num-samples", "4", "--device", "cpu"]
"""Added to every study's base: later arguments win, so the file's sizes give way (an axis value that sets its own
--num-samples 1 keeps it). Two epochs: SWAG collects the iterates of two."""
TINY_MCMC = ["--warmup", "4", "--num-samples", "8", "--num-chains", "2", "--max-tree-depth", "3", "--grid-samples", "4"]
"""Added as well where every cell samples (``pyrobnn mcmc``: --num-samples is its draws per chain)."""


def example_methods(path: Path) -> tuple[str, ...]:
    """``METHODS`` of the example named like the study file (read from its source, not run)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["METHODS"]:
            return ast.literal_eval(node.value)
    raise AssertionError(f"{path} has no METHODS tuple")


def test_there_are_study_files():
    assert {path.stem for path in STUDY_FILES} >= {"bbb_mnist", "sparse_vd_mnist", "vdp_mnist", "sinusoid_regression"}


@pytest.mark.slow
@pytest.mark.parametrize("path", [p for p in STUDY_FILES if p.stem not in RUN_BY_TEST_UCI], ids=lambda path: path.stem)
def test_a_study_file_runs_every_cell_at_a_tiny_size(path, data_root, tmp_path):
    study = load_study(path)
    one = study.replace(seeds=None if study.seeds is None else 1, splits=None if study.splits is None else 1)
    sampling = all(cell.command == "mcmc" for cell in one.cells())  # one replicate: every cell parsed once, not x20
    tiny = one.replace(base=(*one.base, *TINY, *(TINY_MCMC if sampling else ()), "--data-root", str(data_root)))
    records = tiny.run(tmp_path / "study", progress=False, console=Console(file=io.StringIO()))
    assert [r["label"] for r in records] == tiny.labels()
    assert all(r["status"] == "done" for r in records), [(r["label"], r["error"]) for r in records]
    for r in records:
        score = r["metrics"].get("accuracy", r["metrics"].get("rmse"))
        assert score is not None and math.isfinite(score) and math.isfinite(r["metrics"]["nll"])
    assert (tmp_path / "study" / "summary.json").exists()


@pytest.mark.parametrize("path", [p for p in STUDY_FILES if (ROOT / "examples" / f"{p.stem}.py").exists()],
                         ids=lambda path: path.stem)
def test_an_example_study_has_a_first_axis_with_a_value_per_method_of_its_example(path):
    study = load_study(path)
    methods = example_methods(ROOT / "examples" / f"{path.stem}.py")
    axis, values = next(iter(study.vary.items()))
    assert len(values) == len(methods), f"{path.name}: [vary] {axis} names {len(methods)} methods, in order"
    baseline = study.resolved_baseline()  # raises unless it names a label, or some axes' values of the labels
    assert baseline in study.labels() or "=" in baseline


def study_file(path: Path) -> dict:
    return tomllib.loads(path.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("path, configuration", [(p, c) for p in STUDY_FILES
                                                 for c in list(study_file(p).get("configurations", {})) or [None]],
                         ids=lambda value: value.stem if isinstance(value, Path) else str(value))
def test_every_configuration_of_a_study_file_parses_its_cells(path, configuration):
    study = load_study(path, configuration)
    one = study.replace(seeds=None if study.seeds is None else 1, splits=None if study.splits is None else 1)
    assert study.configuration == configuration and len(one.cells()) == len(study.labels())
    baseline = study.resolved_baseline()  # raises unless it names a label, or some axes' values of the labels
    assert baseline in study.labels() or "=" in baseline


@pytest.mark.parametrize("path", [p for p in STUDY_FILES if "published" in study_file(p)], ids=lambda path: path.stem)
def test_every_published_figure_of_a_study_file_is_beside_a_label_of_one_of_its_configurations(path):
    document = study_file(path)
    shown = set()
    for configuration in document.get("configurations", {}) or [None]:
        published = load_study(path, configuration).published
        assert not published or published["source"] == document["published"]["source"]
        shown |= set(published)
    assert shown == set(document["published"])
