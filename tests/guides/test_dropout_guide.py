"""MC dropout (DropoutGuide) and point estimates (PointGuide) as guides."""

import itertools
import math

import pyro
import pytest
import torch
from pyro.infer import SVI, Trace_ELBO
from torch import nn
from torch.distributions import kl_divergence

from pyrobnn import BayesianNetwork, DropoutGuide, GaussianPrior, MeanFieldELBO, PointGuide
from pyrobnn.analysis.evaluate import evaluate
from pyrobnn.distributions import DropoutWeight, dropout_kl_constant
from pyrobnn.handlers import ESTIMATORS, local_reparameterization, vdp
from pyrobnn.infer.optim import Optim
from pyrobnn.infer.predict import predictive_outputs
from pyrobnn.infer.svi import fit, svi_step


def _mlp(seed=0, sizes=(4, 6, 3)):
    torch.manual_seed(seed)
    layers = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def test_dropout_weight_moments_match_samples():
    torch.manual_seed(0)
    loc = torch.randn(3, 5, 2)
    q = DropoutWeight(loc, 0.3)
    draws = q.rsample((40000,))
    assert draws.shape == (40000, 3, 5, 2)
    # one mask value per input unit (dimension 1), shared by the other dimensions
    ratio = draws / loc
    assert torch.allclose(ratio[:, 0, :, 0], ratio[:, 1, :, 1], atol=1e-5)
    se = draws.std(0) / math.sqrt(len(draws))
    assert ((draws.mean(0) - q.mean).abs() < 5 * se + 1e-6).all()
    assert torch.allclose(draws.var(0), q.variance, rtol=0.05, atol=1e-4)
    bias = torch.randn(4)  # a bias has no inputs: a point mass
    assert torch.equal(DropoutWeight(bias, 0.5).rsample((3,)), bias.expand(3, 4))


def test_dropout_kl_to_gaussian_prior_is_the_expected_negative_log_prior_less_its_constant():
    """The KL is Gal & Ghahramani's weight decay: -E_q log p(W) less the constant D/2 log(2 pi s^2)."""
    torch.manual_seed(1)
    loc = torch.randn(4, 6)
    q, p = DropoutWeight(loc, 0.4), GaussianPrior(0.0, 0.7)(loc)
    kl = kl_divergence(q, p)
    constant = dropout_kl_constant(q, p)
    assert constant == pytest.approx(24 * (math.log(0.7) + 0.5 * math.log(2 * math.pi)))
    draws = q.rsample((50000,))
    neg_log_p = -p.log_prob(draws)
    se = neg_log_p.std() / math.sqrt(len(draws))
    assert abs(kl + constant - neg_log_p.mean()) < 5 * se
    # rate 0: exactly -log p(M) less the constant, the MAP penalty of weight decay
    assert torch.allclose(kl_divergence(DropoutWeight(loc, 0.0), p), loc.square().sum() / (2 * 0.7**2))


def _masked_forward(net, x, rate):
    """The MLP by hand: every Linear layer's input dropped per example (inverted dropout) at ``rate``, or at
    ``rate[i]`` for the i-th Linear layer."""
    h, rates = x, iter(rate if isinstance(rate, (list, tuple)) else itertools.repeat(rate))
    for module in net:
        if isinstance(module, nn.Linear):
            p = next(rates)
            if p:
                h = h * torch.empty_like(h).bernoulli_(1 - p) / (1 - p)
            h = nn.functional.linear(h, module.weight_init, module.bias_init)
        else:
            h = module(h)
    return h


def test_rates_per_layer_keep_the_input_undropped_and_refuse_a_pattern_that_matches_no_site():
    net = _mlp()
    model = BayesianNetwork(net)  # sites net.0.weight, net.0.bias, net.2.weight, net.2.bias
    guide = DropoutGuide(model, rate={"net.0.*": 0.0, "*": 0.3})
    assert [guide.rate(name) for name in guide.site_names] == [0.0, 0.0, 0.3, 0.3]
    x = torch.randn(5, 4)
    torch.manual_seed(7)
    draws = predictive_outputs(model, guide, x, num_samples=6)
    torch.manual_seed(7)
    assert torch.allclose(draws, _masked_forward(net, x.repeat(6, 1), [0.0, 0.3]).view(6, 5, 3), atol=1e-6)
    with pytest.raises(ValueError, match=r"'conv1\.\*' matches no site of the model; its sites are net\.0\.weight"):
        DropoutGuide(model, rate={"conv1.*": 0.0, "*": 0.3})


def test_predictive_equals_averaging_masked_deterministic_passes():
    net = _mlp()
    model = BayesianNetwork(net)
    guide = DropoutGuide(model, rate=0.3)
    x = torch.randn(5, 4)
    torch.manual_seed(7)
    draws = predictive_outputs(model, guide, x, num_samples=6)  # vectorized: 6 particles x 5 rows
    torch.manual_seed(7)
    by_hand = _masked_forward(net, x.repeat(6, 1), 0.3).view(6, 5, 3)
    assert torch.allclose(draws, by_hand, atol=1e-6)
    torch.manual_seed(7)
    looped = predictive_outputs(model, guide, x, num_samples=6, vectorized=False)  # one mask per pass
    assert looped.shape == (6, 5, 3)
    assert not torch.allclose(looped[0], looped[1])


def test_predictive_mean_matches_enumeration_of_masks():
    torch.manual_seed(3)
    net = nn.Sequential(nn.Linear(4, 2))
    model = BayesianNetwork(net)
    guide = DropoutGuide(model, rate=0.5)
    x = torch.randn(3, 4)
    w, b = net[0].weight_init, net[0].bias_init
    exact = torch.stack([torch.softmax(nn.functional.linear(x * torch.tensor(m) / 0.5, w, b), -1)
                         for m in itertools.product([0.0, 1.0], repeat=4)]).mean(0)
    pyro.set_rng_seed(0)
    probs = torch.softmax(predictive_outputs(model, guide, x, num_samples=20000), -1)
    se = probs.std(0) / math.sqrt(len(probs))
    assert ((probs.mean(0) - exact).abs() < 5 * se).all()


def test_vdp_moments_of_a_dropout_layer_are_exact_for_a_fixed_input():
    torch.manual_seed(4)
    net = nn.Sequential(nn.Linear(6, 3))
    model = BayesianNetwork(net)
    guide = DropoutGuide(model, rate=0.2)
    x = torch.randn(2, 6)
    with vdp():
        trace = pyro.poutine.trace(guide).get_trace()
        out = pyro.poutine.replay(model.net, trace=trace)(x)
    w, b = net[0].weight_init, net[0].bias_init
    assert torch.allclose(out.loc, nn.functional.linear(x, w, b), atol=1e-6)
    assert torch.allclose(out.variance, (x.square() @ w.square().T) * 0.2 / 0.8, atol=1e-6)


@pytest.mark.parametrize("estimator", sorted(ESTIMATORS))
@pytest.mark.parametrize("guide_cls", [DropoutGuide, PointGuide])
def test_every_estimator_trains_a_step(estimator, guide_cls):
    pyro.clear_param_store()
    model = BayesianNetwork(_mlp(), num_data=32)
    guide = guide_cls(model)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    optim = torch.optim.Adam(guide.parameters(), 1e-2)
    before = [p.detach().clone() for p in guide.parameters()]
    terms = svi_step(model, guide, optim, x, y,
                     elbo=MeanFieldELBO(1 if estimator == "vdp" else 2, vectorize_particles=True,
                                        estimator=estimator))
    assert torch.isfinite(terms.loss)
    assert all(not torch.equal(a, b) for a, b in zip(before, guide.parameters()))


def test_point_guide_is_map_and_matches_trace_elbo():
    pyro.clear_param_store()
    model = BayesianNetwork(_mlp(), num_data=20, prior=GaussianPrior(0.0, 2.0))
    guide = PointGuide(model)
    x, y = torch.randn(20, 4), torch.randint(0, 3, (20,))
    loss = MeanFieldELBO().loss(model, guide, x, y)
    assert loss == pytest.approx(Trace_ELBO().loss(model, guide, x, y), rel=1e-6)
    logits = pyro.poutine.replay(model.net, trace=pyro.poutine.trace(guide).get_trace())(x)
    nll = nn.functional.cross_entropy(logits, y, reduction="sum")
    penalty = sum(-GaussianPrior(0.0, 2.0)(p).log_prob(p) for p in guide.median().values())
    assert loss == pytest.approx((nll + penalty).item(), rel=1e-5)
    draws = predictive_outputs(model, guide, x, num_samples=3)
    assert torch.equal(draws[0], draws[2])


def test_dropout_guide_matches_trace_elbo_in_expectation():
    pyro.clear_param_store()
    model = BayesianNetwork(_mlp(), num_data=16)
    guide = DropoutGuide(model, rate=0.25)
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    pyro.set_rng_seed(0)
    ours = torch.tensor([MeanFieldELBO().loss(model, guide, x, y) for _ in range(400)])
    pyro.set_rng_seed(1)
    pyros = torch.tensor([Trace_ELBO().loss(model, guide, x, y) for _ in range(400)])
    se = math.sqrt(ours.var() / len(ours) + pyros.var() / len(pyros))
    # Trace_ELBO scores log q = 0 and the full cross-entropy: the KL plus the constant D/2 log(2 pi s^2)
    constant = sum(dropout_kl_constant(guide.posterior(n), site.prior_distribution())
                   for n, site in zip(guide.site_names, model.sites()))
    assert constant > 0
    assert abs(ours.mean() + constant - pyros.mean()) < 5 * se


@pytest.mark.recorded
def test_plain_pyro_svi_trains_the_dropout_guide():
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    x = torch.randn(128, 4)
    y = (x[:, 0] + x[:, 1] > 0).long()
    model = BayesianNetwork(_mlp(sizes=(4, 16, 2)), num_data=128)
    guide = DropoutGuide(model, rate=0.1)
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.02}), Trace_ELBO())
    with pytest.warns(UserWarning, match="one dropout mask per batch, not one per example"):
        first = svi.step(x, y)
    for _ in range(150):
        last = svi.step(x, y)
    assert last < first
    assert "DropoutGuide.locs.net.0.weight" in pyro.get_param_store()
    assert evaluate(model, guide, x, y, num_samples=20)["accuracy"] > 0.9


@pytest.mark.recorded
def test_fit_trains_mc_dropout_and_it_swaps_in_by_one_argument():
    pyro.set_rng_seed(0)
    x = torch.randn(256, 4)
    y = (x[:, 0] * x[:, 1] > 0).long()
    results = {}
    for name, make in {"dropout": lambda m: DropoutGuide(m, rate=0.1), "point": PointGuide}.items():
        model = BayesianNetwork(_mlp(sizes=(4, 32, 2)))
        guide = make(model)
        fit(model, guide, x, y, epochs=30, batch_size=64, optimizer=Optim(lr=0.01), progress=False)
        results[name] = evaluate(model, guide, x, y, num_samples=10)["accuracy"]
    assert min(results.values()) > 0.85, results


def test_fit_and_prediction_do_not_warn_about_masks_per_batch(recwarn):
    """The warning is for training outside an estimator handler; ``fit`` trains under one, and a prediction pass
    without gradients is one whole draw of the network (the sequential path and the input probe included)."""
    pyro.set_rng_seed(0)
    x = torch.randn(64, 4)
    y = (x[:, 0] > 0).long()
    model = BayesianNetwork(_mlp(sizes=(4, 8, 2)))
    guide = DropoutGuide(model, rate=0.2)
    fit(model, guide, x, y, epochs=1, batch_size=32, progress=False)
    for vectorized in (True, False):
        assert predictive_outputs(model, guide, x, num_samples=3, vectorized=vectorized).shape == (3, 64, 2)
    assert not [w for w in recwarn if "dropout mask" in str(w.message)]


def test_rate_per_site_by_pattern_and_bad_rates():
    model = BayesianNetwork(_mlp())
    guide = DropoutGuide(model, rate={"net.0.*": 0.0, "*": 0.3})
    assert guide.rate("net.0.weight") == 0.0 and guide.rate("net.2.weight") == 0.3
    assert not guide.posterior("net.0.weight").dropped and guide.posterior("net.2.weight").dropped
    for bad in (1.0, -0.1, "half", True):
        with pytest.raises(ValueError, match="rate"):
            DropoutGuide(BayesianNetwork(_mlp()), rate=bad)


def test_local_reparameterization_particles_draw_one_mask_per_example_and_particle():
    model = BayesianNetwork(nn.Sequential(nn.Linear(50, 1, bias=False)))
    guide = DropoutGuide(model, rate=0.5)
    x = torch.ones(4, 50)
    with local_reparameterization(num_particles=3, batch_size=4) as handler:
        out = pyro.poutine.replay(model.net, trace=pyro.poutine.trace(guide).get_trace())(x)
    rows = handler.particles.split(out).reshape(12)
    assert len(set(rows.tolist())) == 12  # every (particle, example) its own mask
