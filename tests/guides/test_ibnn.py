"""Implicit BNNs: node priors, the mixture node guide, its KL terms, component assignment, Pyro and pyrobnn APIs.

Every check is against an independent computation: hand-written layers, closed forms computed with
``torch.distributions``, or Monte Carlo with standard-error bounds.
"""

from __future__ import annotations

import copy
import math

import pyro
import pyro.distributions as dist
import pytest
import torch
import torch.nn.functional as F
from pyro import poutine
from pyro.infer import SVI, Trace_ELBO
from torch import nn
from torch.distributions import Normal, kl_divergence

from pyrobnn import BayesianNetwork, Gaussian, GaussianPrior, MeanFieldELBO, NormalGuide
from pyrobnn.analysis.evaluate import evaluate
from pyrobnn.distributions import (
    EqualMixtureNormal,
    mixture_entropy_lower_bound,
    mixture_kl_upper_bound,
    mixture_mean_kl,
)
from pyrobnn.guides.mixture_node import MixtureNodeGuide
from pyrobnn.handlers import local_reparameterization, vdp, weight_sampling
from pyrobnn.handlers.node_draws import NodeDraws
from pyrobnn.infer.optim import FlatThenLinear, TwoGroupSGD
from pyrobnn.infer.predict import predict_moments, predictive_outputs
from pyrobnn.infer.svi import fit
from pyrobnn.model.priors import NodePrior


def mlp(sizes=(3, 5, 2), seed=0):
    torch.manual_seed(seed)
    layers = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers += [nn.Linear(a, b)] + ([nn.ReLU()] if i < len(sizes) - 2 else [])
    return nn.Sequential(*layers)


def convnet(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(2, 3, 3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 4 * 4, 4))


def set_components(guide, locs_fn, rho=-30.0):
    """Give every site's components the means ``locs_fn(k, shape)`` and sigma = softplus(rho)."""
    for name in guide.site_names:
        locs, rhos = guide.param(name, "locs"), guide.param(name, "rhos")
        with torch.no_grad():
            for k in range(locs.shape[0]):
                locs[k].copy_(locs_fn(k, locs.shape[1:]))
            rhos.fill_(rho)


def random_mixture(k, shape, spread, seed):
    g = torch.Generator().manual_seed(seed)
    locs = 1 + spread * torch.randn((k,) + shape, generator=g, dtype=torch.float64)
    scales = 0.05 + torch.rand((k,) + shape, generator=g, dtype=torch.float64)
    return EqualMixtureNormal(locs, scales)


def mc_mean(values):
    values = torch.as_tensor(values, dtype=torch.float64)
    return values.mean().item(), values.std().item() / math.sqrt(len(values))


# ----------------------------------------------------------------------------- the node prior and its sites


def test_node_prior_is_an_independent_normal_around_one():
    prior = NodePrior(0.3)(torch.ones(4, 1, 1))
    z = torch.randn(7, 4, 1, 1)
    expected = Normal(1.0, 0.3).log_prob(z).sum((-3, -2, -1))
    torch.testing.assert_close(prior.log_prob(z), expected)
    assert prior.event_shape == (4, 1, 1)
    draws = prior.sample((20000,))
    assert abs(draws.mean().item() - 1) < 5 * 0.3 / math.sqrt(80000)
    assert abs(draws.std().item() - 0.3) < 0.01


@pytest.mark.parametrize("mode, bias, expected", [
    ("in", False, {"net.0.nodes": (2, 1, 1), "net.3.nodes": (48,)}),
    ("out", False, {"net.0.nodes": (3, 1, 1), "net.3.nodes": (4,)}),
    ("in", True, {"net.0.nodes": (2, 1, 1), "net.0.bias_nodes": (3, 1, 1), "net.3.nodes": (48,),
                  "net.3.bias_nodes": (4,)}),
])
def test_node_sites_replace_weight_sites_and_keep_the_weights_as_parameters(mode, bias, expected):
    net = convnet()
    state = copy.deepcopy(net.state_dict())
    model = BayesianNetwork(net, prior=NodePrior(0.3, mode, bias), num_data=10)
    assert {s.name: tuple(s.shape) for s in model.sites()} == expected
    assert all(torch.equal(s.init, torch.ones(s.shape)) for s in model.sites())
    assert set(dict(model.net.named_parameters())) == set(state)  # weights are ordinary parameters, same names
    assert all(torch.equal(model.net.state_dict()[k], v) for k, v in state.items())


def test_include_selects_which_layers_get_node_latents():
    model = BayesianNetwork(mlp((3, 5, 4, 2)), prior=NodePrior(0.3), include="2.*", num_data=10)
    assert [s.name for s in model.sites()] == ["net.2.nodes"]
    model = BayesianNetwork(mlp((3, 5, 4, 2)), prior=NodePrior(0.3), include=nn.Linear, exclude="0.*", num_data=10)
    assert [s.name for s in model.sites()] == ["net.2.nodes", "net.4.nodes"]


# ----------------------------------------------------------------------------- the node product


def test_mode_in_and_out_compute_the_hand_written_layers():
    x = torch.randn(6, 3)
    for mode in ("in", "out"):
        net = mlp()
        (w1, b1), (w2, b2) = [(m.weight.detach().clone(), m.bias.detach().clone()) for m in net if
                              isinstance(m, nn.Linear)]
        model = BayesianNetwork(net, prior=NodePrior(0.3, mode), num_data=10)
        guide = MixtureNodeGuide(model, num_components=3, init_sigma=(0.2, 0.05))
        trace = poutine.trace(guide).get_trace()
        z1, z2 = trace.nodes["net.0.nodes"]["value"], trace.nodes["net.2.nodes"]["value"]
        out = poutine.replay(model.net, trace=trace)(x)
        if mode == "in":
            expected = F.linear(z2 * F.relu(F.linear(z1 * x, w1, b1)), w2, b2)
        else:
            expected = z2 * F.linear(F.relu(z1 * F.linear(x, w1, b1)), w2, b2)
        torch.testing.assert_close(out, expected)


def test_convolution_nodes_and_the_bias_latent_compute_the_hand_written_layers():
    net = convnet()
    conv, linear = net[0], net[3]
    (wc, bc), (wl, bl) = [(m.weight.detach().clone(), m.bias.detach().clone()) for m in (conv, linear)]
    model = BayesianNetwork(net, prior=NodePrior(0.3, "in", bias=True), num_data=10)
    guide = MixtureNodeGuide(model, num_components=2, init_sigma=(0.3, 0.05))
    trace = poutine.trace(guide).get_trace()
    z = {name: trace.nodes[name]["value"] for name in guide.site_names}
    x = torch.randn(5, 2, 6, 6)
    out = poutine.replay(model.net, trace=trace)(x)
    h = F.conv2d(x * z["net.0.nodes"].view(1, 2, 1, 1), wc) + (bc * z["net.0.bias_nodes"].view(3)).view(1, 3, 1, 1)
    expected = F.linear(z["net.3.nodes"] * F.relu(h).flatten(1), wl) + bl * z["net.3.bias_nodes"]
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("make_net, x_shape", [(mlp, (8, 3)), (convnet, (8, 2, 6, 6))])
def test_sigma_to_zero_and_means_one_reproduce_the_deterministic_network(make_net, x_shape):
    net = make_net()
    reference = copy.deepcopy(net)
    x = torch.randn(x_shape)
    model = BayesianNetwork(net, prior=NodePrior(0.3, bias=True), num_data=10)
    guide = MixtureNodeGuide(model, num_components=4, init_scale=0.0, init_sigma=(1e-12, 0.0))
    with torch.no_grad():
        expected = reference(x)
        torch.testing.assert_close(poutine.replay(model.net, trace=poutine.trace(guide).get_trace())(x), expected)
        torch.testing.assert_close(predictive_outputs(model, guide, x, num_samples=8),
                                   expected.expand(8, *expected.shape))
        with vdp():
            out = poutine.replay(model.net, trace=poutine.trace(guide).get_trace())(x)
        torch.testing.assert_close(out.loc, expected)
        assert out.variance.abs().max().item() < 1e-12


# ----------------------------------------------------------------------------- component assignment


def components_model(k, mode="in"):
    net = mlp((3, 4, 2))
    model = BayesianNetwork(net, prior=NodePrior(0.3, mode), num_data=50)
    guide = MixtureNodeGuide(model, num_components=k)
    set_components(guide, lambda c, shape: 0.5 + 0.3 * c + 0.1 * torch.arange(shape.numel()).view(shape))
    return model, guide


def network_with_component(model, guide, c, x):
    """The network with every node latent at the mean of component ``c``."""
    fixed = {name: guide.posterior(name).locs[c].detach() for name in guide.site_names}
    return poutine.condition(model.net, data=fixed)(x)


def test_row_r_uses_component_r_mod_k():
    k, x = 4, torch.randn(8, 3)
    model, guide = components_model(k)
    with torch.no_grad(), local_reparameterization():
        out = poutine.replay(model.net, trace=poutine.trace(guide).get_trace())(x)
    for r in range(len(x)):
        torch.testing.assert_close(out[r], network_with_component(model, guide, r % k, x)[r])


@pytest.mark.parametrize("batch, particles", [(3, 4), (4, 2)])
def test_particle_s_of_example_b_uses_component_b_plus_s_mod_k(batch, particles):
    k, x = 4, torch.randn(batch, 3)
    model, guide = components_model(k, mode="out")
    with torch.no_grad(), weight_sampling(num_particles=particles, batch_size=batch) as handler:
        out = handler.particles.split(poutine.replay(model.net, trace=poutine.trace(guide).get_trace())(x))
    for s in range(particles):
        for b in range(batch):
            torch.testing.assert_close(out[s, b], network_with_component(model, guide, (b + s) % k, x)[b])


def test_every_component_gets_gradients_in_one_pass():
    model = BayesianNetwork(mlp(), Gaussian(0.5), prior=NodePrior(0.3), num_data=40)
    guide = MixtureNodeGuide(model, num_components=4)
    x, y = torch.randn(8, 3), torch.randn(8, 2)
    calls = []
    model.net[0].register_forward_hook(lambda *_: calls.append(1))
    with local_reparameterization():
        MeanFieldELBO().differentiable_loss(model, guide, x, y).backward()
    assert len(calls) == 1
    for name in guide.site_names:
        for role in ("locs", "rhos"):
            grad = guide.param(name, role).grad
            assert (grad.flatten(1).abs().sum(1) > 0).all(), (name, role)


def test_node_draws_are_the_lazy_value_and_refuse_other_operations():
    model, guide = components_model(2)
    with local_reparameterization():
        value = poutine.trace(guide).get_trace().nodes["net.0.nodes"]["value"]
    assert isinstance(value, NodeDraws)
    with pytest.raises(TypeError, match="only multiplies"):
        torch.exp(value)


# ----------------------------------------------------------------------------- the KL terms


def test_mixture_mean_kl_is_the_kl_of_the_mixture_mean_gaussian():
    q = random_mixture(3, (4,), 0.5, seed=0)
    prior = NodePrior(0.5)(torch.ones(4, dtype=torch.float64))
    expected = kl_divergence(Normal(q.locs.mean(0), q.scales.square().sum(0).sqrt() / 3), Normal(1.0, 0.5)).sum()
    torch.testing.assert_close(kl_divergence(q, prior), expected)
    torch.testing.assert_close(mixture_mean_kl(q, 1.0, 0.5), expected)


def test_mixture_mean_kl_is_the_kl_of_the_average_of_one_draw_per_component_not_the_mixtures_kl():
    torch.manual_seed(0)
    n, s = 40000, 0.3
    prior = dist.Normal(torch.ones(3, dtype=torch.float64), s).to_event(1)

    def true_kl(q):  # E_q[log q - log p] by Monte Carlo
        z = q.sample((n,))
        return mc_mean(q.log_prob(z) - prior.log_prob(z))

    # what it is: z_hat = mean_k z_k, one independent draw z_k per component, is N(mu_hat, sigma_hat^2)
    q = random_mixture(4, (3,), 0.5, seed=1)
    z_hat = q.component_draws(torch.arange(4).expand(n, 4)).mean(1)
    mu_hat, sigma_hat = q.locs.mean(0), q.scales.square().sum(0).sqrt() / 4
    assert ((z_hat.mean(0) - mu_hat).abs() < 5 * sigma_hat / math.sqrt(n)).all()
    assert ((z_hat.std(0) - sigma_hat).abs() < 5 * sigma_hat / math.sqrt(2 * n)).all()
    # identical components equal to the prior: the mixture's KL is 0, the mixture-mean KL is not
    same = EqualMixtureNormal(torch.ones(4, 3, dtype=torch.float64), torch.full((4, 3), s, dtype=torch.float64))
    kl, se = true_kl(same)
    assert abs(kl) < 5 * se + 1e-12
    torch.testing.assert_close(kl_divergence(same, prior), torch.tensor(3 * (math.log(2) + 1 / 8 - 1 / 2),
                                                                         dtype=torch.float64))
    # components spread symmetrically around the prior mean: the mixture-mean KL is far below the mixture's KL
    spread = EqualMixtureNormal(torch.tensor([[-1.0] * 3, [3.0] * 3], dtype=torch.float64),
                                torch.full((2, 3), s, dtype=torch.float64))
    kl, se = true_kl(spread)
    assert kl_divergence(spread, prior).item() < kl - 10 * se


@pytest.mark.parametrize("k, shape, spread", [(1, (3,), 0.5), (2, (1,), 0.2), (3, (4,), 1.0), (5, (2, 3), 0.3),
                                              (8, (10,), 0.05), (4, (2,), 3.0)])
def test_entropy_bound_is_below_the_monte_carlo_entropy_and_the_kl_bound_above_the_kl(k, shape, spread):
    torch.manual_seed(k)
    q = random_mixture(k, shape, spread, seed=10 + k)
    z = q.sample((20000,))
    entropy, se = mc_mean(-q.log_prob(z))
    bound = mixture_entropy_lower_bound(q).item()
    assert bound <= entropy + 4 * se
    component_entropy = Normal(q.locs, q.scales).entropy().flatten(1).sum(1).mean().item()
    assert component_entropy - 1e-9 <= bound <= component_entropy + math.log(k) + 1e-9
    prior = dist.Normal(torch.ones(shape, dtype=torch.float64), 0.5).to_event(len(shape))
    kl, kl_se = mc_mean(q.log_prob(z) - prior.log_prob(z))
    upper = mixture_kl_upper_bound(q, 1.0, 0.5).item()
    assert upper >= kl - 4 * kl_se
    if k == 1:  # a single Gaussian: both bounds are exact
        assert bound == pytest.approx(Normal(q.locs, q.scales).entropy().sum().item())
        assert upper == pytest.approx(kl_divergence(Normal(q.locs[0], q.scales[0]), Normal(1.0, 0.5)).sum().item())


def test_registered_kl_chooses_the_term_and_subtracts_the_entropy_bonus():
    q = random_mixture(3, (5,), 0.4, seed=3)
    prior = NodePrior(0.5)(torch.ones(5, dtype=torch.float64))
    bound = EqualMixtureNormal(q.locs, q.scales, kl="entropy_bound")
    torch.testing.assert_close(kl_divergence(bound, prior), mixture_kl_upper_bound(q, 1.0, 0.5))
    bonus = EqualMixtureNormal(q.locs, q.scales, kl="mixture_mean", entropy_weight=0.5)
    torch.testing.assert_close(kl_divergence(bonus, prior),
                               mixture_mean_kl(q, 1.0, 0.5) - 0.5 * mixture_entropy_lower_bound(q))


def test_mixture_sampling_and_log_density():
    q = random_mixture(3, (2,), 1.0, seed=4)
    z = torch.randn(6, 2, dtype=torch.float64)
    dens = torch.stack([Normal(q.locs[k], q.scales[k]).log_prob(z).sum(-1).exp() for k in range(3)]).mean(0)
    torch.testing.assert_close(q.log_prob(z), dens.log())
    draws = q.sample((40000,))
    assert ((draws.mean(0) - q.mean).abs() < 5 * q.variance.sqrt() / 200).all()
    assert ((draws.var(0) - q.variance).abs() < 0.05 * q.variance).all()
    q.locs.requires_grad_(True)
    q.rsample((3,)).sum().backward()  # reparameterized: the means get the gradient of the picked components
    assert q.locs.grad.sum().item() == pytest.approx(3 * 2)


# ----------------------------------------------------------------------------- Pyro and pyrobnn APIs


def regression_problem(seed=0, n=16):
    g = torch.Generator().manual_seed(seed)
    x = torch.linspace(-2, 2, n)[:, None]
    return x, torch.sin(2 * x) + 0.1 * torch.randn(x.shape, generator=g)


def test_plain_pyro_svi_runs_and_trace_elbo_matches_mean_field_elbo_in_expectation():
    """Trace_ELBO scores log q - log p of the sampled z; MeanFieldELBO the registered KL term. Without a handler
    both draw one z per site, so E[Trace_ELBO] = E[MeanFieldELBO nll] + KL(q||p), the mixture's true KL (Monte
    Carlo), which the entropy bound's term exceeds."""
    x, y = regression_problem()
    model = BayesianNetwork(mlp((1, 8, 1)), Gaussian(0.3), prior=NodePrior(0.5), num_data=len(x))
    guide = MixtureNodeGuide(model, num_components=3, init_scale=0.3, init_sigma=(0.2, 0.05), kl="entropy_bound")
    n = 600
    with torch.no_grad():
        trace_elbo = [Trace_ELBO().loss(model, guide, x, y) for _ in range(n)]
        terms = [MeanFieldELBO().terms(model, guide, x, y) for _ in range(n)]
        qs = [guide.posterior(name) for name in guide.site_names]
        priors = [guide._priors[name]() for name in guide.site_names]
        log_ratio = sum(q.log_prob(z) - p.log_prob(z) for q, p, z in ((q, p, q.sample((20000,))) for q, p in
                                                                      zip(qs, priors)))
    true_kl, kl_se = mc_mean(log_ratio)
    te, te_se = mc_mean(trace_elbo)
    nll, nll_se = mc_mean([t.nll for t in terms])
    assert abs(te - (nll + true_kl)) < 4 * math.sqrt(te_se**2 + nll_se**2 + kl_se**2)
    assert terms[0].kl.item() >= true_kl - 4 * kl_se
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.02}), loss=Trace_ELBO())
    losses = [svi.step(x, y) for _ in range(100)]
    assert sum(losses[-20:]) < sum(losses[:20])


def test_fit_predict_evaluate_with_the_two_learning_rates():
    x, y = regression_problem(n=32)
    model = BayesianNetwork(mlp((1, 16, 1)), Gaussian(0.3), prior=NodePrior(0.3), num_data=len(x))
    guide = MixtureNodeGuide(model, num_components=4, init_scale=0.1)
    before = evaluate(model, guide, x, y, num_samples=8)
    history = fit(model, guide, x, y, epochs=60, batch_size=16,
                  optimizer=TwoGroupSGD(lr=0.01, variational_lr=0.1, schedule=[FlatThenLinear(60), lambda epoch: 1.0]),
                  elbo=MeanFieldELBO(estimator="local"), progress=False)
    assert history.last["loss"] < history.epochs[0]["loss"]
    after = evaluate(model, guide, x, y, num_samples=8)
    assert after["rmse"] < before["rmse"]
    outputs = predictive_outputs(model, guide, x, num_samples=12)
    assert outputs.shape == (12, 32, 1)
    moments = predict_moments(model, guide, x)
    assert moments["mean"].shape == (32, 1) and torch.isfinite(moments["var"]).all()


def test_prediction_draws_cover_every_component_equally():
    k, t, x = 4, 2, torch.randn(5, 3)
    model, guide = components_model(k)
    outputs = predictive_outputs(model, guide, x, num_samples=k * t)
    for s in range(k * t):
        for b in range(len(x)):
            torch.testing.assert_close(outputs[s, b], network_with_component(model, guide, (b + s) % k, x)[b])


def test_vdp_propagates_the_mixture_moments_through_a_node_layer():
    net = nn.Sequential(nn.Linear(3, 2))
    w, b = net[0].weight.detach().clone(), net[0].bias.detach().clone()
    model = BayesianNetwork(net, Gaussian(1.0), prior=NodePrior(0.3), num_data=10)
    guide = MixtureNodeGuide(model, num_components=3, init_scale=0.4, init_sigma=(0.2, 0.05))
    q = guide.posterior("net.0.nodes")
    x = torch.randn(4, 3)
    moments = predict_moments(model, guide, x)
    torch.testing.assert_close(moments["mean"], F.linear(x * q.mean, w, b))
    torch.testing.assert_close(moments["var"], F.linear(x.square() * q.variance, w.square()))


def test_optimizer_groups_and_learning_rate_schedule():
    model = BayesianNetwork(mlp(), prior=NodePrior(0.3), num_data=100)
    guide = MixtureNodeGuide(model, num_components=2)
    optim = TwoGroupSGD(lr=0.05, variational_lr=1.2, weight_decay=5e-4)(model, guide)
    deterministic, variational = optim.param_groups
    assert {id(p) for p in deterministic["params"]} == {id(p) for p in model.parameters()}
    assert {id(p) for p in variational["params"]} == {id(p) for p in guide.parameters()}
    assert deterministic["lr"] == pytest.approx(0.05 / 100) and deterministic["weight_decay"] == pytest.approx(0.05)
    assert deterministic["nesterov"] and deterministic["momentum"] == 0.9 and deterministic["scheduled"]
    assert variational["lr"] == pytest.approx(1.2 / 100) and variational["weight_decay"] == 0.0
    assert not variational["scheduled"]
    schedule = FlatThenLinear(300)
    assert [schedule(e) for e in (0, 150, 210, 270, 299)] == pytest.approx([1, 1, 1 - 0.99 * 0.5, 0.01, 0.01])


def test_guide_state_round_trip_gives_the_same_posterior():
    model = BayesianNetwork(mlp(), prior=NodePrior(0.3), num_data=10)
    guide = MixtureNodeGuide(model, num_components=3, name="first")
    other = MixtureNodeGuide(model, num_components=3, name="second")
    other.load_state_dict(guide.state_dict())
    for name in guide.site_names:
        torch.testing.assert_close(other.posterior(name).locs, guide.posterior(name).locs)
        torch.testing.assert_close(other.posterior(name).scales, guide.posterior(name).scales)


# ----------------------------------------------------------------------------- bad inputs


@pytest.mark.parametrize("kwargs, match", [({"scale": 0.0}, "scale"), ({"scale": -1.0}, "scale"),
                                           ({"mode": "side"}, "mode"), ({"mode": "out", "bias": True}, "bias")])
def test_bad_node_priors_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        NodePrior(**kwargs)


@pytest.mark.parametrize("k", [0, -1, 1.5, True])
def test_bad_number_of_components_raises(k):
    model = BayesianNetwork(mlp(), prior=NodePrior(0.3), num_data=10)
    with pytest.raises(ValueError, match="num_components"):
        MixtureNodeGuide(model, num_components=k)


def test_bad_guide_options_raise():
    model = BayesianNetwork(mlp(), prior=NodePrior(0.3), num_data=10)
    with pytest.raises(ValueError, match="kl"):
        MixtureNodeGuide(model, kl="exact")
    with pytest.raises(ValueError, match="entropy_weight"):
        MixtureNodeGuide(model, entropy_weight=-1.0)
    with pytest.raises(ValueError, match="NodePrior"):
        MixtureNodeGuide(BayesianNetwork(mlp(), prior=GaussianPrior(), num_data=10))


def test_a_network_without_linear_or_conv_layers_raises():
    with pytest.raises(ValueError, match="Linear or Conv"):
        BayesianNetwork(nn.Sequential(nn.Embedding(5, 3), nn.Flatten()), prior=NodePrior(0.3), num_data=10)
    with pytest.raises(ValueError, match="Linear or Conv"):
        BayesianNetwork(nn.Sequential(nn.Linear(3, 3), nn.LayerNorm(3)), prior=NodePrior(0.3),
                        include=nn.LayerNorm, exclude=None, num_data=10)


def test_a_batch_that_cannot_be_split_among_the_components_raises():
    model = BayesianNetwork(mlp(), Gaussian(1.0), prior=NodePrior(0.3), num_data=10)
    guide = MixtureNodeGuide(model, num_components=4)
    x, y = torch.randn(6, 3), torch.randn(6, 2)
    with pytest.raises(ValueError, match="multiple of 4"), local_reparameterization():
        MeanFieldELBO().differentiable_loss(model, guide, x, y)
    with pytest.raises(ValueError, match="multiple of the guide.s 4 mixture components"):
        predictive_outputs(model, guide, x[:3], num_samples=6)
    MeanFieldELBO().differentiable_loss(model, guide, x, y)  # plain sampling: one draw per site, any batch


def test_optimizer_needs_the_training_set_size():
    model = BayesianNetwork(mlp(), prior=NodePrior(0.3))
    with pytest.raises(ValueError, match="num_data"):
        TwoGroupSGD()(model, MixtureNodeGuide(model))
    with pytest.raises(ValueError, match="variational_lr"):
        TwoGroupSGD(variational_lr=0.0)


def test_normal_guide_on_node_sites_is_a_mean_field_node_posterior():
    model = BayesianNetwork(mlp(), Gaussian(1.0), prior=NodePrior(0.3), num_data=10)
    guide = NormalGuide(model, init_rho=-2.0)
    x, y = torch.randn(4, 3), torch.randn(4, 2)
    terms = MeanFieldELBO().terms(model, guide, x, y)
    expected = sum(kl_divergence(Normal(*guide.loc_scale(n)), Normal(1.0, 0.3)).sum() for n in guide.site_names)
    torch.testing.assert_close(terms.kl, expected.detach())
