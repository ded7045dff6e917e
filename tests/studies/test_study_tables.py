"""Studies on your own data: a table cross-validated by ``--splits`` (the split in each cell's key), arrays held in
Python written once to the study's folder and run on worker processes, every cell's data checked before anything
runs, and the default baseline matched within each data set."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from pyrobnn.cli import parse_config
from pyrobnn.cli.options import MCMCConfig, RunConfig
from pyrobnn.studies import Study
from pyrobnn.studies.baseline import resolve_baseline
from pyrobnn.studies.cells import cache_key

TINY = ["--hidden", "8", "--epochs", "2", "--batch-size", "32", "--num-samples", "4"]


def table(tmp_path, name: str = "t.csv", rows: int = 40) -> str:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 2))
    text = "a,b,y\n" + "".join(f"{a:.4f},{b:.4f},{a - 2 * b + 0.1 * rng.normal():.4f}\n" for a, b in x)
    (tmp_path / name).write_text(text)
    return f"csv:{tmp_path / name}"


def test_splits_of_a_table_are_folds_each_a_cell_of_its_own(tmp_path):
    study = Study(base=["--dataset", table(tmp_path), *TINY], vary={"method": ["map", "mcdropout"]}, splits=5)
    cells = study.cells()
    assert [cell.split for cell in cells] == [0, 1, 2, 3, 4] * 2
    assert len({cell.key for cell in cells}) == 10 and all("--split" in cell.argv for cell in cells)


def test_cells_cached_before_the_data_options_existed_keep_their_keys():
    """The keys of d96a161, before --data.target and the other table options: a UCI cell of studies/uci.toml and a
    NUTS cell keep theirs (their cached runs are found); setting one of the options makes a new key. (The UCI cell
    trained with the noise 0.1, then the default: it names it now that an unset noise is learned.)"""
    argv = ["--dataset", "uci-boston", "--method", "mcdropout", "--split", "3", "--likelihood.scale", "0.1"]
    assert cache_key("train", parse_config(RunConfig, argv, "pyrobnn train")) == "02ced9d8237d"
    assert cache_key("mcmc", parse_config(MCMCConfig, ["--dataset", "uci-boston"], "pyrobnn mcmc")) == "01767b255a59"
    seeded = parse_config(RunConfig, [*argv, "--data.seed", "0"], "pyrobnn train")  # set, even to the rule's value
    assert cache_key("train", seeded) != "02ced9d8237d"


@pytest.mark.slow
def test_a_study_on_arrays_in_memory_runs_on_two_worker_processes(tmp_path):
    """The arrays are written once, named by their content, to the study's folder, where the spawned workers (which
    cannot see this process's memory) read them; the same content makes the same cells, other content new ones."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(60, 3))
    y = x @ np.array([1.0, 0.5, -1.0])  # (N,): one output
    study = Study(base=[*TINY, "--data.folds", "2"], data=(x, y), vary={"method": ["mcdropout"]}, splits=2)
    records = study.run(tmp_path / "arrays", workers=2, progress=False)
    assert [r["status"] for r in records] == ["done"] * 2 and all(r["metrics"]["rmse"] > 0 for r in records)
    written = list((tmp_path / "arrays" / "data").glob("*.npz"))
    assert len(written) == 1 and all(f"npz:{written[0]}" in r["command"] for r in records)
    again = study.replace(data=(x.copy(), y.copy()), out=tmp_path / "arrays")
    assert [c.key for c in again.cells()] == [r["key"] for r in records]
    changed = again.replace(data=(x, 2 * y))
    assert not {c.key for c in changed.cells()} & {r["key"] for r in records}


def test_every_cell_is_checked_before_anything_is_written(tmp_path):
    out = tmp_path / "study"
    with pytest.raises(FileNotFoundError, match="nothing.csv: no such file"):
        Study(base=["--dataset", f"csv:{tmp_path / 'nothing.csv'}", *TINY], vary={"method": ["map"]}).run(out)
    rows = "a,y\n" + "".join(f"{i},{'p' if i != 5 else 'q'}\n" for i in range(12))
    (tmp_path / "rare.csv").write_text(rows)  # the one row of class q is tested by one of the three folds
    with pytest.raises(ValueError, match=r"study cell 'map' split \d: .*class 'q'"):
        Study(base=["--dataset", f"csv:{tmp_path / 'rare.csv'}", "--data.folds", "3", *TINY],
              vary={"method": ["map"]}, splits=3).run(out)
    with pytest.raises(ValueError, match="column 'b'"):
        Study(base=TINY, data={"a": [1.0, 2.0, 3.0], "b": [1.0, float("nan"), 2.0], "y": [0.0, 1.0, 2.0]})
    with pytest.raises(ValueError, match="data= and --dataset"):
        Study(base=["--dataset", "two-moons"], data={"a": [1.0, 2.0], "y": [0.0, 1.0]})
    assert not out.exists()


def test_the_default_baseline_is_the_first_method_of_each_data_set(tmp_path):
    study = Study(base=TINY, vary={"dataset": [table(tmp_path, "a.csv"), table(tmp_path, "b.csv")],
                                   "method": ["mcdropout", "map"]})
    baseline = study.resolved_baseline()
    assert baseline == "method=mcdropout"
    axes = [dict(zip(study.vary, values)) for values in itertools.product(*study.vary.values())]
    compared = resolve_baseline(baseline, dict(zip(study.labels(), axes))).of
    for label, values in zip(study.labels(), axes):
        assert compared[label] == f"dataset={values['dataset']} method=mcdropout"
    one_axis = Study(base=TINY, vary={"method": ["mcdropout", "map"]})
    assert one_axis.resolved_baseline() == "mcdropout"  # as before: the first label
    explicit = study.replace(baseline="method=map")
    assert explicit.resolved_baseline() == "method=map"


def test_only_the_cells_whose_noise_became_learned_by_default_change_their_keys(tmp_path):
    """A regression that leaves its noise unset, which was fixed at 0.1 and is now learned (pyrobnn.cli.noise),
    trains again under a new key; the cells whose run did not change keep the keys they had before (computed at
    c33612f): a classifier, a UCI cell whose noise --grid protocol chooses, a heteroscedastic regression. A table's
    task is read from it: a regression table is keyed as learning its noise, a classification table is not."""
    def key(*argv):
        return cache_key("train", parse_config(RunConfig, list(argv), "pyrobnn train"))

    uci = ["--dataset", "uci-boston", "--method", "mcdropout", "--split", "3"]
    assert key(*uci) != "02ced9d8237d"  # its key when the unset noise was 0.1
    assert key(*uci) != key(*uci, "--likelihood.scale", "1.0", "--likelihood.learn-scale")
    assert key(*uci, "--grid", "protocol") == "c762009f229f"
    assert key("--dataset", "mnist", "--method", "bbb") == "13c625caf759"
    assert key("--dataset", "uci-boston", "--likelihood", "heteroscedastic") == "e8fcd16d290d"
    assert key("--dataset", "sinusoid", "--likelihood.scale", "0.1") == "3aab3830901f"
    regression = table(tmp_path)
    (tmp_path / "labels.csv").write_text("a,b,y\n" + "".join(f"{i},{i % 3},{i % 2}\n" for i in range(40)))
    for name, learned in ((regression, True), (f"csv:{tmp_path / 'labels.csv'}", False)):
        config = parse_config(RunConfig, ["--dataset", name], "pyrobnn train")
        unset = cache_key("train", config)
        config.likelihood.scale = 0.1
        assert (unset != cache_key("train", config)) == learned
