"""examples/nuts_toys.py at CI size: NUTS (started at the MAP of the fan-in Gaussian prior, ``map_steps``) against a
variational guide on y = x³, with the depth study's first depth; the run finishes, writes its plots and prints one
JSON object whose figures are finite and sane."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from tests.support import ROOT

EXAMPLE = ROOT / "examples" / "nuts_toys.py"


@pytest.mark.recorded
@pytest.mark.slow
def test_nuts_toys_runs_at_ci_size(tmp_path):
    out = tmp_path / "out"
    argv = [sys.executable, str(EXAMPLE), "--problems", "cubic", "--methods", "bbb", "--samples", "30",
            "--warmup", "30", "--chains", "2", "--max-tree-depth", "5", "--map-steps", "200", "--epochs", "100",
            "--anneal", "20", "--pred-samples", "20", "--cubic-hidden", "16", "--depths", "1", "--depth-width", "16",
            "--depth-samples", "10", "--depth-warmup", "10", "--depth-tree-depth", "4", "--out", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    nuts = results["cubic"]["nuts"]
    # y = x³ + N(0, 3²): a predictive that fits has a per-example test log-likelihood near -log(3 √(2πe)) = -2.52
    assert -4.0 < nuts["test_ll"] < -2.0, nuts
    assert 0.0 < nuts["rmse"] < 10.0, nuts
    assert 0.0 <= nuts["coverage95"] <= 1.0
    w2 = results["cubic"]["bbb"]["w2_to_nuts"]
    assert math.isfinite(w2) and w2 >= 0.0
    assert "1" in results["cubic_depth"]
    assert (out / "cubic.png").is_file() and (out / "cubic_depth.png").is_file()
