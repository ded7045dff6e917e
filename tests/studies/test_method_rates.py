"""No option the user wrote is dropped: an explicit ``--lr`` applies through every door (``pyrobnn train``, a study's
base, ``--grid``, Python), or the run stops in one line naming the rate the method uses and how to set it; a
divergence names the rate the run trained at; and SWAG's and IVON's presets train on the shared UCI sets under
``studies/uci_quick.toml``'s protocol without diverging (their rates per unit noise on its grid's fixed noises)."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from pyrobnn.__main__ import main
from pyrobnn.cli import parse_config
from pyrobnn.cli.build import method_of
from pyrobnn.cli.methods import expand_method
from pyrobnn.cli.options import RunConfig
from pyrobnn.infer.optim import Optim
from pyrobnn.methods import METHODS
from pyrobnn.studies.cells import make_cell
from pyrobnn.studies.spec import Study
from tests.support import ROOT, error_line, run_cli

UCI_QUICK = ["--dataset", "uci-yacht", "--hidden", "50", "--epochs", "400", "--lr", "0.01", "--batch-size", "128"]
"""The base of studies/uci_quick.toml with the rate it once held for every method (its grid left out: these tests
parse the cells)."""

MOONS = ["--dataset", "two-moons", "--train-size", "64", "--test-size", "32", "--hidden", "8", "--batch-size", "32",
         "--epochs", "2", "--num-samples", "4", "--no-progress"]


def _method(cell):
    return method_of(parse_config(RunConfig, expand_method(["train", *cell.argv])[1:], "pyrobnn train"))


def _study(argv) -> int:
    try:
        main(["study", *map(str, argv)])
    except SystemExit as exit_:
        return exit_.code
    return 0


def test_a_rate_in_a_studys_base_reaches_every_method_of_its_axis(data_root):
    base = [*UCI_QUICK, "--data-root", str(data_root)]
    for name in ("mcdropout", "bbb", "swag", "ivon", "sgld"):
        method = _method(make_cell(base, {"method": name}, {"split": 0}, f"method={name}"))
        assert method.learning_rate == 0.01, name


def test_a_rate_below_swags_swa_rate_stops_the_study_naming_the_rate_and_how_to_set_it(data_root, tmp_path,
                                                                                        capsys):
    """The issue's case: ``--lr 0.002`` in the base with SWAG, whose SGD falls to its SWA rate 0.01."""
    out = tmp_path / "study"
    assert _study(["--dataset", "uci-yacht", "--data-root", data_root, "--lr", "0.002", "--vary",
                   "method=swag,mcdropout", "--out", out]) == 2
    line = error_line(capsys)
    assert "--lr 0.002 is below SWAG's SWA rate --swag.lr 0.01" in line and "--vary swag.lr=" in line
    assert not out.exists()
    # SWAG's rate in the base reaches its SWAG cells and no other
    base = [*UCI_QUICK, "--lr", "0.002", "--swag.lr", "0.002", "--data-root", str(data_root)]
    swag, dropout = (make_cell(base, {"method": name}, {"split": 0}, name) for name in ("swag", "mcdropout"))
    assert _method(swag).swa_lr == 0.002 and _method(swag).learning_rate == 0.002
    assert "--swag.lr" not in dropout.argv and _method(dropout).learning_rate == 0.002


def test_a_rate_the_method_cannot_take_stops_train_and_python_alike(tmp_path, capsys):
    assert run_cli(["train", *MOONS, "--method", "swag", "--lr", "0.002", "--out", tmp_path / "run"]) == 2
    assert "--lr 0.002 is below SWAG's SWA rate --swag.lr 0.01" in error_line(capsys)
    with pytest.raises(ValueError, match="optimizer.lr 0.002 is below SWAG's SWA rate swa_lr 0.01.*set swa_lr to "
                                         "0.002 or lower"):
        dataclasses.replace(METHODS["swag"], optimizer=Optim("sgd", 0.002))
    assert run_cli(["train", *MOONS, "--method", "swag", "--lr", "0.01", "--out", tmp_path / "ok"]) == 0
    header = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("pyrobnn two-moons"))
    assert ", lr 0.01, " in header
    config = json.loads((tmp_path / "ok" / "metrics.json").read_text())["config"]
    assert config["optim"]["lr"] == 0.01


def test_a_divergence_names_the_rate_the_run_trained_at(tmp_path, capsys):
    argv = ["train", *MOONS, "--method", "swag", "--lr", "1e30", "--swag.lr", "1e30"]
    assert run_cli([*argv, "--out", tmp_path / "run"]) == 1
    assert "The run trained at lr 1e+30 (--lr sets it)" in capsys.readouterr().err
    assert run_cli([*argv, "--grid", "prior.scale=1,2", "--out", tmp_path / "grid"]) == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith("error: --grid: the training of every one of its 2 points diverged; they trained at lr "
                           "1e+30: lower --lr")


def test_sgds_rate_is_per_unit_noise_on_a_fixed_noise(data_root, tmp_path, capsys):
    """Yacht at its grid's smallest noise: the header names the rate per unit noise and the one it steps at."""
    argv = ["train", "--method", "swag", "--dataset", "uci-yacht", "--data-root", data_root, "--hidden", "8",
            "--epochs", "2", "--likelihood.scale", "0.1", "--num-samples", "4", "--no-progress"]
    assert run_cli([*argv, "--out", tmp_path / "run"]) == 0
    assert "lr 0.05 (per unit noise: 0.0005 at noise 0.1)" in capsys.readouterr().out


def _quick(data_root, monkeypatch, datasets, methods):
    monkeypatch.setenv("PYROBNN_DATA", str(data_root))
    study = Study.from_file(ROOT / "studies" / "uci_quick.toml")
    return study.replace(splits=1, baseline=None, vary={"dataset": datasets, "method": methods})


def _trained_without_diverging(study, tmp_path) -> None:
    records = study.run(tmp_path, progress=False)
    assert [r["status"] for r in records] == ["done"] * len(records), [r["error"] for r in records]
    for record in records:
        metrics = json.loads((tmp_path / "cells" / record["key"] / "metrics.json").read_text())
        points = metrics["selection"]["points"]
        assert not any(point.get("diverged") for point in points), record["label"]
        assert math.isfinite(record["metrics"]["log_likelihood"]), record["label"]


def test_swag_and_ivon_train_on_yacht_under_the_quick_studys_protocol(data_root, tmp_path, monkeypatch):
    """Yacht's grid holds the smallest noise of the five sets (0.13 of the standardised target), at which both
    presets diverged in every point when their rates were not per unit noise."""
    study = _quick(data_root, monkeypatch, ["uci-yacht"], ["swag", "ivon"])
    assert "--lr" not in study.base  # the quick study's Adam rate is MC dropout's and BBB's
    _trained_without_diverging(study, tmp_path)


@pytest.mark.slow
def test_swag_and_ivon_train_on_the_five_shared_uci_sets_under_the_quick_studys_protocol(data_root, tmp_path,
                                                                                         monkeypatch):
    study = _quick(data_root, monkeypatch, ["uci-boston", "uci-concrete", "uci-energy", "uci-wine", "uci-yacht"],
                   ["swag", "ivon"])
    _trained_without_diverging(study, tmp_path)
