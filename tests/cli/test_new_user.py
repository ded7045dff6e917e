"""What a new user hit at f307a6a: each item of the new-user issue, as a test that failed there.

Prediction bounded in memory, the NUTS acceptance statistic under its name, ``mcmc --prior node`` refused, an
existing run not overwritten silently, ``--resume`` without a checkpoint said, ``evaluate`` with the training
seed, a wrongly shaped input named, ``--estimator vdp`` with particles refused, option help that fits its
command, plain-Pyro pitfalls warned about once, a run at chance reported.
"""

from __future__ import annotations

import json
import re
import warnings
from types import SimpleNamespace

import pyro
import pytest
import torch
from pyro.infer import SVI, Trace_ELBO

from pyrobnn import BayesianNetwork, DropoutGuide, NormalGuide, PointGuide, predict
from pyrobnn.cli.runs import training_accuracy
from pyrobnn.data import two_moons
from pyrobnn.device import peak_bytes
from pyrobnn.infer.predict import predictive_outputs
from pyrobnn.methods import VariationalPosterior
from pyrobnn.networks import MLP, LeNet5
from tests.support import MOONS, error_line, run_cli

CPU = torch.device("cpu")


# ----------------------------------------------------------------------------- memory


def test_peak_bytes_counts_what_is_alive_at_once():
    def two_alive():
        a = torch.ones(1000)  # 4000 bytes
        b = torch.ones(1000)
        return a + b  # a third buffer while both live

    def one_at_a_time():
        for _ in range(3):
            torch.ones(1000).sum()

    assert peak_bytes(two_alive, CPU) == 12000
    assert 4000 <= peak_bytes(one_at_a_time, CPU) <= 4000 + 64  # the sums' scalars may overlap a buffer


@pytest.mark.parametrize("vectorized", [True, False])
def test_prediction_passes_hold_at_most_max_memory(vectorized):
    """f307a6a sent samples x examples through the network at once (up to 200k rows); now each pass is sized
    from a measured probe to hold at most ``max_memory`` bytes."""
    pyro.set_rng_seed(0)
    model = BayesianNetwork(LeNet5(), num_data=100)
    guide = NormalGuide(model)
    x = torch.rand(256, 1, 28, 28)
    budget = 4_000_000
    unbounded = peak_bytes(lambda: predictive_outputs(model, guide, x, num_samples=16, vectorized=vectorized,
                                                      max_memory=10**12), CPU)
    outputs = 16 * 256 * 10 * 4  # the (S, N, classes) result, kept whole
    weights = 2 * 4 * sum(site.init.numel() for site in model.sites())  # one weight sample, and its noise
    bounded = peak_bytes(lambda: predictive_outputs(model, guide, x, num_samples=16, vectorized=vectorized,
                                                    max_memory=budget), CPU)
    assert unbounded > 2.5 * budget  # the check means something: one pass of everything would not fit
    assert bounded <= 1.5 * budget + 2 * outputs + weights
    pyro.set_rng_seed(1)
    out = predictive_outputs(model, guide, x, num_samples=16, vectorized=vectorized, max_memory=budget)
    assert out.shape == (16, 256, 10) and torch.isfinite(out).all()


def test_prediction_leaves_the_random_state_as_the_old_single_pass_did():
    """The probe that measures memory restores the RNG: same seed, same predictions whatever the budget."""
    pyro.set_rng_seed(0)
    model = BayesianNetwork(MLP(2, (8,), 2), num_data=10)
    guide = NormalGuide(model, init_rho=-2.0)
    x = torch.randn(5, 2)
    pyro.set_rng_seed(3)
    first = predict(model, guide, x, num_samples=4)["probs"]
    pyro.set_rng_seed(3)
    second = predict(model, guide, x, num_samples=4)["probs"]
    assert torch.equal(first, second)


def test_a_wrongly_shaped_input_to_predict_is_named():
    model = BayesianNetwork(LeNet5(), num_data=10)
    with pytest.raises(ValueError, match=r"input x of shape \(4, 3, 28, 28\) does not fit the network"):
        predict(model, NormalGuide(model), torch.rand(4, 3, 28, 28), num_samples=2)


# ----------------------------------------------------------------------------- plain-Pyro pitfalls


def test_dropout_guide_outside_a_handler_warns_once_that_it_draws_one_mask_per_batch():
    data = two_moons(n=64, n_train=32, seed=0)
    model = BayesianNetwork(MLP(2, (8,), 2), num_data=32)
    svi = SVI(model, DropoutGuide(model, rate=0.2), pyro.optim.Adam({"lr": 0.01}), Trace_ELBO())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        svi.step(data.x_train, data.y_train)
        svi.step(data.x_train, data.y_train)
    messages = [str(w.message) for w in caught if "one dropout mask per batch" in str(w.message)]
    assert len(messages) == 1 and "local_reparameterization" in messages[0]


def test_a_model_without_num_data_warns_once_that_the_kl_dominates():
    data = two_moons(n=64, n_train=32, seed=0)
    model = BayesianNetwork(MLP(2, (8,), 2))
    svi = SVI(model, NormalGuide(model), pyro.optim.Adam({"lr": 0.01}), Trace_ELBO())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        svi.step(data.x_train, data.y_train)
        svi.step(data.x_train, data.y_train)
    assert sum("num_data" in str(w.message) for w in caught) == 1


# ----------------------------------------------------------------------------- command line


def test_train_into_an_existing_run_is_refused_unless_resumed_or_overwritten(tmp_path, capsys):
    out = tmp_path / "run"
    assert run_cli(["train", *MOONS, "--epochs", 1, "--out", out]) == 0
    before = (out / "metrics.json").read_text()
    capsys.readouterr()
    assert run_cli(["train", *MOONS, "--epochs", 1, "--seed", 9, "--out", out]) == 2
    assert "already holds a run" in error_line(capsys)
    assert (out / "metrics.json").read_text() == before
    assert run_cli(["train", *MOONS, "--epochs", 1, "--seed", 9, "--out", out, "--overwrite"]) == 0
    assert (out / "metrics.json").read_text() != before


def test_resume_without_a_checkpoint_says_it_trains_from_scratch(tmp_path, capsys):
    assert run_cli(["train", *MOONS, "--epochs", 1, "--out", tmp_path / "fresh", "--resume"]) == 0
    assert "does not exist; training from scratch" in capsys.readouterr().out


@pytest.mark.recorded
def test_metrics_record_peak_memory_and_evaluate_uses_the_training_seed(tmp_path, capsys):
    out = tmp_path / "run"
    assert run_cli(["train", *MOONS, "--epochs", 5, "--lr", 0.05, "--seed", 7, "--out", out]) == 0
    trained = json.loads((out / "metrics.json").read_text())
    assert trained["peak_memory_gb"] > 0 and trained["train_peak_memory_gb"] > 0
    assert trained["warnings"] == [] and trained["train_accuracy"] > 0.6
    assert run_cli(["evaluate", "--checkpoint", out / "checkpoint.pt", "--num-samples", 5, "--json",
                    tmp_path / "eval.json", "--max-memory", 0.01]) == 0
    evaluated = json.loads((tmp_path / "eval.json").read_text())
    assert evaluated["seed"] == 7 and evaluated["test"] == trained["test"]


@pytest.mark.recorded
def test_a_run_that_stays_at_chance_says_so(tmp_path, capsys):
    out = tmp_path / "run"
    code = run_cli(["train", *MOONS, "--epochs", 1, "--lr", 1e-9, "--guide.init-rho", 3.0, "--out", out])
    assert code == 0
    report = json.loads((out / "metrics.json").read_text())
    assert report["train_accuracy"] <= 0.7
    assert len(report["warnings"]) == 1 and "at chance" in report["warnings"][0]
    assert "warning: training accuracy" in capsys.readouterr().err


def test_the_chance_level_is_measured_on_rows_of_every_class():
    """A training set stored class by class (an ImageFolder, CIFAR-10's JPEG copy before its rows were shuffled):
    the check must not read the first 1,000 rows, one class at 100 % chance."""
    torch.manual_seed(0)
    x, y = torch.randn(3000, 2), torch.arange(3).repeat_interleave(1000)
    model = BayesianNetwork(MLP(2, (4,), 3), num_data=3000)
    posterior = VariationalPosterior(model, PointGuide(model), num_samples=1)
    accuracy, chance = training_accuracy(posterior, SimpleNamespace(x_train=x, y_train=y))
    expected = torch.bincount(y[torch.randperm(3000, generator=torch.Generator().manual_seed(0))[:1000]]).max()
    assert chance == pytest.approx(float(expected) / 1000) and 0.3 < chance < 0.4
    assert 0 <= accuracy <= 1


def test_samples_that_the_mixture_cannot_share_are_refused_before_training(tmp_path, capsys):
    out = tmp_path / "r"
    assert run_cli(["train", *MOONS, "--method", "ibnn-4", "--num-samples", 10, "--out", out]) == 2
    line = error_line(capsys)
    assert "--num-samples 10 must be a multiple of --guide.components 4" in line and line.endswith("pass 8 or 12")
    assert run_cli(["train", *MOONS, "--method", "ibnn-4", "--num-samples", 2, "--out", out]) == 2
    assert error_line(capsys).endswith("pass 4")
    assert not out.exists()  # refused before anything was trained or written


def test_vdp_with_particles_is_refused(tmp_path, capsys):
    assert run_cli(["train", *MOONS, "--estimator", "vdp", "--num-particles", 4, "--out", tmp_path / "r"]) == 2
    assert "--num-particles 4 does not apply to --estimator vdp" in error_line(capsys)


def test_mcmc_refuses_the_node_prior(tmp_path, capsys):
    assert run_cli(["mcmc", "--prior", "node", "--out", tmp_path / "r"]) == 2
    assert "--prior node does not apply to NUTS" in error_line(capsys)
    assert not (tmp_path / "r").exists()


def test_mcmc_help_lists_only_its_options_and_train_help_names_the_implicit_bnn(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    for argv in (["mcmc", "--help"], ["train", "--help"]):
        with pytest.raises(SystemExit):
            run_cli_raw(argv)
    text = capsys.readouterr().out
    mcmc_help, train_help = text.split("usage: pyrobnn train")
    # the node prior's --prior.bias (bias latents), not the Gaussian prior's --prior.bias-scale, which mcmc takes
    assert "--prior.mode" not in mcmc_help and not re.search(r"--prior\.bias(?![-\w])", mcmc_help)
    assert "--prior.bias-scale" in mcmc_help and re.search(r"--prior\.bias(?![-\w])", train_help)
    assert "--prior.mode" in train_help
    assert "node: N(1, scale^2) latents" in " ".join(train_help.split()).replace("│ ", "")
    assert "mixture-node: a K-component mixture" in " ".join(train_help.split()).replace("│ ", "")


def run_cli_raw(argv):
    from pyrobnn.cli import main

    main(argv)


@pytest.mark.recorded
def test_mcmc_reports_the_mean_acceptance_probability_that_target_accept_aims_for(tmp_path, capsys):
    out = tmp_path / "nuts"
    assert run_cli(["mcmc", "--train-size", 40, "--test-size", 20, "--hidden", 4, "--num-samples", 60,
                    "--warmup", 60, "--num-chains", 1, "--target-accept", 0.9, "--no-progress", "--out", out]) == 0
    printed = capsys.readouterr().out
    chain = json.loads((out / "diagnostics.json").read_text())["diagnostics"]["chains"][0]
    assert 0.6 < chain["mean_accept_prob"] < 1.0  # dual averaging aims at 0.9
    assert 0.0 <= chain["accept_rate"] <= 1.0
    assert "mean acceptance probability per chain (target 0.9)" in printed
    assert f"{chain['mean_accept_prob']:.3f}" in printed


def test_a_mixture_guide_whose_last_batch_cannot_split_among_its_components_is_refused_before_the_grid(
        tmp_path, capsys, monkeypatch):
    """``pyrobnn train --dataset uci-boston --method ibnn-4 --grid protocol`` trained its three grid points and then
    failed: 455 rows leave a last batch of 71, not a multiple of 4 (the grid's 364 rows leave 108, which is)."""
    from pyrobnn.methods import base

    trained = []
    monkeypatch.setattr(base, "fit_replicas", lambda *args, **kwargs: trained.append(1))
    out = tmp_path / "run"
    argv = ["train", "--dataset", "two-moons", "--train-size", "42", "--test-size", "20", "--hidden", "8",
            "--epochs", "1", "--method", "ibnn-4", "--batch-size", "8", "--num-samples", "4", "--out", out]
    # 42 rows leave a last batch of 2; the grid's 33 rows leave 1
    assert run_cli([*argv, "--grid", "lr=0.01,0.02"]) == 2
    line = error_line(capsys)
    assert line.startswith("error: --guide.components 4, --batch-size 8, --num-particles 2 on 42 training examples: "
                           "batch_size (8) and the last batch (2 of 42 examples) must be multiples")
    assert not trained and not out.exists()
    # 44 rows leave a last batch of 4, which splits; the grid's 35 rows leave 3
    assert run_cli([*argv[:-2], "--train-size", "44", "--grid", "lr=0.01,0.02", "--out", out]) == 2
    assert error_line(capsys).startswith("error: the --grid points' 35 training examples: --guide.components 4, "
                                         "--batch-size 8, --num-particles 2 on 35 training examples: batch_size (8) "
                                         "and the last batch (3 of 35")
    assert not trained and not out.exists()
    assert run_cli([*argv, "--num-particles", "4", "--grid", "lr=0.01"]) == 0
