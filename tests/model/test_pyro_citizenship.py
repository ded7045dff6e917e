"""pyrobnn's guides and models behave as Pyro's autoguides do, checked against AutoNormal / Trace_ELBO.

Each test names the Pyro-user action: a second model in one process, any ELBO, Predictive, the param
store (save / load / clear), state_dict, poutine handlers.
"""

from __future__ import annotations

import contextlib
import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine
from pyro.infer import SVI, Predictive, Trace_ELBO
from pyro.infer.autoguide import AutoDiagonalNormal, AutoNormal
from torch import nn

from pyrobnn import (
    BayesianNetwork,
    MeanFieldELBO,
    NormalGuide,
    ScaleMixturePrior,
    flipout,
    local_reparameterization,
    weight_sampling,
)
from pyrobnn.data import two_moons

GUIDES = {
    "NormalGuide": lambda model: NormalGuide(model, init_rho=-3.0),
    "AutoNormal": lambda model: AutoNormal(model, init_scale=0.05),
}


def moons_model(seed=0, hidden=16, num_data=200):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(2, hidden), nn.Tanh(), nn.Linear(hidden, 2))
    return BayesianNetwork(net, num_data=num_data)


def train_svi(model, guide, data, steps=150):
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.02}), loss=Trace_ELBO())
    for _ in range(steps):
        svi.step(data.x_train, data.y_train)


def accuracy(model, guide, data):
    predictive = Predictive(model, guide=guide, num_samples=20, return_sites=["_RETURN"])
    logits = predictive(data.x_test)["_RETURN"]
    return (logits.softmax(-1).mean(0).argmax(-1) == data.y_test).float().mean().item()


@pytest.mark.recorded
@pytest.mark.parametrize("kind", GUIDES)
def test_a_second_model_and_guide_in_one_process_train(kind):
    """The README's SVI script run twice in one process, without pyro.clear_param_store()."""
    data = two_moons(n=600, n_train=200, seed=0)
    first_model = moons_model(seed=0)
    first = GUIDES[kind](first_model)
    train_svi(first_model, first, data)

    model = moons_model(seed=1)
    guide = GUIDES[kind](model)
    guide(data.x_train, data.y_train)  # autoguides create their parameters on the first call
    before = {k: v.detach().clone() for k, v in pyro.get_param_store().items() if ".locs." in k or "locs." in k}
    train_svi(model, guide, data)
    after = dict(pyro.get_param_store().items())
    moved = max((after[k].detach() - v).abs().max().item() for k, v in before.items())
    assert moved > 1e-2, f"{kind}: the second guide's means did not move"
    assert accuracy(model, guide, data) > 0.8


def test_the_second_guide_starts_from_its_own_initial_values_and_the_first_keeps_its_own():
    data = two_moons(n=300, n_train=100, seed=0)
    model1 = moons_model(seed=0)
    guide1 = NormalGuide(model1)
    train_svi(model1, guide1, data, steps=30)
    trained = guide1.loc_scale("net.0.weight")[0].detach().clone()
    model2 = moons_model(seed=1)
    guide2 = NormalGuide(model2)
    torch.testing.assert_close(guide2.loc_scale("net.0.weight")[0], model2.net[0].weight_init)
    # used side by side, each guide samples around its own means
    for guide, loc in ((guide1, trained), (guide2, model2.net[0].weight_init), (guide1, trained)):
        draws = torch.stack([guide()["net.0.weight"].detach() for _ in range(200)])
        assert (draws.mean(0) - loc).abs().max() < 0.05


@pytest.mark.parametrize("autoguide", [AutoNormal, AutoDiagonalNormal])
def test_mean_field_elbo_equals_trace_elbo_for_autoguides(autoguide):
    """Autoguides sample auxiliary sites (``*_unconstrained``); their log q is part of the loss."""
    data = two_moons(n=300, n_train=100, seed=0)
    model = moons_model()
    guide = autoguide(model)
    guide(data.x_train, data.y_train)
    for seed in range(3):
        pyro.set_rng_seed(seed)
        ours = MeanFieldELBO().loss(model, guide, data.x_train, data.y_train)
        pyro.set_rng_seed(seed)
        reference = Trace_ELBO().loss(model, guide, data.x_train, data.y_train)
        assert ours == pytest.approx(reference, rel=1e-5)


def test_mean_field_elbo_is_trace_elbo_in_expectation_for_the_normal_guide():
    """Analytic KL against Pyro's Monte-Carlo ELBO: equal within its standard error."""
    data = two_moons(n=300, n_train=100, seed=0)
    model = moons_model()
    guide = NormalGuide(model, init_rho=-1.0)
    ours = MeanFieldELBO(num_particles=200).loss(model, guide, data.x_train, data.y_train)
    draws = torch.tensor([Trace_ELBO().loss(model, guide, data.x_train, data.y_train) for _ in range(400)])
    standard_error = draws.std().item() / math.sqrt(len(draws))
    assert abs(ours - draws.mean().item()) < 4 * standard_error + 0.01 * abs(ours)


def test_mean_field_elbo_refuses_what_it_cannot_compute():
    def model():
        pyro.sample("k", dist.Categorical(torch.ones(3)))

    def guide():
        pyro.sample("k", dist.Categorical(torch.ones(3) / 3))

    with pytest.raises(ValueError, match="reparameterized.*'k'.*Trace_ELBO"):
        MeanFieldELBO().loss(model, guide)


@pytest.mark.parametrize("kind", GUIDES)
@pytest.mark.parametrize("handler", [None, local_reparameterization, flipout])
def test_predictive_works_sequentially_under_every_handler(kind, handler):
    data = two_moons(n=300, n_train=100, seed=0)
    model = moons_model()
    guide = GUIDES[kind](model)
    guide(data.x_train, data.y_train)
    with handler() if handler else poutine.messenger.Messenger():
        samples = Predictive(model, guide=guide, num_samples=3)(data.x_test[:7])
    assert samples["obs"].shape == (3, 7)
    assert samples["net.0.weight"].shape[0] == 3 and samples["net.0.weight"].shape[-2:] == (16, 2)


@pytest.mark.parametrize("kind", GUIDES)
def test_pyro_vectorization_is_refused_with_a_message_not_a_shape_error(kind):
    data = two_moons(n=300, n_train=100, seed=0)
    model = moons_model()
    guide = GUIDES[kind](model)
    guide(data.x_train, data.y_train)
    with pytest.raises(ValueError, match="one weight per layer.*num_particles"):
        Predictive(model, guide=guide, num_samples=3, parallel=True)(data.x_test[:7])
    elbo = Trace_ELBO(num_particles=3, vectorize_particles=True, max_plate_nesting=1)
    with pytest.raises(ValueError, match="one weight per layer"):
        elbo.loss(model, guide, data.x_train, data.y_train)
    if kind == "NormalGuide":
        with pytest.raises(ValueError, match="vectorized plate.*num_particles=S"), local_reparameterization():
            elbo.loss(model, guide, data.x_train, data.y_train)


def test_a_latent_site_that_is_not_a_weight_passes_through_the_handlers():
    """A model with a Gamma-distributed noise precision beside the network, trained under flipout."""
    torch.manual_seed(0)
    x = torch.linspace(-1, 1, 64).unsqueeze(-1)
    y = 2 * x.squeeze(-1) + 0.1 * torch.randn(64)
    bnn = BayesianNetwork(nn.Linear(1, 1), num_data=64)

    def model(x, y=None):
        precision = pyro.sample("precision", dist.Gamma(2.0, 0.02))
        mean = bnn.net(x).squeeze(-1)
        with pyro.plate("data", len(x)):
            pyro.sample("y", dist.Normal(mean, precision.rsqrt()), obs=y)

    weights = NormalGuide(bnn)

    def guide(x, y=None):
        rate = pyro.param("rate", torch.tensor(0.02), constraint=dist.constraints.positive)
        pyro.sample("precision", dist.Gamma(2.0, rate))  # score-function site: Trace_ELBO
        weights()

    svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.05}), loss=Trace_ELBO())
    with flipout():
        for _ in range(200):
            svi.step(x, y)
    assert abs(weights.loc_scale("net.weight")[0].item() - 2.0) < 0.3


def test_param_store_save_load_clear(tmp_path):
    data = two_moons(n=300, n_train=100, seed=0)
    model = moons_model()
    guide = NormalGuide(model)
    train_svi(model, guide, data, steps=20)
    path = tmp_path / "params.pt"
    pyro.get_param_store().save(path)
    saved = pyro.param("NormalGuide.locs.net.0.weight").detach().clone()
    train_svi(model, guide, data, steps=20)
    assert not torch.equal(pyro.param("NormalGuide.locs.net.0.weight").detach(), saved)

    pyro.get_param_store().load(path)  # as for an autoguide: the next call uses the loaded values
    draws = torch.stack([guide()["net.0.weight"].detach() for _ in range(300)])
    assert (draws.mean(0) - saved).abs().max() < 0.02
    assert torch.equal(guide.loc_scale("net.0.weight")[0].detach(), saved)

    pyro.clear_param_store()
    train_svi(model, guide, data, steps=5)  # re-registers its parameters and keeps training
    assert "NormalGuide.locs.net.0.weight" in pyro.get_param_store()
    assert pyro.param("NormalGuide.locs.net.0.weight") is guide.loc_scale("net.0.weight")[0]


@pytest.mark.parametrize("kind", GUIDES)
def test_state_dict_round_trip_gives_the_same_posterior(kind):
    data = two_moons(n=300, n_train=100, seed=0)
    model = moons_model()
    guide = GUIDES[kind](model)
    train_svi(model, guide, data, steps=20)
    state = {k: v.clone() for k, v in guide.state_dict().items()}
    pyro.clear_param_store()
    fresh = GUIDES[kind](model)
    fresh(data.x_train, data.y_train)
    fresh.load_state_dict(state)
    for name, value in fresh.median(data.x_train).items():
        torch.testing.assert_close(value, guide.median(data.x_train)[name])


def test_poutine_handlers_see_the_same_sites_as_for_an_autoguide():
    data = two_moons(n=300, n_train=100, seed=0)
    model = moons_model()
    auto = AutoNormal(model)
    auto(data.x_train, data.y_train)
    ours = NormalGuide(model)
    auto_sites = {n for n, s in poutine.trace(auto).get_trace(data.x_train, data.y_train).nodes.items()
                  if s["type"] == "sample" and not s["infer"].get("is_auxiliary")}
    our_trace = poutine.trace(ours).get_trace(data.x_train)
    assert {n for n, s in our_trace.nodes.items() if s["type"] == "sample"} == auto_sites
    # condition the model on the guide's draw, block, scale: plain Pyro handlers compose
    values = {n: our_trace.nodes[n]["value"] for n in auto_sites}
    conditioned = poutine.trace(poutine.condition(model, data=values)).get_trace(data.x_train, data.y_train)
    assert torch.equal(conditioned.nodes["net.0.weight"]["value"], values["net.0.weight"])
    blocked = poutine.trace(poutine.block(ours, hide=["net.0.weight"])).get_trace()
    assert "net.0.weight" not in blocked.nodes and "net.0.bias" in blocked.nodes
    with poutine.scale(scale=0.5):
        scaled = poutine.trace(ours).get_trace()
    assert scaled.nodes["net.0.bias"]["scale"] == 0.5


def test_scale_mixture_prior_trains_under_vdp():
    """A prior without a closed-form KL under moment propagation: the KL is estimated on one weight sample."""
    from pyrobnn.infer.svi import fit

    data = two_moons(n=300, n_train=100, seed=0)
    torch.manual_seed(0)
    model = BayesianNetwork(nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 2)),
                            prior=ScaleMixturePrior())
    guide = NormalGuide(model)
    history = fit(model, guide, data.x_train, data.y_train, epochs=3, batch_size=50,
                  elbo=MeanFieldELBO(estimator="vdp"), progress=False)
    assert all(math.isfinite(v) for v in history["loss"]) and history["kl"][-1] > 0


def test_vectorized_particles_are_the_loop_in_one_pass():
    """The objective carries its particles, as Pyro's Trace_ELBO(num_particles, vectorize_particles) does: S
    particles in one batched pass (the estimator's handler) estimate what S particles in a loop estimate; with a
    nearly deterministic posterior, the same number."""
    data = two_moons(n=300, n_train=64, seed=0)
    model = moons_model()
    guide = NormalGuide(model, init_rho=-30.0)
    loop = MeanFieldELBO(4, estimator="local").terms(model, guide, data.x_train, data.y_train)
    calls = []
    model.net[0].register_forward_hook(lambda module, args, out: calls.append(out.shape[0]))
    one_pass = MeanFieldELBO(4, vectorize_particles=True, estimator="local").terms(model, guide, data.x_train,
                                                                                  data.y_train)
    assert calls == [4 * 64]
    assert torch.allclose(loop.nll, one_pass.nll, rtol=1e-4) and torch.allclose(loop.kl, one_pass.kl)


def test_weight_sampling_particles_repeat_the_targets_through_the_model():
    """The particle handler answers the model's align_targets effect: S x B rows scored, mean over S."""
    data = two_moons(n=300, n_train=64, seed=0)
    model = moons_model()
    guide = NormalGuide(model)
    with weight_sampling(num_particles=4, batch_size=64):
        trace = poutine.trace(poutine.replay(model, trace=poutine.trace(guide).get_trace())).get_trace(
            data.x_train, data.y_train)
    obs = trace.nodes["obs"]
    assert obs["value"].shape == (256,) and torch.equal(obs["value"][64:128], data.y_train)
    assert obs["scale"] == pytest.approx(200 / 256)


def test_svi_step_reads_the_parameters_directly_with_the_same_loss_and_gradients_as_pyro_param():
    from pyrobnn.guides.base import direct_parameters
    from pyrobnn.infer.svi import svi_step

    data = two_moons(n=300, n_train=100, seed=0)
    model = moons_model()
    guide = NormalGuide(model, init_rho=-3.0)
    names = {f"NormalGuide.{role}.{site}" for role in ("locs", "rhos") for site in guide.site_names}
    # outside svi_step the guide emits a param site per parameter, which is how pyro.infer.SVI finds them
    messaged = poutine.trace(guide).get_trace()
    assert {n for n, s in messaged.nodes.items() if s["type"] == "param"} == names
    with direct_parameters():
        direct = poutine.trace(guide).get_trace()
    assert not any(s["type"] == "param" for s in direct.nodes.values())
    for role in ("locs", "rhos"):  # the same tensors: the store's, which the optimiser steps
        for site in guide.site_names:
            with direct_parameters():
                value = guide.param(site, role)
            assert value is guide.param(site, role) is pyro.get_param_store()[f"NormalGuide.{role}.{site}"]

    def loss_and_grads(read_directly):
        pyro.set_rng_seed(3)
        with (direct_parameters() if read_directly else contextlib.nullcontext()):
            loss = MeanFieldELBO().differentiable_loss(model, guide, data.x_train, data.y_train)
        grads = torch.autograd.grad(loss, list(guide.parameters()))
        return loss, grads

    loss, grads = loss_and_grads(False)
    loss_direct, grads_direct = loss_and_grads(True)
    assert torch.equal(loss, loss_direct)
    assert all(torch.equal(a, b) for a, b in zip(grads, grads_direct))
    # and a step of svi_step trains the parameters Pyro's param store holds
    before = {n: pyro.get_param_store()[n].detach().clone() for n in names}
    svi_step(model, guide, torch.optim.Adam(guide.parameters(), lr=0.01), data.x_train, data.y_train)
    assert all(not torch.equal(pyro.get_param_store()[n], before[n]) for n in names)
