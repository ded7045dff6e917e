"""A ``--grid`` point whose training diverges is dropped with one warning naming it, and the search goes on with the
others, instead of failing the run (as SWAG's SGD did at a large noise precision of a UCI set); a grid whose every
point diverges is one error line."""

from __future__ import annotations

import json

from tests.support import run_cli

YACHT = ["--dataset", "uci-yacht", "--method", "swag", "--hidden", "50", "--epochs", "4", "--num-samples", "10",
         "--no-progress"]


def test_a_diverging_grid_point_is_dropped_with_one_warning(data_root, tmp_path, capsys):
    """τ = 1 makes the noise scale 1 / (√τ s_y) ≈ 0.07 of the standardised target: SWAG's SGD at its own rate 0.05
    meets a curvature of about 1 / 0.07² ≈ 220 and its loss becomes inf within two epochs; τ = 0.0025 trains."""
    out = tmp_path / "run"
    assert run_cli(["train", *YACHT, "--data-root", data_root, "--grid", "tau=0.0025,1", "--out", out]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: --grid")]
    assert len(warnings) == 1 and warnings[0].startswith("warning: --grid tau=1: training diverged, so the point is "
                                                         "dropped")
    selection = json.loads((out / "metrics.json").read_text())["selection"]
    assert selection["chosen"] == {"tau": "0.0025"}
    assert [point.get("diverged", False) for point in selection["points"]] == [False, True]


def test_a_grid_whose_every_point_diverges_is_one_error_line(data_root, tmp_path, capsys):
    out = tmp_path / "run"
    assert run_cli(["train", *YACHT, "--data-root", data_root, "--grid", "tau=1,4", "--out", out]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(":")[1] for line in lines[:2]] == [" --grid tau=1", " --grid tau=4"]  # a warning for each
    assert lines[2].startswith("error: --grid: the training of every one of its 2 points diverged") and len(lines) == 3
    assert not (out / "metrics.json").exists()
