"""A ``--grid`` point whose training diverges is dropped with one warning naming it, and the search goes on with the
others, instead of failing the run (as SWAG's SGD did at a large noise precision of a UCI set before its rate was per
unit noise); a grid whose every point diverges is one error line naming the rates they trained at."""

from __future__ import annotations

import json
import re

from tests.support import run_cli

YACHT = ["--dataset", "uci-yacht", "--method", "swag", "--hidden", "50", "--epochs", "4", "--num-samples", "10",
         "--no-progress"]


def test_a_diverging_grid_point_is_dropped_with_one_warning(data_root, tmp_path, capsys):
    """SWAG's SGD at 1e30 per example: its loss becomes inf within an epoch; at its own rate 0.05 it trains."""
    out = tmp_path / "run"
    assert run_cli(["train", *YACHT, "--data-root", data_root, "--grid", "lr=0.05,1e30", "--out", out]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: --grid")]
    assert len(warnings) == 1 and warnings[0].startswith("warning: --grid lr=1e30: training diverged, so the point "
                                                         "is dropped")
    selection = json.loads((out / "metrics.json").read_text())["selection"]
    assert selection["chosen"] == {"lr": "0.05"}
    assert [point.get("diverged", False) for point in selection["points"]] == [False, True]


def test_a_grid_whose_every_point_diverges_is_one_error_line(data_root, tmp_path, capsys):
    out = tmp_path / "run"
    assert run_cli(["train", *YACHT, "--data-root", data_root, "--grid", "lr=1e30,1e31", "tau=1", "--out", out]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(":")[1] for line in lines[:2]] == [" --grid lr=1e30 tau=1", " --grid lr=1e31 tau=1"]
    assert len(lines) == 3 and re.match(
        r"error: --grid: the training of every one of its 2 points diverged; they trained at lr 1e\+30 \(per unit "
        r"noise: 4\.\d+e\+27 at noise 0\.066\d+\), lr 1e\+31 \(per unit noise: 4\.\d+e\+28 at noise 0\.066\d+\): "
        r"lower --lr", lines[2])
    assert not (out / "metrics.json").exists()
