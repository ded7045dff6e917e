"""Five methods compared on a table by K-fold cross-validation: your own CSV, Parquet or .npz file, or scikit-learn's
diabetes data (442 patients, 10 inputs, a disease-progression score) written as CSV.

MAP, MC dropout, Bayes by Backprop, a deep ensemble of 5 and the last-layer Laplace approximation, each trained on
the training folds of every split (``--splits``, default 5) and tested on the held-out fold: one ``pyrobnn study``
(:class:`pyrobnn.studies.Study`), cached in ``--out`` (a second run trains nothing; an interrupted one resumes), on
``--workers`` local processes or a Dask cluster (``--executor dask``). For a regression target the likelihood's
noise (``--likelihood.scale``, in standardised units) is chosen per cell on the last 20 % of the fold's training rows
(``--grid``), never on its test fold. Prints the study's table (mean ± standard error over the folds, each method's
paired difference to MAP) and one JSON line last: per method, the mean test metrics in the target's original units.

    python examples/table_study.py                                      # diabetes, 5 folds
    python examples/table_study.py --table houses.csv --target price --workers 2
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from pyrobnn.data import Columns, load_dataset
from pyrobnn.data.tables import table_source
from pyrobnn.studies import Study

METHODS = ("map", "mcdropout", "bbb", "ensemble-5", "laplace")
NOISE_GRID = "likelihood.scale=0.4,0.7,1.0"
"""Noise scales tried on each fold's held-out training rows (a regression target is standardised: 1 is its spread)."""


def diabetes_csv(path: Path) -> Path:
    """scikit-learn's diabetes data (in its original units) as a CSV file, the target ``progression`` last."""
    from sklearn.datasets import load_diabetes

    data = load_diabetes(scaled=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*data.feature_names, "progression"])
        writer.writerows([*row, target] for row, target in zip(data.data, data.target))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", type=Path, default=None, help="a CSV, Parquet or .npz table (default: diabetes)")
    parser.add_argument("--target", default=None, help="the column to predict (default: the last)")
    parser.add_argument("--splits", type=int, default=5, help="folds: each method is tested on every one")
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--hidden", type=int, default=50, help="units of the one hidden layer")
    parser.add_argument("--out", type=Path, default=Path("runs/table_study"))
    parser.add_argument("--workers", type=int, default=1, help="cells run at once")
    parser.add_argument("--executor", choices=("local", "dask"), default="local")
    parser.add_argument("--force", action="store_true", help="train every cell again, cached or not")
    args = parser.parse_args()

    table = args.table or diabetes_csv(args.out / "diabetes.csv")
    name = str(table) if table_source(str(table)) else f"csv:{table}"  # .csv, .parquet, .npz: by their ending
    columns = ["--data.target", args.target] if args.target else []
    task = load_dataset(name, columns=Columns(target=args.target)).task
    base = ["--dataset", name, *columns, "--hidden", args.hidden, "--epochs", args.epochs, "--batch-size", "32",
            "--data.folds", args.splits, "--num-samples", "50"]
    if task == "regression":
        base += ["--grid", NOISE_GRID]
    study = Study(base=base, vary={"method": list(METHODS)}, splits=args.splits, name="table_study")
    records = study.run(args.out, workers=args.workers, executor=args.executor, force=args.force)
    metrics = ("rmse", "log_likelihood") if task == "regression" else ("accuracy", "nll", "ece")
    summary = {}
    for method in METHODS:
        done = [r["metrics"] for r in records if r["label"] == method and r["status"] == "done"]
        summary[method] = {m: sum(d[m] for d in done) / len(done) for m in metrics} if done else None
    print(json.dumps({"table": str(table), "task": task, "folds": args.splits, "mean_test": summary}))


if __name__ == "__main__":
    main()
