"""The noise of a regression on a user's table (pyrobnn.cli.noise): learned from the target's spread when the run
does not set it, said on the header and recorded in metrics.json; a learned noise refused before anything runs for
the posteriors that replay several networks' weights in one; classification, an explicit noise and the grid's
noise untouched. On scikit-learn's diabetes table (442 patients, 10 inputs), written as the CSV a user would have."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import re

import pytest
import torch
from sklearn.datasets import load_diabetes

from pyrobnn.cli.noise import STARTING_SCALE, noise_options
from pyrobnn.cli.options import MCMCConfig, RunConfig
from pyrobnn.methods import resolve_method
from tests.support import MOONS, error_line, run_cli


@pytest.fixture(scope="module")
def diabetes(tmp_path_factory):
    """scikit-learn's diabetes data in its original units, the target in a column named ``target``."""
    data = load_diabetes(scaled=False)
    path = tmp_path_factory.mktemp("table") / "diabetes.csv"
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*data.feature_names, "target"])
        writer.writerows([*row, target] for row, target in zip(data.data, data.target))
    return ["--dataset", f"csv:{path}", "--data.target", "target", "--no-progress"]


def _train(argv, out, capsys):
    assert run_cli(["train", *argv, "--out", out]) == 0
    printed = capsys.readouterr().out
    return printed, json.loads((out / "metrics.json").read_text())


def test_a_regression_on_a_table_learns_its_noise_from_the_targets_spread_and_says_so(diabetes, tmp_path, capsys):
    """No noise option: the header says the noise is learned from 1, the learned value is printed and recorded (the
    checkpoint's log scale; times the training target's standard deviation, in its units), it fell from 1 towards the
    residuals, and the test log-likelihood beats the former fixed default 0.1 set explicitly, which stays fixed."""
    common = [*diabetes, "--method", "mcdropout", "--epochs", "30"]
    printed, metrics = _train(common, tmp_path / "auto", capsys)
    header = next(line for line in printed.splitlines() if line.startswith("pyrobnn csv:"))
    assert header.endswith("noise learned from 1 (the standardised target's spread; --likelihood.scale S fixes it)")
    noise = metrics["noise"]
    assert noise["learned"] and noise["default"]
    state = torch.load(tmp_path / "auto" / "checkpoint.pt", weights_only=False)["model"]
    assert noise["scale"] == pytest.approx(math.exp(float(state["likelihood.log_scale"])), rel=1e-6)
    assert 0.5 < noise["scale"] < STARTING_SCALE
    shown = re.search(r"noise: learned scale ([0-9.]+) \(([0-9.]+) in the target's units\)", printed)
    assert float(shown.group(1)) == pytest.approx(noise["scale"], rel=1e-3)
    assert float(shown.group(2)) == pytest.approx(noise["scale_in_target_units"], rel=1e-3)
    y = torch.tensor(load_diabetes().target, dtype=torch.float64)  # the training rows' spread is about all rows'
    assert noise["scale_in_target_units"] / noise["scale"] == pytest.approx(float(y.std()), rel=0.1)

    printed, fixed = _train([*common, "--likelihood.scale", "0.1"], tmp_path / "fixed", capsys)
    assert ", noise 0.1 (fixed)" in printed
    assert fixed["noise"] == {"scale": pytest.approx(0.1), "learned": False, "default": False,
                              "scale_in_target_units": pytest.approx(0.1 * noise["scale_in_target_units"]
                                                                     / noise["scale"])}
    assert metrics["test"]["log_likelihood"] > fixed["test"]["log_likelihood"] + 1.0


@pytest.mark.parametrize("method", ["ensemble-5", "multiswag-5", "sgld"])
def test_a_learned_noise_is_refused_at_the_precheck_where_every_draw_would_take_the_first_networks(
        method, diabetes, tmp_path, capsys):
    """An ensemble, MultiSWAG and SG-MCMC replay several networks' weights in one network: --likelihood.learn-scale
    is one error line naming the fix, and nothing is written."""
    out = tmp_path / "run"
    assert run_cli(["train", *diabetes, "--method", method, "--likelihood.learn-scale", "--out", out]) == 2
    line = error_line(capsys)
    assert line.startswith("error: --likelihood.learn-scale: ")
    assert "--likelihood.scale S" in line and "--grid likelihood.scale=" in line
    assert not out.exists()


def test_an_ensemble_holds_its_default_noise_at_the_targets_spread_and_says_why(diabetes, tmp_path, capsys):
    printed, metrics = _train([*diabetes, "--method", "ensemble-2", "--epochs", "2"], tmp_path / "ensemble", capsys)
    assert ("noise 1 (the standardised target's spread, fixed: --method ensemble-2: its 2 members' weights are "
            "replayed in one network; choose it with --grid likelihood.scale=0.4,0.7,1.0)") in printed
    assert {k: metrics["noise"][k] for k in ("scale", "learned", "default")} == {
        "scale": STARTING_SCALE, "learned": False, "default": True}


def test_a_classifier_says_nothing_of_a_noise(tmp_path, capsys):
    printed, metrics = _train([*MOONS, "--epochs", "1"], tmp_path / "moons", capsys)
    assert "noise" not in printed and "noise" not in metrics


def test_the_noise_options_resolve_only_an_unset_noise():
    """Unset: learned from 1, or held at 1 for a method whose draws replay several networks' weights; a set noise (a
    --grid point's, the UCI protocol's tau, pyrobnn mcmc's) is returned as it is."""
    options = RunConfig().likelihood
    assert noise_options(options, resolve_method("mcdropout")) == dataclasses.replace(
        options, scale=STARTING_SCALE, learn_scale=True)
    for name in ("ensemble-5", "multiswag-3", "sghmc"):
        assert noise_options(options, resolve_method(name)) == dataclasses.replace(
            options, scale=STARTING_SCALE, learn_scale=False)
    for name in ("swag", "ensemble-1", "laplace", "ivon"):
        assert noise_options(options, resolve_method(name)).learn_scale
    explicit = dataclasses.replace(options, scale=0.3)
    assert noise_options(explicit, resolve_method("ensemble-5")) is explicit
    mcmc = MCMCConfig()
    assert noise_options(mcmc.likelihood, resolve_method("nuts")) is mcmc.likelihood and mcmc.likelihood.scale == 0.1
