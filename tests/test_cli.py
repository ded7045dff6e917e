"""The ``pyrobnn`` command line: train/evaluate round trip, bad inputs, help text."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch

from pyrobnn import data as pyrobnn_data
from pyrobnn.cli import main
from pyrobnn.config import RunConfig


def run_cli(argv):
    """main(argv), returning the SystemExit code (0 when it returns normally)."""
    try:
        main([str(a) for a in argv])
    except SystemExit as exit_:
        return exit_.code
    return 0


# ----------------------------------------------------------------------------- round trip


@pytest.fixture(scope="module")
def mnist_run(tmp_path_factory, data_root):
    if not (data_root / "MNIST" / "raw").is_dir():
        pytest.skip(f"no MNIST under {data_root}")
    out = tmp_path_factory.mktemp("cli") / "run"
    code = run_cli([
        "train", "--dataset", "mnist", "--data-root", data_root, "--train-size", 1000, "--test-size", 500,
        "--epochs", 1, "--hidden", 32, "--batch-size", 32, "--lr", 0.01, "--samples", 10,
        "--no-progress", "--out", out,
    ])
    assert code == 0
    return out


def test_train_writes_checkpoint_metrics_and_diagram(mnist_run):
    for name in ("checkpoint.pt", "metrics.json", "reliability.png"):
        assert (mnist_run / name).is_file(), name
    assert (mnist_run / "reliability.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    metrics = json.loads((mnist_run / "metrics.json").read_text())
    test = metrics["test"]
    assert set(test) >= {"accuracy", "nll", "ece", "brier"}
    assert test["accuracy"] > 0.7
    assert 0 <= test["ece"] <= 1 and 0 <= test["brier"] <= 2 and test["nll"] > 0
    assert len(metrics["history"]) == 1 and metrics["history"][0]["epoch"] == 1
    config = metrics["config"]
    assert config["train_size"] == 1000 and config["hidden"] in ([32], (32,)) and config["epochs"] == 1
    # no temporary files left by the atomic writes
    assert sorted(p.name for p in mnist_run.iterdir()) == ["checkpoint.pt", "metrics.json", "reliability.png"]


def test_evaluate_checkpoint_writes_json(mnist_run, tmp_path, capsys):
    trained = json.loads((mnist_run / "metrics.json").read_text())["test"]
    out = tmp_path / "eval" / "eval.json"
    code = run_cli(["evaluate", "--checkpoint", mnist_run / "checkpoint.pt", "--samples", 10, "--json", out,
                    "--device", "cpu", "--reliability", tmp_path / "plots"])
    assert code == 0
    payload = json.loads(out.read_text())
    test = payload["test"]
    assert set(test) >= {"accuracy", "nll", "ece", "brier"}
    assert all(isinstance(test[k], float) for k in ("accuracy", "nll", "ece", "brier"))
    assert payload["samples"] == 10
    # same 500 test examples, another 10 posterior draws
    assert abs(test["accuracy"] - trained["accuracy"]) < 0.04
    assert abs(test["nll"] - trained["nll"]) < 0.15
    assert "accuracy" in capsys.readouterr().out
    assert (tmp_path / "plots" / "reliability.png").is_file()


def test_cli_resume_continues_the_run(tmp_path):
    out = tmp_path / "moons"
    common = ["train", "--dataset", "two-moons", "--train-size", 100, "--test-size", 100, "--hidden", 8,
              "--samples", 5, "--batch-size", 50, "--no-progress", "--out", out]
    assert run_cli(common + ["--epochs", 1]) == 0
    first = json.loads((out / "metrics.json").read_text())["history"]
    assert run_cli(common + ["--epochs", 3, "--resume"]) == 0
    history = json.loads((out / "metrics.json").read_text())["history"]
    assert [r["epoch"] for r in history] == [1, 2, 3]
    assert history[0]["loss"] == first[0]["loss"]
    assert torch.load(out / "checkpoint.pt", weights_only=False)["epoch"] == 2


@pytest.mark.parametrize("bayesian, sites", [("all", 4), ("last-layer", 2), ("*.weight", 2), ("none", 0)])
def test_cli_bayesian_selection(tmp_path, bayesian, sites):
    out = tmp_path / "run"
    assert run_cli(["train", "--dataset", "two-moons", "--train-size", 60, "--test-size", 40, "--hidden", 8,
                    "--epochs", 1, "--samples", 3, "--bayesian", bayesian, "--no-progress", "--out", out]) == 0
    guide_state = torch.load(out / "checkpoint.pt", weights_only=False)["guide"]
    assert len([k for k in guide_state if k.endswith("_loc")]) == sites
    assert json.loads((out / "metrics.json").read_text())["config"]["bayesian"] == bayesian


# ----------------------------------------------------------------------------- bad inputs


def _no_download(fetch, dirs):
    return ConnectionError("offline (test)")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--dataset", "imagenet"], "unknown dataset"),
        (["--dataset", "two-moons", "--prior", "scale-mixture", "--pi", 1.5], "pi"),
        (["--dataset", "two-moons", "--prior-scale", -1], "scale"),
        (["--dataset", "mnist", "--data-root", "{tmp}/missing-data"], "not found"),
        (["--dataset", "two-moons", "--epochs", 0], "epochs"),
        (["--dataset", "two-moons", "--batch-size", 0], "batch_size"),
        (["--dataset", "two-moons", "--model", "resnet9000"], "unknown model"),
        (["--dataset", "two-moons", "--train-size", 0], "train_size"),
    ],
    ids=["unknown-dataset", "pi", "prior-scale", "missing-data-root", "epochs", "batch-size", "model",
         "train-size"],
)
def test_cli_bad_inputs_exit_2_and_write_nothing(args, message, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(pyrobnn_data, "_try_download", _no_download)  # never reach the network
    monkeypatch.setenv("COLUMNS", "200")
    args = [a.replace("{tmp}", str(tmp_path)) if isinstance(a, str) else a for a in args]
    out = tmp_path / "run"
    code = run_cli(["train", *args, "--hidden", 8, "--no-progress", "--out", out])
    assert code == 2
    printed = capsys.readouterr()
    text = " ".join((printed.out + printed.err).split())
    assert "error" in text.lower() and message in text, text
    assert not out.exists()
    assert not (tmp_path / "missing-data").exists()


@pytest.mark.parametrize(
    "args",
    [["--prior", "laplace"], ["--epochs", "three"], ["--no-such-option", "1"]],
    ids=["bad-choice", "bad-int", "unknown-option"],
)
def test_cli_parse_errors_exit_2_and_write_nothing(args, tmp_path, capsys):
    out = tmp_path / "run"
    assert run_cli(["train", "--dataset", "two-moons", *args, "--out", out]) == 2
    assert not out.exists()


def test_cuda_without_cuda_exits_2(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    out = tmp_path / "run"
    assert run_cli(["train", "--dataset", "two-moons", "--device", "cuda", "--out", out]) == 2
    assert "CUDA" in capsys.readouterr().out
    assert not out.exists()


def test_cli_divergence_is_a_clean_error_and_keeps_the_checkpoint(tmp_path, capsys):
    """A NaN/inf loss is reported as an error message and a non-zero exit, not a traceback;
    the checkpoint of the last good epoch stays usable."""
    out = tmp_path / "run"
    # one minibatch per epoch: epoch 1 is fine, its Adam step (lr 1e30) makes the epoch-2 loss inf
    argv = ["train", "--dataset", "two-moons", "--train-size", 50, "--test-size", 50, "--hidden", 8,
            "--epochs", 3, "--lr", 1e30, "--no-progress", "--out", out]
    try:
        code = run_cli(argv)
    except FloatingPointError as error:  # TrainingDiverged escaping main()
        pytest.fail(f"pyrobnn train let TrainingDiverged escape as a traceback: {error}")
    assert code not in (0, None)
    text = " ".join(capsys.readouterr().out.split())
    assert "error" in text.lower() and "epoch 2" in text
    assert torch.load(out / "checkpoint.pt", weights_only=False)["epoch"] == 0
    assert not (out / "metrics.json").exists()


def test_evaluate_missing_checkpoint_exits_2(tmp_path, capsys):
    code = run_cli(["evaluate", "--checkpoint", tmp_path / "nope.pt", "--json", tmp_path / "e.json"])
    assert code == 2
    assert "does not exist" in " ".join(capsys.readouterr().out.split())
    assert not (tmp_path / "e.json").exists()


# ----------------------------------------------------------------------------- help


def _help(argv, capsys):
    assert run_cli(argv) == 0
    captured = capsys.readouterr()
    return captured.out + captured.err


def test_help_lists_subcommands_and_every_run_config_field(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    top = _help(["--help"], capsys)
    assert "train" in top and "evaluate" in top

    train_help = _help(["train", "--help"], capsys)
    flags = set(re.findall(r"--[a-z0-9][a-z0-9-]*", train_help))
    missing = [f.name for f in dataclasses.fields(RunConfig) if "--" + f.name.replace("_", "-") not in flags]
    assert not missing, f"train --help does not list {missing}"
    assert "--no-progress" in flags

    evaluate_help = _help(["evaluate", "--help"], capsys)
    for flag in ("--checkpoint", "--samples", "--json", "--data-root", "--test-size", "--device"):
        assert flag in evaluate_help, flag
