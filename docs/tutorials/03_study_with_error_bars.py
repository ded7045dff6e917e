"""
A study with error bars
=======================

Is MC dropout better calibrated than Bayes by Backprop on this problem, or is the difference seed-to-seed noise?
A :class:`~pyrobnn.studies.Study` answers with one object: a base ``pyrobnn train`` run, the axes to vary, and
seeds. Every cell is a command line, checked before anything runs and cached in the study's folder (a second run
trains nothing); the report gives each method its mean ± standard error over the seeds and its paired difference
to the baseline with a 95 % interval.

The same study from a shell::

    pyrobnn study --dataset two-moons --hidden 32 32 --epochs 300 --vary method=map,mcdropout,bbb --seeds 5

The output on this page is from its CI size (``PYROBNN_TUTORIAL_SIZE=ci``: 3 seeds); its running time is at the
foot of the page. Run the script without it for the full size (5 seeds).
"""

# %%
import os
import tempfile

import matplotlib.pyplot as plt

from pyrobnn.studies import Study

CI = os.environ.get("PYROBNN_TUTORIAL_SIZE") == "ci"
EPOCHS, SEEDS = (300, 3) if CI else (300, 5)

study = Study(
    base=[
        "--dataset",
        "two-moons",
        "--hidden",
        "32",
        "32",
        "--epochs",
        str(EPOCHS),
        "--num-samples",
        "20",
    ],
    vary={"method": ["map", "mcdropout", "bbb"]},
    seeds=SEEDS,
    baseline="method=map",
)
# a study's folder: cells/, records.jsonl, summary.md, plots
out = os.path.join(tempfile.mkdtemp(), "moons")
records = study.run(out, progress=False)
print(len(records), "cells;", sorted({r["status"] for r in records}))
assert len(records) == 3 * SEEDS and all(r["status"] == "done" for r in records)

# %%
# ``records`` holds one dict per cell: its axes, seed, status and test ``metrics``.
# The report's plots are in the folder (``metrics.png``, ``accuracy_vs_ece.png``,
# ``reliability.png``); here the NLL per method with its standard error, from the
# records themselves.
import statistics  # noqa: E402

methods = study.vary["method"]
fig, axes = plt.subplots(1, 2, figsize=(8, 3))
for ax, metric in zip(axes, ["nll", "ece"]):
    values = [
        [r["metrics"][metric] for r in records if r["axes"]["method"] == m]
        for m in methods
    ]
    means = [statistics.mean(v) for v in values]
    errors = [statistics.stdev(v) / len(v) ** 0.5 for v in values]
    ax.bar(
        methods,
        means,
        yerr=errors,
        capsize=4,
        color=["0.6", "tab:blue", "tab:orange"],
    )
    ax.set_title(f"test {metric.upper()} (mean ± s.e., {SEEDS} seeds)", fontsize=10)
fig.tight_layout()
plt.show()

# %%
# The answer to the opening question: ECE of MC dropout minus ECE of BBB, seed by
# seed (the same seed trains both on the same data), with its 95 % Student-t interval
# (:func:`~pyrobnn.studies.aggregate.paired_difference`). An interval that contains 0
# says the difference is seed-to-seed noise at this size; the printed verdict below
# is computed, not written in advance.
from pyrobnn.studies.aggregate import paired_difference  # noqa: E402

ece = {
    m: {r["seed"]: r["metrics"]["ece"] for r in records if r["axes"]["method"] == m}
    for m in methods
}
difference = paired_difference(ece["mcdropout"], ece["bbb"])
print(
    f"ECE, MC dropout - BBB: {difference.mean:+.4f} over {difference.n} seeds, "
    f"95 % interval [{difference.low:+.4f}, {difference.high:+.4f}]"
)
noise = difference.low <= 0 <= difference.high
print(
    "seed-to-seed noise at this size"
    if noise
    else ("MC dropout" if difference.mean < 0 else "BBB")
    + " is better calibrated beyond the seeds' noise"
)

# The page's claims, checked as it runs: every method learnt the moons (a comparison
# of untrained networks would answer nothing), and the interval is one over all the
# seeds, around its mean.
for method in methods:
    accuracy = statistics.mean(
        r["metrics"]["accuracy"] for r in records if r["axes"]["method"] == method
    )
    assert accuracy > 0.75, (method, accuracy)
assert difference.n == SEEDS and difference.low < difference.mean < difference.high
