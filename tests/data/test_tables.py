"""Your own data: scikit-learn's diabetes (regression) and breast-cancer (classification) tables written as CSV,
Parquet and ``.npz`` load alike and train; splits by test fraction and by K folds; the auto task rule, one-hot
columns, arrays with targets (N,) or (N, 1), a Python function's arrays, class folders split as a table; and every
kind of bad input is one line naming the file, row or column and the fix, with nothing written."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
from PIL import Image
from sklearn.datasets import load_breast_cancer, load_diabetes

from pyrobnn.__main__ import main
from pyrobnn.cli import _parse
from pyrobnn.cli.train import train as run_train
from pyrobnn.data import Columns, load_dataset, save_arrays
from pyrobnn.data.splits import holdout_size, split_rows

FORMATS = ("csv", "parquet", "npz")

FAST = ["--hidden", "32", "--batch-size", "64", "--num-samples", "10", "--compile", "trace", "--no-progress"]
"""A small network, few samples and the recorded step: a run of 100 epochs on diabetes takes about 2 s."""


def write_table(folder, name: str, columns: dict) -> dict[str, str]:
    """``columns`` as ``<name>.csv``, ``.parquet`` and ``.npz``; returns ``{format: dataset name}``."""
    with open(folder / f"{name}.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        writer.writerows(zip(*columns.values()))
    save_arrays(folder / f"{name}.npz", columns)
    names = {"csv": f"csv:{folder / name}.csv", "npz": f"npz:{folder / name}.npz"}
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:  # the tables extra is not installed: Parquet is skipped
        return names
    pq.write_table(pa.table({k: list(v) for k, v in columns.items()}), folder / f"{name}.parquet")
    return {**names, "parquet": f"parquet:{folder / name}.parquet"}


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    """Diabetes (442 rows, 10 numbers, the target last) and breast cancer (569 rows, 30 numbers, the diagnosis as
    text) in every format, and the diabetes target's standard deviation."""
    folder = tmp_path_factory.mktemp("tables")
    diabetes, cancer = load_diabetes(scaled=False), load_breast_cancer()
    return {
        "diabetes": write_table(folder, "diabetes", {**dict(zip(diabetes.feature_names, diabetes.data.T)),
                                                     "progression": diabetes.target}),
        "cancer": write_table(folder, "cancer", {**dict(zip(cancer.feature_names, cancer.data.T)),
                                                 "diagnosis": cancer.target_names[cancer.target]}),
        "target": diabetes.target, "folder": folder,
    }


def dataset(sets, name: str, fmt: str) -> str:
    if fmt not in sets[name]:
        pytest.skip(f"{fmt} needs pyarrow (pip install 'pyrobnn[tables]')")
    return sets[name][fmt]


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_loads_the_same_split_standardised_on_its_training_rows(sets, fmt):
    data = load_dataset(dataset(sets, "diabetes", fmt), split=2)
    reference = load_dataset(sets["diabetes"]["csv"], split=2)
    train, test = split_rows(442, split=2)
    assert data.task == "regression" and data.x_train.shape == (len(train), 10) and data.y_test.shape == (len(test), 1)
    assert data.features == ("age", "sex", "bmi", "bp", "s1", "s2", "s3", "s4", "s5", "s6")
    for part in ("x_train", "y_train", "x_test", "y_test", "y_mean", "y_std"):
        assert torch.allclose(getattr(data, part), getattr(reference, part)), part
    target = sets["target"]  # the statistics are the training rows' alone; test metrics go back to these units
    assert data.y_mean.item() == pytest.approx(target[train].mean()) and data.y_std.item() == pytest.approx(
        target[train].std())
    assert np.allclose(data.y_test[:, 0] * data.y_std + data.y_mean, target[test], atol=1e-3)
    assert data.x_train.mean(0).abs().max() < 1e-5 and data.x_test.mean(0).abs().max() > 1e-3
    cancer = load_dataset(dataset(sets, "cancer", fmt))
    assert cancer.task == "classification" and cancer.classes == ("benign", "malignant") and cancer.num_outputs == 2
    assert len(cancer.x_test) == round(0.2 * 569) and cancer.y_train.dtype == torch.int64 and cancer.y_std is None


@pytest.mark.recorded
@pytest.mark.parametrize("fmt", FORMATS)
def test_training_from_every_format_learns(sets, fmt, tmp_path):
    """MC dropout after 100 epochs: the diabetes test RMSE (in the target's units) is below the target's standard
    deviation; 10 epochs classify the breast-cancer test rows at more than 90 %."""
    regression = run_train(_parse(["train", "--dataset", dataset(sets, "diabetes", fmt), "--method", "mcdropout",
                               "--epochs", "100", *FAST, "--out", str(tmp_path / "diabetes")]))
    assert regression["rmse"] < sets["target"].std()
    classification = run_train(_parse(["train", "--dataset", dataset(sets, "cancer", fmt), "--method", "mcdropout",
                                   "--epochs", "10", *FAST, "--out", str(tmp_path / "cancer")]))
    assert classification["accuracy"] > 0.9


def test_the_folds_test_every_row_once_and_the_seed_draws_the_order():
    tested = [split_rows(23, split=i, folds=4) for i in range(4)]
    assert sorted(np.concatenate([test for _, test in tested]).tolist()) == list(range(23))
    for train, test in tested:
        assert len(train) + len(test) == 23 and not set(train) & set(test) and len(test) in (5, 6)
    assert np.array_equal(split_rows(23, split=1, folds=4)[1], tested[1][1])  # fixed by the seed
    assert not np.array_equal(split_rows(23, split=1, folds=4, seed=1)[1], tested[1][1])
    train, test = split_rows(23, test_fraction=0.3)
    assert len(test) == 7 and sorted([*train, *test]) == list(range(23))


def test_the_grid_chooses_on_the_training_rows_of_a_fold(sets, tmp_path):
    """--grid on a fold: every point trains on the first 80 % of the fold's training rows (standardised on them)
    and is scored on the last 20 %; the test fold is not among them."""
    name = sets["diabetes"]["csv"]
    held = load_dataset(name, split=1, validation=True)
    train, _ = split_rows(442, split=1)
    keep = holdout_size(len(train))
    original = torch.cat([held.y_train, held.y_test])[:, 0] * held.y_std + held.y_mean
    assert np.allclose(original, sets["target"][train], atol=1e-3) and len(held.y_train) == keep
    assert held.y_train.mean().abs() < 1e-5  # standardised on the 80 %
    metrics = run_train(_parse(["train", "--dataset", name, "--split", "1", "--method", "mcdropout", "--epochs", "2",
                                *FAST, "--grid", "tau=0.0001,0.001", "--out", str(tmp_path / "grid")]))
    selection = json.loads((tmp_path / "grid" / "metrics.json").read_text())["selection"]
    assert selection["fit_size"] == keep and selection["held_out_size"] == len(train) - keep
    assert len(selection["points"]) == 2 and "rmse" in metrics


def test_text_columns_are_one_hot_and_the_auto_task_rule(tmp_path):
    table = tmp_path / "mixed.csv"
    table.write_text("colour;size;grade;score\n" + "".join(
        f"{'red green blue'.split()[i % 3]};{i * 0.5};{1 + i % 4};{i % 3 + 0.25 * i}\n" for i in range(20)))
    data = load_dataset(str(table))  # a bare path ending in .csv; ; as the delimiter; the last column: a number
    assert data.task == "regression" and data.features == ("colour=blue", "colour=green", "colour=red", "size",
                                                           "grade")
    grade = load_dataset(f"csv:{table}", columns=Columns(target="grade"))  # whole numbers, 4 values: classes
    assert grade.task == "classification" and grade.classes == ("1", "2", "3", "4")
    colour = load_dataset(f"csv:{table}", columns=Columns(target="colour", categorical=("grade",)))
    assert colour.classes == ("blue", "green", "red") and colour.input_shape == (6,)
    forced = load_dataset(f"csv:{table}", columns=Columns(target="grade", task="regression",
                                                          features=("size",)))
    assert forced.task == "regression" and forced.features == ("size",) and forced.y_std is not None


def test_arrays_take_single_output_targets_of_shape_n_or_n_1_and_images(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 3))
    y = x @ np.array([1.0, -2.0, 0.5]) + 0.1 * rng.normal(size=40)
    flat, column = (load_dataset(f"npz:{save_arrays(tmp_path / f'{name}.npz', (x, target))}", split=0)
                    for name, target in (("flat", y), ("column", y[:, None])))
    assert flat.y_train.shape == (32, 1) and flat.num_outputs == 1 and flat.features == ("x0", "x1", "x2")
    assert torch.equal(flat.y_train, column.y_train) and torch.equal(flat.x_test, column.x_test)
    images = rng.integers(0, 256, size=(30, 6, 5), dtype=np.uint8)
    pictures = load_dataset(f"npz:{save_arrays(tmp_path / 'images.npz', {'x': images, 'y': np.arange(30) % 3})}")
    assert pictures.input_shape == (1, 6, 5) and pictures.classes == ("0", "1", "2") and pictures.x_train.max() <= 1


def test_a_python_function_is_a_dataset(tmp_path, monkeypatch):
    (tmp_path / "my_tables.py").write_text(
        "import numpy as np\n"
        "def load():\n"
        "    x = np.linspace(-1, 1, 50)[:, None]\n"
        "    return {'x': x[:, 0], 'noise': np.cos(7 * x[:, 0]), 'y': 3 * x[:, 0] ** 2}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    data = load_dataset("py:my_tables:load", split=4, folds=5)
    assert data.task == "regression" and data.features == ("x", "noise") and len(data.x_test) == 10
    with pytest.raises(ValueError, match="my_tables has no loader"):
        load_dataset("py:my_tables:loader")


def test_class_folders_are_split_like_a_table(tmp_path):
    rng = np.random.default_rng(0)
    for label in ("cat", "dog"):
        (tmp_path / "pets" / label).mkdir(parents=True)
        for i in range(5):
            Image.fromarray(rng.integers(0, 256, (4, 4), dtype=np.uint8), "L").save(tmp_path / "pets" / label /
                                                                                      f"{i}.png")
    folds = [load_dataset(f"folder:{tmp_path / 'pets'}", split=i, folds=5) for i in range(5)]
    assert all(len(fold.x_test) == 2 and len(fold.x_train) == 8 for fold in folds)
    tested = torch.cat([fold.x_test.flatten(1) for fold in folds])
    assert len(torch.unique(tested, dim=0)) == 10  # every image tested once
    assert folds[0].classes == ("cat", "dog") and folds[0].input_shape == (1, 4, 4)


# ----------------------------------------------------------------------------- bad input


def write(tmp_path, name: str, text: str) -> str:
    (tmp_path / name).write_text(text)
    return f"csv:{tmp_path / name}"


BAD = {
    # case: (the file's text or None for no file, extra arguments, what the line must name)
    "a missing file": (None, [], ["no such file", "nothing.csv"]),
    "a missing target column": ("a,b,y\n1,2,3\n4,5,6\n", ["--data.target", "z"],
                                ["no column 'z'", "--data.target", "'a', 'b', 'y'"]),
    "a non-numeric cell": ("a,b,y\n1,2,3\n4,x,6\n7,8,9\n", [], ["line 3, column 'b'", "'x' is not a number",
                                                                "fix the cell"]),
    "a NaN cell": ("a,b,y\n1,2,3\n4,NaN,6\n7,8,9\n", [], ["line 3, column 'b'", "'NaN'", "fill the cell"]),
    "an empty cell": ("a,b,y\n1,2,3\n4,,6\n7,8,9\n", [], ["line 3, column 'b'", "empty", "drop the row"]),
    "an empty file": ("", [], ["is empty", "header row"]),
    "a target of one value": ("a,y\n1,5\n2,5\n3,5\n", [], ["column 'y'", "one value, 5", "--data.target"]),
    "a class absent from the training rows": ("a,y\n" + "".join(f"{i},{'p' if i != 2 else 'q'}\n" for i in range(12)),
                                              ["--split", "{fold}", "--data.folds", "3"],
                                              ["class 'q'", "training rows of split", "--data.seed"]),
    "--split out of range": ("a,y\n" + "".join(f"{i},{i * 0.5}\n" for i in range(12)), ["--split", "5"],
                             ["--split 5 is out of range", "--data.folds 5", "0..4"]),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_one_line_naming_it_and_the_fix_and_writes_nothing(case, tmp_path, capsys):
    text, extra, named = BAD[case]
    name = write(tmp_path, "table.csv", text) if text is not None else f"csv:{tmp_path / 'nothing.csv'}"
    if "{fold}" in extra:  # the fold whose test rows hold the one row of class 'q' (row 2)
        extra = [str(next(i for i in range(3) if 2 in split_rows(12, split=i, folds=3)[1])) if a == "{fold}" else a
                 for a in extra]
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--dataset", name, *extra, "--epochs", "1", "--out", str(out)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and err.startswith("error: "), err
    for part in named:
        assert part in err, (part, err)
    assert not out.exists()
