r"""The last-layer Laplace approximation (``pyrobnn.infer.laplace``, ``pyrobnn train --laplace``) through laplace-torch.

On regression with a linear last layer the sampled predictive variance of the output must match the closed form of the
Kronecker-factored posterior (independent weight and bias blocks),
:math:`\phi_*^\top (\lambda I + \Phi^\top\Phi/\sigma^2)^{-1}\phi_* + 1/(\lambda + N/\sigma^2)`, and
laplace-torch's own linearised predictive, within Monte-Carlo error; the prior precision maximises the marginal
likelihood; the sites below the last layer stay at the MAP; the command line writes draws that ``pyrobnn evaluate``
reads back with the same numbers."""

from __future__ import annotations

import json

import pyro
import pytest
import torch
from torch import nn

from pyrobnn import BayesianNetwork, NodePrior, NormalGuide, PointGuide, fit, predict
from pyrobnn.checkpoint import load_checkpoint
from pyrobnn.data import load_dataset
from pyrobnn.guides.point import point_values
from pyrobnn.infer.laplace import fit_laplace, last_layer_inputs
from pyrobnn.model.likelihoods import Gaussian, HeteroscedasticGaussian
from pyrobnn.networks import MLP
from tests.infer.test_ensemble import assert_evaluate_reproduces
from tests.support import MOONS, run_cli

SIGMA = 0.1


@pytest.fixture(scope="module")
def regression():
    """A MAP fit of a 1-16-1 tanh-free ReLU network to y = sin(3x) + N(0, 0.1^2) on 64 points."""
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(64, 1, generator=generator) * 2 - 1
    y = torch.sin(3 * x) + SIGMA * torch.randn(64, 1, generator=generator)
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    model = BayesianNetwork(MLP(1, (16,), 1), Gaussian(SIGMA), num_data=64)
    guide = PointGuide(model, name="regression")
    fit(model, guide, x, y, epochs=150, batch_size=64, progress=False)
    return model, guide, x, y, torch.linspace(-1.5, 1.5, 20)[:, None]


def test_sampled_variance_matches_the_kron_closed_form_and_laplace_torchs_glm_predictive(regression):
    model, guide, x, y, x_test = regression
    result = fit_laplace(model, guide, x, y, num_samples=4000, seed=1)
    phi, phi_test = last_layer_inputs(model, guide, x), last_layer_inputs(model, guide, x_test)
    prior = result.prior_precision[0]
    weight_precision = prior * torch.eye(phi.shape[1], dtype=torch.float64) + phi.double().T @ phi.double() / SIGMA**2
    closed = (phi_test.double() @ torch.linalg.solve(weight_precision, phi_test.double().T)).diagonal() \
        + 1 / (prior + len(x) / SIGMA**2)
    _, glm = result.laplace(phi_test, pred_type="glm")
    torch.testing.assert_close(glm.reshape(-1).double(), closed, rtol=1e-3, atol=1e-9)
    sampled = predict(model, result.guide(), x_test, num_samples=len(result))["epistemic_std"].reshape(-1) ** 2
    assert torch.allclose(sampled.double(), closed, rtol=0.12), (sampled, closed)  # sd of the estimate: 2.2 %


def test_prior_precision_maximises_the_marginal_likelihood(regression):
    model, guide, x, y, _ = regression
    result = fit_laplace(model, guide, x, y, num_samples=2)
    best = torch.tensor(result.prior_precision)
    evidence = {factor: float(result.laplace.log_marginal_likelihood(prior_precision=best * factor))
                for factor in (0.5, 1.0, 2.0)}
    assert evidence[1.0] == pytest.approx(result.log_marginal_likelihood)
    assert evidence[1.0] > evidence[0.5] and evidence[1.0] > evidence[2.0]
    assert best.item() != pytest.approx(1.0)  # tuned away from laplace-torch's initial value


def test_classification_samples_the_last_layer_around_the_map_and_keeps_the_rest(tmp_path):
    data = load_dataset("two-moons", train_size=100, test_size=100, seed=0)
    pyro.set_rng_seed(0)
    model = BayesianNetwork(MLP(2, (16,), 2), num_data=100)
    guide = PointGuide(model)
    fit(model, guide, data.x_train, data.y_train, epochs=60, batch_size=50, optimizer=lambda m, g: torch.optim.Adam(
        [*g.parameters()], lr=0.02), progress=False)
    result = fit_laplace(model, guide, data.x_train, data.y_train, num_samples=400, seed=0)
    values = point_values(guide)
    assert {name: tuple(v.shape) for name, v in result.draws.items()} == {
        "net.1.weight": (1, 1, 16, 2), "net.1.bias": (1, 1, 16), "net.3.weight": (1, 400, 2, 16),
        "net.3.bias": (1, 400, 2)}
    assert torch.equal(result.draws["net.1.weight"][0, 0], values["net.1.weight"])
    last = result.draws["net.3.weight"][0]
    spread = last.std(0)
    assert (spread > 0).all()
    assert ((last.mean(0) - values["net.3.weight"]).abs() <= 4 * spread / 20).all()  # within 4 standard errors
    map_probs = predict(model, guide, data.x_test, num_samples=1)["probs"]
    laplace = predict(model, result.guide(), data.x_test, num_samples=len(result))
    assert laplace["probs"].max(-1).values.mean() < map_probs.max(-1).values.mean()  # less confident than the MAP
    assert laplace["epistemic"].mean() > 0
    again = fit_laplace(model, guide, data.x_train, data.y_train, num_samples=400, seed=0)
    assert all(torch.equal(again.draws[k], result.draws[k]) for k in result.draws)  # the seed fixes the draws


def test_what_has_no_last_layer_laplace_is_refused(regression):
    model, guide, x, y, _ = regression
    with pytest.raises(ValueError, match="is no point estimate"):
        fit_laplace(model, NormalGuide(model, name="normal"), x, y)
    hetero = BayesianNetwork(MLP(1, (4,), 2), HeteroscedasticGaussian(), num_data=64)
    with pytest.raises(ValueError, match="Categorical or Gaussian likelihood"):
        fit_laplace(hetero, PointGuide(hetero, name="hetero"), x, y)
    squashed = BayesianNetwork(nn.Sequential(nn.Linear(1, 4), nn.ReLU(), nn.Linear(4, 1), nn.Tanh()), Gaussian(SIGMA),
                               num_data=64)
    with pytest.raises(ValueError, match="not its last nn.Linear's"):
        fit_laplace(squashed, PointGuide(squashed, name="squashed"), x, y)
    nodes = BayesianNetwork(MLP(1, (4,), 1), Gaussian(SIGMA), prior=NodePrior(), num_data=64)
    with pytest.raises(ValueError, match="no Bayesian weight"):
        fit_laplace(nodes, PointGuide(nodes, name="nodes"), x, y)


def test_cli_laplace_writes_draws_that_evaluate_reads_back(tmp_path, capsys):
    out = tmp_path / "run"
    assert run_cli(["train", *MOONS, "--epochs", 3, "--lr", 0.01, "--guide", "point", "--laplace", "--num-samples", 30,
                    "--out", out]) == 0
    report = json.loads((out / "metrics.json").read_text())
    assert report["laplace"]["prior_precision"][0] > 0 and "log_marginal_likelihood" in report["laplace"]
    state = load_checkpoint(out / "draws.pt")
    assert state["kind"] == "laplace" and state["laplace"] == report["laplace"]
    draws = state["draws"]
    assert draws["net.1.weight"].shape == (1, 1, 8, 2) and draws["net.3.weight"].shape == (1, 30, 2, 8)
    assert_evaluate_reproduces(out, "laplace", 30, tmp_path, capsys)
    map_fit = tmp_path / "map.json"  # checkpoint.pt is the MAP fit the approximation starts from
    assert run_cli(["evaluate", "--checkpoint", out / "checkpoint.pt", "--num-samples", 1, "--json", map_fit,
                    "--no-progress"]) == 0
    assert json.loads(map_fit.read_text())["test"]["nll"] != report["test"]["nll"]
