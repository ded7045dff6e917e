"""Stochastic-gradient MCMC (``pyrobnn.infer.sgmcmc``): SGLD and SGHMC at a small step size sample a 2-D correlated
Gaussian and the closed-form posterior of Bayesian linear regression (means and variances within Monte-Carlo error,
judged by the effective sample size; the regression through ``fit``'s minibatch loss, so a wrong N in the noise shows
as a posterior N times too wide), cyclical SGHMC follows Zhang et al.'s cosine schedule and keeps its draws in the
sampling stages, and bad settings are refused before anything trains."""

from __future__ import annotations

import math

import pyro
import pytest
import torch
from pyro.ops.stats import effective_sample_size
from torch import nn

from pyrobnn import BayesianNetwork, NormalGuide, PointGuide, fit, predict
from pyrobnn.infer.optim import trained_parameters
from pyrobnn.infer.schedules import LinearWarmup
from pyrobnn.infer.sgmcmc import SGHMC, SGMCMC_SAMPLERS, SGMCMCOptimizer, StepSchedule, fit_sgmcmc
from pyrobnn.infer.svi import Checkpoint, TrainingDiverged
from pyrobnn.model.likelihoods import Gaussian
from pyrobnn.model.priors import GaussianPrior

COVARIANCE = torch.tensor([[1.0, 0.8], [0.8, 1.0]])


def assert_moments(draws: torch.Tensor, mean: torch.Tensor, variance: torch.Tensor, bias: float = 0.0) -> None:
    """``draws`` ``(chains, samples, d)`` have ``mean`` and ``variance`` within 4 Monte-Carlo standard errors (from
    the effective sample size of each coordinate: sqrt(var / ESS) for the mean, var sqrt(2 / ESS) for the variance),
    the variance also within the relative discretisation ``bias`` of the step size."""
    ess = effective_sample_size(draws.double(), chain_dim=0, sample_dim=1).float()
    flat = draws.reshape(-1, draws.shape[-1])
    assert (ess > 100).all(), ess
    assert ((flat.mean(0) - mean).abs() < 4 * (variance / ess).sqrt()).all(), (flat.mean(0), mean, ess)
    assert ((flat.var(0) - variance).abs() < variance * (4 * (2 / ess).sqrt() + bias)).all(), (flat.var(0), variance,
                                                                                            ess)


@pytest.mark.parametrize("friction, lr", [(1.0, 0.01), (0.1, 0.002)])
@pytest.mark.parametrize("temperature", [1.0, 0.25])
def test_sgld_and_sghmc_sample_a_correlated_gaussian(friction, lr, temperature):
    """U(θ) = θᵀΣ⁻¹θ / 2 with correlation 0.8, 200 chains of the optimiser's own step on the exact gradient: the draws
    have the mean 0, the variances T Σ_ii and the correlation 0.8 of exp(-U / T); ε λ_max = 0.05 bounds SGLD's
    discretisation bias (ε λ / 2 on the variance)."""
    torch.manual_seed(0)
    precision = torch.linalg.inv(COVARIANCE)
    theta = nn.Parameter(torch.zeros(200, 2))
    optim = SGHMC([theta], lr=lr, friction=friction, temperature=temperature)
    draws = []
    for step in range(2500):
        theta.grad = theta.detach() @ precision
        optim.step()
        if step >= 500:
            draws.append(theta.detach().clone())
    draws = torch.stack(draws, 1)
    assert_moments(draws, torch.zeros(2), temperature * COVARIANCE.diag(), bias=lr * 5 / 2)
    assert torch.corrcoef(draws.reshape(-1, 2).T)[0, 1] == pytest.approx(0.8, abs=0.03)


N, SIGMA = 64, 1.0


@pytest.fixture(scope="module")
def regression():
    """64 rows of y = x w + N(0, 1) noise with two correlated inputs, and the exact posterior of w under N(0, I):
    precision A = XᵀX / σ² + I, mean A⁻¹ Xᵀ y / σ²."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(N, 2, generator=generator) @ torch.tensor([[1.0, 0.6], [0.0, 0.8]])
    y = x @ torch.tensor([1.0, -0.5]) + SIGMA * torch.randn(N, generator=generator)
    precision = x.T @ x / SIGMA ** 2 + torch.eye(2)
    covariance = torch.linalg.inv(precision)
    return x, y[:, None], covariance @ x.T @ y / SIGMA ** 2, covariance


SGLD = {**SGMCMC_SAMPLERS["sgld"], "temperature": 1.0}
"""SGLD's settings (the posterior: temperature 1)."""


def linear(c: int = 0):
    """Bayesian linear regression as a network: one Linear without bias, N(0, 1) prior, the fixed noise σ = 1."""
    model = BayesianNetwork(nn.Linear(2, 1, bias=False), Gaussian(SIGMA), prior=GaussianPrior(scale=1.0), num_data=N)
    return model, PointGuide(model, init_loc="prior")


@pytest.mark.parametrize("name, lr", [("sgld", 0.05), ("sghmc", 0.01)])
def test_sgld_and_sghmc_recover_the_posterior_of_bayesian_linear_regression(regression, name, lr):
    """16 chains as one stacked network, batches of 16 of the 64 rows, ``lr`` per example (ε = lr / 64 on the summed
    loss, ε λ_max ≈ 0.09 for SGLD): the draws of the last 70 % of 300 epochs have the closed-form posterior mean and
    variances within Monte-Carlo error. The noise of the per-example rate instead of ε would widen them 64-fold."""
    x, y, mean, covariance = regression
    settings = {**SGMCMC_SAMPLERS[name], "temperature": 1.0, "exploration": 0.3}
    pyro.set_rng_seed(1)
    result = fit_sgmcmc(*linear(), x, y, lr=lr, **settings, chains=16, make_chain=linear, epochs=300, batch_size=16,
                        seed=1, progress=False)
    draws = result.draws["net.weight"][:, :, 0, :]
    assert draws.shape == (16, 210, 2) and len(result) == 16 * 210 and result.draw_epochs == list(range(91, 301))
    assert_moments(draws, mean, covariance.diag(), bias=lr * 1.9 / 2)
    probs = predict(result.model, result.guide(), x[:5], num_samples=len(result))["mean"]
    torch.testing.assert_close(probs, (x[:5] @ draws.reshape(-1, 2).T).mean(1, keepdim=True), rtol=1e-4, atol=1e-4)


def test_one_chain_trains_through_fit_and_keeps_a_draw_after_each_epoch_past_the_burn_in(regression):
    x, y, _, _ = regression
    records = []
    result = fit_sgmcmc(*linear(), x, y, lr=0.05, **SGLD, epochs=6, batch_size=16, progress=False,
                        on_epoch_end=lambda epoch, record: records.append(epoch))
    assert result.draw_epochs == [4, 5, 6] and result.draws["net.weight"].shape == (1, 3, 1, 2)
    assert records == list(range(6)) and len(result.epochs) == 6 and result.epochs[0]["lr"] == pytest.approx(0.05)


def test_the_cyclical_schedule_is_zhang_et_als_formula():
    """α_k = α₀/2 [cos(π mod(k-1, ⌈K/M⌉) / ⌈K/M⌉) + 1] (Zhang et al. 2020, eq. 1), noise where r(k) >= β; the
    sampler's steps follow it: with a unit gradient and no noise, step k moves θ by -ε α_k / α₀."""
    for total, cycles, exploration in ((1000, 4, 0.8), (1003, 4, 0.9), (37, 5, 0.5)):
        schedule = StepSchedule(total, cycles, exploration)
        length = math.ceil(total / cycles)
        for k in range(1, total + 1):
            r = ((k - 1) % length) / length
            assert schedule.rate(k) == pytest.approx((math.cos(math.pi * r) + 1) / 2)
            assert schedule.noisy(k) == (r >= exploration)
            assert schedule.collects(k) == ((k - 1) % length + 1 > exploration * length)
    constant = StepSchedule(100, 0, 0.5)
    assert all(constant.rate(k) == 1 and constant.noisy(k) for k in range(1, 101))
    assert [k for k in range(1, 101) if constant.collects(k)] == list(range(51, 101))

    schedule = StepSchedule(40, 2, 0.5)
    theta = nn.Parameter(torch.zeros((), dtype=torch.float64))
    optim = SGHMC([theta], lr=0.1, friction=1.0, temperature=0.0, schedule=schedule)
    moves = []
    for _ in range(40):
        before = theta.item()
        theta.grad = torch.ones((), dtype=torch.float64)
        optim.step()
        moves.append(before - theta.item())
    assert moves == pytest.approx([0.1 * schedule.rate(k) for k in range(1, 41)])

    # with momentum, the velocity carries over as in Zhang et al.'s code: v = (1 - α) v - ε_k ∇U, θ += v
    theta = nn.Parameter(torch.ones((), dtype=torch.float64))
    optim = SGHMC([theta], lr=0.1, friction=0.5, temperature=0.0, schedule=schedule)
    by_hand, velocity = 1.0, 0.0
    for k in range(1, 41):
        theta.grad = theta.detach().clone()  # U = θ² / 2
        optim.step()
        velocity = 0.5 * velocity - 0.1 * schedule.rate(k) * by_hand
        by_hand += velocity
        assert theta.item() == pytest.approx(by_hand, rel=1e-9, abs=1e-12)


def test_csghmc_keeps_its_draws_at_the_ends_of_the_epochs_of_each_sampling_stage(regression):
    """4 cycles of 5 epochs (4 steps each), exploration 0.7: the draws are those of the epochs whose last step lies in
    the last 30 % of its cycle, epochs 4 and 5 of each; the step size restarts at each cycle."""
    x, y, _, _ = regression
    result = fit_sgmcmc(*linear(), x, y, lr=0.05, friction=0.9, temperature=1.0, cycles=4, exploration=0.7,
                        epochs=20, batch_size=16, progress=False)
    assert result.draw_epochs == [4, 5, 9, 10, 14, 15, 19, 20]
    sampler = SGMCMCOptimizer(0.05, 0.9, 1.0, 4, 0.7, epochs=20, steps_per_epoch=4)
    assert sampler.schedule_of_steps().draws(20, 4) == 8


@pytest.mark.parametrize("friction", [1.0, 0.1])
def test_without_noise_the_sampler_is_sgd_with_momentum_at_the_per_example_rate(regression, friction):
    """T = 0: the step is torch's SGD with momentum 1 - α at ε = lr / N on the summed loss (the per-example rate of
    :class:`~pyrobnn.infer.optim.Optim`), so the last draw is SGD's last iterate."""
    x, y, _, _ = regression
    pyro.set_rng_seed(0)
    model, guide = linear()
    start = {k: v.clone() for k, v in guide.state_dict().items()}
    fit(model, guide, x, y, epochs=3, batch_size=16, progress=False,
        optimizer=lambda m, g: torch.optim.SGD(trained_parameters(m, g), lr=0.05 / N, momentum=1 - friction))
    sgd = guide.state_dict()["locs.net.weight_unconstrained"].clone()
    guide.load_state_dict(start)
    result = fit_sgmcmc(model, guide, x, y, lr=0.05, friction=friction, temperature=0.0, cycles=0, exploration=0.0,
                        epochs=3, batch_size=16, progress=False)
    assert result.draw_epochs == [1, 2, 3]
    torch.testing.assert_close(result.draws["net.weight"][0, -1], sgd)


@pytest.mark.parametrize("options, message", [
    (dict(friction=0.0), "friction"),
    (dict(friction=1.5), "friction"),
    (dict(temperature=-1.0), "temperature"),
    (dict(lr=0.0), "lr"),
    (dict(cycles=2, epochs=3, batch_size=22, exploration=0.9), r"no epoch of the 3 \(3 steps each\) ends past the "
                                                                "exploration of its cycle"),
    (dict(exploration=1.0), "exploration"),
    (dict(beta=LinearWarmup(2, 2)), "beta = 1"),
    (dict(checkpoint=Checkpoint("never-written.pt", resume=True)), "cannot be resumed"),
    (dict(chains=2), "needs make_chain"),
    (dict(chains=2, make_chain=linear, transform=lambda x: x), "takes no transform"),
])
def test_bad_settings_are_one_line_before_anything_trains(regression, options, message):
    x, y, _, _ = regression
    model, guide = linear()
    before = {k: v.clone() for k, v in guide.state_dict().items()}
    settings = dict(lr=0.05, **SGLD, epochs=6, batch_size=16, progress=False)
    with pytest.raises(ValueError, match=message) as error:
        fit_sgmcmc(model, guide, x, y, **{**settings, **options})
    assert "\n" not in str(error.value)
    assert all(torch.equal(before[k], v) for k, v in guide.state_dict().items())


def test_guides_without_point_values_and_networks_with_their_own_state_are_refused(regression):
    x, y, _, _ = regression
    model = linear()[0]
    with pytest.raises(ValueError, match="NormalGuide is no point estimate"):
        fit_sgmcmc(model, NormalGuide(model), x, y, lr=0.05, **SGLD, epochs=2, progress=False)
    noisy = BayesianNetwork(nn.Linear(2, 1), Gaussian(1.0, learn_scale=True), num_data=N)
    with pytest.raises(ValueError, match="likelihood.log_scale"):
        fit_sgmcmc(noisy, PointGuide(noisy), x, y, lr=0.05, **SGLD, epochs=2, progress=False)


def test_a_step_size_that_diverges_stops_training_and_says_so(regression):
    x, y, _, _ = regression
    with pytest.raises(TrainingDiverged, match="loss became (inf|nan) at epoch .* Lower the learning rate"):
        fit_sgmcmc(*linear(), x, y, lr=1e3, **SGLD, epochs=50, batch_size=16, progress=False)
