"""NUTS on a BayesianNetwork (pyrobnn.infer.mcmc), checked against independent computations: the flat
potential against the model's own Pyro trace and a hand-written log joint, the draws against the
closed-form posterior of Bayesian linear regression, the empirical guide's predictive against an
average over draws computed by hand, split R-hat against its textbook formula, and the argument
checks. Every NUTS run is a few weights and a few hundred draws."""

from __future__ import annotations

import math

import numpy as np
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine
from pyro.distributions import constraints
from torch import nn
from torch.func import functional_call

from pyrobnn import BayesianNetwork, Categorical, Gaussian, GaussianPrior, LogUniformPrior, ScaleMixturePrior
from pyrobnn.guides import PosteriorDraws
from pyrobnn.infer.mcmc import MAX_FULL_BATCH, FlatPotential, MCMCResult, chain_diagnostics, sample_posterior
from pyrobnn.infer.predict import predict
from pyrobnn.infer.recording import ExecutorFailed
from pyrobnn.model.priors import Prior
from tests.support import nuts

MLP_SITES = ["net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias"]


def mlp(d_in: int, hidden: int, d_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d_in, hidden), nn.Tanh(), nn.Linear(hidden, d_out))


def split_by_hand(theta: torch.Tensor, shapes: list[tuple[int, ...]]) -> list[torch.Tensor]:
    """theta cut into consecutive blocks of the given shapes (the layout FlatPotential documents)."""
    out, start = [], 0
    for shape in shapes:
        size = math.prod(shape)
        out.append(theta[..., start:start + size].reshape(theta.shape[:-1] + shape))
        start += size
    assert start == theta.shape[-1]
    return out


# ----------------------------------------------------------------------------- 1. the potential


@pytest.mark.parametrize("prior", [GaussianPrior(0.3, 0.7), ScaleMixturePrior(0.5, 1.0, 0.1)], ids=["gauss", "mix"])
@pytest.mark.parametrize("task", ["classification", "regression"])
def test_potential_equals_trace_log_joint_and_its_gradient(prior, task):
    torch.manual_seed(1)
    n, d_in, hidden = 12, 3, 4
    x = torch.randn(n, d_in)
    if task == "classification":
        net, likelihood, y = mlp(d_in, hidden, 3), Categorical(), torch.randint(0, 3, (n,))
    else:
        net, likelihood, y = mlp(d_in, hidden, 2), Gaussian(0.4), torch.randn(n, 2)
    d_out = 3 if task == "classification" else 2
    model = BayesianNetwork(net, likelihood, prior=prior, num_data=n)
    potential = FlatPotential(model, x, y)
    shapes = [(hidden, d_in), (hidden,), (d_out, hidden), (d_out,)]
    assert potential.names == MLP_SITES
    assert [tuple(s) for s in potential.shapes] == shapes
    assert potential.size == sum(math.prod(s) for s in shapes)

    generator = torch.Generator().manual_seed(2)
    for _ in range(3):
        theta = (0.8 * torch.randn(potential.size, generator=generator)).requires_grad_()
        log_joint = potential.log_joint(theta)
        (grad,) = torch.autograd.grad(log_joint, theta)

        weights = {name: part.detach().clone().requires_grad_()
                   for name, part in zip(MLP_SITES, split_by_hand(theta.detach(), shapes))}
        trace = poutine.trace(poutine.condition(model, data=weights)).get_trace(x, y)
        for name in MLP_SITES:  # the trace really scored these weights, as observed prior sites
            assert trace.nodes[name]["is_observed"] and trace.nodes[name]["value"] is weights[name]
        assert trace.nodes["obs"]["scale"] == 1.0  # num_data = len(x): the full batch, unscaled
        expected = trace.log_prob_sum()
        expected_grad = torch.autograd.grad(expected, list(weights.values()))

        assert torch.allclose(log_joint, expected, rtol=1e-5, atol=1e-4), (log_joint, expected)
        assert torch.allclose(grad, torch.cat([g.reshape(-1) for g in expected_grad]), rtol=1e-4, atol=1e-4)
        assert torch.allclose(potential({"weights": theta.detach()}), -expected.detach(), rtol=1e-5, atol=1e-4)

    compiled = FlatPotential(model, x, y).compile()  # compile="trace": the recording, the same value and gradient
    theta = (0.8 * torch.randn(potential.size, generator=generator)).requires_grad_()
    value, traced = potential({"weights": theta}), compiled({"weights": theta})
    assert torch.allclose(traced, value, rtol=1e-5, atol=1e-4)
    assert torch.allclose(torch.autograd.grad(traced, theta)[0], torch.autograd.grad(value, theta)[0],
                          rtol=1e-4, atol=1e-4)


def test_potential_equals_hand_written_log_joint():
    """log N(w; 0.3, 0.7^2) + log N(y; W2 tanh(W0 x + b0) + b2, 0.4^2), in float64 by hand."""
    torch.manual_seed(3)
    x, y = torch.randn(10, 2), torch.randn(10, 1)
    model = BayesianNetwork(mlp(2, 3, 1), Gaussian(0.4), prior=GaussianPrior(0.3, 0.7), num_data=10)
    potential = FlatPotential(model, x, y)
    theta = torch.randn(potential.size)
    w0, b0, w2, b2 = (t.double() for t in split_by_hand(theta, [(3, 2), (3,), (1, 3), (1,)]))
    xd, yd = x.double(), y.double()
    out = torch.tanh(xd @ w0.T + b0) @ w2.T + b2
    expected = (torch.distributions.Normal(0.3, 0.7).log_prob(theta.double()).sum()
                + torch.distributions.Normal(out, 0.4).log_prob(yd).sum())
    assert math.isclose(float(potential.log_joint(theta)), float(expected), rel_tol=1e-5, abs_tol=1e-4)
    assert torch.allclose(potential.network(potential.unflatten(theta), x).double(), out, atol=1e-5)
    # the network outside the potential still samples: the cached weights do not leak out
    assert not torch.allclose(model.net(x).double(), out, atol=1e-3)


def test_initial_and_unflatten_round_trip():
    model = BayesianNetwork(mlp(2, 3, 2), num_data=5)
    potential = FlatPotential(model, torch.randn(5, 2), torch.randint(0, 2, (5,)))
    theta = potential.initial()
    expected = torch.cat([getattr(model.net[i], f"{attr}_init").reshape(-1)
                          for i in (0, 2) for attr in ("weight", "bias")])
    assert torch.equal(theta, expected)
    batch = torch.randn(4, 5, potential.size)
    parts = potential.unflatten(batch)
    assert list(parts) == MLP_SITES and parts["net.2.weight"].shape == (4, 5, 2, 3)
    assert torch.equal(torch.cat([v.flatten(2) for v in parts.values()], -1), batch)


def test_mode_is_the_ridge_solution_and_chains_start_there():
    r"""Gaussian prior N(0, s^2) and likelihood N(y; X beta, sigma^2): the MAP estimate is the ridge solution
    (X^T X / sigma^2 + I / s^2)^{-1} X^T y / sigma^2 (X with a column of ones); ``map_steps`` starts every chain
    there, plus its jitter."""
    n, sigma, s = 30, 0.5, 0.7
    model, x, y = _regression(n, prior=GaussianPrior(0.0, s))
    model.likelihood = Gaussian(sigma)
    potential = FlatPotential(model, x, y)
    design = torch.cat([x, torch.ones(n, 1)], 1).double()
    ridge = torch.linalg.solve(design.T @ design / sigma**2 + torch.eye(3, dtype=torch.float64) / s**2,
                               design.T @ y.double().squeeze(1) / sigma**2)
    start = potential.initial()
    mode = potential.mode(start, 3000, lr=0.02)
    assert torch.allclose(mode.double(), ridge, atol=1e-3) and not torch.allclose(start.double(), ridge, atol=0.1)
    assert torch.equal(potential.initial(), start)  # the network's own weights are not moved
    far = torch.full((3,), 5.0)  # one draw of one leapfrog step from far away stays far; from the mode, near it
    for steps, near in ((0, False), (3000, True)):
        result = sample_posterior(model, x, y, **nuts(num_samples=1, warmup=0, num_chains=2, initial=far,
                                                      map_steps=steps, max_tree_depth=1, seed=0, sampler="batched"))
        first = torch.cat([result.draws["net.weight"].flatten(2), result.draws["net.bias"]], -1)[:, 0].double()
        assert bool(((first - ridge).norm(dim=-1) < 1.0).all()) is near, first


# ----------------------------------------------------------------------------- 2. linear regression


@pytest.mark.recorded
def test_nuts_recovers_bayesian_linear_regression_posterior():
    r"""y = [x, 1] beta + N(0, sigma^2), beta ~ N(0, s^2 I): the posterior is N(mu, Sigma) with
    Sigma = (X^T X / sigma^2 + I / s^2)^{-1}, mu = Sigma X^T y / sigma^2 (X with a column of ones)."""
    torch.manual_seed(0)
    n, d, sigma, s = 20, 2, 0.5, 1.0
    x = torch.randn(n, d) @ torch.tensor([[1.0, 0.6], [0.0, 0.8]])  # correlated inputs: a tilted posterior
    y = x @ torch.tensor([[1.0], [-0.5]]) + 0.3 + sigma * torch.randn(n, 1)
    model = BayesianNetwork(nn.Linear(d, 1), Gaussian(sigma), prior=GaussianPrior(0.0, s), num_data=n)
    result = sample_posterior(model, x, y, **nuts(num_samples=300, warmup=200, num_chains=2, seed=0))

    design = torch.cat([x, torch.ones(n, 1)], 1).double()
    cov = torch.linalg.inv(design.T @ design / sigma**2 + torch.eye(d + 1, dtype=torch.float64) / s**2)
    mean = cov @ design.T @ y.double().squeeze(1) / sigma**2

    assert result.draws["net.weight"].shape == (2, 300, 1, d) and result.draws["net.bias"].shape == (2, 300, 1)
    diag = result.diagnostics
    assert diag["converged"] and diag["warnings"] == [] and diag["divergences"] == 0 and diag["num_weights"] == 3
    assert diag["r_hat_max"] < 1.05 and diag["ess_min"] > 100
    theta = torch.cat([result.draws["net.weight"].flatten(2), result.draws["net.bias"]], -1).flatten(0, 1).double()
    sd = cov.diagonal().sqrt()
    error = (theta.mean(0) - mean).abs()
    assert (error < 4 * sd / math.sqrt(diag["ess_min"])).all(), (theta.mean(0), mean, diag["ess_min"])
    sample_cov = torch.cov(theta.T)
    assert torch.allclose(sample_cov.diagonal(), cov.diagonal(), rtol=0.35), (sample_cov.diagonal(), cov.diagonal())
    # correlations within 0.25 (the posterior of the two slopes is strongly tilted)
    assert ((sample_cov - cov).abs() / torch.outer(sd, sd) < 0.25).all()
    assert cov[0, 1] / (sd[0] * sd[1]) < -0.3

    # the empirical guide's predictive against the analytic posterior predictive N(x mu, x Sigma x^T + sigma^2)
    x_test = torch.tensor([[-2.0, 1.0], [0.0, 0.0], [1.5, 2.0]])
    posterior = result.guide()
    assert len(posterior) == 600
    pred = predict(model, posterior, x_test, num_samples=len(posterior))
    design_test = torch.cat([x_test, torch.ones(3, 1)], 1).double()
    by_hand = design_test @ theta.T  # (3, S): the network output of every draw
    pred = {key: value.squeeze(1).double() for key, value in pred.items()}
    assert torch.allclose(pred["mean"], by_hand.mean(1), atol=1e-4)
    assert torch.allclose(pred["epistemic_std"], by_hand.std(1, unbiased=False), atol=1e-4)
    assert torch.allclose(pred["std"], (by_hand.var(1, unbiased=False) + sigma**2).sqrt(), atol=1e-4)
    analytic_sd = (design_test @ cov @ design_test.T).diagonal().sqrt()
    assert ((pred["mean"] - design_test @ mean).abs() < 4 * analytic_sd / math.sqrt(diag["ess_min"])).all()


# ----------------------------------------------------------------------------- 3. the empirical guide


def test_posterior_draws_predictive_is_the_average_over_draws():
    torch.manual_seed(4)
    model = BayesianNetwork(mlp(2, 3, 3), Categorical(), num_data=8)
    shapes = {"net.0.weight": (3, 2), "net.0.bias": (3,), "net.2.weight": (3, 3), "net.2.bias": (3,)}
    chains, per_chain = 2, 4
    draws = {name: 1.5 * torch.randn((chains, per_chain) + shape) for name, shape in shapes.items()}
    posterior = MCMCResult(model, draws).guide()
    assert len(posterior) == chains * per_chain
    for name, value in posterior.draws().items():  # chain-major: draw c * S + s is chain c's draw s
        assert torch.equal(value[per_chain + 1], draws[name][1, 1])

    x = torch.randn(5, 2)
    plain = mlp(2, 3, 3)  # an ordinary copy of the architecture, fed each draw's weights
    probs = []
    for c in range(chains):
        for s in range(per_chain):
            params = {name[len("net."):]: draws[name][c, s] for name in shapes}
            probs.append(functional_call(plain, params, (x,)).softmax(-1))
    expected = torch.stack(probs).mean(0)

    pred = predict(model, posterior, x, num_samples=len(posterior))
    assert torch.allclose(pred["probs"], expected, atol=1e-6)
    assert not torch.allclose(torch.stack(probs)[0], expected, atol=1e-2)  # the draws really differ
    # the guide cycles: a partial call shifts the start, a full pass still covers every draw once
    predict(model, posterior, x, num_samples=3)
    assert torch.allclose(predict(model, posterior, x, num_samples=len(posterior))["probs"], expected, atol=1e-6)
    # FlatPotential.network agrees with the hand-built network on a draw
    potential = FlatPotential(model, x, torch.zeros(5, dtype=torch.long))
    first = {name: value[0] for name, value in posterior.draws().items()}
    assert torch.allclose(potential.network(first, x).softmax(-1), probs[0], atol=1e-6)


def test_posterior_draws_rejects_bad_draws():
    with pytest.raises(ValueError, match="at least one site"):
        PosteriorDraws({})
    with pytest.raises(ValueError, match="same number of draws"):
        PosteriorDraws({"a": torch.zeros(3, 2), "b": torch.zeros(4)})


# ----------------------------------------------------------------------------- 4. diagnostics


def split_r_hat_by_hand(chains: np.ndarray) -> float:
    """Gelman et al. (2013) split R-hat of one scalar from (chains, samples) draws."""
    half = chains.shape[1] // 2
    parts = np.concatenate([chains[:, :half], chains[:, -half:]])
    n = parts.shape[1]
    within = parts.var(axis=1, ddof=1).mean()
    between = n * parts.mean(axis=1).var(ddof=1)
    return math.sqrt(((n - 1) / n * within + between / n) / within)


def test_chain_diagnostics_flag_chains_at_different_means():
    generator = torch.Generator().manual_seed(5)
    same = torch.randn(2, 400, 3, generator=generator, dtype=torch.float64)
    apart = same.clone()
    apart[1, :, 2] += 3.0  # only element 2 of chain 1 sits at another mode
    out = chain_diagnostics({"same": same, "apart": apart})

    assert out["same"]["r_hat_max"] < 1.02
    assert out["apart"]["r_hat_max"] > 1.05
    for name, draws in (("same", same), ("apart", apart)):
        by_hand = max(split_r_hat_by_hand(draws[..., k].numpy()) for k in range(3))
        assert math.isclose(out[name]["r_hat_max"], by_hand, rel_tol=1e-6), (name, out[name], by_hand)
    assert 400 < out["same"]["ess_min"] < 1200  # iid draws: ESS close to the 800 draws
    assert out["apart"]["ess_min"] < 20  # two separated clusters: a handful of effective draws

    short = chain_diagnostics({"w": torch.zeros(2, 1, 3)})["w"]  # too few draws to check: inf and 0, no crash
    assert short == {"r_hat_max": math.inf, "ess_min": 0.0}
    with pytest.raises(ValueError, match=r"\(chains, samples"):
        chain_diagnostics({"w": torch.zeros(5)})


def _sign_symmetric_model():
    """y = v tanh(w x): (w, v) and (-w, -v) fit equally well, two modes far apart for tight data."""
    torch.manual_seed(6)
    n = 30
    x = torch.linspace(-3, 3, n).unsqueeze(1)
    y = 1.5 * torch.tanh(x) + 0.05 * torch.randn(n, 1)
    net = nn.Sequential(nn.Linear(1, 1, bias=False), nn.Tanh(), nn.Linear(1, 1, bias=False))
    return BayesianNetwork(net, Gaussian(0.05), prior=GaussianPrior(0.0, 2.0), num_data=n), x, y


@pytest.mark.recorded
def test_nuts_chains_at_opposite_modes_are_flagged():
    model, x, y = _sign_symmetric_model()
    initial = torch.tensor([[1.0, 1.5], [-1.0, -1.5]])
    result = sample_posterior(model, x, y, **nuts(num_samples=100, warmup=100, num_chains=2, seed=0, initial=initial))
    w, v = result.draws["net.0.weight"].flatten(2), result.draws["net.2.weight"].flatten(2)
    assert (w[0] > 0).all() and (v[0] > 0).all() and (w[1] < 0).all() and (v[1] < 0).all()  # each kept its mode
    diag = result.diagnostics
    assert diag["converged"] is False and diag["r_hat_max"] > 1.05
    assert any("chains disagree" in warning and "R-hat" in warning for warning in diag["warnings"])
    assert diag["sites"]["net.0.weight"]["r_hat_max"] > 1.05 and diag["sites"]["net.2.weight"]["r_hat_max"] > 1.05

    # the same chains started in one mode agree (w and v are correlated: 200 draws for a steady R-hat)
    same = sample_posterior(model, x, y, **nuts(num_samples=200, warmup=100, num_chains=2, seed=0, initial=initial[0]))
    assert same.diagnostics["converged"] is True and same.diagnostics["warnings"] == []
    assert (same.draws["net.0.weight"] > 0).all()


def test_too_few_draws_warn_instead_of_crashing():
    model, x, y = _sign_symmetric_model()
    result = sample_posterior(model, x, y, **nuts(num_samples=1, warmup=5, num_chains=1, seed=0,
                              initial=torch.tensor([1.0, 1.5])))
    assert result.draws["net.0.weight"].shape == (1, 1, 1, 1)
    assert result.diagnostics["converged"] is False
    assert any("too few for split R-hat" in warning for warning in result.diagnostics["warnings"])


# ----------------------------------------------------------------------------- 5. bad inputs


class _NoDensity(dist.TorchDistribution):
    """A prior that can be sampled but has no log density (Distribution.log_prob raises NotImplementedError)."""

    arg_constraints = {}
    support = constraints.real

    def __init__(self, shape):
        super().__init__(torch.Size(), torch.Size(shape))

    def sample(self, sample_shape=torch.Size()):
        return torch.zeros(self._extended_shape(sample_shape))


class NoDensityPrior(Prior):
    def __call__(self, reference):
        return _NoDensity(reference.shape)


class PerWeightPrior(Prior):
    """Forgets .to_event: one log density per weight instead of one per parameter."""

    def __call__(self, reference):
        return dist.Normal(torch.zeros_like(reference), 1.0)


class NarrowUniformPrior(Prior):
    def __call__(self, reference):
        return dist.Uniform(-1e-3 * torch.ones_like(reference), 1e-3 * torch.ones_like(reference)).to_event(
            reference.dim())


def _regression(n=8, prior=None, deterministic=False):
    torch.manual_seed(7)
    model = BayesianNetwork(nn.Linear(2, 1), Gaussian(0.5), prior=prior, num_data=n, deterministic=deterministic,
                            input_shape=(2,))
    return model, torch.randn(n, 2), torch.randn(n, 1)


@pytest.mark.parametrize("kwargs, match", [
    ({"num_samples": 0}, "num_samples must be a positive integer"),
    ({"num_samples": 2.5}, "num_samples must be a positive integer"),
    ({"num_chains": 0}, "num_chains must be a positive integer"),
    ({"warmup": -1}, "warmup must be an integer >= 0"),
    ({"warmup": True}, "warmup must be an integer >= 0"),
    ({"max_data": 5}, r"8 training examples exceed max_data=5.*SVI"),
    ({"init_jitter": -0.1}, "init_jitter"),
    ({"target_accept": 1.0}, "target_accept"),
    ({"max_tree_depth": 0}, "max_tree_depth"),
    ({"map_steps": -1}, r"map_steps must be an integer >= 0"),
    ({"map_steps": 1.5}, r"map_steps must be an integer >= 0"),
    ({"initial": torch.zeros(4)}, r"initial must be a tensor of shape \(3,\) or \(2, 3\)"),
    ({"initial": torch.zeros(3, 3)}, r"initial must be a tensor of shape"),
    ({"initial": torch.tensor([0.0, math.nan, 0.0])}, "initial weights must be finite"),
])
def test_bad_arguments(kwargs, match):
    model, x, y = _regression()
    with pytest.raises(ValueError, match=match):
        sample_posterior(model, x, y, **nuts(**{"num_samples": 5, "warmup": 5, "num_chains": 2, **kwargs}))


def test_bad_data():
    model, x, y = _regression()
    with pytest.raises(ValueError, match="x has 8 examples but y has 7"):
        sample_posterior(model, x, y[:7], **nuts(num_samples=5, warmup=5))
    with pytest.raises(ValueError, match="per-example shape"):
        sample_posterior(model, x[:, :1], y, **nuts(num_samples=5, warmup=5))
    big = MAX_FULL_BATCH + 1  # the documented default limit of full-batch NUTS
    with pytest.raises(ValueError, match=f"{big} training examples exceed max_data={MAX_FULL_BATCH}"):
        sample_posterior(model, torch.zeros(big, 2), torch.zeros(big, 1), **nuts(num_samples=5, warmup=5))


@pytest.mark.parametrize("prior, match", [
    (LogUniformPrior(), "improper log-uniform prior"),
    (NoDensityPrior(), r"'net.weight' \(_NoDensity\) has no density.*Gaussian or scale-mixture"),
    (PerWeightPrior(), r"log densities of shape \(1, 2\), not one number.*to_event"),
    (NarrowUniformPrior(), r"'net.weight' \(Independent\) has support .*not every real number"),
    (GaussianPrior(0.0, 1e-30), "log density -inf at the network's weights.*finite density"),
])
def test_priors_without_a_usable_density(prior, match):
    model, x, y = _regression(prior=prior)
    with pytest.raises(ValueError, match=match):
        sample_posterior(model, x, y, **nuts(num_samples=5, warmup=5))


def test_deterministic_model_has_nothing_to_sample():
    model, x, y = _regression(deterministic=True)
    with pytest.raises(ValueError, match="no Bayesian parameters.*deterministic=True"):
        sample_posterior(model, x, y, **nuts(num_samples=5, warmup=5))


def test_effective_sample_size_of_anti_correlated_draws_is_capped_not_negative():
    draws = torch.tensor([(-1.0) ** i for i in range(200)]).view(1, 200, 1) + 1e-3 * torch.randn(1, 200, 1)
    ess = chain_diagnostics({"w": draws})["w"]["ess_min"]
    assert ess == pytest.approx(200 * math.log10(200))


def test_pyros_sampler_asked_to_compile_refuses_in_one_line_and_runs_the_recorded_potential():
    # one executor policy: an explicit mode that cannot run is an error naming it and the way out
    model, x, y = _regression()
    with pytest.raises(ExecutorFailed, match=r"compile='inductor' cannot run Pyro's NUTS .*compile='auto'"):
        sample_posterior(model, x, y, **nuts(num_samples=4, warmup=4, num_chains=1, seed=0, sampler="pyro",
                         compile="inductor"))
    result = sample_posterior(model, x, y, **nuts(num_samples=4, warmup=4, num_chains=1, seed=0, sampler="pyro",
                              compile="trace"))
    assert result.diagnostics["sampler"] == "pyro" and result.diagnostics["compile"] == "trace"
