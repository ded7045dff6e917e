"""Weight sampling, local reparameterization and flipout handlers: moments vs weight sampling, vectorized
particles, gradients, refusals."""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pyrobnn import BayesianNetwork, GaussianPrior, MeanFieldELBO, NormalGuide, ScaleMixturePrior
from pyrobnn.handlers import ESTIMATORS, flipout, local_reparameterization, weight_sampling
from pyrobnn.handlers.flipout_messenger import rademacher
from pyrobnn.handlers.gaussian_weight import GaussianWeight
from pyrobnn.infer.optim import Optim, make_optimizer
from pyrobnn.infer.svi import svi_step

S = 20000  # Monte-Carlo draws per check


def _gaussian(shape, seed):
    g = torch.Generator().manual_seed(seed)
    loc = torch.randn(shape, generator=g, dtype=torch.float64)
    scale = 0.2 + torch.rand(shape, generator=g, dtype=torch.float64)
    return loc, scale


def _check_moments(samples, mean, var, what):
    """Sample mean within 5 standard errors; sample variance within 5 of its standard errors."""
    n = samples.shape[0]
    mean_err = (samples.mean(0) - mean).abs() / (var / n).sqrt()
    var_err = (samples.var(0) - var).abs() / (var * math.sqrt(2.0 / (n - 1)))
    assert mean_err.max() < 5, f"{what}: mean off by {mean_err.max():.1f} standard errors"
    assert var_err.max() < 5, f"{what}: variance off by {var_err.max():.1f} standard errors"


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["local", "flipout"])
def test_linear_preactivations_have_the_moments_of_weight_sampling(mode):
    torch.manual_seed(0)
    x = torch.randn(3, 5, dtype=torch.float64)
    (w_loc, w_scale), (b_loc, b_scale) = _gaussian((4, 5), 1), _gaussian((4,), 2)
    mean = F.linear(x, w_loc, b_loc)
    var = F.linear(x**2, w_scale**2, b_scale**2)
    # the handler's way: one batch per draw
    out = torch.stack([F.linear(x, GaussianWeight(w_loc, w_scale, ESTIMATORS[mode]()),
                                GaussianWeight(b_loc, b_scale, ESTIMATORS[mode]()))
                       for _ in range(S)])
    _check_moments(out, mean, var, mode)
    # the reference: sampled weights, same closed-form moments
    w = w_loc + w_scale * torch.randn(S, 4, 5, dtype=torch.float64)
    b = b_loc + b_scale * torch.randn(S, 4, dtype=torch.float64)
    _check_moments(torch.einsum("ni,soi->sno", x, w) + b[:, None], mean, var, "weight sampling")


@pytest.mark.parametrize("mode", ["local", "flipout"])
def test_conv2d_preactivations_have_the_moments_of_weight_sampling(mode):
    torch.manual_seed(0)
    x = torch.randn(2, 2, 5, 5, dtype=torch.float64)
    (w_loc, w_scale), (b_loc, b_scale) = _gaussian((3, 2, 3, 3), 3), _gaussian((3,), 4)
    mean = F.conv2d(x, w_loc, b_loc, padding=1)
    var = F.conv2d(x**2, w_scale**2, b_scale**2, padding=1)
    out = torch.stack([F.conv2d(x, GaussianWeight(w_loc, w_scale, ESTIMATORS[mode]()),
                                GaussianWeight(b_loc, b_scale, ESTIMATORS[mode]()),
                                padding=1) for _ in range(S // 4)])
    _check_moments(out, mean, var, mode)


def test_flipout_signs_are_independent_fair_coin_flips():
    """rademacher(like): ±1 of like's shape and dtype; over 400 draws of 6,405 signs (not a multiple of the 16 bits
    of a random word) each sign is +1 half the time, at every position (each bit of a word) within 5 standard
    errors, and neighbours (within a word, lag 1) and equal bits of consecutive words (lag 16) are uncorrelated."""
    torch.manual_seed(0)
    like = torch.empty(61, 3, 7, 5, dtype=torch.float64)
    draws = torch.stack([rademacher(like) for _ in range(400)])
    assert draws.dtype == torch.float64 and draws.shape[1:] == like.shape
    assert set(draws.unique().tolist()) == {-1.0, 1.0}
    flat = draws.view(400, -1)
    frequency = (flat > 0).double().mean(0)  # per position, over the draws
    assert (frequency - 0.5).abs().max() < 5 * 0.5 / math.sqrt(400)
    assert abs(frequency.mean() - 0.5) < 4 * 0.5 / math.sqrt(flat.numel())
    for lag in (1, 16):
        correlation = (flat[:, lag:] * flat[:, :-lag]).mean()
        assert abs(correlation) < 4 / math.sqrt(flat[:, lag:].numel())
    torch.manual_seed(0)
    assert torch.equal(rademacher(like), draws[0])  # the seed decides them


def test_flipout_examples_are_decorrelated_but_local_draws_are_independent():
    torch.manual_seed(0)
    x = torch.ones(2, 6, dtype=torch.float64)  # two identical examples
    w_loc, w_scale = torch.zeros(1, 6, dtype=torch.float64), torch.ones(1, 6, dtype=torch.float64)
    for mode in ("local", "flipout"):
        out = torch.stack([F.linear(x, GaussianWeight(w_loc, w_scale, ESTIMATORS[mode]()))
                           for _ in range(5000)])[..., 0]
        corr = torch.corrcoef(out.T)[0, 1]
        assert abs(corr) < 0.1, f"{mode}: identical examples correlated ({corr:.2f})"
    # plain weight sampling: one weight for the batch, identical examples are perfectly correlated
    shared = torch.stack([F.linear(x, GaussianWeight(w_loc, w_scale, None).sample()) for _ in range(500)])[..., 0]
    assert torch.corrcoef(shared.T)[0, 1] > 0.99


@pytest.mark.parametrize("handler", [local_reparameterization, flipout])
def test_gradients_reach_mu_and_rho(handler):
    pyro.set_rng_seed(0)
    model = BayesianNetwork(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)), num_data=100)
    guide = NormalGuide(model)
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    with handler():
        MeanFieldELBO().terms(model, guide, x, y).loss.backward()
    for name in guide.site_names:
        for role in ("locs", "rhos"):
            grad = guide.param(name, role).grad
            assert grad is not None and grad.abs().sum() > 0, f"no gradient for {name} {role}"


@pytest.mark.parametrize("handler", [local_reparameterization, flipout, weight_sampling])
def test_non_normal_latent_sites_are_sampled_as_usual_and_once_per_particle(handler):
    """A non-Normal latent (e.g. a Laplace weight, a Gamma noise scale) is sampled as usual; under S vectorized
    particles a reparameterized one is drawn S times (one value per particle, ParticleValues, scored on those
    draws); one that cannot be reparameterized (a discrete latent) is refused by name (svi_step then loops)."""
    from pyrobnn.handlers.lazy_value import ScoredByDraws
    from pyrobnn.handlers.particles import ParticlesUnsupported, ParticleValues

    def guide():
        return pyro.sample("w", dist.Laplace(torch.zeros(3), 1.0).to_event(1))

    with pytest.warns(UserWarning, match="found no site it can act on"), handler():
        value = guide()
    assert type(value) is torch.Tensor and value.shape == (3,) and value.abs().sum() > 0
    with handler(num_particles=2, batch_size=4):
        trace = pyro.poutine.trace(guide).get_trace()
    value = trace.nodes["w"]["value"]
    assert isinstance(value, ParticleValues) and value.values.shape == (2, 3) and value.shape == (3,)
    assert not torch.equal(value.values[0], value.values[1])
    fn = trace.nodes["w"]["fn"]
    assert isinstance(fn, ScoredByDraws)
    expected = dist.Laplace(torch.zeros(3), 1.0).to_event(1).log_prob(value.values).mean()
    assert torch.allclose(fn.log_prob(value), expected)

    def discrete():
        return pyro.sample("k", dist.Bernoulli(0.5))

    with handler(num_particles=2, batch_size=4), pytest.raises(ParticlesUnsupported, match=r"site 'k'.*Bernoulli"):
        discrete()


def test_layers_without_a_rule_keep_weight_sampling():
    """A Bayesian LayerNorm weight gets one ordinary sample; the Linear layer is local-reparameterised."""
    pyro.set_rng_seed(0)
    net = nn.Sequential(nn.Linear(4, 6), nn.LayerNorm(6), nn.Linear(6, 2))
    model = BayesianNetwork(net, exclude=(), num_data=50)
    guide = NormalGuide(model, init_rho=-2.0)
    assert "net.1.weight" in guide.site_names
    with local_reparameterization():
        terms = MeanFieldELBO().terms(model, guide, torch.randn(8, 4), torch.randint(0, 2, (8,)))
    assert torch.isfinite(terms.loss)


@pytest.mark.parametrize("handler", [local_reparameterization, flipout])
@pytest.mark.parametrize("prior", [GaussianPrior(), ScaleMixturePrior()])
def test_training_under_the_handler_learns(handler, prior):
    """Two-moons-like data: the ELBO falls and the classifier separates the classes."""
    pyro.set_rng_seed(0)
    x = torch.randn(200, 2)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
    model = BayesianNetwork(nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 2)), prior=prior,
                            num_data=len(x))
    guide = NormalGuide(model, init_loc="prior" if isinstance(prior, GaussianPrior) else "module")
    optim = make_optimizer(guide.parameters(), lr=0.05)
    losses = []
    with handler():
        for step in range(150):
            losses.append(svi_step(model, guide, optim, x, y).loss.item())
    assert sum(losses[-10:]) < sum(losses[:10])
    from pyrobnn.infer.predict import predict

    accuracy = (predict(model, guide, x, num_samples=20)["probs"].argmax(-1) == y).float().mean()
    assert accuracy > 0.9


def _small_model(seed=0):
    pyro.set_rng_seed(seed)
    net = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 4))
    model = BayesianNetwork(net, num_data=100)
    guide = NormalGuide(model, init_rho=-1.0)
    return model, guide


def test_vectorized_and_looped_predictions_agree_in_distribution():
    """Per example, S vectorized draws and S looped weight draws have the same output moments."""
    from pyrobnn.infer.predict import predictive_outputs

    model, guide = _small_model()
    x = torch.randn(6, 3)
    n = 4000
    fast = predictive_outputs(model, guide, x, num_samples=n, vectorized=True, max_memory=2_000_000)
    slow = predictive_outputs(model, guide, x, num_samples=n, vectorized=False)
    assert fast.shape == slow.shape == (n, 6, 4)
    var = slow.var(0) + fast.var(0)  # variance of the difference of the two means, times n
    z = (fast.mean(0) - slow.mean(0)).abs() / (var / n).sqrt()
    assert z.max() < 5, f"means differ by {z.max():.1f} standard errors"
    # the ratio of two sample variances has relative standard error about sqrt(4 / n) for Gaussian
    # outputs; ReLU outputs are heavier-tailed, so allow 10 of those standard errors
    ratio = fast.var(0) / slow.var(0)
    assert ((ratio - 1).abs() < 10 * math.sqrt(4.0 / n)).all(), f"variance ratios {ratio}"


@pytest.mark.slow
@pytest.mark.parametrize("network", ["lenet5", "vit"])
def test_vectorized_prediction_of_convolutional_and_token_networks_is_weight_sampling(network):
    """Convolutions (and linear maps of tokens) share weights across positions: the vectorized
    predictive draws S weight samples for them, so its outputs have the moments of the loop's; a
    network using a Bayesian parameter outside a layer (the ViT's positional embedding) falls back to
    the loop, and refuses vectorized=True clearly."""
    from pyrobnn.handlers.particles import ParticlesUnsupported
    from pyrobnn.infer.predict import predictive_outputs
    from pyrobnn.networks import LeNet5, ViT

    net = LeNet5() if network == "lenet5" else ViT(dim=16, depth=1, heads=2, mlp_dim=32)
    model = BayesianNetwork(net, prior=GaussianPrior(), num_data=100)
    guide = NormalGuide(model, init_rho=-3.0)
    x = torch.rand(3, 1, 28, 28)
    n = 1000
    fast = predictive_outputs(model, guide, x, num_samples=n)
    slow = predictive_outputs(model, guide, x, num_samples=n, vectorized=False)
    z = (fast.mean(0) - slow.mean(0)).abs() / ((slow.var(0) + fast.var(0)) / n).sqrt()
    assert z.max() < 5, f"means differ by {z.max():.1f} standard errors"
    ratio = fast.var(0) / slow.var(0)
    assert ((ratio - 1).abs() < 8 * math.sqrt(4.0 / n)).all(), f"variance ratios {ratio}"
    if network == "vit":
        with pytest.raises(ParticlesUnsupported, match="uses a Bayesian parameter directly"):
            predictive_outputs(model, guide, x, num_samples=4, vectorized=True)


def test_vectorized_particles_average_the_elbo_over_particles():
    """With tiny posterior noise, S vectorized particles give the same NLL as one particle."""
    model, guide = _small_model()
    for name in guide.site_names:
        guide.param(name, "rhos").data.fill_(-30.0)
    x, y = torch.randn(8, 3), torch.randint(0, 4, (8,))
    one = MeanFieldELBO().terms(model, guide, x, y)
    with local_reparameterization(num_particles=5, batch_size=8):
        five = MeanFieldELBO().terms(model, guide, x, y)
    assert torch.allclose(one.nll, five.nll, rtol=1e-4)
    assert torch.allclose(one.kl, five.kl)


@pytest.mark.parametrize("handler", [weight_sampling, local_reparameterization, flipout])
def test_vectorized_particles_need_the_batch_size(handler):
    with pytest.raises(ValueError, match="batch_size"):
        handler(num_particles=3)
    with pytest.raises(ValueError, match="num_particles"):
        handler(num_particles=0, batch_size=3)
    model, guide = _small_model()
    with handler(num_particles=3, batch_size=5), pytest.raises(ValueError, match=r"received 8 rows.*batch_size=5"):
        MeanFieldELBO().terms(model, guide, torch.randn(8, 3), torch.randint(0, 4, (8,)))


def _particle_terms(model, guide, x, y, particles):
    """The S-particle ELBO terms computed in one pass, and each particle's weight samples."""
    traced_guide = pyro.poutine.trace(guide)
    with weight_sampling(num_particles=particles, batch_size=len(x)):
        terms = MeanFieldELBO().terms(model, traced_guide, x, y)
    draws = {name: site["value"].particle_samples(particles) for name, site in traced_guide.trace.nodes.items()
             if site["type"] == "sample" and isinstance(site["value"], GaussianWeight)}
    return terms, draws


@pytest.mark.parametrize("prior", [GaussianPrior(), ScaleMixturePrior()])
@pytest.mark.parametrize("network", ["mlp", "conv"])
def test_vectorized_weight_sampling_is_the_mean_of_per_particle_elbos(prior, network):
    """Exact check: the one-pass S-particle ELBO equals the average over s of the ELBO computed with
    particle s's weights substituted into the network (the NLL through the net; the KL analytic, or
    log q - log p at the same draws for the scale mixture)."""
    pyro.set_rng_seed(0)
    if network == "mlp":  # a deterministic bias checks the shared-bias path of the batched product
        net, x = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 4)), torch.randn(6, 3)
        model = BayesianNetwork(net, prior=prior, num_data=60, include="*.weight")
    else:
        net = nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.Flatten(), nn.Linear(2 * 4 * 4, 4))
        model, x = BayesianNetwork(net, prior=prior, num_data=60), torch.randn(6, 1, 6, 6)
    guide = NormalGuide(model, init_rho=-1.0)
    y = torch.randint(0, 4, (6,))
    particles = 3
    terms, draws = _particle_terms(model, guide, x, y, particles)
    assert set(draws) == set(guide.site_names)
    nll = kl = 0.0
    for s in range(particles):
        weights = {name: w[s] for name, w in draws.items()}
        logits = pyro.poutine.condition(model.net, data=weights)(x)
        nll = nll + F.cross_entropy(logits, y, reduction="sum") * 60 / 6
        for site in model.sites():
            q = guide.posterior(site.name)
            p = site.prior(site.init)
            try:
                kl = kl + torch.distributions.kl_divergence(q, p)
            except NotImplementedError:
                kl = kl + q.log_prob(weights[site.name]) - p.log_prob(weights[site.name])
    assert torch.allclose(terms.nll, nll.detach() / particles, rtol=1e-5)
    assert torch.allclose(terms.kl, kl.detach() / particles, rtol=1e-5)
    terms.loss.backward()
    assert all(guide.param(n, "rhos").grad.abs().sum() > 0 for n in guide.site_names)


def test_vectorized_particles_are_independent_weight_draws():
    """Under weight_sampling the examples of one particle share a weight (perfectly correlated when
    identical); different particles are independent draws with the moments of q."""
    torch.manual_seed(0)
    x = torch.ones(2, 6, dtype=torch.float64)  # two identical examples
    w_loc, w_scale = torch.zeros(1, 6, dtype=torch.float64), torch.ones(1, 6, dtype=torch.float64)
    out = F.linear(x, GaussianWeight(w_loc, w_scale, ESTIMATORS["sample"](4000, 2)))[..., 0].view(4000, 2)
    assert torch.corrcoef(out.T)[0, 1] > 0.999
    _check_moments(out[:, :1], torch.zeros(1), torch.full((1,), 6.0, dtype=torch.float64), "particles")
    lagged = torch.corrcoef(torch.stack([out[:-1, 0], out[1:, 0]]))[0, 1]
    assert abs(lagged) < 0.1, f"consecutive particles correlated ({lagged:.2f})"


@pytest.mark.parametrize("network", ["mlp", "conv"])
def test_vectorized_flipout_particles_have_the_moments_of_weight_sampling(network):
    """Flipout with S particles in one pass: per example and unit, the S outputs have the mean and
    variance of weight sampling, through two Bayesian layers (conv layers use S weight samples)."""
    torch.manual_seed(0)
    if network == "mlp":
        x = torch.randn(2, 3, dtype=torch.float64)
        shapes, op = [((4, 3), (4,)), ((2, 4), (2,))], F.linear
    else:
        x = torch.randn(2, 1, 4, 4, dtype=torch.float64)
        shapes, op = [((2, 1, 3, 3), (2,)), ((2, 2, 2, 2), (2,))], F.conv2d
    params = [(_gaussian(w, 10 + i), _gaussian(b, 20 + i)) for i, (w, b) in enumerate(shapes)]

    def forward(mode, particles):
        h = x
        estimator = ESTIMATORS[mode](*(particles[::-1] if particles else ()))
        for i, ((wl, ws), (bl, bs)) in enumerate(params):
            h = op(h, GaussianWeight(wl, ws, estimator), GaussianWeight(bl, bs, estimator))
            h = torch.relu(h) if i == 0 else h
        return h

    n = 6000
    fast = forward("flipout", (2, n)).view((n, 2) + forward("sample", None).shape[1:])
    slow = torch.stack([forward("sample", None) for _ in range(n)])
    z = (fast.mean(0) - slow.mean(0)).abs() / ((fast.var(0) + slow.var(0)) / n).sqrt()
    assert z.max() < 5, f"means differ by {z.max():.1f} standard errors"
    ratio = fast.var(0) / slow.var(0)
    assert ((ratio - 1).abs() < 10 * math.sqrt(4.0 / n)).all(), f"variance ratios {ratio}"


def test_svi_step_loops_particles_when_a_network_cannot_vectorize():
    """A ViT uses its Bayesian positional embedding outside a layer: num_particles > 1 falls back to
    the loop instead of failing."""
    from pyrobnn.networks import ViT

    pyro.set_rng_seed(0)
    model = BayesianNetwork(ViT(dim=16, depth=1, heads=2, mlp_dim=32), num_data=100)
    guide = NormalGuide(model)
    optim = make_optimizer(guide.parameters())
    for estimator in ("sample", "local", "flipout"):
        terms = svi_step(model, guide, optim, torch.rand(4, 1, 28, 28), torch.randint(0, 10, (4,)),
                         elbo=MeanFieldELBO(3, vectorize_particles=True, estimator=estimator))
        assert torch.isfinite(terms.loss)


@pytest.mark.recorded
@pytest.mark.parametrize("estimator", ["sample", "local", "flipout"])
def test_fit_with_each_estimator(estimator):
    from pyrobnn.infer.schedules import Constant
    from pyrobnn.infer.svi import fit

    model, guide = _small_model()
    x = torch.randn(64, 3)
    y = (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()
    history = fit(model, guide, x, y, epochs=20, batch_size=16, optimizer=Optim(lr=0.03),
                  elbo=MeanFieldELBO(3, vectorize_particles=True,
                                     estimator=estimator), beta=Constant(0.1), progress=False, device="cpu")
    assert history["nll"][-1] < 0.7 * history["nll"][0]
