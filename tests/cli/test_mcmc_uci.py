"""``pyrobnn mcmc`` on a UCI regression data set: the protocol's data handling, the test metrics of all draws in the
target's original units (against scipy on the draws), the noise precision chosen on the training split alone, and
bad input as one error line."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from scipy import stats
from scipy.special import logsumexp

from pyrobnn.checkpoint import load_checkpoint
from pyrobnn.cli import _parse
from pyrobnn.cli.build import build_network, check_mcmc
from pyrobnn.cli.mcmc import choose_noise
from pyrobnn.cli.options import MCMCConfig
from pyrobnn.cli.runs import load_data
from pyrobnn.infer.potential import FlatPotential
from tests.data.test_uci import TARGET, rows, write_folder
from tests.support import error_line, run_cli

TINY = ["--hidden", "4", "--num-chains", "2", "--warmup", "15", "--num-samples", "10", "--grid-samples", "8",
        "--max-tree-depth", "4", "--no-progress"]
"""A few short NUTS runs: these tests check the protocol's data handling and metrics, not the sampler, so the
trajectories stop at 15 leapfrog steps (a valid NUTS kernel at any depth)."""


@pytest.fixture
def folder(tmp_path):
    path = tmp_path / "tiny"
    write_folder(path)
    return path


def test_mcmc_on_a_uci_split_reports_the_predictive_mixture_of_its_draws_in_original_units(folder, tmp_path):
    out = tmp_path / "nuts"
    assert run_cli(["mcmc", "--dataset", f"uci:{folder}", "--split", "1", *TINY, "--grid", "protocol",
                    "--out", out]) == 0
    report = json.loads((out / "diagnostics.json").read_text())
    selection, test = report["selection"], report["test"]
    assert selection["grid"] == {"tau": ["0.5", "2.0"]} and (selection["fit_size"], selection["held_out_size"]) == (
        19, 5)
    assert selection["chosen"] == max(selection["points"], key=lambda p: p["log_likelihood"])["values"]
    assert not (out / "predictive.png").exists()  # no plot of a multi-input data set

    # the chosen tau sets the noise of the standardised target: sigma = 1 / (sqrt(tau) s_y), s_y of the train rows
    table = np.loadtxt(folder / "data.txt")
    y_train, y_test = table[rows(folder, "train", 1), TARGET], table[rows(folder, "test", 1), TARGET]
    tau = float(selection["chosen"]["tau"])
    assert report["config"]["likelihood"]["scale"] == pytest.approx(1 / (math.sqrt(tau) * y_train.std()), rel=1e-5)

    # RMSE and log-likelihood of all draws' predictive mixture in original units, recomputed from draws.pt
    state = load_checkpoint(out / "draws.pt")
    cfg = MCMCConfig.from_dict(state["config"])
    data = load_data(cfg)
    model = build_network(cfg, data)
    model.load_state_dict(state["model"])
    draws = {name: value.flatten(0, 1) for name, value in state["draws"].items()}
    assert len(next(iter(draws.values()))) == 2 * 10
    potential = FlatPotential(model, data.x_train, data.y_train)
    with torch.no_grad():
        means = np.stack([potential.network({n: v[t] for n, v in draws.items()}, data.x_test)[:, 0].double().numpy()
                          for t in range(20)])
    predicted = y_train.mean() + y_train.std() * means  # (draws, test points), original units
    noise = 1 / math.sqrt(tau)
    log_likelihood = np.mean(logsumexp(stats.norm.logpdf(y_test, predicted, noise), axis=0) - math.log(20))
    assert test["log_likelihood"] == pytest.approx(log_likelihood, rel=1e-4)
    assert test["rmse"] == pytest.approx(np.sqrt(np.mean((predicted.mean(0) - y_test) ** 2)), rel=1e-4)
    assert report["diagnostics"]["num_weights"] == 3 * 4 + 4 + 4 + 1


def test_the_noise_is_chosen_without_the_test_split(folder, tmp_path, monkeypatch, request):
    cfg = _parse(["mcmc", "--dataset", f"uci:{folder}", "--split", "1", *TINY, "--grid", "tau=0.5,2",
                  "--out", str(tmp_path / "run")])
    data = load_data(cfg)  # the run's own data (its test split is read here, before the search)
    read = request.getfixturevalue("forbid_test_split")
    chosen, selection = choose_noise(cfg, check_mcmc(cfg), data)
    assert set(read) == {("train", 1)} and len(selection["points"]) == 2
    monkeypatch.undo()

    # permuted test targets: the same search, point for point
    table = np.loadtxt(folder / "data.txt")
    test_rows = rows(folder, "test", 1)
    table[test_rows, TARGET] = np.random.default_rng(1).permutation(table[test_rows, TARGET]) * 3 + 100
    np.savetxt(folder / "data.txt", table)
    again, permuted = choose_noise(cfg, check_mcmc(cfg), load_data(cfg))
    assert permuted["chosen"] == selection["chosen"] and again.likelihood.scale == chosen.likelihood.scale
    assert [p["log_likelihood"] for p in permuted["points"]] == [p["log_likelihood"] for p in selection["points"]]


@pytest.mark.parametrize("args, message", [
    (["--split", "2"], "split must be an integer in [0, 1]"),
    (["--grid", "prior.scale=1,2"], "chooses only the noise precision"),
    (["--grid", "tau=0.5,-1"], "must be a positive number"),
    (["--grid", "tau=0.5", "--likelihood.scale", "0.3"], "both set the noise"),
    (["--grid-samples", "0"], "--grid-samples"),
], ids=["split-out-of-range", "grid-other-option", "grid-negative-tau", "grid-and-scale", "grid-samples"])
def test_bad_uci_input_is_one_error_line_and_writes_nothing(args, message, folder, tmp_path, capsys):
    out = tmp_path / "run"
    assert run_cli(["mcmc", "--dataset", f"uci:{folder}", *TINY, *args, "--out", out]) == 2
    assert message in error_line(capsys)
    assert not out.exists()


@pytest.mark.parametrize("args, message", [
    (["--dataset", "cubic", "--split", "1"], "--split applies to the UCI data sets"),
    (["--dataset", "cubic", "--grid", "protocol"], "no protocol files"),
    (["--dataset", "two-moons", "--grid", "tau=1"], "regression"),
    (["--dataset", "mnist"], "the UCI regression data sets"),
], ids=["toy-split", "toy-protocol", "classification-grid", "mnist"])
def test_options_of_the_uci_protocol_on_other_datasets_are_one_error_line(args, message, tmp_path, capsys):
    out = tmp_path / "run"
    assert run_cli(["mcmc", *TINY, "--train-size", "20", "--test-size", "10", *args, "--out", out]) == 2
    assert message in error_line(capsys)
    assert not out.exists()
