"""Variational dropout: the log-uniform prior, the Kingma and Molchanov KL approximations,
the additive / multiplicative dropout guides and the log-variance Normal guide (SPEC 3, 4.1-4.3)."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
from pyro import poutine
from torch import nn
from torch.distributions import kl_divergence

from pyrobnn import (
    AdditiveDropoutGuide,
    BayesianNetwork,
    GaussianPrior,
    LogUniformPrior,
    MeanFieldELBO,
    MultiplicativeDropoutGuide,
    NormalGuide,
    local_reparameterization,
)
from pyrobnn.distributions import (
    KINGMA_CONSTANTS,
    MOLCHANOV_CONSTANTS,
    DropoutNormal,
    LogUniform,
    kingma_kl,
    molchanov_kl,
)
from pyrobnn.handlers.gaussian_weight import GaussianWeight

# --------------------------------------------------------------------------- reference KL
#
# Exact KL(N(theta, alpha theta^2) || p), p(w) ∝ 1/|w|, up to an additive constant:
#   KL = E_q log q(w) - E_q log p(w) = -H(q) + E_q log|w| + c
#   H(q) = ½ log(2πe α θ²) = ½ log α + log|θ| + c
#   E_q log|w| = E log|θ (1 + √α ε)| = log|θ| + E log|1 + √α ε|,    ε ~ N(0, 1)
# so log|θ| cancels and    f(α) = -½ log α + E_ε log|1 + √α ε| + const.
#
# Exact series (independent of the Monte Carlo estimate): with a = α^{-1/2},
#   log|1 + √α ε| = ½ log α + ½ log (ε + a)²,  (ε + a)² ~ noncentral χ²_1(λ = a² = 1/α),
# a Poisson(λ/2) mixture of central χ²_{1+2J}, and E log χ²_k = log 2 + ψ(k/2). Hence
#   f(α) = ½ E_{J ~ Poisson(1/(2α))} ψ(J + ½) + const,
# and the constant that makes f → 0 as α → ∞ (J = 0 a.s.) is -½ ψ(½) (Molchanov's convention).


def exact_kl_series(log_alpha: float) -> float:
    """½ E_{J~Poisson(1/(2α))} ψ(J + ½) - ½ ψ(½), float64."""
    lam = 0.5 * math.exp(-log_alpha)
    jmax = int(lam + 40 * math.sqrt(lam + 1) + 60)
    j = torch.arange(jmax, dtype=torch.float64)
    log_w = -lam + j * math.log(lam) - torch.lgamma(j + 1)
    w = log_w.exp()
    assert abs(w.sum().item() - 1) < 1e-9  # the Poisson tail is covered
    half = torch.tensor(0.5, dtype=torch.float64)
    return 0.5 * (w * torch.special.digamma(j + 0.5)).sum().item() - 0.5 * torch.special.digamma(half).item()


@pytest.fixture(scope="module")
def normals():
    return torch.randn(2_000_000, generator=torch.Generator().manual_seed(1234), dtype=torch.float64)


def mc_kl(log_alpha: float, eps: torch.Tensor) -> tuple[float, float]:
    """-½ log α + mean log|1 + √α ε| and its Monte-Carlo standard error."""
    values = (1 + math.exp(0.5 * log_alpha) * eps).abs().log()
    return -0.5 * log_alpha + values.mean().item(), values.std().item() / math.sqrt(len(eps))


def test_published_constants():
    assert KINGMA_CONSTANTS == (1.16145124, -1.50204118, 0.58629921)
    assert MOLCHANOV_CONSTANTS == (0.63576, 1.87320, 1.48695)


def test_exact_series_matches_monte_carlo(normals):
    # E log|ε| = ½ (log 2 + ψ(½)) is the constant between the MC form (const = 0) and the series
    offset = 0.5 * (math.log(2) + torch.special.digamma(torch.tensor(0.5, dtype=torch.float64)).item())
    for log_alpha in (-6.0, -2.0, 0.0, 2.0, 6.0):
        mc, se = mc_kl(log_alpha, normals)
        assert abs(mc - (exact_kl_series(log_alpha) + offset)) < 5 * se, log_alpha


def _approximation_errors(approx, grid, normals):
    """Max |approx - MC| after the mean offset, max MC standard error, and the same against the series."""
    mc, ses = zip(*(mc_kl(v, normals) for v in grid))
    mc = torch.tensor(mc, dtype=torch.float64)
    exact = torch.tensor([exact_kl_series(v) for v in grid], dtype=torch.float64)
    values = approx(torch.tensor(grid, dtype=torch.float64))
    d_mc, d_ex = values - mc, values - exact
    return (d_mc - d_mc.mean()).abs().max().item(), max(ses), (d_ex - d_ex.mean()).abs().max().item(), d_ex


def test_molchanov_kl_matches_monte_carlo_kl(normals):
    grid = [-6 + 0.5 * i for i in range(25)]  # log α in [-6, 6]
    err_mc, se, err_exact, d_exact = _approximation_errors(molchanov_kl, grid, normals)
    # Molchanov et al. report an approximation error of ~0.01; the MC noise is 5 SE < 5e-3
    assert se < 1e-3
    assert err_mc < 0.02
    assert err_exact < 0.02
    # with the published constant C = -k1 the approximation is already within 0.01 without an offset
    assert d_exact.abs().max().item() < 0.012


def test_kingma_kl_matches_monte_carlo_kl_for_alpha_at_most_one(normals):
    grid = [-6 + 0.5 * i for i in range(13)]  # log α in [-6, 0]
    err_mc, se, err_exact, _ = _approximation_errors(kingma_kl, grid, normals)
    assert se < 1e-3
    # Kingma's cubic fit is intrinsically ~0.021 off (after the mean offset) at log α = -6 against
    # the exact series (its error is (c1 - ½) α-like as α -> 0 while the fit centres the band),
    # so the bound is 0.025 = 0.021 + 5 SE, not 0.02
    assert err_exact < 0.025
    assert err_mc < 0.025
    # and it is a fit only for α <= 1: at α = e^3 it is far off (the MC-relative error grows)
    far, _, _, _ = _approximation_errors(kingma_kl, [0.0, 3.0], normals)
    assert far > 0.1


def test_molchanov_kl_vanishes_for_large_alpha_and_equals_its_formula():
    k1, k2, k3 = 0.63576, 1.87320, 1.48695
    for log_alpha in [-8.0, -3.3, -0.7, 0.0, 1.1, 3.0, 7.5, 20.0]:
        alpha = math.exp(log_alpha)
        expected = k1 - k1 / (1 + math.exp(-(k2 + k3 * log_alpha))) + 0.5 * math.log1p(1 / alpha)
        got = molchanov_kl(torch.tensor(log_alpha, dtype=torch.float64)).item()
        assert got == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert 0 <= molchanov_kl(torch.tensor(20.0, dtype=torch.float64)).item() < 1e-3
    assert 0 <= molchanov_kl(torch.tensor(20.0)).item() < 1e-3  # float32 too


def test_kingma_kl_equals_its_formula():
    c1, c2, c3 = 1.16145124, -1.50204118, 0.58629921
    for log_alpha in [-8.0, -2.5, -0.3, 0.0]:
        a = math.exp(log_alpha)
        expected = -(0.5 * log_alpha + c1 * a + c2 * a**2 + c3 * a**3)
        assert kingma_kl(torch.tensor(log_alpha, dtype=torch.float64)).item() == pytest.approx(expected, rel=1e-12)


# --------------------------------------------------------------------------- models and guides


def tiny_model(prior=None, d_in=3, d_out=2, seed=0, num_data=10):
    torch.manual_seed(seed)
    return BayesianNetwork(nn.Linear(d_in, d_out), prior=prior or LogUniformPrior(), num_data=num_data)


def mlp_model(prior=None, seed=0, num_data=200):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 2))
    return BayesianNetwork(net, prior=prior or LogUniformPrior(), num_data=num_data)


def set_param(guide, name, role, value):
    with torch.no_grad():
        param = guide.param(name, role)
        param.copy_(torch.as_tensor(value, dtype=param.dtype).expand_as(param))


THETA = [[0.5, -1.0, 2.0], [1.5, -0.7, 0.3]]
BIAS = [0.8, -1.2]


def ref_molchanov(la):
    k1, k2, k3 = MOLCHANOV_CONSTANTS
    return k1 - k1 * torch.sigmoid(k2 + k3 * la) + 0.5 * torch.log1p(torch.exp(-la))


def ref_kingma(la):
    c1, c2, c3 = KINGMA_CONSTANTS
    a = la.exp()
    return -(0.5 * la + c1 * a + c2 * a**2 + c3 * a**3)


def test_log_uniform_log_prob_and_sampling():
    p = LogUniform((2, 3))
    w = torch.tensor([[0.5, -2.0, 3.0], [-0.1, 7.0, 1.0]], dtype=torch.float64)
    assert p.log_prob(w).item() == pytest.approx(-sum(math.log(abs(v)) for v in w.flatten().tolist()), rel=1e-12)
    batch = torch.stack([w, 2 * w])
    expected = torch.tensor([-w.abs().log().sum().item(), -(2 * w).abs().log().sum().item()], dtype=torch.float64)
    assert torch.allclose(p.log_prob(batch), expected)
    assert LogUniformPrior()(torch.zeros(4, 5)).event_shape == (4, 5)
    with pytest.raises(ValueError, match="improper.*cannot be sampled"):
        p.sample()
    with pytest.raises(ValueError, match="improper.*cannot be sampled"):
        NormalGuide(tiny_model(), init_loc="prior")


def dropout_guides():
    return [
        ("additive", lambda m: AdditiveDropoutGuide(m)),
        ("mult-weight", lambda m: MultiplicativeDropoutGuide(m, share="weight")),
        ("mult-row", lambda m: MultiplicativeDropoutGuide(m, share="row")),
        ("mult-layer", lambda m: MultiplicativeDropoutGuide(m, share="layer")),
        ("mult-molchanov", lambda m: MultiplicativeDropoutGuide(m, share="row", max_log_alpha=8.0,
                                                                 approximation="molchanov")),
    ]


@pytest.mark.parametrize("kind, make", dropout_guides(), ids=[k for k, _ in dropout_guides()])
def test_registered_kl_sums_the_elementwise_approximation(kind, make):
    model = tiny_model()
    guide = make(model)
    gen = torch.Generator().manual_seed(3)
    expected_total = 0.0
    for site in model.sites():
        name = site.name
        shape = site.shape
        if kind == "additive":
            theta = torch.rand(shape, generator=gen, dtype=torch.float64) + 0.2
            log_sigma2 = torch.empty(shape, dtype=torch.float64).uniform_(-12, 4, generator=gen)
            set_param(guide, name, "locs", theta)
            set_param(guide, name, "log_variances", log_sigma2)
            la = (log_sigma2.float().double() - 2 * theta.float().double().log()).clamp(-8, 8)
            approx = ref_molchanov
        else:
            raw = guide.param(name, "log_alphas")
            values = torch.empty(raw.shape, dtype=torch.float64).uniform_(-5, 6, generator=gen)
            set_param(guide, name, "log_alphas", values)
            la = values.float().double().clamp(max=guide.max_log_alpha).expand(shape)
            approx = ref_molchanov if guide.approximation == "molchanov" else ref_kingma
        expected = approx(la).sum().item()
        expected_total += expected
        prior = site.prior(site.init)
        assert isinstance(prior, LogUniform)
        kl = kl_divergence(guide.posterior(name), prior)
        assert kl.shape == ()
        assert kl.item() == pytest.approx(expected, rel=1e-5, abs=1e-5)
    # the ELBO uses the registered KL, not the Monte-Carlo fallback
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 1, 0])
    terms = MeanFieldELBO().terms(model, guide, x, y)
    assert terms.kl.item() == pytest.approx(expected_total, rel=1e-5)


def _check_moments(samples, mean, var, label):
    n = samples.shape[0]
    mean, var = torch.as_tensor(mean, dtype=torch.float64), torch.as_tensor(var, dtype=torch.float64)
    samples = samples.double()
    se_mean = (var / n).sqrt()
    se_var = var * math.sqrt(2 / (n - 1))
    assert ((samples.mean(0) - mean).abs() < 5 * se_mean + 1e-7).all(), label
    assert ((samples.var(0) - var).abs() < 5 * se_var + 1e-10).all(), label


N_SAMPLES = 40_000


def test_additive_guide_samples_and_clipped_log_alpha():
    model = tiny_model()
    guide = AdditiveDropoutGuide(model)
    log_sigma2 = torch.tensor([[-2.0, 0.5, -9.0], [1.0, -4.0, 0.0]])
    set_param(guide, "net.weight", "locs", THETA)
    set_param(guide, "net.weight", "log_variances", log_sigma2)
    set_param(guide, "net.bias", "locs", [0.01, -1.0])  # log α(bias[0]) = 0 - log 1e-4 = 9.2 -> 8
    set_param(guide, "net.bias", "log_variances", [0.0, -20.0])  # log α(bias[1]) = -20 -> -8
    draws = guide.posterior("net.weight").sample((N_SAMPLES,))
    _check_moments(draws, THETA, log_sigma2.exp(), "additive weight")
    # the variance is exp(log σ²) even where log α is clipped (the clip only enters the KL)
    _check_moments(guide.posterior("net.bias").sample((N_SAMPLES,)), [0.01, -1.0],
                   torch.tensor([1.0, math.exp(-20)]), "additive bias")
    theta = torch.tensor(THETA)
    assert torch.allclose(guide.log_alpha("net.weight"), (log_sigma2 - 2 * theta.abs().log()).clamp(-8, 8),
                          atol=1e-5)
    assert guide.log_alpha("net.bias").tolist() == [8.0, -8.0]
    # one guide() draw per site, with the same distribution (pooled z-scores over 800 calls)
    z = []
    for _ in range(800):
        w = guide()["net.weight"].detach()
        z.append((w - theta) / (0.5 * log_sigma2).exp())
    z = torch.stack(z).flatten().double()
    assert abs(z.mean().item()) < 5 / math.sqrt(len(z))
    assert abs(z.var().item() - 1) < 5 * math.sqrt(2 / len(z))


def test_mask_pruned_zeroes_the_mean_of_pruned_weights_and_keeps_their_noise_and_kl():
    """train_clip of Molchanov et al.'s code: mean θ·[log α <= 3], the same σ and the KL of the unmasked log α; the
    data's gradient no longer reaches a pruned θ."""
    log_sigma2 = torch.tensor([[0.0, 3.5, -9.0], [1.0, -4.0, 2.0]])  # log α: 1.39, 3.5, -8 / 0.19, -3.29, 4.41
    guides = {}
    for masked in (False, True):
        guides[masked] = AdditiveDropoutGuide(tiny_model(), mask_pruned=masked)
        set_param(guides[masked], "net.weight", "locs", THETA)
        set_param(guides[masked], "net.weight", "log_variances", log_sigma2)
    theta = torch.tensor(THETA)
    log_alpha = log_sigma2 - 2 * theta.abs().log()
    kept = log_alpha <= 3
    assert kept.tolist() == [[True, False, True], [True, True, False]]
    plain, masked = guides[False].posterior("net.weight"), guides[True].posterior("net.weight")
    assert torch.equal(masked.mean, torch.where(kept, theta, torch.zeros(())))
    assert torch.equal(plain.mean, theta)
    assert torch.equal(masked.stddev, plain.stddev)
    prior = guides[True]._priors["net.weight"]()
    assert torch.equal(kl_divergence(masked, prior), kl_divergence(plain, prior))
    assert torch.equal(guides[True].median()["net.weight"], masked.mean)
    locs = guides[True].param("net.weight", "locs")
    gradient, = torch.autograd.grad(masked.mean.sum(), locs)
    assert torch.equal(gradient, kept.float())
    with pytest.raises(ValueError, match="mask_pruned"):
        AdditiveDropoutGuide(tiny_model(), mask_pruned="yes")


@pytest.mark.parametrize("share, log_alpha_shape", [("weight", (2, 3)), ("row", (2, 1)), ("layer", ())])
def test_multiplicative_guide_samples(share, log_alpha_shape):
    model = tiny_model()
    guide = MultiplicativeDropoutGuide(model, share=share, max_log_alpha=0.5)
    assert tuple(guide.param("net.weight", "log_alphas").shape) == log_alpha_shape
    bias_shape = () if share == "layer" else (2,)
    assert tuple(guide.param("net.bias", "log_alphas").shape) == bias_shape
    raw = {"weight": [[-2.0, 2.0, -0.5], [-3.0, 0.3, -1.5]], "row": [[-1.0], [3.0]], "layer": 1.7}[share]
    raw = torch.tensor(raw)
    set_param(guide, "net.weight", "locs", THETA)
    set_param(guide, "net.weight", "log_alphas", raw)
    set_param(guide, "net.bias", "locs", BIAS)
    # α is clipped at max_log_alpha = 0.5: raw values 2.0, 3.0, 1.7 act as 0.5
    alpha = raw.clamp(max=0.5).exp().expand(2, 3)
    assert torch.equal(guide.log_alpha("net.weight"), raw.clamp(max=0.5))
    theta = torch.tensor(THETA)
    draws = guide.posterior("net.weight").sample((N_SAMPLES,))
    _check_moments(draws, theta, alpha * theta**2, f"multiplicative {share}")
    # and the unclipped α would give a variance that these samples reject
    unclipped = raw.exp().expand(2, 3) * theta**2
    se_var = unclipped * math.sqrt(2 / N_SAMPLES)
    assert ((draws.double().var(0) - unclipped).abs() > 5 * se_var).any()
    b_alpha = math.exp(-4.0)  # init_log_alpha default
    _check_moments(guide.posterior("net.bias").sample((N_SAMPLES,)), BIAS,
                   b_alpha * torch.tensor(BIAS) ** 2, "multiplicative bias")
    # guide() draws follow the same law: w = θ (1 + √α ε) -> (w/θ - 1)/√α is standard normal
    z = []
    for _ in range(800):
        z.append((guide()["net.weight"].detach() / theta - 1) / alpha.sqrt())
    z = torch.stack(z).flatten().double()
    assert abs(z.mean().item()) < 5 / math.sqrt(len(z))
    assert abs(z.var().item() - 1) < 5 * math.sqrt(2 / len(z))


def test_normal_guide_log_variance_parameterization():
    for rho in (-5.0, 0.0, 2.5):
        soft = NormalGuide(tiny_model(GaussianPrior()), init_rho=rho)
        logv = NormalGuide(tiny_model(GaussianPrior()), init_rho=rho, parameterization="log_variance")
        sigma0 = math.log1p(math.exp(rho))
        for name in soft.site_names:
            assert torch.allclose(soft.loc_scale(name)[1], torch.full((), sigma0), rtol=1e-6)
            assert torch.allclose(logv.loc_scale(name)[1], soft.loc_scale(name)[1], rtol=1e-5)
            assert torch.allclose(logv.param(name, "log_variances"), torch.full((), 2 * math.log(sigma0)), rtol=1e-5)
    model = tiny_model(GaussianPrior(0.3, 2.0))
    guide = NormalGuide(model, parameterization="log_variance")
    gen = torch.Generator().manual_seed(5)
    total = 0.0
    for site in model.sites():
        loc = torch.randn(site.shape, generator=gen)
        log_var = torch.empty(site.shape).uniform_(-6, 1, generator=gen)
        set_param(guide, site.name, "locs", loc)
        set_param(guide, site.name, "log_variances", log_var)
        mu, var = loc.double(), log_var.double().exp()
        sigma = var.sqrt()
        assert torch.allclose(guide.loc_scale(site.name)[1].double(), sigma, rtol=1e-6)
        closed = (math.log(2.0) - sigma.log() + (var + (mu - 0.3) ** 2) / (2 * 4.0) - 0.5).sum().item()
        total += closed
        kl = kl_divergence(guide.posterior(site.name), site.prior(site.init))
        assert kl.item() == pytest.approx(closed, rel=1e-5)
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 1, 0])
    assert MeanFieldELBO().terms(model, guide, x, y).kl.item() == pytest.approx(total, rel=1e-5)
    # sampled with σ = exp(½ log σ²)
    set_param(guide, "net.weight", "locs", THETA)
    set_param(guide, "net.weight", "log_variances", [[-2.0, 0.0, 1.0], [-4.0, 0.5, -1.0]])
    draws = guide.posterior("net.weight").sample((N_SAMPLES,))
    _check_moments(draws, THETA, torch.tensor([[-2.0, 0.0, 1.0], [-4.0, 0.5, -1.0]]).exp(), "log-variance")


TRAIN_GUIDES = [
    ("additive", lambda m: AdditiveDropoutGuide(m)),
    ("mult-weight", lambda m: MultiplicativeDropoutGuide(m)),
    ("mult-row", lambda m: MultiplicativeDropoutGuide(m, share="row")),
    ("mult-layer-molchanov", lambda m: MultiplicativeDropoutGuide(m, share="layer", max_log_alpha=8.0,
                                                                   approximation="molchanov")),
]


@pytest.mark.parametrize("local", [False, True], ids=["weights", "local-reparam"])
@pytest.mark.parametrize("kind, make", TRAIN_GUIDES, ids=[k for k, _ in TRAIN_GUIDES])
def test_dropout_guides_train_on_a_tiny_classification_problem(kind, make, local):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(200, 2, generator=gen)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
    model = mlp_model()
    guide = make(model)
    optimizer = torch.optim.Adam(guide.parameters(), lr=1e-2)
    elbo = MeanFieldELBO()
    if local:  # the handler is really in use: the guide's sites are Gaussian weights
        with local_reparameterization():
            trace = poutine.trace(guide).get_trace()
        assert all(isinstance(site["value"], GaussianWeight) for site in trace.nodes.values()
                   if site["type"] == "sample")
    nll, loss = [], []
    for _ in range(100):
        with local_reparameterization() if local else contextlib.nullcontext():
            terms = elbo.terms(model, guide, x, y)
        optimizer.zero_grad()
        terms.loss.backward()
        optimizer.step()
        nll.append(terms.nll.item())
        loss.append(terms.loss.item())
        assert math.isfinite(loss[-1]) and math.isfinite(terms.kl.item())
    assert all(p.isfinite().all() for p in guide.parameters())
    start, end = sum(nll[:5]) / 5, sum(nll[-5:]) / 5
    assert end < 0.5 * start, (start, end)
    assert sum(loss[-5:]) / 5 < sum(loss[:5]) / 5


def test_bad_arguments_raise_value_errors_naming_them():
    model = tiny_model()
    with pytest.raises(ValueError, match="share"):
        MultiplicativeDropoutGuide(model, share="column")
    with pytest.raises(ValueError, match="init_log_alpha"):
        MultiplicativeDropoutGuide(model, init_log_alpha=1.0, max_log_alpha=0.0)
    with pytest.raises(ValueError, match="clip"):
        AdditiveDropoutGuide(model, clip=(1.0, -1.0))
    with pytest.raises(ValueError, match="parameterization"):
        NormalGuide(model, parameterization="exp")
    with pytest.raises(ValueError, match="approximation"):
        DropoutNormal(torch.ones(2), torch.ones(2), torch.zeros(2), approximation="foo")
    with pytest.raises(ValueError, match="init_log_sigma2"):
        AdditiveDropoutGuide(model, init_log_sigma2=float("nan"))


def test_multiplicative_guide_rejects_unknown_approximation_at_construction():
    # every other argument of the guide is checked eagerly; an unknown KL approximation
    # should not wait for the first training step to fail
    with pytest.raises(ValueError, match="approximation"):
        MultiplicativeDropoutGuide(tiny_model(), approximation="foo")
