"""Your own Pyro model: every guide, estimator, predictor and sampler on a Bayesian network written the way Pyro's
tutorials write one (``PyroModule[nn.Linear]`` layers with ``PyroSample`` priors, a noise scale with its own prior,
``pyro.sample("obs", ...)`` under ``pyro.plate("data", ...)``), and a classifier with a ``PyroModule[nn.Conv2d]``.

Each is checked against Pyro itself: ``Trace_ELBO``, ``AutoNormal``, ``initialize_model``'s potential.
"""

from __future__ import annotations

import math
import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
import torch.nn.functional as F
from pyro import poutine
from pyro.infer import SVI, Trace_ELBO
from pyro.infer.autoguide import AutoNormal
from pyro.infer.mcmc.util import initialize_model
from pyro.nn import PyroModule, PyroSample
from sklearn.datasets import load_digits
from torch import nn

from pyrobnn import (
    BayesianNetwork,
    DropoutGuide,
    Gaussian,
    GaussianPrior,
    MeanFieldELBO,
    NormalGuide,
    Optim,
    PointGuide,
    PosteriorDraws,
    evaluate,
    fit,
    flipout,
    local_reparameterization,
    predict,
    predict_moments,
    sample_posterior,
    vdp,
    weight_sampling,
)
from pyrobnn.infer.potential import BatchedPotential, FlatPotential
from pyrobnn.model import TracedModel, network_model
from pyrobnn.networks import PyroBNN
from tests.support import nuts

BNN = PyroBNN  # the README's model, verbatim


class FixedNoiseBNN(BNN):
    """The same network with the noise scale fixed: the model ``BayesianNetwork(MLP, Gaussian(sigma))`` is."""

    def __init__(self, hidden, sigma):
        super().__init__(hidden)
        self.sigma = sigma

    def forward(self, x, y=None):
        mu = self.layer2(torch.tanh(self.layer1(x))).squeeze(-1)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Normal(mu, self.sigma), obs=y)
        return mu


class ConvClassifier(PyroModule):
    """A classifier of 8x8 digits: a PyroModule[nn.Conv2d] and a PyroModule[nn.Linear], Categorical logits."""

    def __init__(self, channels=4, classes=10):
        super().__init__()
        self.conv = PyroModule[nn.Conv2d](1, channels, 3, padding=1)
        self.conv.weight = PyroSample(dist.Normal(0., 1.).expand([channels, 1, 3, 3]).to_event(4))
        self.conv.bias = PyroSample(dist.Normal(0., 1.).expand([channels]).to_event(1))
        self.fc = PyroModule[nn.Linear](channels * 16, classes)
        self.fc.weight = PyroSample(dist.Normal(0., 1.).expand([classes, channels * 16]).to_event(2))
        self.fc.bias = PyroSample(dist.Normal(0., 1.).expand([classes]).to_event(1))

    def forward(self, x, y=None):
        logits = self.fc(F.max_pool2d(F.relu(self.conv(x)), 2).flatten(1))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
        return logits


def sinusoid(n=64, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.linspace(-2, 2, n)[:, None]
    return x, torch.sin(2 * x[:, 0]) + 0.1 * torch.randn(n, generator=generator)


def digits(n=400):
    data = load_digits()
    x = torch.tensor(data.images[:n], dtype=torch.float32)[:, None] / 16.0
    return x, torch.tensor(data.target[:n])


GUIDES = {
    "NormalGuide": lambda model: NormalGuide(model, init_rho=-4.0),
    "PointGuide": PointGuide,
    "DropoutGuide": lambda model: DropoutGuide(model, rate={"conv.*" if isinstance(model, ConvClassifier)
                                                            else "layer1.*": 0.0, "*": 0.05}),
    "AutoNormal": lambda model: AutoNormal(model, init_scale=0.01),
}


def train(model, guide, x, y, steps, lr=0.02):
    """Plain Pyro SVI, each step under local reparameterization (one dropout mask per example)."""
    loss = Trace_ELBO() if isinstance(guide, AutoNormal) else MeanFieldELBO()
    svi = SVI(model, guide, pyro.optim.Adam({"lr": lr}), loss=loss)
    for _ in range(steps):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PointGuide: local reparameterization has nothing to act on
            with local_reparameterization():
                svi.step(x, y)
    return guide


@pytest.mark.recorded
@pytest.mark.slow
@pytest.mark.parametrize("kind", GUIDES)
@pytest.mark.parametrize("task", ["regression", "classification"])
def test_every_guide_trains_the_users_model_and_predicts(kind, task):
    """Pyro's SVI trains the user's model with each guide; predict and evaluate take it (the observed site found by
    tracing), and it learns: RMSE well below the targets' spread, or digits far above chance."""
    pyro.set_rng_seed(0)
    if task == "regression":
        (x, y), model = sinusoid(), BNN(hidden=16)
    else:
        (x, y), model = digits(), ConvClassifier()
    guide = train(model, GUIDES[kind](model), x, y, steps=300 if task == "regression" else 100)
    metrics = evaluate(model, guide, x, y, num_samples=20)
    out = predict(model, guide, x, num_samples=20)
    if task == "regression":
        assert metrics["rmse"] < 0.7 * float(y.std()), metrics
        assert out["mean"].shape == (len(x),) and (out["std"] > 0).all()
    else:
        assert metrics["accuracy"] > 0.75, metrics
        assert out["probs"].shape == (len(x), 10) and torch.allclose(out["probs"].sum(-1), torch.ones(len(x)))


def test_mean_field_elbo_is_trace_elbo_in_expectation_on_the_users_model():
    """MeanFieldELBO (closed-form KL for the Normal weights and the LogNormal noise's log-space Normal) equals the
    mean of Trace_ELBO (log q - log p of the draws) within Monte-Carlo error."""
    x, y = sinusoid(32)
    model = BNN(hidden=8)
    guide = NormalGuide(model, init_rho=-1.5)
    guide(x, y)
    draws = 500
    with torch.no_grad():
        ours = torch.tensor([MeanFieldELBO().loss(model, guide, x, y) for _ in range(draws)])
        pyros = torch.tensor([Trace_ELBO().loss(model, guide, x, y) for _ in range(draws)])
    error = math.sqrt(ours.var() / draws + pyros.var() / draws)
    assert abs(ours.mean() - pyros.mean()) < 4 * error, (ours.mean(), pyros.mean(), error)


@pytest.mark.recorded
@pytest.mark.slow
def test_normal_guide_fits_as_well_as_autonormal_over_seeds():
    """The same steps from three seeds (pyrobnn's fit, local reparameterization, both guides): NormalGuide's test
    RMSE is within the seeds' noise of AutoNormal's."""
    x, y = sinusoid(64, seed=0)
    x_test, y_test = sinusoid(200, seed=1)
    rmse = {"NormalGuide": [], "AutoNormal": []}
    for seed in range(3):
        for kind in rmse:
            pyro.clear_param_store()
            pyro.set_rng_seed(seed)
            model = BNN(hidden=16)
            guide = GUIDES[kind](model)
            fit(model, guide, x, y, epochs=250, batch_size=64, elbo=MeanFieldELBO(estimator="local"),
                optimizer=Optim(lr=0.02),
                seed=seed, progress=False)
            rmse[kind].append(evaluate(model, guide, x_test, y_test, num_samples=50)["rmse"])
    ours, theirs = torch.tensor(rmse["NormalGuide"]), torch.tensor(rmse["AutoNormal"])
    noise = math.sqrt(ours.var() / 3 + theirs.var() / 3) + 0.02  # seeds' standard error, and 0.02 of slack
    assert abs(ours.mean() - theirs.mean()) < 3 * noise, rmse
    assert ours.mean() < 0.4 * float(y.std()), rmse


def _gradient_draws(model, guide, x, y, handler, loss, draws=100):
    """The loss and the gradient of the first layer's weight means over independent draws."""
    locs = [p for name, p in guide.named_parameters() if "layer1.weight" in name and "loc" in name]
    assert len(locs) == 1
    losses, grads = [], []
    for _ in range(draws):
        with handler():
            value = loss.differentiable_loss(model, guide, x, y)
        (grad,) = torch.autograd.grad(value, locs)
        losses.append(value.detach())
        grads.append(grad.flatten())
    return torch.stack(losses), torch.stack(grads)


@pytest.mark.recorded
@pytest.mark.parametrize("kind", ["NormalGuide", "AutoNormal"])
def test_local_reparameterization_and_flipout_lower_the_gradient_variance(kind):
    """The reason these estimators exist: on the user's model, at one posterior, the gradient's variance over draws is
    below weight sampling's, under pyrobnn's guide and under Pyro's AutoNormal; the loss's expectation is the same."""
    x, y = sinusoid(64)
    model = BNN(hidden=16)
    guide = NormalGuide(model, init_rho=-2.0) if kind == "NormalGuide" else AutoNormal(model, init_scale=0.1)
    guide(x, y)
    loss = MeanFieldELBO() if kind == "NormalGuide" else Trace_ELBO()
    results = {name: _gradient_draws(model, guide, x, y, handler, loss)
               for name, handler in (("sample", weight_sampling), ("local", local_reparameterization),
                                     ("flipout", flipout))}
    base_losses, base_grads = results["sample"]
    for name in ("local", "flipout"):
        losses, grads = results[name]
        assert grads.var(0).sum() < 0.7 * base_grads.var(0).sum(), (name, grads.var(0).sum(), base_grads.var(0).sum())
        error = math.sqrt(losses.var() / len(losses) + base_losses.var() / len(base_losses))
        assert abs(losses.mean() - base_losses.mean()) < 4 * error, (name, losses.mean(), base_losses.mean())


@pytest.mark.parametrize("handler", [local_reparameterization, flipout, weight_sampling, vdp])
def test_a_handler_with_no_site_to_act_on_warns_once(handler):
    """Around a model whose latent sites have no posterior the handler draws differently (point masses here), each
    handler says so once, naming itself, however many sites it saw; around the Normal guide it is silent (VDP++
    included: the weights' moments reach the model's own Normal observation)."""
    x, y = sinusoid(16)
    model = BNN(hidden=4)
    guide = PointGuide(model)
    guide(x, y)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with handler():
            MeanFieldELBO().loss(model, guide, x, y)
    messages = [str(w.message) for w in caught if "found no site it can act on" in str(w.message)]
    assert len(messages) == 1 and messages[0].startswith(handler.__name__), messages
    normal = NormalGuide(model, name="normal")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with handler():
            MeanFieldELBO().loss(model, normal, x, y)
    assert not [w for w in caught if "found no site" in str(w.message)]


@pytest.mark.recorded
def test_vdp_propagates_moments_through_the_users_model():
    """VDP++ on the user's model: the weights' moments reach the model's own Normal(mu, sigma), scored as
    N(m, v + sigma^2); it trains, and its one-pass prediction agrees with the sampled predictive."""
    x, y = sinusoid(64)
    model = BNN(hidden=16)
    guide = NormalGuide(model, init_rho=-4.0)
    fit(model, guide, x, y, epochs=300, batch_size=64, elbo=MeanFieldELBO(estimator="vdp"), optimizer=Optim(lr=0.02),
        progress=False)
    moments, sampled = (evaluate(model, guide, x, y, moments=True), evaluate(model, guide, x, y, num_samples=100))
    assert moments["rmse"] < 0.5 * float(y.std()), moments
    assert abs(moments["rmse"] - sampled["rmse"]) < 0.05, (moments, sampled)
    xd, yd = digits(100)
    classifier = ConvClassifier()
    normal = NormalGuide(classifier, name="classifier")
    with vdp():
        loss = MeanFieldELBO().loss(classifier, normal, xd, yd)
    assert math.isfinite(loss)
    out = predict_moments(classifier, normal, xd)
    assert out["probs"].shape == (100, 10) and (out["probs_var"] >= 0).all()


def test_s_particles_of_the_users_model_run_in_one_pass():
    """weight_sampling(num_particles=S) on the user's model (its rows repeated for every particle, TracedModel):
    with a nearly deterministic posterior the S-particle NLL is the one-particle NLL, and the network runs once."""
    x, y = sinusoid(16)
    model = BNN(hidden=4)
    guide = NormalGuide(model, init_rho=-30.0)
    guide(x, y)
    guide.param("sigma", "rhos").data.fill_(-30.0)
    traced = network_model(model)
    traced.num_data = 16
    one = MeanFieldELBO().terms(traced, guide, x, y)
    calls = []
    model.layer1.register_forward_hook(lambda module, args, out: calls.append(out.shape[0]))
    with weight_sampling(num_particles=5, batch_size=16):
        five = MeanFieldELBO().terms(traced, guide, x, y)
    assert calls == [5 * 16]
    assert torch.allclose(one.nll, five.nll, rtol=1e-3)


def test_the_users_potential_is_pyros_potential_fn():
    """FlatPotential on the user's model, the noise scale in log space with its Jacobian, equals the potential of
    Pyro's initialize_model at the same unconstrained values, with the same gradient; the batched potential of C
    chains is the flat potential of each."""
    x, y = sinusoid(20)
    model = BNN(hidden=4)
    flat = FlatPotential(model, x, y)
    _, potential_fn, transforms, _ = initialize_model(model, model_args=(x, y))
    theta = flat.initial() + 0.3 * torch.randn(flat.size)
    parts = dict(zip(flat.names, theta.split([math.prod(s) for s in flat.unconstrained_shapes])))
    params = {name: part.reshape(shape).clone().requires_grad_()
              for (name, part), shape in zip(parts.items(), flat.unconstrained_shapes)}
    expected = potential_fn(params)
    expected_grad = torch.cat([g.reshape(-1) for g in torch.autograd.grad(expected, list(params.values()))])
    theta = theta.clone().requires_grad_()
    ours = flat({"weights": theta})
    (grad,) = torch.autograd.grad(ours, theta)
    assert torch.allclose(ours, expected, rtol=1e-5) and torch.allclose(grad, expected_grad, rtol=1e-4, atol=1e-5)
    batched = BatchedPotential(flat)
    thetas = torch.stack([theta.detach(), theta.detach() + 0.1])
    energies, grads = batched(thetas)
    assert torch.allclose(energies[0], expected.detach(), rtol=1e-5)
    assert torch.allclose(grads[0], expected_grad, rtol=1e-4, atol=1e-5)


def _predictive_moments(model, posterior, grid, samples):
    out = predict(model, posterior, grid, num_samples=samples)
    return out["mean"].reshape(-1), out["epistemic_std"].reshape(-1) ** 2


@pytest.mark.slow
def test_nuts_on_the_users_model_matches_the_bayesian_network_and_pyros_nuts():
    """The batched NUTS samples the user's model; its posterior predictive on a grid (mean and variance) equals that
    of the same architecture and priors built as a BayesianNetwork and that of Pyro's NUTS (sampler="pyro"), within
    Monte-Carlo error; predict and evaluate take the draws, and a thinned subset holds draws of every chain."""
    x, y = sinusoid(12, seed=3)
    grid = torch.linspace(-2.5, 2.5, 9)[:, None]
    runs = {}
    settings = dict(num_samples=100, warmup=100, seed=0, map_steps=100)
    pyro.set_rng_seed(0)
    user = FixedNoiseBNN(hidden=2, sigma=1.0)
    runs["user"] = (user, sample_posterior(user, x, y, **nuts(num_chains=4, compile="trace", **settings)))
    runs["pyro"] = (user, sample_posterior(user, x, y, **nuts(num_chains=2, sampler="pyro", compile="trace",
                                                              **settings)))
    net = nn.Sequential(nn.Linear(1, 2), nn.Tanh(), nn.Linear(2, 1))
    reference = BayesianNetwork(net, Gaussian(1.0), prior=GaussianPrior(0.0, 1.0), num_data=12)
    runs["network"] = (reference, sample_posterior(reference, x, y[:, None], **nuts(num_chains=4, compile="trace",
                                                   **settings)))
    assert runs["user"][1].diagnostics["sampler"] == "batched" and runs["pyro"][1].diagnostics["sampler"] == "pyro"
    moments = {}
    for name, (model, result) in runs.items():
        draws = result.guide()
        mean, var = _predictive_moments(model, draws, grid, len(draws))
        ess = min(result.diagnostics["prediction_ess_min"], float(len(draws)))
        moments[name] = (mean, var, ess)
    for name in ("network", "pyro"):
        (m1, v1, e1), (m2, v2, e2) = moments["user"], moments[name]
        z_mean = (m1 - m2) / (v1 / e1 + v2 / e2 + 1e-6).sqrt()
        z_var = (v1 - v2) / (2 * v1**2 / e1 + 2 * v2**2 / e2 + 1e-6).sqrt()
        assert z_mean.abs().max() < 5 and z_var.abs().max() < 5, (name, z_mean, z_var)
    model, result = runs["user"]
    metrics = evaluate(model, result.guide(), x, y, num_samples=100)
    assert metrics["rmse"] < float(y.std())


def test_a_thinned_subset_of_draws_holds_every_chain():
    """8 chains x 1,000 draws (chain-major): 100 predictive samples are evenly spaced over all of them, so every
    chain contributes (the first 100 would be chain 0's), deterministically."""
    chains, per_chain = 8, 1000
    chain_of_draw = torch.arange(chains).repeat_interleave(per_chain).float()
    model = BayesianNetwork(nn.Linear(1, 1, bias=False), Gaussian(1.0), num_data=4)
    draws = PosteriorDraws({"net.weight": chain_of_draw[:, None, None]})
    outputs = predict(model, draws, torch.ones(1, 1), num_samples=100)
    thinned = draws.thinned(100)
    used = thinned.draws()["net.weight"].flatten()
    assert set(used.long().tolist()) == set(range(chains))
    assert torch.equal(used, draws.thinned(100).draws()["net.weight"].flatten())
    assert torch.allclose(outputs["mean"], chain_of_draw.mean().reshape(1, 1), atol=0.1)


def test_bayesian_network_keeps_the_users_priors():
    """A network whose first layer carries the user's PyroSample priors: BayesianNetwork keeps them (the trace's
    prior scales are the user's) and fills only the plain parameters with its prior."""
    first = PyroModule[nn.Linear](2, 3)
    first.weight = PyroSample(dist.Normal(0., 0.25).expand([3, 2]).to_event(2))
    first.bias = PyroSample(dist.Normal(0., 0.5).expand([3]).to_event(1))
    net = PyroModule[nn.Sequential](first, nn.ReLU(), nn.Linear(3, 2))
    model = BayesianNetwork(net, prior=GaussianPrior(0.0, 2.0), num_data=8)
    trace = poutine.trace(model).get_trace(torch.randn(4, 2), torch.randint(0, 2, (4,)))
    scales = {name: float(torch.as_tensor(getattr(site["fn"], "base_dist", site["fn"]).scale).reshape(-1)[0])
              for name, site in trace.nodes.items() if site["type"] == "sample" and not site["is_observed"]
              and not poutine.util.site_is_subsample(site)}
    assert scales == {"net.0.weight": 0.25, "net.0.bias": 0.5, "net.2.weight": 2.0, "net.2.bias": 2.0}
    assert [site.name for site in model.sites()] == list(scales)
    guide = NormalGuide(model)
    assert guide.family_names == list(scales)


def test_bad_models_are_refused_in_one_line_naming_the_site():
    """No latent site, a discrete latent (under a guide and under NUTS), a local latent inside the data plate, an
    observation that cannot be found: each a ValueError naming the site and the fix; no parameter is made."""
    x, y = sinusoid(8)

    def no_latent(x, y=None):
        with pyro.plate("data", len(x)):
            pyro.sample("obs", dist.Normal(x[:, 0], 1.0), obs=y)

    def discrete(x, y=None):
        k = pyro.sample("k", dist.Bernoulli(0.5))
        with pyro.plate("data", len(x)):
            pyro.sample("obs", dist.Normal(k * x[:, 0], 1.0), obs=y)

    def local(x, y=None):
        with pyro.plate("data", len(x)):
            z = pyro.sample("z", dist.Normal(0.0, 1.0))
            pyro.sample("obs", dist.Normal(z, 1.0), obs=y)

    def two_observations(x, y=None):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        with pyro.plate("data", len(x)):
            pyro.sample("obs", dist.Normal(w * x[:, 0], 1.0), obs=y)
            pyro.sample("also", dist.Normal(w * x[:, 0], 1.0), obs=y)

    cases = [(no_latent, "has no latent site"), (discrete, r"site 'k' is discrete \(Bernoulli\).*enumerate"),
             (local, r"site 'z' is sampled inside plate 'data'.*AutoNormal"),
             (two_observations, r"observed site .* cannot be found: 2 sites.*observed='<site>'")]
    for model, match in cases:
        pyro.clear_param_store()
        with pytest.raises(ValueError, match=match) as error:
            NormalGuide(model)(x, y)
        assert "\n" not in str(error.value)
        assert not list(pyro.get_param_store().keys())
    with pytest.raises(ValueError, match=r"site 'k' .*is discrete: NUTS samples continuous latents"):
        sample_posterior(discrete, x, y, **nuts(num_samples=4, warmup=4))
    assert TracedModel(two_observations, observed="also").trace(x, y).observed_site == "also"


def test_a_model_that_observes_its_own_data_is_refused_by_bayesian_network_in_one_line():
    """BayesianNetwork around the user's whole Pyro model (it samples sigma and observes obs under its own data
    plate): a one-line TypeError naming those sites and the way that works, both under plain Pyro SVI (inside
    poutine.trace, where Pyro would otherwise fail on a second 'data' plate) and under fit, with nothing trained.
    The same model used as it is trains (the supported way the message names)."""
    x, y = sinusoid(16)
    for run in (lambda model: SVI(model, NormalGuide(model), pyro.optim.Adam({"lr": 0.01}), Trace_ELBO()).step(x, y),
                lambda model: fit(model, NormalGuide(model), x, y, epochs=1, batch_size=8, progress=False)):
        pyro.clear_param_store()
        model = BayesianNetwork(BNN(hidden=4), Gaussian(), num_data=len(x))
        with pytest.raises(TypeError, match=r"PyroBNN's forward samples its own sites \['sigma', 'obs'\].*"
                                            r"without BayesianNetwork .*TracedModel") as error:
            run(model)
        assert "\n" not in str(error.value)
    pyro.clear_param_store()
    model = BNN(hidden=4)
    history = fit(model, NormalGuide(model), x, y, epochs=2, batch_size=8, progress=False)
    assert len(history.epochs) == 2 and math.isfinite(history.epochs[-1]["loss"])
    assert [site.name for site in network_model(model).sites()] == [
        "layer1.weight", "layer1.bias", "layer2.weight", "layer2.bias", "sigma"]


def test_a_network_with_only_pyrosample_parameters_and_deterministic_sites_passes_the_check():
    """The check looks for the network's own sample statements only: PyroSample priors the user put on a layer and
    a pyro.deterministic record pass, and the model's trace is the priors' sites and its one observation."""
    first = PyroModule[nn.Linear](2, 3)
    first.weight = PyroSample(dist.Normal(0., 0.5).expand([3, 2]).to_event(2))

    class Recorded(PyroModule):
        def __init__(self):
            super().__init__()
            self.first, self.last = first, nn.Linear(3, 1)

        def forward(self, x):
            hidden = pyro.deterministic("hidden", torch.tanh(self.first(x)))
            return self.last(hidden).squeeze(-1)

    model = BayesianNetwork(Recorded(), Gaussian(0.5), num_data=4)
    trace = poutine.trace(model).get_trace(torch.randn(4, 2), torch.randn(4))
    sampled = [name for name, site in trace.nodes.items() if site["type"] == "sample"
               and not poutine.util.site_is_subsample(site)]
    assert sampled == ["net.first.weight", "net.first.bias", "hidden", "net.last.weight", "net.last.bias", "obs"]
