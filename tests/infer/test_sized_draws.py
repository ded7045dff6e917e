"""A test report sized to the run: :func:`~pyrobnn.infer.predict.sized_draws` chooses the draws from one draw's
measured cost, and :func:`~pyrobnn.analysis.evaluate.monte_carlo_error` states the metrics' Monte-Carlo error from the
two halves of the draws. No assertion rests on a time: the budgets are far above or below any pass."""

from __future__ import annotations

import json
import math

import pyro
import pytest
import torch
from torch import nn

from pyrobnn import BayesianNetwork, Gaussian, MixtureNodeGuide, NodePrior, NormalGuide
from pyrobnn.analysis.calibration import Mixture
from pyrobnn.analysis.evaluate import evaluate, monte_carlo_error
from pyrobnn.analysis.metrics import classification_metrics
from pyrobnn.guides import PosteriorDraws
from pyrobnn.infer.predict import LEAST_DRAWS, sized_draws
from tests.support import MOONS, run_cli

HUGE = 10**15
"""Inputs per draw that no machine predicts within any budget here."""


def _net():
    pyro.clear_param_store()
    return BayesianNetwork(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)), num_data=64)


def test_a_cheap_report_keeps_the_methods_draws_and_a_costly_one_the_fewest():
    model = _net()
    guide, x = NormalGuide(model), torch.randn(64, 4)
    kept = sized_draws(model, guide, x, budget=0.0, most=100)  # 100 draws of 64 rows: far below FREE_SECONDS
    assert kept.num_samples == 100 and "all 100 of the method's take" in str(kept)
    fewest = sized_draws(model, guide, x, budget=0.0, most=100, rows=HUGE, free=0.0)
    assert fewest.num_samples == LEAST_DRAWS == 2 and fewest.rows == HUGE
    assert "the fewest a report takes (2, two halves for its Monte-Carlo error)" in str(fewest)
    assert "--num-samples N sets the number" in str(fewest)
    assert sized_draws(model, guide, x, budget=0.0, most=1, rows=HUGE, free=0.0).num_samples == 1  # never above most
    with pytest.raises(ValueError, match="most must be a positive integer"):
        sized_draws(model, guide, x, budget=1.0, most=0)


def test_the_draws_fill_the_budget_between_the_fewest_and_the_most():
    model = _net()
    guide, x = NormalGuide(model), torch.randn(64, 4)
    rows = 10**8
    chosen = sized_draws(model, guide, x, budget=1e6, most=10**9, rows=rows, free=0.0)
    expected = int(1e6 // chosen.seconds_per_draw)  # what one measured draw's cost allows
    assert chosen.num_samples == expected and LEAST_DRAWS < expected < 10**9
    assert "the most within" in str(chosen) and "the run so far" in str(chosen)


def test_a_mixture_guides_draws_are_a_multiple_of_its_components():
    pyro.clear_param_store()
    model = BayesianNetwork(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)), prior=NodePrior(), num_data=64)
    guide, x = MixtureNodeGuide(model, num_components=3), torch.randn(64, 4)
    guide(x)
    assert sized_draws(model, guide, x, budget=0.0, most=100).num_samples == 99  # 100 rounded down to 3s
    assert sized_draws(model, guide, x, budget=0.0, most=100, rows=HUGE, free=0.0).num_samples == 3


def test_measuring_leaves_the_random_state_and_the_empirical_draws_as_they_were():
    model = _net()
    draws = PosteriorDraws({name: torch.randn(5, *site.shape) for name, site in _sites(model).items()})
    x = torch.randn(64, 4)
    torch.manual_seed(7)
    before = torch.get_rng_state()
    assert sized_draws(model, draws, x, budget=0.0, most=5).num_samples == 5
    assert torch.equal(torch.get_rng_state(), before) and draws.index == 0


def _sites(model):
    guide = NormalGuide(model)
    guide(torch.randn(2, 4))
    return {name: guide.posterior(name).mean for name in guide.site_names}


def test_the_monte_carlo_error_is_the_spread_of_the_metrics_over_the_halves():
    generator = torch.Generator().manual_seed(0)
    log_probs = torch.randn(6, 50, 3, generator=generator).log_softmax(-1)
    y = torch.randint(0, 3, (50,), generator=generator)
    errors = monte_carlo_error(Mixture(log_probs=log_probs), y)
    first, second = (classification_metrics(part.exp().mean(0), y) for part in (log_probs[:3], log_probs[3:]))
    assert errors == pytest.approx({k: math.sqrt(math.pi / 8) * abs(first[k] - second[k]) for k in first}, abs=1e-12)
    assert set(errors) == {"accuracy", "nll", "ece", "brier"}
    assert monte_carlo_error(Mixture(log_probs=log_probs[:1]), y) == {}  # one draw: no Monte-Carlo error
    same = monte_carlo_error(Mixture(log_probs=log_probs[:1].expand(4, -1, -1)), y)
    assert same == {"accuracy": 0.0, "nll": 0.0, "ece": 0.0, "brier": 0.0}  # draws that agree


def test_a_regressions_monte_carlo_error_names_its_metrics():
    model = BayesianNetwork(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)), Gaussian(0.5), num_data=32)
    guide, x, y = NormalGuide(model, init_rho=-2.0), torch.randn(32, 4), torch.randn(32, 1)
    metrics = evaluate(model, guide, x, y, num_samples=10, mc_error=True)
    assert set(metrics["mc_error"]) == {"rmse", "nll", "mae", "log_likelihood"}
    assert all(value > 0 for value in metrics["mc_error"].values())


def test_train_sizes_an_unset_report_and_obeys_a_given_one(tmp_path, capsys):
    base = [arg for arg in MOONS if arg not in ("--num-samples", 5)]
    assert run_cli(["train", *base, "--method", "mcdropout", "--epochs", "1", "--out", tmp_path / "auto"]) == 0
    out = capsys.readouterr().out
    assert "report draws sized to the run after training" in out
    assert "test report: 100 predictive draws of 200 inputs" in out and "all 100 of the method's take" in out
    metrics = json.loads((tmp_path / "auto" / "metrics.json").read_text())["test"]
    assert set(metrics["mc_error"]) == {"accuracy", "nll", "ece", "brier"} and "± Monte-Carlo error" in out
    assert run_cli(["train", *MOONS, "--method", "mcdropout", "--epochs", "1", "--out", tmp_path / "given"]) == 0
    out = capsys.readouterr().out
    assert "report draws 5" in out and "test report:" not in out and "test metrics (5 samples)" in out
