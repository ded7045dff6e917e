"""
Your own data
=============

A table is a data set like the built-in ones: ``--dataset csv:PATH`` for ``pyrobnn train`` and ``pyrobnn study``,
``load_dataset("csv:PATH")`` in Python (also Parquet and ``.npz``). The target is the last column unless
``--data.target`` names another; text columns are one-hot encoded; a regression target and the inputs are
standardised on the training rows, and the metrics come back in the target's units. ``--split i`` tests fold i of
K (``--data.folds``), so ``--splits K`` in a study is K-fold cross-validation. Here scikit-learn's diabetes data
(442 patients, 10 inputs, a disease-progression score), written as a CSV file, and MAP, MC dropout and Bayes by
Backprop compared by cross-validation.

The output on this page is from its CI size (``PYROBNN_TUTORIAL_SIZE=ci``: 3 folds, 100 epochs); its running time
is at the foot of the page. Run the script without it for the full size (5 folds).
"""

# %%
import csv
import os
import statistics
import tempfile
from pathlib import Path

from sklearn.datasets import load_diabetes

from pyrobnn.data import load_dataset
from pyrobnn.studies import Study

CI = os.environ.get("PYROBNN_TUTORIAL_SIZE") == "ci"
FOLDS, EPOCHS = (3, 100) if CI else (5, 100)

folder = Path(tempfile.mkdtemp())
table = folder / "diabetes.csv"
raw = load_diabetes(scaled=False)
with open(table, "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow([*raw.feature_names, "progression"])
    writer.writerows([*row, target] for row, target in zip(raw.data, raw.target))
print(table.read_text().splitlines()[:3])

# %%
# What pyrobnn reads from it: a regression of ``progression`` on the ten other
# columns, fold 0 of 5 held out.
data = load_dataset(f"csv:{table}", split=0)
print(data.task, data.features, data.x_train.shape, data.x_test.shape)

# %%
# The same table in a cross-validated study: every method on every fold, the report's
# mean ± standard error over the folds and each method's paired difference to MAP,
# fold by fold.
study = Study(
    base=[
        "--dataset",
        f"csv:{table}",
        "--hidden",
        "50",
        "--epochs",
        str(EPOCHS),
        "--batch-size",
        "32",
        "--data.folds",
        str(FOLDS),
        "--num-samples",
        "50",
    ],
    vary={"method": ["map", "mcdropout", "bbb"]},
    splits=FOLDS,
    baseline="method=map",
)
records = study.run(folder / "study", progress=False)
spread = statistics.pstdev(raw.target)
print(f"{'the mean':10s} RMSE {spread:6.1f}   (the target's standard deviation)")
for method in study.vary["method"]:
    done = [
        r["metrics"]
        for r in records
        if r["axes"]["method"] == method and r["status"] == "done"
    ]
    rmse = sum(d["rmse"] for d in done) / len(done)
    print(
        f"{method:10s} RMSE {rmse:6.1f}   log-likelihood "
        f"{sum(d['log_likelihood'] for d in done) / len(done):6.2f}"
    )
    # The page's claim, checked as it runs: every fold ran, and each method predicts
    # the progression well below the error of predicting its mean.
    assert len(done) == FOLDS and rmse < 0.8 * spread, (method, len(done), rmse)

# %%
# Each fold's test RMSE, method by method, against the error of predicting the mean.
import matplotlib.pyplot as plt  # noqa: E402

fig, ax = plt.subplots(figsize=(6, 3.2))
for i, method in enumerate(study.vary["method"]):
    folds = [r["metrics"]["rmse"] for r in records if r["axes"]["method"] == method]
    ax.scatter([i] * len(folds), folds, s=25)
ax.axhline(spread, color="0.5", ls="--", label="predicting the mean")
ax.set_xticks(range(len(study.vary["method"])), study.vary["method"])
ax.set_ylabel("test RMSE per fold")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %%
# Arrays you hold in Python are data too: ``Study(..., data=(x, y))`` writes them
# once to the study's folder, where every worker reads them. The study's own report
# is in its folder (``summary.md`` and the plots); its rows of the test
# log-likelihood, whole (metric | method | folds | mean ± s.e. | difference to MAP
# [95 % interval]):
summary = (folder / "study" / "summary.md").read_text().splitlines()
print("\n".join(line for line in summary if line.startswith("| log_likelihood |")))
