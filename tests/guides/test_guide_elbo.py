"""NormalGuide, MeanFieldELBO terms, KL annealing, plain-Pyro SVI usage, parameter selection,
torchvision models and the beta schedules."""

from __future__ import annotations

import copy
import math
from fractions import Fraction

import pyro
import pytest
import torch
import torch.nn.functional as F
from pyro import poutine
from torch import nn
from torch.func import functional_call

import pyrobnn
from pyrobnn import (
    BayesianNetwork,
    GaussianPrior,
    MeanFieldELBO,
    NormalGuide,
    ScaleMixturePrior,
    bayesian,
    bayesian_sites,
    kl_annealing,
    last_layer,
)
from pyrobnn.infer.predict import predict
from pyrobnn.infer.schedules import Constant, Geometric, LinearWarmup, geometric_weights


def small_mlp(d_in=4, hidden=8, d_out=3, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, d_out))


def small_convnet(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3)
    )


def sampled_weights(guide, *args):
    """Weights of one guide draw, keyed by site name."""
    trace = poutine.trace(guide).get_trace(*args)
    return {name: site["value"].detach() for name, site in trace.nodes.items() if site["type"] == "sample"}


def net_params(weights):
    """Site names 'net.0.weight' -> parameter names '0.weight' of the original network."""
    return {name[len("net."):]: value for name, value in weights.items()}


def kl_formula(mu, sigma, mu_p, sigma_p):
    mu, sigma = mu.detach().double(), sigma.detach().double()
    return (torch.log(sigma_p / sigma) + (sigma**2 + (mu - mu_p) ** 2) / (2 * sigma_p**2) - 0.5).sum().item()


# ----------------------------------------------------------------------------- guide


@pytest.mark.parametrize("make_net, x_shape", [(small_mlp, (20, 4)), (small_convnet, (6, 1, 8, 8))])
def test_sigma_to_zero_guide_reproduces_the_pretrained_network(make_net, x_shape):
    net = make_net()
    if any(isinstance(m, nn.BatchNorm2d) for m in net.modules()):
        # give BatchNorm non-trivial running statistics, as a pretrained network would have
        net.train()
        with torch.no_grad():
            for _ in range(3):
                net(torch.randn(16, 1, 8, 8) * 2 + 0.5)
    reference = copy.deepcopy(net).eval()
    model = BayesianNetwork(net, prior=GaussianPrior(), num_data=100)
    guide = NormalGuide(model, init_loc="module", init_rho=-30)
    x = torch.randn(x_shape)
    with torch.no_grad():
        expected = reference(x).softmax(-1)
    probs = predict(model, guide, x, num_samples=4)["probs"]
    assert probs.shape == expected.shape
    torch.testing.assert_close(probs, expected, atol=1e-5, rtol=0)
    # the posterior means are the pretrained weights, the standard deviations ~ softplus(-30)
    for site in model.sites():
        loc, scale = guide.loc_scale(site.name)
        assert torch.equal(loc.detach(), site.init)
        assert scale.max().item() < 1e-12


def test_guide_samples_have_mean_mu_and_std_softplus_rho():
    model = BayesianNetwork(small_mlp(3, 5, 2), num_data=10)
    guide = NormalGuide(model)
    g = torch.Generator().manual_seed(1)
    for name in guide.site_names:
        loc, rho = guide.param(name, "locs"), guide.param(name, "rhos")
        with torch.no_grad():
            loc.copy_(torch.randn(loc.shape, generator=g))
            rho.copy_(torch.randn(rho.shape, generator=g) - 1.0)
    n = 1000
    draws = [sampled_weights(guide) for _ in range(n)]
    for name in guide.site_names:
        w = torch.stack([d[name] for d in draws]).double()
        mu, sigma = (t.detach().double() for t in guide.loc_scale(name))
        torch.testing.assert_close(sigma, F.softplus(guide.param(name, "rhos").detach().double()))
        z_mean = (w.mean(0) - mu) / (sigma / math.sqrt(n))
        z_std = (w.std(0) - sigma) / (sigma / math.sqrt(2 * (n - 1)))
        assert z_mean.abs().max().item() < 5, name
        assert z_std.abs().max().item() < 5, name


def test_guide_sampling_is_reparameterised():
    model = BayesianNetwork(small_mlp(3, 4, 2), num_data=10)
    guide = NormalGuide(model, init_rho=-1.0)
    name = guide.site_names[0]
    w = poutine.trace(guide).get_trace().nodes[name]["value"]
    loc, scale = guide.loc_scale(name)
    eps = ((w - loc) / scale).detach()
    w.sum().backward()
    loc_p, rho_p = guide.param(name, "locs"), guide.param(name, "rhos")
    torch.testing.assert_close(loc_p.grad, torch.ones_like(loc_p))
    torch.testing.assert_close(rho_p.grad, eps * torch.sigmoid(rho_p.detach()))


def test_guide_init_options():
    model = BayesianNetwork(small_mlp(), num_data=10)
    zeros = NormalGuide(model, init_loc="zeros")
    for name in zeros.site_names:
        assert torch.count_nonzero(zeros.param(name, "locs")) == 0
    custom = NormalGuide(model, init_loc=lambda site: torch.full(site.shape, 0.5), init_rho=-2.0, name="custom")
    for name in custom.site_names:
        loc, scale = custom.loc_scale(name)
        assert torch.all(loc == 0.5)
        torch.testing.assert_close(scale, torch.full_like(scale, math.log1p(math.exp(-2.0))))
    with pytest.raises(ValueError, match="init_loc"):
        NormalGuide(model, init_loc="pretrained")
    with pytest.raises(ValueError, match="init_rho"):
        NormalGuide(model, init_rho=float("nan"))
    with pytest.raises(ValueError, match="shape"):
        NormalGuide(model, init_loc=lambda site: torch.zeros(2))


# ----------------------------------------------------------------------------- ELBO terms

N, B = 40, 8


def elbo_setup(prior=None, rho=-2.0):
    net = small_mlp()
    reference = copy.deepcopy(net)
    model = BayesianNetwork(net, prior=prior or GaussianPrior(0.2, 0.7), num_data=N)
    guide = NormalGuide(model, init_rho=rho)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(B, 4, generator=g)
    y = torch.randint(0, 3, (B,), generator=g)
    return reference, model, guide, x, y


def expected_nll(reference, weights, x, y):
    logits = functional_call(reference, net_params(weights), (x,))
    return -(N / B) * F.log_softmax(logits.double(), -1)[torch.arange(len(y)), y].sum().item()


def test_elbo_terms_kl_is_sum_of_closed_form_kls_and_nll_is_scaled_likelihood():
    reference, model, guide, x, y = elbo_setup()
    expected_kl = sum(kl_formula(*guide.loc_scale(name), 0.2, 0.7) for name in guide.site_names)
    pyro.set_rng_seed(11)
    weights = sampled_weights(guide, x, y)
    pyro.set_rng_seed(11)
    terms = MeanFieldELBO().terms(model, guide, x, y)
    assert terms.kl.item() == pytest.approx(expected_kl, rel=1e-5)
    assert terms.nll.item() == pytest.approx(expected_nll(reference, weights, x, y), rel=1e-5)
    assert terms.loss.item() == pytest.approx(terms.nll.item() + terms.kl.item(), rel=1e-5)
    # the weights really are random (sigma = softplus(-2)), so the nll depends on the draw
    other = MeanFieldELBO().terms(model, guide, x, y)
    assert other.nll.item() != terms.nll.item()
    assert other.kl.item() == pytest.approx(expected_kl, rel=1e-5)


def test_elbo_nll_with_deterministic_weights_equals_network_cross_entropy():
    reference, model, guide, x, y = elbo_setup(rho=-30.0)
    terms = MeanFieldELBO().terms(model, guide, x, y)
    logits = reference(x)
    expected = (N / B) * F.cross_entropy(logits, y, reduction="sum").item()
    assert terms.nll.item() == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("beta", [0.0, 0.3, 2.0])
def test_kl_annealing_scales_only_the_kl(beta):
    reference, model, guide, x, y = elbo_setup()
    pyro.set_rng_seed(5)
    plain = MeanFieldELBO().terms(model, guide, x, y)
    pyro.set_rng_seed(5)
    with kl_annealing(beta=beta):
        annealed = MeanFieldELBO().terms(model, guide, x, y)
    assert annealed.nll.item() == pytest.approx(plain.nll.item(), rel=1e-6)
    assert annealed.kl.item() == pytest.approx(plain.kl.item(), rel=1e-6)  # reported unweighted
    assert annealed.loss.item() == pytest.approx(plain.nll.item() + beta * plain.kl.item(), rel=1e-5)
    # the gradient of the guide's rho under beta = 0 comes from the likelihood only
    annealed.loss.backward()
    assert all(p.grad is not None for p in guide.parameters())


def test_kl_annealing_with_pyro_svi_loss_function():
    """kl_annealing also wraps svi.step / elbo.loss, with the same effect."""
    _, model, guide, x, y = elbo_setup()
    elbo = MeanFieldELBO()
    pyro.set_rng_seed(2)
    t = elbo.terms(model, guide, x, y)
    pyro.set_rng_seed(2)
    with kl_annealing(beta=0.5):
        loss = elbo.loss(model, guide, x, y)
    assert loss == pytest.approx(t.nll.item() + 0.5 * t.kl.item(), rel=1e-5)
    with pytest.raises(ValueError, match="beta"):
        kl_annealing(beta=-0.1)


def test_num_particles_averages_single_particle_terms():
    _, model, guide, x, y = elbo_setup()
    pyro.set_rng_seed(3)
    singles = [MeanFieldELBO().terms(model, guide, x, y) for _ in range(4)]
    pyro.set_rng_seed(3)
    four = MeanFieldELBO(num_particles=4).terms(model, guide, x, y)
    for field in ("loss", "nll", "kl"):
        mean = sum(getattr(t, field).item() for t in singles) / 4
        assert getattr(four, field).item() == pytest.approx(mean, rel=1e-5), field
    assert len({t.nll.item() for t in singles}) == 4  # four distinct draws were averaged


def test_scale_mixture_kl_is_the_single_sample_log_ratio():
    prior = ScaleMixturePrior(0.5, 1.0, 0.05)
    reference, model, guide, x, y = elbo_setup(prior=prior, rho=-3.0)
    pyro.set_rng_seed(9)
    weights = sampled_weights(guide, x, y)
    pyro.set_rng_seed(9)
    terms = MeanFieldELBO().terms(model, guide, x, y)
    expected = 0.0
    for site in model.sites():
        w = weights[site.name].double()
        loc, scale = (t.detach().double() for t in guide.loc_scale(site.name))
        log_q = torch.distributions.Normal(loc, scale).log_prob(w).sum()
        log_p = torch.logaddexp(math.log(0.5) + torch.distributions.Normal(0.0, 1.0).log_prob(w),
                                math.log(0.5) + torch.distributions.Normal(0.0, 0.05).log_prob(w)).sum()
        expected += (log_q - log_p).item()
    assert terms.kl.item() == pytest.approx(expected, rel=1e-4)
    assert terms.nll.item() == pytest.approx(expected_nll(reference, weights, x, y), rel=1e-5)


# ----------------------------------------------------------------------------- the README script


@pytest.mark.recorded
@pytest.mark.parametrize("loss", [pyrobnn.MeanFieldELBO(), pyro.infer.Trace_ELBO()],
                         ids=["MeanFieldELBO", "Trace_ELBO"])
def test_readme_twenty_line_svi_script(loss):
    import pyro
    from torch import nn

    import pyrobnn
    from pyrobnn.data import two_moons
    from pyrobnn.infer.predict import predict

    # 200 points: with only 50, the N(0, 1) prior's KL (~160 weights) outweighs the data and the
    # posterior stays near the prior (training accuracy ~0.8, which is correct Bayesian behaviour)
    pyro.set_rng_seed(0)
    data = two_moons(n=700, n_train=200, seed=0)
    net = nn.Sequential(nn.Linear(2, 32), nn.Tanh(), nn.Linear(32, 2))
    model = pyrobnn.BayesianNetwork(net, num_data=len(data.x_train))
    guide = pyrobnn.NormalGuide(model)
    svi = pyro.infer.SVI(model, guide, pyro.optim.Adam({"lr": 1e-2}), loss=loss)
    losses = [svi.step(data.x_train, data.y_train) for _ in range(300)]
    probs = predict(model, guide, data.x_train, num_samples=20)["probs"]
    accuracy = (probs.argmax(-1) == data.y_train).float().mean().item()

    assert all(math.isfinite(v) for v in losses)
    assert sum(losses[-30:]) / 30 < 0.7 * sum(losses[:30]) / 30
    assert accuracy > 0.85
    test_probs = predict(model, guide, data.x_test, num_samples=20)["probs"]
    assert (test_probs.argmax(-1) == data.y_test).float().mean().item() > 0.8
    # SVI trained the guide's parameters (they are in Pyro's parameter store)
    assert any(".rhos." in name for name in pyro.get_param_store().keys())


# ----------------------------------------------------------------------------- selection


def site_names(model):
    return {site.name for site in model.sites()}


def test_include_weights_leaves_biases_deterministic():
    model = BayesianNetwork(small_mlp(), include="*.weight", num_data=10)
    assert site_names(model) == {"net.0.weight", "net.2.weight"}
    params = dict(model.named_parameters())
    assert set(params) == {"net.0.bias", "net.2.bias"}
    guide = NormalGuide(model)
    assert set(guide.site_names) == {"net.0.weight", "net.2.weight"}
    # one ELBO step trains the deterministic biases too
    x, y = torch.randn(5, 4), torch.tensor([0, 1, 2, 0, 1])
    MeanFieldELBO().terms(model, guide, x, y).loss.backward()
    assert params["net.0.bias"].grad is not None


def test_default_exclude_keeps_batchnorm_deterministic():
    model = BayesianNetwork(small_convnet(), num_data=10)
    assert site_names(model) == {"net.0.weight", "net.0.bias", "net.4.weight", "net.4.bias"}
    bn = model.net[1]
    assert isinstance(bn.weight, nn.Parameter) and isinstance(bn.bias, nn.Parameter)
    assert set(dict(model.named_parameters())) == {"net.1.weight", "net.1.bias"}
    guide = NormalGuide(model)
    x, y = torch.randn(6, 1, 8, 8), torch.tensor([0, 1, 2, 0, 1, 2])
    before = bn.running_mean.clone()
    MeanFieldELBO().terms(model, guide, x, y).loss.backward()
    assert bn.weight.grad is not None and not torch.equal(bn.running_mean, before)


def test_exclude_none_makes_batchnorm_bayesian_and_type_selectors_work():
    model = BayesianNetwork(small_convnet(), exclude=None, num_data=10)
    assert {"net.1.weight", "net.1.bias"} <= site_names(model)
    model = BayesianNetwork(small_convnet(), include=nn.Linear, num_data=10)
    assert site_names(model) == {"net.4.weight", "net.4.bias"}
    model = BayesianNetwork(small_convnet(), exclude=[nn.BatchNorm2d, "*.bias"], num_data=10)
    assert site_names(model) == {"net.0.weight", "net.4.weight"}


def test_last_layer_selects_only_the_last_linear():
    net = small_convnet()
    assert last_layer(net) == ["4.weight", "4.bias"]
    model = BayesianNetwork(net, include=last_layer(net), num_data=10)
    assert site_names(model) == {"net.4.weight", "net.4.bias"}
    mlp = small_mlp()
    converted = bayesian(mlp, include=last_layer(mlp))
    assert converted is mlp and isinstance(converted, pyro.nn.PyroModule)
    assert {s.name for s in bayesian_sites(converted)} == {"2.weight", "2.bias"}
    with pytest.raises(ValueError, match="no parameters"):
        last_layer(nn.Sequential(nn.ReLU()))


def test_selection_that_matches_nothing_raises():
    with pytest.raises(ValueError, match="selected no parameter"):
        bayesian(small_mlp(), include="fc9.*")
    with pytest.raises(ValueError, match="selected no parameter"):
        BayesianNetwork(small_mlp(), include="*.weight", exclude="*.weight")
    with pytest.raises(ValueError, match="selected no parameter"):
        BayesianNetwork(nn.Sequential(nn.BatchNorm1d(3)))
    with pytest.raises(TypeError):
        bayesian(small_mlp(), include=3)


def test_prior_follows_module_dtype():
    model = BayesianNetwork(small_mlp(), prior=GaussianPrior(0.1, 0.5), num_data=10)
    guide = NormalGuide(model, init_rho=-1.0)
    x, y = torch.randn(5, 4), torch.tensor([0, 1, 2, 0, 1])
    assert MeanFieldELBO().terms(model, guide, x, y).loss.dtype == torch.float32
    model.double()  # after a first call: the prior must follow the module, not stay float32
    guide.double()
    terms = MeanFieldELBO().terms(model, guide, x.double(), y)
    assert terms.loss.dtype == torch.float64
    expected = sum(kl_formula(*guide.loc_scale(name), 0.1, 0.5) for name in guide.site_names)
    assert terms.kl.item() == pytest.approx(expected, rel=1e-12)
    trace = poutine.trace(model).get_trace(x.double(), y)
    assert all(site["value"].dtype == torch.float64 for name, site in trace.nodes.items()
               if site["type"] == "sample" and name.startswith("net."))


# ----------------------------------------------------------------------------- torchvision


def test_torchvision_resnet18_as_bayesian_network():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    net = torchvision.models.resnet18(num_classes=10)
    conv_weights = {f"net.{n}.weight" for n, m in net.named_modules() if isinstance(m, nn.Conv2d)}
    bn_names = [n for n, m in net.named_modules() if isinstance(m, nn.BatchNorm2d)]
    model = BayesianNetwork(net, num_data=100)
    guide = NormalGuide(model)
    names = site_names(model)
    assert names == conv_weights | {"net.fc.weight", "net.fc.bias"}
    assert bn_names and not any(name.startswith(f"net.{bn}.") for bn in bn_names for name in names)
    for bn in bn_names:
        module = model.net.get_submodule(bn)
        assert isinstance(module.weight, nn.Parameter) and isinstance(module.bias, nn.Parameter)
    x = torch.randn(2, 3, 32, 32)
    trace = poutine.trace(guide).get_trace(x)
    with torch.no_grad():
        logits = poutine.replay(model, trace=trace)(x)
        again = poutine.replay(model, trace=trace)(x)
    assert logits.shape == (2, 10) and torch.isfinite(logits).all()
    assert torch.allclose(logits, again, atol=1e-5)


# ----------------------------------------------------------------------------- schedules


@pytest.mark.parametrize("m", [1, 2, 10, 469, 2000])
def test_geometric_weights_sum_to_one_without_overflow(m):
    weights = geometric_weights(m)
    assert len(weights) == m
    assert all(math.isfinite(w) and w >= 0 for w in weights)
    assert all(a >= b for a, b in zip(weights, weights[1:]))
    assert math.fsum(weights) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("m", [1, 2, 3, 5, 10, 20])
def test_geometric_weights_equal_blundell_formula(m):
    weights = geometric_weights(m)
    for i, w in enumerate(weights, start=1):
        exact = Fraction(2 ** (m - i), 2**m - 1)
        assert w == float(exact) or abs(Fraction(w) - exact) <= exact * Fraction(1, 2**51), (i, w, exact)
    assert geometric_weights(1) == [1.0]
    assert geometric_weights(2) == pytest.approx([2 / 3, 1 / 3], rel=1e-15)


@pytest.mark.parametrize("m", [1, 3, 10, 469])
def test_geometric_schedule_counts_the_kl_once_per_epoch(m):
    schedule = Geometric()
    for epoch in (0, 7):
        betas = [schedule(epoch, step, m) for step in range(m)]
        assert math.fsum(b / m for b in betas) == pytest.approx(1.0, abs=1e-12)
        assert betas == pytest.approx([m * w for w in geometric_weights(m)], rel=1e-12)


def test_linear_warmup_schedule():
    schedule = LinearWarmup(warmup=2, anneal=4)
    m = 5
    betas = [schedule(e, s, m) for e in range(8) for s in range(m)]
    assert all(b == 0.0 for b in betas[: 2 * m])
    assert betas[2 * m] > 0
    assert all(a <= b for a, b in zip(betas, betas[1:]))
    assert max(betas) == 1.0
    assert schedule(5, m - 1, m) == 1.0  # end of the ramp
    assert schedule(5, m - 2, m) < 1.0
    assert all(b == 1.0 for b in betas[6 * m:])
    # linear within the ramp: beta = (e - W + (i+1)/M) / A
    assert schedule(3, 2, m) == pytest.approx((1 + 3 / 5) / 4)
    assert LinearWarmup(warmup=1, anneal=0, final=0.5)(1, 0, m) == 0.5
    assert LinearWarmup(warmup=1, anneal=0, final=0.5)(0, 4, m) == 0.0


def test_constant_schedule():
    schedule = Constant(0.1)
    assert {schedule(e, s, 7) for e in range(3) for s in range(7)} == {0.1}
    assert Constant()(0, 0, 1) == 1.0
    assert Constant(0.0)(5, 2, 3) == 0.0


@pytest.mark.parametrize(
    "make, name",
    [
        (lambda: Constant(-0.1), "beta"),
        (lambda: Constant(float("nan")), "beta"),
        (lambda: Constant(float("inf")), "beta"),
        (lambda: LinearWarmup(warmup=-1), "warmup"),
        (lambda: LinearWarmup(anneal=-2), "anneal"),
        (lambda: LinearWarmup(warmup=1.5), "warmup"),
        (lambda: LinearWarmup(final=-1.0), "final"),
        (lambda: geometric_weights(0), "num_batches"),
        (lambda: geometric_weights(-3), "num_batches"),
    ],
)
def test_schedule_invalid_arguments(make, name):
    with pytest.raises(ValueError, match=name):
        make()
