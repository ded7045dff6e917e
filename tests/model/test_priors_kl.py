"""Priors (log-densities, sampling, argument checks) and the KL divergence the ELBO uses,
checked against independent float64 evaluations of the formulas."""

from __future__ import annotations

import math

import numpy as np
import pyro.distributions as dist
import pytest
import torch
from torch import nn
from torch.distributions import kl_divergence

from pyrobnn import BayesianNetwork, GaussianPrior, MeanFieldELBO, NormalGuide, ScaleMixturePrior
from pyrobnn.distributions import IsotropicNormal, LogUniform, ScaleMixtureNormal, _DiagonalNormalKL, softplus
from pyrobnn.model.priors import PRIORS, LogUniformPrior, NodePrior, Prior

HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


# ----------------------------------------------------------------------------- references


def gauss_logpdf(w: float, loc: float, scale: float) -> float:
    return -0.5 * math.log(2 * math.pi * scale**2) - (w - loc) ** 2 / (2 * scale**2)


def mixture_logpdf(w: float, pi: float, s1: float, s2: float) -> float:
    """log(pi N(w;0,s1^2) + (1-pi) N(w;0,s2^2)) by a float64 log-sum-exp."""
    a = math.log(pi) + gauss_logpdf(w, 0.0, s1)
    b = math.log1p(-pi) + gauss_logpdf(w, 0.0, s2)
    hi, lo = max(a, b), min(a, b)
    return hi + math.log1p(math.exp(lo - hi))


def mixture_logpdf_naive(w: float, pi: float, s1: float, s2: float) -> float:
    """The textbook evaluation: underflows to log(0) away from the origin."""
    dens = pi * math.exp(gauss_logpdf(w, 0.0, s1)) + (1 - pi) * math.exp(gauss_logpdf(w, 0.0, s2))
    return math.log(dens) if dens > 0 else -math.inf


def kl_formula(mu, sigma, mu_p, sigma_p) -> float:
    """sum log(sigma_p/sigma) + (sigma^2 + (mu-mu_p)^2)/(2 sigma_p^2) - 1/2 in float64 numpy."""
    mu, sigma = np.asarray(mu, np.float64), np.asarray(sigma, np.float64)
    return float(np.sum(np.log(sigma_p / sigma) + (sigma**2 + (mu - mu_p) ** 2) / (2 * sigma_p**2) - 0.5))


# ----------------------------------------------------------------------------- Gaussian prior


@pytest.mark.parametrize("loc, scale", [(0.0, 1.0), (0.5, 2.0), (-1.3, 0.05), (0.0, 1e-3)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gaussian_prior_log_density_matches_closed_form(loc, scale, dtype):
    reference = torch.zeros(3, 4, dtype=dtype)
    prior = GaussianPrior(loc, scale)(reference)
    assert prior.event_shape == (3, 4) and prior.batch_shape == ()
    g = torch.Generator().manual_seed(1)
    w = (loc + 3 * scale * torch.randn(3, 4, generator=g, dtype=torch.float64)).to(dtype)
    expected = sum(gauss_logpdf(v, loc, scale) for v in w.double().flatten().tolist())
    got = prior.log_prob(w)
    assert got.shape == () and got.dtype == dtype
    tol = 1e-10 if dtype == torch.float64 else 1e-4
    assert got.item() == pytest.approx(expected, rel=tol, abs=tol)
    # the per-weight factors, too: one weight per event, a batch of 12 events
    each = GaussianPrior(loc, scale)(torch.zeros(1, dtype=dtype)).log_prob(w.reshape(12, 1))
    assert each.shape == (12,)
    expected_each = torch.tensor([gauss_logpdf(v, loc, scale) for v in w.double().flatten().tolist()],
                                 dtype=torch.float64)
    torch.testing.assert_close(each.double(), expected_each, rtol=tol, atol=tol)
    # and a batch of samples of the whole tensor gives one log-density per sample
    batch = torch.stack([w, w * 0.5, w - 1])
    got_batch = prior.log_prob(batch)
    assert got_batch.shape == (3,)
    for row, value in zip(batch, got_batch):
        ref = sum(gauss_logpdf(v, loc, scale) for v in row.double().flatten().tolist())
        assert value.item() == pytest.approx(ref, rel=tol, abs=tol)


def test_gaussian_prior_of_a_scalar_parameter():
    """A 0-dim parameter (e.g. a learnable temperature) has a 0-dim event: log_prob of a batch of
    values is one log-density per value."""
    prior = GaussianPrior(0.5, 2.0)(torch.zeros((), dtype=torch.float64))
    assert prior.event_shape == () and prior.batch_shape == ()
    w = torch.tensor([-1.0, 0.0, 0.5, 3.0, 10.0], dtype=torch.float64)
    got = prior.log_prob(w)
    expected = torch.tensor([gauss_logpdf(v, 0.5, 2.0) for v in w.tolist()], dtype=torch.float64)
    assert got.shape == (5,)
    torch.testing.assert_close(got, expected)
    assert prior.log_prob(w[1]).item() == pytest.approx(gauss_logpdf(0.0, 0.5, 2.0), rel=1e-12)


def test_gaussian_prior_follows_reference_dtype_and_shape():
    prior = GaussianPrior(0.0, 2.0)(torch.zeros(5, dtype=torch.float64))
    sample = prior.sample((20000,))
    assert sample.shape == (20000, 5) and sample.dtype == torch.float64
    # sample std 2 within 4 standard errors (SE of a std ~ sigma / sqrt(2 n))
    assert abs(sample.std().item() - 2.0) < 4 * 2.0 / math.sqrt(2 * sample.numel())


def test_fan_in_gaussian_prior_scales_each_weight_tensor_by_its_fan_in():
    """fan_in=True: N(loc, scale^2 / fan_in) on a weight of fan-in n (a Linear's in_features, a Conv's
    in_channels * kernel area), N(loc, bias_scale^2) on a bias; the ELBO's KL is the closed form with those scales."""
    prior = GaussianPrior(0.1, math.sqrt(2.0), fan_in=True, bias_scale=0.5)
    w = torch.linspace(-2, 2, 120, dtype=torch.float64)
    for shape, n in (((3, 20), 20), ((4, 2, 3, 5), 30)):
        got = prior(torch.zeros(shape, dtype=torch.float64)).log_prob(w[:math.prod(shape)].reshape(shape))
        sigma = math.sqrt(2.0 / n)
        assert got.item() == pytest.approx(sum(gauss_logpdf(v, 0.1, sigma) for v in w[:math.prod(shape)].tolist()),
                                           rel=1e-12)
    bias = prior(torch.zeros(4, dtype=torch.float64)).log_prob(w[:4])
    assert bias.item() == pytest.approx(sum(gauss_logpdf(v, 0.1, 0.5) for v in w[:4].tolist()), rel=1e-12)
    assert GaussianPrior(0.0, 2.0, fan_in=True)(torch.zeros(3)).scale == 2.0  # biases default to scale
    assert GaussianPrior(0.0, 2.0)(torch.zeros(3, 50)).scale == 2.0  # without fan_in, as before
    torch.manual_seed(3)
    model = BayesianNetwork(nn.Sequential(nn.Linear(20, 3)), prior=prior, num_data=20)
    guide = NormalGuide(model, init_rho=-1.0)
    expected = 0.0
    for site, scale_p in zip(model.sites(), (math.sqrt(2.0 / 20), 0.5)):
        mu, sigma = guide.loc_scale(site.name)
        expected += kl_formula(mu.detach().numpy(), sigma.detach().numpy(), 0.1, scale_p)
    kl = MeanFieldELBO().terms(model, guide, torch.randn(5, 20), torch.tensor([0, 1, 2, 1, 0])).kl.item()
    assert kl == pytest.approx(expected, rel=1e-5)


# ----------------------------------------------------------------------------- scale mixture


EXTREME_W = [0.0, 1e-30, 1e-12, 1e-8, 1e-5, 1e-4, 3.3e-4, 1e-3, 5e-3, 0.01, 0.1, 0.5, 1.0, 5.0, 30.0, 45.0,
             1e3, -1e-6, -0.2, -60.0]
MIXTURES = [(0.25, 1.0, math.exp(-8)), (0.5, math.exp(-1), math.exp(-6)), (0.75, math.exp(-2), math.exp(-7))]


@pytest.mark.parametrize("pi, s1, s2", MIXTURES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_scale_mixture_log_density_matches_logsumexp_reference(pi, s1, s2, dtype):
    w = torch.tensor(EXTREME_W, dtype=dtype)
    prior = ScaleMixturePrior(pi, s1, s2)
    got = ScaleMixtureNormal(pi, s1, s2, w.shape, dtype=dtype).log_prob(w)
    assert got.shape == w.shape and got.dtype == dtype
    assert torch.isfinite(got).all(), got
    expected = torch.tensor([mixture_logpdf(v, pi, s1, s2) for v in w.double().tolist()], dtype=torch.float64)
    if dtype == torch.float64:
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-10)
    else:
        torch.testing.assert_close(got.double(), expected, rtol=2e-6, atol=1e-4)
    # the event-level density is the sum of the factors
    total = prior(w).log_prob(w)
    assert total.shape == ()
    assert total.double().item() == pytest.approx(expected.sum().item(), rel=1e-5)


def test_scale_mixture_extreme_weights_are_where_naive_evaluation_fails():
    pi, s1, s2 = MIXTURES[0]
    # sanity of the test itself: the naive density underflows for these weights ...
    for v in (0.1, 1.0, 45.0, 1e3):
        naive_spike = (1 - pi) * math.exp(gauss_logpdf(v, 0.0, s2))
        assert naive_spike == 0.0
    assert mixture_logpdf_naive(45.0, pi, s1, s2) == -math.inf
    # ... while the prior stays exact: far from 0 only the slab counts, at 0 both components add up
    w = torch.tensor([45.0, 1e3, 0.0], dtype=torch.float64)
    got = ScaleMixtureNormal(pi, s1, s2, w.shape, dtype=torch.float64).log_prob(w)
    assert got[0].item() == pytest.approx(math.log(pi) - math.log(s1) - HALF_LOG_2PI - 45.0**2 / 2, rel=1e-14)
    assert got[1].item() == pytest.approx(math.log(pi) - math.log(s1) - HALF_LOG_2PI - 1e6 / 2, rel=1e-14)
    at_zero = math.log(pi / s1 + (1 - pi) / s2) - HALF_LOG_2PI
    assert got[2].item() == pytest.approx(at_zero, rel=1e-14)
    # and where both components matter the float64 naive value agrees
    v = 1e-3
    assert mixture_logpdf(v, pi, s1, s2) == pytest.approx(mixture_logpdf_naive(v, pi, s1, s2), rel=1e-12)


@pytest.mark.parametrize("pi, s1, s2", [(0.25, 1.0, math.exp(-8)), (0.6, 0.5, 0.02)])
def test_scale_mixture_samples_variance_and_slab_fraction(pi, s1, s2):
    n = 200_000
    w = ScaleMixtureNormal(pi, s1, s2, (n,), dtype=torch.float64).sample()
    assert w.shape == (n,) and w.dtype == torch.float64
    # E w^2 = pi s1^2 + (1-pi) s2^2; Var(w^2) = 3 (pi s1^4 + (1-pi) s2^4) - (E w^2)^2
    var = pi * s1**2 + (1 - pi) * s2**2
    fourth = 3 * (pi * s1**4 + (1 - pi) * s2**4)
    se = math.sqrt((fourth - var**2) / n)
    assert abs((w * w).mean().item() - var) < 4 * se
    assert abs(w.mean().item()) < 4 * math.sqrt(var / n)
    # P(|w| > 10 s2) = pi P(|z| > 10 s2/s1) + (1-pi) P(|z| > 10)  (~ pi for s2 << s1)
    p = pi * math.erfc(10 * s2 / s1 / math.sqrt(2)) + (1 - pi) * math.erfc(10 / math.sqrt(2))
    frac = (w.abs() > 10 * s2).double().mean().item()
    assert abs(frac - p) < 4 * math.sqrt(p * (1 - p) / n)
    if s2 / s1 < 1e-3:
        assert abs(frac - pi) < 0.01
    # the distribution reports the same moments
    d = ScaleMixtureNormal(pi, s1, s2, (3,), dtype=torch.float64)
    torch.testing.assert_close(d.variance, torch.full((3,), var, dtype=torch.float64))
    torch.testing.assert_close(d.mean, torch.zeros(3, dtype=torch.float64))


def test_scale_mixture_prior_sample_has_reference_shape_and_dtype():
    reference = torch.zeros(4, 3, dtype=torch.float64)
    prior = ScaleMixturePrior()(reference)
    s = prior.sample()
    assert s.shape == (4, 3) and s.dtype == torch.float64
    assert prior.event_shape == (4, 3)
    assert prior.sample((7,)).shape == (7, 4, 3)


# ----------------------------------------------------------------------------- KL


def _guide_posterior_and_prior(prior, shape=(3, 5), seed=0):
    """A NormalGuide posterior with random mu, rho and the model's prior for a (3, 5) weight."""
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(shape[1], shape[0], bias=False))
    model = BayesianNetwork(net, prior=prior, num_data=10)
    guide = NormalGuide(model, init_rho=-1.0)
    (site,) = model.sites()
    with torch.no_grad():
        guide.param(site.name, "locs").copy_(torch.randn(shape) * 0.7)
        guide.param(site.name, "rhos").copy_(torch.randn(shape) - 1.0)
    loc, scale = guide.loc_scale(site.name)
    return guide.posterior(site.name), site.prior(site.init), loc.detach(), scale.detach()


@pytest.mark.parametrize("loc_p, scale_p", [(0.0, 1.0), (0.3, 0.5), (-1.0, 2.0)])
def test_analytic_kl_guide_to_gaussian_prior_matches_formula(loc_p, scale_p):
    q, p, mu, sigma = _guide_posterior_and_prior(GaussianPrior(loc_p, scale_p))
    kl = kl_divergence(q, p)
    assert kl.shape == ()
    expected = kl_formula(mu.numpy(), sigma.numpy(), loc_p, scale_p)
    assert kl.item() == pytest.approx(expected, rel=1e-5, abs=1e-5)
    # the generic torch Normal-Normal KL agrees
    generic = kl_divergence(dist.Normal(mu, sigma), dist.Normal(torch.full_like(mu, loc_p),
                                                                  torch.full_like(mu, scale_p))).sum()
    assert kl.item() == pytest.approx(generic.item(), rel=1e-5)
    # the fused KL's hand-written gradient is autograd's gradient of the generic KL
    base = q.base_dist
    fused_grads = torch.autograd.grad(kl, (base.loc, base.scale))
    reference = kl_divergence(dist.Normal(base.loc, base.scale),
                              dist.Normal(torch.full_like(mu, loc_p), torch.full_like(mu, scale_p))).sum()
    for got, expected in zip(fused_grads, torch.autograd.grad(reference, (base.loc, base.scale))):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [(3, 5), (), (2, 3, 4)])
@pytest.mark.parametrize("loc_p, scale_p", [(0.0, 1.0), (0.4, 0.3)])
def test_fused_kl_backward_passes_gradcheck_and_gradgradcheck(shape, loc_p, scale_p):
    """The hand-written backward of _DiagonalNormalKL against finite differences, in float64; its
    backward is itself differentiable, so second derivatives are checked too."""
    g = torch.Generator().manual_seed(0)
    loc = torch.randn(shape, generator=g, dtype=torch.float64).requires_grad_()
    scale = (0.2 + torch.rand(shape, generator=g, dtype=torch.float64)).requires_grad_()

    def kl(a, b):
        return _DiagonalNormalKL.apply(a, b, loc_p, scale_p)

    assert kl(loc, scale).item() == pytest.approx(kl_formula(loc.detach(), scale.detach(), loc_p, scale_p),
                                                  rel=1e-12)
    assert torch.autograd.gradcheck(kl, (loc, scale))
    assert torch.autograd.gradgradcheck(kl, (loc, scale))
    # one input at a time: the other gets no gradient
    (only_loc,) = torch.autograd.grad(kl(loc, scale.detach()), (loc,))
    torch.testing.assert_close(only_loc, (loc - loc_p).detach() / scale_p**2)


def reference_softplus(rho: np.ndarray) -> np.ndarray:
    """log(1 + e^rho) in float64 by numpy, written the stable way: max(rho, 0) + log1p(e^-|rho|)."""
    return np.maximum(rho, 0.0) + np.log1p(np.exp(-np.abs(rho)))


def test_softplus_is_within_three_ulps_of_float64_over_the_whole_float32_range():
    """σ = softplus(ρ) without torch.log1p (log u minus the rounding error of u = 1 + e^ρ) against numpy's float64
    log1p: relative error at most 3 float32 ulps from ρ = -87 (e^ρ near the smallest normal float) to 110, where
    1 + e^ρ rounds to 1 (ρ < -17: σ = e^ρ), to 2 (ρ = 0), and to e^ρ (ρ > 17), and above the threshold 20."""
    rho = torch.cat([torch.linspace(-87.0, 110.0, 400_001), torch.tensor([-20.0, -16.6, 0.0, 19.99, 20.0, 20.01])])
    expected = reference_softplus(rho.double().numpy())
    got = softplus(rho).double().numpy()
    assert np.isfinite(got).all()
    assert np.max(np.abs(got - expected) / expected) <= 3 * 2.0**-24
    assert softplus(torch.tensor(-30.0)).item() == pytest.approx(math.exp(-30.0), rel=1e-7)
    assert softplus(torch.tensor(100.0)).item() == 100.0  # ρ itself above 20, where e^ρ would overflow soon


def test_softplus_gradient_is_the_sigmoid_and_its_backward_is_differentiable():
    """dσ/dρ = sigmoid(ρ), against finite differences in float64 (gradcheck), and second derivatives
    (gradgradcheck: the backward is written in differentiable operations)."""
    rho = torch.tensor([-40.0, -5.0, -0.3, 0.0, 2.0, 19.0, 25.0], dtype=torch.float64, requires_grad=True)
    (gradient,) = torch.autograd.grad(softplus(rho).sum(), rho)
    np.testing.assert_allclose(gradient.numpy(), 1.0 / (1.0 + np.exp(-rho.detach().numpy())), rtol=1e-12)
    assert torch.autograd.gradcheck(softplus, (rho,))
    assert torch.autograd.gradgradcheck(softplus, (rho,))


def test_batched_kl_to_an_isotropic_prior_is_one_kl_per_batch_entry():
    """A posterior with batch dimensions (e.g. vectorised particles) takes the unfused path: one KL
    per batch entry, summed over the event dims only, with the same gradient as the fused path."""
    g = torch.Generator().manual_seed(1)
    loc = torch.randn(4, 3, 5, generator=g, dtype=torch.float64).requires_grad_()
    scale = (0.1 + torch.rand(4, 3, 5, generator=g, dtype=torch.float64)).requires_grad_()
    p = IsotropicNormal(0.2, 0.7, (3, 5), dtype=torch.float64)
    batched = kl_divergence(dist.Normal(loc, scale).to_event(2), p)
    assert batched.shape == (4,)
    for b in range(4):
        assert batched[b].item() == pytest.approx(kl_formula(loc[b].detach(), scale[b].detach(), 0.2, 0.7),
                                                  rel=1e-12)
        fused = kl_divergence(dist.Normal(loc[b], scale[b]).to_event(2), p)
        assert fused.item() == pytest.approx(batched[b].item(), rel=1e-12)
    fused_total = sum(kl_divergence(dist.Normal(loc[b], scale[b]).to_event(2), p) for b in range(4))
    for got, expected in zip(torch.autograd.grad(batched.sum(), (loc, scale)),
                             torch.autograd.grad(fused_total, (loc, scale))):
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("loc_p, scale_p", [(0.0, 1.0), (0.5, 0.3)])
def test_analytic_kl_agrees_with_monte_carlo(loc_p, scale_p):
    dtype = torch.float64
    mu = torch.tensor([0.3, -0.8, 1.2], dtype=dtype)
    sigma = torch.tensor([0.2, 0.9, 0.5], dtype=dtype)
    q = dist.Normal(mu, sigma).to_event(1)
    p = GaussianPrior(loc_p, scale_p)(mu)
    analytic = kl_divergence(q, p).item()
    assert analytic == pytest.approx(kl_formula(mu, sigma, loc_p, scale_p), rel=1e-12)
    n = 200_000
    w = q.sample((n,))
    log_ratio = q.log_prob(w) - p.log_prob(w)
    mc, se = log_ratio.mean().item(), log_ratio.std().item() / math.sqrt(n)
    assert abs(mc - analytic) < 4 * se, (mc, analytic, se)


def test_scale_mixture_has_no_closed_form_kl_and_mc_estimate_is_consistent():
    pi, s1, s2 = 0.5, 1.0, 0.1
    dtype = torch.float64
    mu = torch.tensor([0.05, -0.3], dtype=dtype)
    sigma = torch.tensor([0.05, 0.4], dtype=dtype)
    q = dist.Normal(mu, sigma).to_event(1)
    p = ScaleMixturePrior(pi, s1, s2)(mu)
    with pytest.raises(NotImplementedError):
        kl_divergence(q, p)
    # MC estimate vs a deterministic quadrature of the same integral (per weight, then summed)
    n = 200_000
    w = q.sample((n,))
    log_ratio = q.log_prob(w) - p.log_prob(w)
    mc, se = log_ratio.mean().item(), log_ratio.std().item() / math.sqrt(n)
    quad = 0.0
    for m, s in zip(mu.tolist(), sigma.tolist()):
        grid = np.linspace(m - 10 * s, m + 10 * s, 20001)
        logq = np.array([gauss_logpdf(v, m, s) for v in grid])
        logp = np.array([mixture_logpdf(v, pi, s1, s2) for v in grid])
        quad += float(np.trapezoid(np.exp(logq) * (logq - logp), grid))
    assert abs(mc - quad) < 4 * se, (mc, quad, se)


def test_elbo_kl_term_is_the_analytic_kl_for_a_gaussian_prior():
    """MeanFieldELBO's kl for a single-site model equals kl_divergence(posterior, prior), for any sample."""
    prior = GaussianPrior(0.2, 0.8)
    torch.manual_seed(3)
    model = BayesianNetwork(nn.Sequential(nn.Linear(4, 3)), prior=prior, num_data=20)
    guide = NormalGuide(model, init_loc="prior", init_rho=-0.5)
    expected = 0.0
    for site in model.sites():
        mu, sigma = guide.loc_scale(site.name)
        expected += kl_formula(mu.detach().numpy(), sigma.detach().numpy(), 0.2, 0.8)
    x, y = torch.randn(5, 4), torch.tensor([0, 1, 2, 1, 0])
    kls = [MeanFieldELBO().terms(model, guide, x, y).kl.item() for _ in range(3)]
    for kl in kls:
        assert kl == pytest.approx(expected, rel=1e-5)


class _Tempered(nn.Module):
    """A linear layer times a learnable 0-dim temperature."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 3)
        self.temperature = nn.Parameter(torch.tensor(1.5))

    def forward(self, x):
        return self.linear(x) * self.temperature


def test_elbo_kl_is_analytic_for_a_scalar_parameter_too():
    """A 0-dim Bayesian parameter with a Gaussian prior has a closed-form KL like any other."""
    torch.manual_seed(0)
    model = BayesianNetwork(_Tempered(), prior=GaussianPrior(0.0, 1.0), num_data=20)
    guide = NormalGuide(model, init_rho=-0.5)
    assert {site.name for site in model.sites()} == {"net.linear.weight", "net.linear.bias", "net.temperature"}
    q = guide.posterior("net.temperature")
    (site,) = [s for s in model.sites() if s.name == "net.temperature"]
    mu, sigma = guide.loc_scale("net.temperature")
    assert kl_divergence(q, site.prior(site.init)).item() == pytest.approx(
        kl_formula(mu.detach().numpy(), sigma.detach().numpy(), 0.0, 1.0), rel=1e-5)
    expected = sum(kl_formula(*(t.detach().numpy() for t in guide.loc_scale(name)), 0.0, 1.0)
                   for name in guide.site_names)
    x, y = torch.randn(5, 4), torch.tensor([0, 1, 2, 1, 0])
    for _ in range(3):
        assert MeanFieldELBO().terms(model, guide, x, y).kl.item() == pytest.approx(expected, rel=1e-5)


# ----------------------------------------------------------------------------- Prior and PRIORS


def test_a_prior_that_does_not_override_call_says_so():
    class Unfinished(Prior):
        pass

    with pytest.raises(NotImplementedError, match=r"^Unfinished must override __call__\(reference\)$"):
        Unfinished()(torch.zeros(3))


def test_the_registry_names_every_prior_class_and_each_builds_a_prior_of_the_reference_shape():
    assert PRIORS == {"gaussian": GaussianPrior, "scale-mixture": ScaleMixturePrior,
                      "log-uniform": LogUniformPrior, "node": NodePrior}
    reference = torch.zeros(4, 3, dtype=torch.float64)
    w = torch.full((4, 3), 0.5, dtype=torch.float64)
    expected = {
        "gaussian": 12 * gauss_logpdf(0.5, 0.0, 1.0),
        "scale-mixture": 12 * mixture_logpdf(0.5, 0.25, 1.0, math.exp(-8)),
        "log-uniform": -12 * math.log(0.5),
        "node": 12 * gauss_logpdf(0.5, 1.0, 0.3),
    }
    for name, cls in PRIORS.items():
        prior = cls()(reference)
        assert issubclass(cls, Prior) and prior.event_shape == (4, 3), name
        assert prior.log_prob(w).item() == pytest.approx(expected[name], rel=1e-12), name
    # a scalar parameter is one event with no dimensions: log_prob stays per value
    per_value = LogUniform(()).log_prob(torch.tensor([0.5, 2.0], dtype=torch.float64))
    assert per_value.tolist() == pytest.approx([math.log(2), -math.log(2)], rel=1e-12)


# ----------------------------------------------------------------------------- argument checks


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(scale=0.0), "scale"),
        (dict(scale=-1.0), "scale"),
        (dict(scale=float("nan")), "scale"),
        (dict(scale=float("inf")), "scale"),
        (dict(loc=float("nan")), "loc"),
        (dict(loc=float("inf")), "loc"),
        (dict(bias_scale=0.0), "bias_scale"),
        (dict(fan_in=True, bias_scale=-2.0), "bias_scale"),
    ],
)
def test_gaussian_prior_rejects_invalid_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        GaussianPrior(**kwargs)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(pi=0.0), "pi"),
        (dict(pi=1.0), "pi"),
        (dict(pi=1.5), "pi"),
        (dict(pi=-0.25), "pi"),
        (dict(pi=float("nan")), "pi"),
        (dict(sigma1=0.0), "sigma1"),
        (dict(sigma1=-1.0), "sigma1"),
        (dict(sigma1=float("nan")), "sigma1"),
        (dict(sigma2=0.0), "sigma2"),
        (dict(sigma2=-1e-3), "sigma2"),
        (dict(sigma2=float("nan")), "sigma2"),
    ],
)
def test_scale_mixture_prior_rejects_invalid_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        ScaleMixturePrior(**kwargs)


def test_valid_edge_arguments_are_accepted():
    GaussianPrior(loc=-3.0, scale=1e-8)
    ScaleMixturePrior(pi=1e-6, sigma1=10.0, sigma2=1e-9)
    ScaleMixturePrior(pi=1 - 1e-6)
