"""The batched NUTS sampler (pyrobnn.infer.batched_nuts, hmc_util, potential) against independent computations:
Stan's warm-up windows written out, the iterative U-turn checks against the criterion applied to every balanced
sub-trajectory of a stored trajectory, dual averaging and Welford's variance against their formulas, the batched
potential against one pass per chain, and the draws against closed forms (a correlated Gaussian, Bayesian linear
regression), against Pyro's NUTS (two moons, y = x³) and NumPyro's (y = x³), a bimodal target (R-hat), and
Neal's funnel (divergences)."""

from __future__ import annotations

import importlib.util
import math
import sys

import pyro
import pytest
import torch
from pyro.ops.stats import effective_sample_size
from torch import nn

from pyrobnn import BayesianNetwork, Categorical, Gaussian, GaussianPrior, ScaleMixturePrior
from pyrobnn.data import cubic, two_moons
from pyrobnn.distributions import IsotropicNormal
from pyrobnn.infer import batched_nuts
from pyrobnn.infer.batched_nuts import BatchedNUTS, sample_chains
from pyrobnn.infer.hmc_util import (
    DualAveraging,
    Subtree,
    WelfordVariance,
    Window,
    adaptation_windows,
    checkpoint_range,
    extend_subtree,
    is_turning,
    leapfrog,
)
from pyrobnn.infer.mcmc import chain_diagnostics, sample_posterior, summarise
from pyrobnn.infer.potential import BatchedPotential, CannotBatch, FlatPotential
from pyrobnn.model.priors import Prior
from pyrobnn.networks import MLP
from tests.support import nuts

COMPILERS = ["trace", "none"]  # inductor (seconds to compile) is checked once, in test_every_compiler_...


def gaussian_potential(mean: torch.Tensor, cov: torch.Tensor):
    """U(z) = (z - m)^T Sigma^-1 (z - m) / 2 and its gradient, for every row of z."""
    precision = torch.linalg.inv(cov)

    def potential(z):
        centred = z - mean
        grad = centred @ precision
        return 0.5 * (grad * centred).sum(-1), grad

    return potential


CORRELATED_MEAN = torch.tensor([1.0, -2.0])
CORRELATED_COV = torch.tensor([[1.0, 0.9 * 3**0.5], [0.9 * 3**0.5, 3.0]])  # sd 1 and sqrt 3, correlation 0.9


# ----------------------------------------------------------------------------- 1. the pure pieces


def test_adaptation_windows_follow_stans_schedule():
    """Stan's reference manual: 75 fast, then slow windows 25, 50, 100, 200, 500 (the last stretched), 50 fast."""
    assert adaptation_windows(1000) == [Window(0, 74), Window(75, 99), Window(100, 149), Window(150, 249),
                                        Window(250, 449), Window(450, 949), Window(950, 999)]
    assert adaptation_windows(150) == [Window(0, 74), Window(75, 99), Window(100, 149)]
    assert adaptation_windows(100) == [Window(0, 14), Window(15, 89), Window(90, 99)]  # 15 % / 75 % / 10 %
    assert adaptation_windows(10) == [Window(0, 9)] and adaptation_windows(0) == []
    for n in range(20, 400, 7):  # contiguous, covering every iteration
        windows = adaptation_windows(n)
        assert windows[0].start == 0 and windows[-1].end == n - 1
        assert all(a.end + 1 == b.start for a, b in zip(windows, windows[1:]))


def test_checkpoint_range_closes_every_balanced_subtrajectory():
    """Leaf n (odd) must be checked against the starts n + 1 - 2^k of every balanced sub-trajectory it ends, each
    still held at its checkpoint (stored when that start leaf was even and not overwritten since)."""
    slots = {}
    for n in range(2**9):
        low, high = checkpoint_range(n)
        if n % 2 == 0:
            assert low == high + 1  # nothing to check
            slots[high] = n
        else:
            trailing = (n ^ (n + 1)).bit_length() - 1
            starts = {n + 1 - 2**k for k in range(1, trailing + 1)}
            assert {slots[j] for j in range(low, high + 1)} == starts


def test_leapfrog_matches_a_step_by_hand_and_runs_back():
    potential = gaussian_potential(CORRELATED_MEAN, CORRELATED_COV)
    z, r = torch.tensor([[0.3, -1.0], [2.0, 0.5]]), torch.tensor([[1.0, 0.2], [-0.4, 0.7]])
    inverse_mass, eps = torch.tensor([[1.0, 2.0], [0.5, 1.0]]), torch.tensor([[0.1], [0.25]])
    _, grad = potential(z)
    z1, r1, u1, grad1 = leapfrog(z, r, grad, eps * inverse_mass, 0.5 * eps, potential)
    r_half = r - 0.5 * eps * grad  # Neal 2011, eq. 5.18-5.20
    z_hand = z + eps * inverse_mass * r_half
    assert torch.allclose(z1, z_hand) and torch.allclose(r1, r_half - 0.5 * eps * potential(z_hand)[1])
    assert torch.allclose(u1, potential(z_hand)[0])
    z0, r0, _, _ = leapfrog(z1, r1, grad1, -eps * inverse_mass, -0.5 * eps, potential)  # time-reversible
    assert torch.allclose(z0, z, atol=1e-6) and torch.allclose(r0, r, atol=1e-6)


def test_extend_subtree_u_turns_as_the_criterion_on_every_balanced_subtrajectory():
    """A harmonic oscillator turns its momentum around; the iterative checks (stored dot products) must stop the
    subtree exactly where the generalised criterion, applied by hand to every balanced sub-trajectory the leaf
    closes, first says so."""
    torch.manual_seed(0)
    chains, dim, leaves = 6, 3, 64
    inverse_mass = torch.rand(chains, dim) + 0.5

    def potential(z):
        return 0.5 * (z * z).sum(-1), z

    z, r = torch.randn(chains, dim), torch.randn(chains, dim)
    eps = torch.rand(chains, 1) * 0.3 + 0.1
    energy0 = potential(z)[0] + 0.5 * (inverse_mass * r * r).sum(-1)
    zeros, no = torch.zeros(chains), torch.zeros(chains, dtype=torch.bool)
    leaf = torch.stack([z, r, potential(z)[1]], 1)
    tree = Subtree(leaf, leaf, zeros, zeros, r, zeros, zeros, no, no, ~no)
    checkpoints = (torch.zeros(chains, 9, dim), torch.zeros(chains, 9, dim), torch.zeros(chains, 9))
    momenta, stopped_at = [], torch.full((chains,), -1)
    for i in range(leaves):
        low, high = checkpoint_range(i)
        check = torch.zeros(9, dtype=torch.bool)
        check[low:high + 1] = True
        was_active = tree.active.clone()
        tree, p, a = extend_subtree(tree, *checkpoints, check, torch.tensor(i == 0), torch.rand(chains),
                                    eps * inverse_mass, 0.5 * eps, inverse_mass, energy0, 1000.0, potential)
        if i % 2 == 0:
            for buffer, value in zip(checkpoints, (tree.leaf[:, 1], p, a)):
                buffer[:, high] = value
        momenta.append(tree.leaf[:, 1].clone())
        stopped_at = torch.where(was_active & ~tree.active, i, stopped_at)
    assert (stopped_at > 0).all(), "every oscillator turns within 64 leaves"
    for c in range(chains):
        expected = -1
        for n in range(1, leaves, 2):
            for k in range(1, (n ^ (n + 1)).bit_length()):
                start = n + 1 - 2**k
                part = torch.stack([m[c] for m in momenta[start:n + 1]])
                v = inverse_mass[c]
                if is_turning(v * part[0], v * part[-1], part[0], part[-1], part.sum(0)):
                    expected = n
                    break
            if expected >= 0:
                break
        assert stopped_at[c] == expected
        assert tree.turning[c] and not tree.diverging[c] and tree.num_steps[c] == expected + 1


def test_dual_averaging_follows_hoffman_and_gelman():
    mu, t0, kappa, gamma = math.log(10 * 0.3), 10, 0.75, 0.05
    averaging = DualAveraging(torch.tensor([mu]))
    g_avg = x_avg = 0.0
    for t, statistic in enumerate([0.3, -0.1, 0.5, 0.0, -0.4, 0.2], start=1):
        x = float(averaging.update(torch.tensor([statistic]))[0])
        g_avg = (1 - 1 / (t + t0)) * g_avg + statistic / (t + t0)  # Hoffman & Gelman 2014, eq. 6
        x_avg = t**-kappa * (mu - math.sqrt(t) / gamma * g_avg) + (1 - t**-kappa) * x_avg
        assert math.isclose(x, mu - math.sqrt(t) / gamma * g_avg, rel_tol=1e-5)
        assert math.isclose(float(averaging.x_avg[0]), x_avg, rel_tol=1e-5, abs_tol=1e-6)


def test_welford_variance_is_the_sample_variance_regularised_as_stan_does():
    draws = torch.randn(40, 3, 5, dtype=torch.float64) * torch.tensor([1.0, 2.0, 0.5, 3.0, 1.5], dtype=torch.float64)
    variance = WelfordVariance(draws[0])
    for z in draws:
        variance.update(z)
    sample = draws.var(0)
    assert torch.allclose(variance.variance(regularize=False), sample)
    assert torch.allclose(variance.variance(), 40 / 45 * sample + 1e-3 * 5 / 45)


# ----------------------------------------------------------------------------- 2. the batched potential


class FanInPrior(Prior):
    """N(0, 2/fan_in) on weights, N(0, 1) on biases: a different isotropic Gaussian per site."""

    def __call__(self, reference):
        scale = (2.0 / reference.shape[1]) ** 0.5 if reference.dim() > 1 else 1.0
        return IsotropicNormal(0.0, scale, reference.shape, dtype=reference.dtype, device=reference.device)


@pytest.mark.parametrize("prior", [GaussianPrior(0.3, 0.7), FanInPrior(), ScaleMixturePrior(0.5, 1.0, 0.1)],
                         ids=["gauss", "fan-in", "mixture"])
@pytest.mark.parametrize("task", ["classification", "regression"])
def test_batched_potential_is_the_flat_potential_of_every_chain(prior, task):
    torch.manual_seed(1)
    x = torch.randn(12, 3)
    if task == "classification":
        model, y = BayesianNetwork(MLP(3, (4,), 3), Categorical(), prior=prior), torch.randint(0, 3, (12,))
    else:
        model, y = BayesianNetwork(MLP(3, (4, 5), 2), Gaussian(0.4), prior=prior), torch.randn(12, 2)
    flat = FlatPotential(model, x, y)
    batched = BatchedPotential(flat)
    theta = torch.randn(5, flat.size)
    potential, grad = batched(theta)
    for c in range(5):
        one = theta[c].clone().requires_grad_()
        expected = flat({"weights": one})
        assert torch.allclose(potential[c], expected.detach(), rtol=1e-5, atol=1e-4)
        assert torch.allclose(grad[c], torch.autograd.grad(expected, one)[0], rtol=1e-4, atol=1e-4)
    predictions = batched.predictions(theta[:, None].expand(-1, 2, -1), x[:4])  # (chains, draws, points, K)
    with torch.no_grad():
        out = flat.network(flat.unflatten(theta[3]), x[:4])
    expected = out.softmax(-1) if task == "classification" else out
    assert predictions.shape == (5, 2, 4, expected.shape[-1]) and torch.allclose(predictions[3, 1], expected, atol=1e-5)


class Scaled(nn.Module):
    """A Bayesian parameter used outside a Linear/Conv layer: on the layer's output each chain's rows meet its own
    value (ParticleValues), so the batched pass runs it; on the input, shared by the chains before the first layer,
    it cannot."""

    def __init__(self, on_input: bool = False):
        super().__init__()
        self.linear = nn.Linear(2, 1)
        self.gain = nn.Parameter(torch.ones(1))
        self.on_input = on_input

    def forward(self, x):
        return self.linear(x * self.gain) if self.on_input else self.linear(x) * self.gain


def test_a_network_that_cannot_batch_is_refused_by_name_or_sampled_by_pyro():
    torch.manual_seed(0)
    x, y = torch.randn(10, 2), torch.randn(10, 1)
    BatchedPotential(FlatPotential(BayesianNetwork(Scaled(), Gaussian(0.5)), x, y))  # checks every chain's potential
    model = BayesianNetwork(Scaled(on_input=True), Gaussian(0.5))
    with pytest.raises(CannotBatch, match="outside a Linear/Conv layer"):
        BatchedPotential(FlatPotential(model, x, y))
    with pytest.raises(ValueError, match=r"sampler='batched'.*cannot run several weight vectors.*sampler='pyro'"):
        sample_posterior(model, x, y, **nuts(num_samples=5, warmup=5, sampler="batched"))
    result = sample_posterior(model, x, y, **nuts(num_samples=10, warmup=10, sampler="auto"))
    assert result.diagnostics["sampler"] == "pyro" and result.predictions.shape == (2, 10, 10, 1)


# ----------------------------------------------------------------------------- 3. the sampler


@pytest.mark.parametrize("compiler", COMPILERS)
def test_transitions_leave_the_target_distribution_invariant(compiler):
    """Chains started at exact draws of a correlated Gaussian stay distributed as it after NUTS transitions
    (stationarity, the property MCMC rests on), with a diagonal mass matrix that is not the identity."""
    chains = 20_000
    generator = torch.Generator().manual_seed(0)
    potential = gaussian_potential(CORRELATED_MEAN, CORRELATED_COV)
    z = CORRELATED_MEAN + torch.randn(chains, 2, generator=generator) @ torch.linalg.cholesky(CORRELATED_COV).T
    kernel = BatchedNUTS(potential, generator=generator, compile=compiler)
    u, grad = kernel.potential(z)
    inverse_mass = torch.tensor([[0.7, 2.5]]).expand(chains, 2)
    for _ in range(2):
        step = kernel.transition(z, u, grad, torch.full((chains,), 0.4), inverse_mass)
        z, u, grad = step.z, step.potential, step.grad
    z = z.double()
    cov = CORRELATED_COV.double()
    assert ((z.mean(0) - CORRELATED_MEAN).abs() < 4 * cov.diagonal().sqrt() / chains**0.5).all()
    assert ((z.var(0) - cov.diagonal()).abs() < 4 * cov.diagonal() * (2 / chains) ** 0.5).all()
    assert float(step.num_steps.mean()) > 3 and not step.diverging.any()


def test_correlated_gaussian_means_and_variances_within_monte_carlo_error():
    draws, stats = sample_chains(gaussian_potential(CORRELATED_MEAN, CORRELATED_COV), torch.zeros(8, 2),
                                 num_samples=500, warmup=300, generator=torch.Generator().manual_seed(1))
    assert draws.shape == (8, 500, 2) and stats["tree_depth"].shape == (8, 500)
    draws = draws.double()
    mean, cov = CORRELATED_MEAN.double(), CORRELATED_COV.double()
    ess = effective_sample_size(draws, chain_dim=0, sample_dim=1)
    assert (ess > 500).all()
    assert ((draws.flatten(0, 1).mean(0) - mean).abs() < 4 * (cov.diagonal() / ess).sqrt()).all()
    squares = (draws - mean) ** 2
    ess_squares = effective_sample_size(squares, chain_dim=0, sample_dim=1)
    error = squares.flatten(0, 1).mean(0) - cov.diagonal()
    assert (error.abs() < 4 * squares.flatten(0, 1).std(0) / ess_squares.sqrt()).all(), error
    correlation = torch.corrcoef(draws.flatten(0, 1).T)[0, 1]
    assert abs(correlation - 0.9) < 0.02
    assert not stats["diverging"].any() and 0.7 < float(stats["accept_prob"].mean()) < 1.0
    inverse_mass = stats["inverse_mass"].mean(0)  # the adapted diagonal: about the posterior variances
    assert torch.allclose(inverse_mass, CORRELATED_COV.diagonal(), rtol=0.35)


@pytest.mark.recorded
def test_nuts_recovers_bayesian_linear_regression_posterior():
    r"""y = [x, 1] beta + N(0, sigma^2), beta ~ N(0, s^2 I): the posterior is N(mu, Sigma) with
    Sigma = (X^T X / sigma^2 + I / s^2)^{-1}, mu = Sigma X^T y / sigma^2 (X with a column of ones)."""
    torch.manual_seed(0)
    n, d, sigma, s = 20, 2, 0.5, 1.0
    x = torch.randn(n, d) @ torch.tensor([[1.0, 0.6], [0.0, 0.8]])
    y = x @ torch.tensor([[1.0], [-0.5]]) + 0.3 + sigma * torch.randn(n, 1)
    model = BayesianNetwork(nn.Linear(d, 1), Gaussian(sigma), prior=GaussianPrior(0.0, s), num_data=n)
    result = sample_posterior(model, x, y, **nuts(num_samples=400, warmup=300, num_chains=4, seed=0, sampler="batched"))
    diag = result.diagnostics
    assert diag["sampler"] == "batched" and diag["converged"] and diag["warnings"] == [] and diag["divergences"] == 0
    design = torch.cat([x, torch.ones(n, 1)], 1).double()
    cov = torch.linalg.inv(design.T @ design / sigma**2 + torch.eye(d + 1, dtype=torch.float64) / s**2)
    mean = cov @ design.T @ y.double().squeeze(1) / sigma**2
    theta = torch.cat([result.draws["net.weight"].flatten(2), result.draws["net.bias"]], -1).double()
    ess = effective_sample_size(theta, chain_dim=0, sample_dim=1)
    theta = theta.flatten(0, 1)
    assert ((theta.mean(0) - mean).abs() < 4 * (cov.diagonal() / ess).sqrt()).all()
    assert torch.allclose(theta.var(0), cov.diagonal(), rtol=0.2)
    assert ((torch.cov(theta.T) - cov).abs() / cov.diagonal().sqrt().outer(cov.diagonal().sqrt()) < 0.15).all()
    # per draw: the sampler's own statistics, and predictions at the training inputs (function space)
    assert result.stats["tree_depth"].shape == (4, 400) and result.predictions.shape == (4, 400, n, 1)
    assert diag["prediction_r_hat_max"] < 1.05 and diag["prediction_ess_min"] > 200
    assert torch.allclose(result.predictions[2, 7].double(), (design @ theta[2 * 400 + 7])[:, None], atol=1e-4)


def predictive_moments(values: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Mean and variance over draws of ``values`` ``(chains, draws, points)`` with their Monte-Carlo variances: the
    mean's var / ESS, and the variance's own, var((x - mean)^2) / ESS((x - mean)^2) (the variance is the mean of the
    squared deviations, so it has their autocorrelation and their spread; the Gaussian 2 var^2 / ESS is wrong for
    bounded, skewed values such as a class probability)."""
    values = values.double()
    ess = effective_sample_size(values, chain_dim=0, sample_dim=1).clamp(min=10)
    flat = values.flatten(0, 1)
    mean = flat.mean(0)
    squares = (values - mean) ** 2
    squares_ess = effective_sample_size(squares, chain_dim=0, sample_dim=1).clamp(min=10)
    return mean, flat.var(0), flat.var(0) / ess, squares.flatten(0, 1).var(0) / squares_ess


def assert_same_predictive(a, b, z_max: float = 4.5) -> None:
    """Two samplers' predictive means agree within their Monte-Carlo errors, and so do their variances."""
    (m1, v1, m1_error, v1_error), (m2, v2, m2_error, v2_error) = a, b
    z_mean = (m1 - m2) / (m1_error + m2_error).sqrt()
    z_var = (v1 - v2) / (v1_error + v2_error).sqrt()
    assert (z_mean.abs() < z_max).all(), z_mean
    assert (z_var.abs() < z_max).all(), z_var


@pytest.mark.recorded
@pytest.mark.slow
def test_two_moons_predictive_agrees_with_pyros_nuts_and_numpyros():
    """The same model, prior and data, sampled by Pyro's NUTS, by the batched sampler and by NumPyro's NUTS (an
    independent implementation in JAX): the predictive probability of class 1 on a grid agrees within Monte-Carlo
    error."""
    data = two_moons(400, 30, seed=0)
    grid = torch.stack(torch.meshgrid(torch.linspace(-1.5, 2.5, 5), torch.linspace(-1.0, 1.5, 5), indexing="xy"),
                       -1).reshape(-1, 2)
    predictive = {}
    for sampler, chains, draws in (("pyro", 2, 100), ("batched", 8, 150)):
        pyro.set_rng_seed(0)
        model = BayesianNetwork(MLP(2, (3,), 2), prior=GaussianPrior(0.0, 1.0))
        result = sample_posterior(model, data.x_train, data.y_train, **nuts(
            num_samples=draws, warmup=draws, num_chains=chains, seed=0, sampler=sampler, prediction_x=grid,
            init_jitter=0.1))
        assert result.diagnostics["sampler"] == sampler and result.diagnostics["prediction_r_hat_max"] < 1.1
        predictive[sampler] = predictive_moments(result.predictions[..., 1])
    assert_same_predictive(predictive["pyro"], predictive["batched"])
    if importlib.util.find_spec("numpyro") is not None:
        reference = predictive_moments(numpyro_predictive(data.x_train, data.y_train, grid, (2, 3, 2), chains=4,
                                                          draws=200).softmax(-1)[..., 1])
        assert_same_predictive(reference, predictive["batched"])
        assert_same_predictive(reference, predictive["pyro"])


def cubic_problem(hidden: int = 6):
    """y = x³ + N(0, 3²) on 20 points, x and y standardised on them, the noise 3 / s_y; a grid over the data and
    beyond it (the extrapolation where the posterior is widest)."""
    data = cubic(n_train=20, n_test=10, seed=1)
    x, y = data.x_train, data.y_train
    x, y, s_y = (x - x.mean()) / x.std(), (y - y.mean()) / y.std(), float(y.std())
    grid = torch.linspace(-2.5, 2.5, 9)[:, None]
    return x, y, 3.0 / s_y, grid, hidden


def numpyro_predictive(x, y, grid, widths: tuple[int, int, int], chains: int, draws: int, noise: float | None = None,
                       max_tree_depth: int = 10):
    """NumPyro's NUTS on the same one-hidden-layer ReLU network of ``widths`` (in, hidden, out), prior N(0, 1) and
    likelihood (Gaussian of ``noise``, or categorical on the logits when it is None), written independently in JAX:
    the network's outputs at ``grid`` ``(chains, draws, points, out)``."""
    jax = pytest.importorskip("jax")
    numpyro = pytest.importorskip("numpyro")
    import numpyro.distributions as nd
    from jax import numpy as jnp

    def mlp(params, inputs):
        return jax.nn.relu(inputs @ params["w1"].T + params["b1"]) @ params["w2"].T + params["b2"]

    inputs_, hidden, outputs = widths
    shapes = {"w1": (hidden, inputs_), "b1": (hidden,), "w2": (outputs, hidden), "b2": (outputs,)}

    def model(inputs, targets):
        params = {name: numpyro.sample(name, nd.Normal(0.0, 1.0).expand(shape).to_event(len(shape)))
                  for name, shape in shapes.items()}
        out = mlp(params, inputs)
        observed = nd.Normal(out, noise).to_event(2) if noise is not None else nd.Categorical(logits=out).to_event(1)
        numpyro.sample("y", observed, obs=targets)

    kernel = numpyro.infer.NUTS(model, max_tree_depth=max_tree_depth)
    mcmc = numpyro.infer.MCMC(kernel, num_warmup=draws, num_samples=draws, num_chains=chains,
                              chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), jnp.asarray(x.numpy()), jnp.asarray(y.numpy()))
    samples = mcmc.get_samples(group_by_chain=True)
    outs = jax.vmap(jax.vmap(lambda params: mlp(params, jnp.asarray(grid.numpy()))))(samples)
    return torch.from_numpy(jax.device_get(outs).copy())


CUBIC_TREE_DEPTH = 7
"""Every sampler of the y = x³ comparison stops trajectories at 127 leapfrog steps (a valid NUTS kernel at any depth;
this posterior's trajectories would otherwise run to hundreds of steps: at depth 8 the test took 84 s, Pyro's NUTS
58 s of it; the tolerances come from each sampler's ESS, so shorter trajectories widen them, never bias them)."""


@pytest.mark.recorded
@pytest.mark.slow
def test_cubic_predictive_agrees_with_pyros_nuts_and_numpyros():
    """y = x³ with a 1-6-1 ReLU network: the predictive mean function's mean and variance on a grid (inside the
    data and extrapolating) agree between the batched sampler, Pyro's NUTS and NumPyro's NUTS (an independent
    implementation in JAX), within Monte-Carlo error."""
    pytest.importorskip("numpyro")
    x, y, noise, grid, hidden = cubic_problem()
    predictive = {}
    for sampler, chains, draws in (("pyro", 2, 100), ("batched", 8, 200)):
        pyro.set_rng_seed(0)
        model = BayesianNetwork(MLP(1, (hidden,), 1), Gaussian(noise), prior=GaussianPrior(0.0, 1.0))
        result = sample_posterior(model, x, y, **nuts(num_samples=draws, warmup=draws, num_chains=chains, seed=0,
                                  sampler=sampler, prediction_x=grid, init_jitter=0.1, compile="trace",
                                  max_tree_depth=CUBIC_TREE_DEPTH))
        assert result.diagnostics["prediction_r_hat_max"] < 1.1
        predictive[sampler] = predictive_moments(result.predictions[..., 0])
    assert_same_predictive(predictive["pyro"], predictive["batched"])
    reference = predictive_moments(numpyro_predictive(x, y, grid, (1, hidden, 1), chains=4, draws=300, noise=noise,
                                                      max_tree_depth=CUBIC_TREE_DEPTH)[..., 0])
    assert_same_predictive(reference, predictive["batched"])
    assert_same_predictive(reference, predictive["pyro"])


def test_chains_in_different_modes_are_flagged_by_r_hat():
    """Two well separated modes; chains started in each stay there: split R-hat (on the draws as on any function
    of them) reads far above 1.05 and summarise says so."""
    centres = torch.tensor([[-4.0, 0.0], [4.0, 0.0]])

    def bimodal(z):
        d2 = ((z[:, None] - centres) ** 2).sum(-1) / (2 * 0.3**2)  # (C, 2 modes)
        weights = torch.softmax(-d2, -1)
        potential = -torch.logsumexp(-d2, -1)
        grad = (weights[..., None] * (z[:, None] - centres)).sum(1) / 0.3**2
        return potential, grad

    start = torch.tensor([[-4.0, 0.1], [4.0, -0.1], [-4.1, 0.0], [3.9, 0.0]])
    draws, stats = sample_chains(bimodal, start, num_samples=200, warmup=100,
                                 generator=torch.Generator().manual_seed(0))
    assert (draws[[0, 2], :, 0] < 0).all() and (draws[[1, 3], :, 0] > 0).all()
    assert chain_diagnostics({"z": draws})["z"]["r_hat_max"] > 2
    per_chain = [{"divergences": 0, "leapfrog_steps": 1.0}] * 4
    diagnostics = summarise({"z": draws}, per_chain, seconds=1.0, predictions=draws[..., :1] ** 2 + draws[..., :1])
    assert not diagnostics["converged"] and diagnostics["prediction_r_hat_max"] > 2
    assert any("chains disagree" in w for w in diagnostics["warnings"])
    assert any("chains predict differently" in w for w in diagnostics["warnings"])


@pytest.mark.recorded
def test_weight_symmetry_inflates_weight_r_hat_but_not_function_space_r_hat():
    """f(x) = v tanh(w x) is the same function at (w, v) and (-w, -v): chains in the two mirrored modes disagree
    on every weight, not on a single prediction."""
    torch.manual_seed(0)
    x = torch.linspace(-2, 2, 25)[:, None]
    y = 1.5 * torch.tanh(x) + 0.05 * torch.randn(25, 1)
    net = nn.Sequential(nn.Linear(1, 1, bias=False), nn.Tanh(), nn.Linear(1, 1, bias=False))
    model = BayesianNetwork(net, Gaussian(0.05), prior=GaussianPrior(0.0, 2.0))
    initial = torch.tensor([[1.0, 1.5], [-1.0, -1.5], [1.0, 1.5], [-1.0, -1.5]])
    result = sample_posterior(model, x, y, **nuts(num_samples=150, warmup=100, num_chains=4, seed=0, initial=initial))
    diag = result.diagnostics
    assert diag["sampler"] == "batched" and diag["r_hat_max"] > 1.5 and not diag["converged"]
    assert diag["prediction_r_hat_max"] < 1.05, diag["prediction_r_hat_max"]


def test_funnel_reports_divergences():
    """Neal's funnel, v ~ N(0, 3^2), x_i ~ N(0, e^v): its neck is too narrow for one step size, and NUTS says so by
    counting divergent transitions (energy error above 1000). 32 chains in one batched pass cost what 4 do and reach
    the neck (v < -5) in every seed tried (0-3: 4-8 divergences kept, 139-163 in warm-up); 4 chains may not."""

    def funnel(z):
        v, x = z[:, 0], z[:, 1:]
        potential = v**2 / 18 + 0.5 * (x**2).sum(-1) * torch.exp(-v) + 0.5 * x.shape[1] * v
        grad_v = v / 9 - 0.5 * (x**2).sum(-1) * torch.exp(-v) + 0.5 * x.shape[1]
        return potential, torch.cat([grad_v[:, None], x * torch.exp(-v)[:, None]], 1)

    draws, stats = sample_chains(funnel, torch.zeros(32, 10), num_samples=100, warmup=100, max_tree_depth=6,
                                 generator=torch.Generator().manual_seed(0))
    assert int(stats["diverging"].sum()) > 0 and int(stats["warmup_divergences"].sum()) > 0


@pytest.mark.slow
def test_same_seed_same_draws_and_every_compiler_the_same_transition():
    potential = gaussian_potential(CORRELATED_MEAN, CORRELATED_COV)
    runs = [sample_chains(potential, torch.zeros(3, 2), num_samples=20, warmup=30, compile=compiler,
                          generator=torch.Generator().manual_seed(5)) for compiler in ("trace", "trace", "none")]
    assert [stats["compile"] for _, stats in runs] == ["trace", "trace", "none"]
    assert torch.equal(runs[0][0], runs[1][0]) and torch.allclose(runs[0][0], runs[2][0], atol=1e-5)
    other = sample_chains(potential, torch.zeros(3, 2), num_samples=20, warmup=30,
                          generator=torch.Generator().manual_seed(6))[0]
    assert not torch.allclose(runs[0][0], other)
    # inductor's fused kernels round differently, so long runs part ways; one transition agrees
    z = torch.randn(16, 2, generator=torch.Generator().manual_seed(0))
    steps = []
    for compiler in ("trace", "inductor"):
        kernel = BatchedNUTS(potential, generator=torch.Generator().manual_seed(1), compile=compiler)
        steps.append(kernel.transition(z, *kernel.potential(z), torch.full((16,), 0.3), torch.ones(16, 2)))
        assert kernel.leaf_compile == compiler
    assert torch.allclose(steps[0].z, steps[1].z, atol=1e-4) and torch.equal(steps[0].num_steps, steps[1].num_steps)


@pytest.mark.parametrize("compiler", COMPILERS)
def test_narrow_checks_of_large_states_give_the_same_trees(monkeypatch, compiler):
    """A state of NARROW_CHECK_STATE numbers or more checks one checkpoint in the leaf's graph and the others after it
    (the same U-turn criterion, fewer numbers read): the same draws, tree depths and leapfrog steps as all at once."""
    potential = gaussian_potential(CORRELATED_MEAN, CORRELATED_COV * 25.0)  # long trees: leaves close 1-6 checkpoints
    runs = {}
    for narrow in (False, True):
        monkeypatch.setattr(batched_nuts, "NARROW_CHECK_STATE", 0 if narrow else 10**9)
        runs[narrow] = sample_chains(potential, torch.zeros(4, 2), num_samples=40, warmup=40, compile=compiler,
                                     max_tree_depth=7, generator=torch.Generator().manual_seed(3))
    (wide_draws, wide), (narrow_draws, narrow) = runs[False], runs[True]
    assert int(wide["tree_depth"].max()) >= 4  # the further checks ran
    assert torch.equal(wide["num_steps"], narrow["num_steps"]) and torch.equal(wide["tree_depth"], narrow["tree_depth"])
    assert torch.allclose(wide_draws, narrow_draws, atol=1e-5)


def test_the_tree_depth_limit_bounds_every_trajectory():
    _, stats = sample_chains(gaussian_potential(CORRELATED_MEAN, CORRELATED_COV * 1e4), torch.zeros(4, 2),
                             num_samples=30, warmup=20, max_tree_depth=2, generator=torch.Generator().manual_seed(0))
    assert int(stats["tree_depth"].max()) == 2 and float(stats["num_steps"].max()) <= 3


# ----------------------------------------------------------------------------- 4. the entry point


def _regression(n=8):
    torch.manual_seed(7)
    model = BayesianNetwork(nn.Linear(2, 1), Gaussian(0.5), num_data=n)
    return model, torch.randn(n, 2), torch.randn(n, 1)


@pytest.mark.parametrize("kwargs, match", [
    ({"num_chains": 0}, "num_chains must be a positive integer"),
    ({"max_tree_depth": 0}, "max_tree_depth must be a positive integer"),
    ({"sampler": "hmc"}, "sampler must be one of"),
    ({"prediction_x": torch.zeros(3, 5)}, r"prediction_x must be a non-empty tensor of inputs shaped like x"),
])
def test_bad_arguments_get_one_clear_error(kwargs, match):
    model, x, y = _regression()
    with pytest.raises(ValueError, match=match):
        sample_posterior(model, x, y, **nuts(**{"num_samples": 5, "warmup": 5, **kwargs}))


def test_draws_export_to_arviz(monkeypatch):
    pytest.importorskip("arviz")
    model, x, y = _regression()
    result = sample_posterior(model, x, y, **nuts(num_samples=12, warmup=10, num_chains=3, seed=0))
    data = result.to_inference_data()
    assert data.posterior["net.weight"].shape == (3, 12, 1, 2)
    assert data.sample_stats["diverging"].shape == (3, 12) and data.sample_stats["tree_depth"].shape == (3, 12)
    assert data.predictions["predictions"].shape == (3, 12, 8, 1)
    monkeypatch.setitem(sys.modules, "arviz", None)
    with pytest.raises(ImportError, match="pip install arviz"):
        result.to_inference_data()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_runs_on_cuda():
    model, x, y = _regression()
    model.cuda()
    result = sample_posterior(model, x.cuda(), y.cuda(), **nuts(num_samples=20, warmup=20, num_chains=4, seed=0))
    assert result.diagnostics["sampler"] == "batched" and result.draws["net.weight"].is_cuda
    assert math.isfinite(result.diagnostics["prediction_r_hat_max"])
