"""VDP++ moment propagation: every rule against Monte Carlo (pyrobnn.handlers.moments, pyrobnn.handlers.vdp)."""

import math

import pyro
import pytest
import torch
import torch.nn.functional as F
from pyro import poutine

from pyrobnn import BayesianNetwork, NormalGuide
from pyrobnn.handlers import VDPMessenger, vdp
from pyrobnn.handlers.gaussian_weight import GaussianWeight
from pyrobnn.handlers.moments import Moments
from pyrobnn.infer.optim import Optim
from pyrobnn.networks import LeNet5

S = 40000
DT = torch.float64


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _gaussian(shape, seed, low=0.2, high=1.0):
    g = _gen(seed)
    return torch.randn(shape, generator=g, dtype=DT), low + (high - low) * torch.rand(shape, generator=g, dtype=DT)


def _draw(mean, std, n=S, seed=0):
    return mean + std * torch.randn((n,) + tuple(mean.shape), generator=_gen(seed), dtype=DT)


def _exact(samples, out: Moments, what):
    """Sample mean within 5 standard errors, sample variance within 5 of its standard errors (kurtosis-robust)."""
    n = samples.shape[0]
    centred = samples - samples.mean(0)
    var_se = ((centred**4).mean(0) - samples.var(0) ** 2).clamp_min(1e-30).sqrt() / math.sqrt(n)
    mean_z = (samples.mean(0) - out.loc).abs() / (out.variance / n).sqrt()
    var_z = (samples.var(0) - out.variance).abs() / var_se
    assert mean_z.max() < 5, f"{what}: mean off by {mean_z.max():.1f} s.e."
    assert var_z.max() < 5, f"{what}: variance off by {var_z.max():.1f} s.e."


def _first_order(samples, out: Moments, what, rtol):
    """Nonlinear rules are first-order accurate: relative errors below rtol at small input variance."""
    assert torch.allclose(out.loc, samples.mean(0), rtol=rtol, atol=1e-3), what
    rel = (out.variance - samples.var(0)).abs() / samples.var(0).clamp_min(1e-12)  # 0/0 where both vanish
    assert rel.max() < rtol, f"{what}: variance relative error {rel.max():.3f}"


def test_linear_with_deterministic_input_is_exact():
    x = torch.randn(3, 5, dtype=DT, generator=_gen(1))
    (mw, sw), (mb, sb) = _gaussian((4, 5), 2), _gaussian((4,), 3)
    out = F.linear(x, GaussianWeight(mw, sw, VDPMessenger()), GaussianWeight(mb, sb, VDPMessenger()))
    assert isinstance(out, Moments)
    w, b = _draw(mw, sw, seed=4), _draw(mb, sb, seed=5)
    _exact(torch.einsum("ni,soi->sno", x, w) + b[:, None], out, "linear")


def test_linear_with_random_input_is_exact():
    (ma, sa), (mw, sw) = _gaussian((3, 5), 6), _gaussian((4, 5), 7)
    out = F.linear(Moments(ma, sa**2), GaussianWeight(mw, sw, VDPMessenger()))
    a, w = _draw(ma, sa, seed=8), _draw(mw, sw, seed=9)
    _exact(torch.einsum("sni,soi->sno", a, w), out, "linear, random input")
    deterministic = torch.randn(4, 5, dtype=DT, generator=_gen(10))
    out = F.linear(Moments(ma, sa**2), deterministic)
    _exact(a @ deterministic.T, out, "deterministic layer, random input")


def test_conv2d_with_random_input_is_exact():
    (ma, sa), (mw, sw) = _gaussian((2, 2, 5, 5), 11), _gaussian((3, 2, 3, 3), 12)
    out = F.conv2d(Moments(ma, sa**2), GaussianWeight(mw, sw, VDPMessenger()), padding=1)
    n = 4000
    a, w = _draw(ma, sa, n, seed=13), _draw(mw, sw, n, seed=14)
    samples = torch.stack([F.conv2d(a[s], w[s], padding=1) for s in range(n)])
    _exact(samples, out, "conv2d")


def test_average_pool_and_addition_are_exact():
    (ma, sa), (mb, sb) = _gaussian((2, 3, 4, 4), 15), _gaussian((2, 3, 4, 4), 16)
    a, b = _draw(ma, sa, seed=17), _draw(mb, sb, seed=18)
    _exact(F.avg_pool2d(a.flatten(0, 1), 2).unflatten(0, (S, 2)), F.avg_pool2d(Moments(ma, sa**2), 2), "avg pool")
    _exact(a + b, Moments(ma, sa**2) + Moments(mb, sb**2), "residual addition")
    _exact(a.flatten(2), Moments(ma, sa**2).flatten(1), "flatten")


@pytest.mark.parametrize("name, f", [("relu", F.relu), ("tanh", torch.tanh), ("sigmoid", torch.sigmoid),
                                     ("gelu", F.gelu)])
def test_elementwise_activations_are_first_order_accurate(name, f):
    g = _gen(19)
    mean = torch.randn(50, dtype=DT, generator=g) * 2
    mean = torch.where(mean.abs() < 0.5, mean.sign() * 0.5 + mean, mean)  # away from the ReLU kink
    slope = torch.func.vmap(torch.func.grad(f))(mean)
    mean = mean[slope.abs() > 0.2]  # first order is accurate where f' does not vanish (GELU's minimum)
    std = torch.full_like(mean, 0.02)
    _first_order(f(_draw(mean, std, seed=20)), f(Moments(mean, std**2)), name, rtol=0.1)


def test_max_pool_co_pooling_takes_the_variance_at_the_argmax():
    mean = torch.tensor([[[[0.0, 5.0], [10.0, 2.0]]]], dtype=DT)
    std = torch.tensor([[[[0.1, 0.2], [0.3, 0.4]]]], dtype=DT)
    out = F.max_pool2d(Moments(mean, std**2), 2)
    assert out.loc.item() == 10.0 and math.isclose(out.variance.item(), 0.09)
    _exact(F.max_pool2d(_draw(mean, std, seed=21).flatten(0, 1), 2).unflatten(0, (S, 1)), out, "max pool")


def test_softmax_jacobian_rule_is_first_order_accurate():
    mean = torch.tensor([[1.0, 0.0, -1.0, 2.0]], dtype=DT)
    std = torch.full_like(mean, 0.02)
    _first_order(F.softmax(_draw(mean, std, seed=22), -1), F.softmax(Moments(mean, std**2), -1), "softmax", 0.1)


def test_batch_norm_in_eval_mode_is_exact():
    (ma, sa) = _gaussian((4, 3), 23)
    bn = torch.nn.BatchNorm1d(3).double().eval()
    bn.running_mean.normal_(generator=_gen(24))
    bn.running_var.uniform_(0.5, 2.0, generator=_gen(25))
    bn.weight.data.normal_(generator=_gen(26))
    with torch.no_grad():
        _exact(bn(_draw(ma, sa, seed=27).flatten(0, 1)).unflatten(0, (S, 4)), bn(Moments(ma, sa**2)), "batch norm")


def test_an_operation_without_a_rule_names_itself():
    with pytest.raises(TypeError, match="vdp: no moment-propagation rule for .*cumsum"):
        torch.cumsum(Moments(torch.zeros(3), torch.ones(3)), 0)


def _vdp_and_monte_carlo(model, guide, x, num_samples):
    """The network's output moments in one pass under ``vdp``, and ``num_samples`` weight-sampled outputs."""
    from pyrobnn.infer.predict import predictive_outputs

    with torch.no_grad():
        with vdp():
            out = poutine.replay(model.net, trace=poutine.trace(guide).get_trace())(x)
        return out, predictive_outputs(model, guide, x, num_samples=num_samples, vectorized=False)


@pytest.mark.slow
@pytest.mark.parametrize("share", ["weight", "row"])
def test_lenet_under_vdp_matches_weight_sampling(share):
    """The same network and guide: one deterministic pass vs Monte-Carlo weight sampling, small sigma,
    with one variance per weight or per output unit (eq. 12)."""
    pyro.set_rng_seed(0)
    model = BayesianNetwork(LeNet5(1, 10))
    guide = NormalGuide(model, init_rho=-6.0, share=share)
    out, samples = _vdp_and_monte_carlo(model, guide, torch.rand(4, 1, 28, 28), 2000)
    assert torch.allclose(out.loc, samples.mean(0), atol=5e-3)
    ratio = out.variance / samples.var(0)
    assert ratio.median().sub(1).abs() < 0.2, f"output variance ratio VDP / MC: median {ratio.median():.2f}"


def test_gradients_reach_the_posterior_through_the_moments():
    pyro.set_rng_seed(0)
    model = BayesianNetwork(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2)))
    guide = NormalGuide(model, init_rho=-2.0)
    with vdp():
        out = poutine.replay(model.net, trace=poutine.trace(guide).get_trace())(torch.randn(5, 3))
    (out.loc.sum() + out.variance.sum()).backward()
    for name in guide.site_names:
        assert guide.param(name, "rhos").grad.abs().sum() > 0


def test_vdp_objective_is_equation_11():
    from pyrobnn.model.likelihoods import MomentCategorical

    mean = torch.tensor([[0.7, 0.2, 0.1]], dtype=DT)
    var = torch.tensor([[0.01, 0.02, 0.03]], dtype=DT)
    y = torch.tensor([0])
    onehot = torch.tensor([[1.0, 0.0, 0.0]], dtype=DT)
    v = var + 1e-3
    expected = -0.5 * (v.log() + (onehot - mean) ** 2 / v).sum()
    assert torch.allclose(MomentCategorical(mean, var).log_prob(y), expected)


@pytest.mark.recorded
@pytest.mark.parametrize("objective", ["gaussian", "cross_entropy"])
def test_training_by_moment_propagation_learns(objective):
    from pyrobnn.infer.elbo import MeanFieldELBO
    from pyrobnn.infer.predict import predict_moments
    from pyrobnn.infer.schedules import Constant
    from pyrobnn.infer.svi import fit
    from pyrobnn.model.likelihoods import Categorical

    pyro.set_rng_seed(0)
    x = torch.randn(200, 2)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
    net = torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    model = BayesianNetwork(net, Categorical(vdp_objective=objective))
    guide = NormalGuide(model, init_loc="prior")
    history = fit(model, guide, x, y, epochs=40, batch_size=50, optimizer=Optim(lr=0.03),
                  elbo=MeanFieldELBO(estimator="vdp"), beta=Constant(0.1), progress=False, device="cpu")
    assert history["nll"][-1] < 0.5 * history["nll"][0]
    out = predict_moments(model, guide, x)
    assert (out["probs"].argmax(-1) == y).float().mean() > 0.9
    assert out["var"].shape == (200, 2) and (out["var"] > 0).all()


@pytest.mark.parametrize("heteroscedastic", [False, True])
def test_regression_moments_add_the_noise_to_the_mean_outputs_variance(heteroscedastic):
    from pyrobnn import Gaussian, HeteroscedasticGaussian
    from pyrobnn.infer.predict import predict_moments

    pyro.set_rng_seed(0)
    likelihood = HeteroscedasticGaussian() if heteroscedastic else Gaussian(0.3)
    net = torch.nn.Sequential(torch.nn.Linear(1, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2 if heteroscedastic else 1))
    model = BayesianNetwork(net, likelihood)
    guide = NormalGuide(model, init_rho=-2.0)
    x = torch.randn(6, 1)
    out = predict_moments(model, guide, x)
    observation = likelihood.moment_distribution(Moments(out["mean"], out["var"]))
    mean, scale = likelihood.mean_scale(out["mean"])
    assert observation.mean.shape == (6, 1)
    assert torch.allclose(observation.stddev, (out["var"][:, :1] + scale**2).sqrt())
    assert torch.allclose(observation.mean, mean)


@pytest.mark.parametrize("share", ["row", "layer"])
@pytest.mark.parametrize("layer", ["linear", "linear-tokens", "conv1d", "conv2d", "conv2d-groups"])
def test_shared_weight_variance_matches_the_per_weight_computation(layer, share):
    """Paper 002 eq. 12 layout: one variance per output unit (or layer) gives the same moments as that
    variance repeated for every weight, for deterministic and random inputs and for local reparameterization."""
    from pyrobnn.handlers.moments import variance_op

    op, x_shape, w_shape, kwargs = {
        "linear": (F.linear, (3, 5), (4, 5), {}),
        "linear-tokens": (F.linear, (2, 3, 5), (4, 5), {}),
        "conv1d": (F.conv1d, (2, 3, 9), (4, 3, 3), {"stride": 2, "padding": 1}),
        "conv2d": (F.conv2d, (2, 3, 6, 6), (4, 3, 3, 3), {"padding": 1, "dilation": 2}),
        "conv2d-groups": (F.conv2d, (2, 4, 6, 6), (4, 2, 3, 3), {"groups": 2}),
    }[layer]
    mw, _ = _gaussian(w_shape, 30)
    (mb, sb), (ma, sa) = _gaussian((4,), 31), _gaussian(x_shape, 32)
    shared = _gaussian(w_shape[:1] + (1,) * (len(w_shape) - 1) if share == "row" else (), 33)[1]
    compact = GaussianWeight(mw, shared, VDPMessenger())
    dense = GaussianWeight(mw, shared.expand(w_shape).clone(), VDPMessenger())
    assert compact.variance.shape != dense.variance.shape == w_shape
    for x in (ma, Moments(ma, sa**2)):
        a = op(x, compact, GaussianWeight(mb, sb, VDPMessenger()), **kwargs)
        want = op(x, dense, GaussianWeight(mb, sb, VDPMessenger()), **kwargs)
        assert torch.allclose(a.loc, want.loc) and torch.allclose(a.variance, want.variance)
    direct = variance_op(op, ma.square(), compact.variance, w_shape, **kwargs)
    assert torch.allclose(direct, op(ma.square(), dense.variance, None, **kwargs))


def test_shared_weight_variance_is_exact_against_monte_carlo():
    (ma, sa), (mw, _) = _gaussian((3, 5), 34), _gaussian((4, 5), 35)
    row = _gaussian((4, 1), 36)[1]
    out = F.linear(Moments(ma, sa**2), GaussianWeight(mw, row, VDPMessenger()))
    a, w = _draw(ma, sa, seed=37), _draw(mw, row.expand(4, 5), seed=38)
    _exact(torch.einsum("sni,soi->sno", a, w), out, "linear, per-unit variance")


def test_per_unit_variance_guide_has_the_kl_of_equation_12():
    from pyrobnn import GaussianPrior, MeanFieldELBO

    pyro.set_rng_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3))
    model = BayesianNetwork(net, prior=GaussianPrior(0.0, 1.0), num_data=10)
    guide = NormalGuide(model, init_rho=-1.0, share="row")
    assert guide.param("net.0.weight", "rhos").shape == (4, 1) and guide.param("net.0.bias", "rhos").shape == (4,)
    kl = MeanFieldELBO().terms(model, guide, torch.randn(10, 5), torch.randint(0, 3, (10,))).kl
    expected = 0.0
    for name in guide.site_names:
        mu, sigma = guide.loc_scale(name)
        j = mu[0].numel()  # weights per unit
        var = sigma.square().reshape(mu.shape[0])
        # eq. 12: -1/2 sum_n (j log sigma_n^2 - ||mu_n||^2 - j sigma_n^2), plus the constant -j/2 per unit
        expected += -0.5 * (j * var.log() - mu.reshape(mu.shape[0], -1).square().sum(1) - j * var + j).sum()
    assert torch.allclose(torch.as_tensor(kl, dtype=torch.float32), expected.detach(), rtol=1e-5)


def test_products_means_and_shape_rules_are_exact():
    """Elementwise and matrix products of independent Gaussians, scaling, the mean over a dimension,
    transposes and indexing: exact first and second moments."""
    (ma, sa), (mb, sb) = _gaussian((2, 3, 4), 40), _gaussian((2, 4, 5), 41)
    (mc, sc) = _gaussian((2, 3, 4), 42)
    a, b, c = Moments(ma, sa**2), Moments(mb, sb**2), Moments(mc, sc**2)
    xa, xb, xc = _draw(ma, sa, seed=43), _draw(mb, sb, seed=44), _draw(mc, sc, seed=45)
    _exact(xa @ xb, a @ b, "matmul")
    _exact(torch.bmm(xa.flatten(0, 1), xb.flatten(0, 1)).unflatten(0, (S, 2)), torch.bmm(a, b), "bmm")
    _exact(xa * xc, a * c, "elementwise product")
    _exact(xa * 3.0 / 2.0, a * 3.0 / 2.0, "scaling")
    _exact(xa.mean(3), a.mean(2), "mean over a dimension")
    _exact(xa.transpose(2, 3), a.transpose(1, 2), "transpose")
    _exact(xa[:, :, 1:], a[:, 1:], "indexing")
    deterministic = torch.randn(4, 5, dtype=DT, generator=_gen(46))
    _exact(xa @ deterministic, a @ deterministic, "matmul with a deterministic factor")


def test_multi_head_self_attention_matches_monte_carlo_to_first_order():
    """Independent q, k, v is the approximation: with input noise only (deterministic projections)
    q, k and v are correlated, so the rule is checked at small variance, where it is first-order accurate."""
    torch.manual_seed(47)
    attention = torch.nn.MultiheadAttention(8, 2, batch_first=True).double().eval()
    mean, std = torch.randn(3, 5, 8, dtype=DT, generator=_gen(48)), torch.full((3, 5, 8), 0.01, dtype=DT)
    with torch.no_grad():
        x = Moments(mean, std**2)
        out, weights = attention(x, x, x)
        samples = _draw(mean, std, 4000, seed=49)
        reference = torch.stack([attention(s, s, s)[0] for s in samples])
    assert isinstance(out, Moments) and weights.shape == (3, 5, 5)
    assert torch.allclose(out.loc, attention(mean, mean, mean)[0], atol=1e-3)
    ratio = out.variance / reference.var(0)
    assert 0.5 < ratio.median() < 2.0, f"attention variance ratio to Monte Carlo: median {ratio.median():.2f}"


def test_attention_options_without_a_moment_rule_are_refused():
    attention = torch.nn.MultiheadAttention(4, 2, batch_first=True)
    x = Moments(torch.randn(1, 3, 4), torch.ones(1, 3, 4))
    with pytest.raises(TypeError, match="attn_mask"):
        attention(x, x, x, attn_mask=torch.zeros(3, 3, dtype=torch.bool))


def test_vision_transformer_under_vdp_matches_weight_sampling():
    """A small ViT (conv patches, Bayesian positional embedding, LayerNorm, attention, GELU, mean pooling):
    the moment pass against Monte Carlo. Tokens share weights, so their errors are correlated and the
    diagonal propagation underestimates the pooled variance: documented, checked to within a factor 5."""
    from pyrobnn.networks import ViT

    pyro.set_rng_seed(0)
    model = BayesianNetwork(ViT(dim=16, depth=1, heads=2, mlp_dim=32))
    guide = NormalGuide(model, init_rho=-6.0)
    out, samples = _vdp_and_monte_carlo(model, guide, torch.rand(3, 1, 28, 28), 500)
    assert torch.allclose(out.loc, samples.mean(0), atol=5e-3)
    ratio = out.variance / samples.var(0)
    assert 0.2 < ratio.median() < 1.5, f"output variance ratio VDP / MC: median {ratio.median():.2f}"


@pytest.mark.recorded
def test_vision_transformer_trains_by_moment_propagation():
    from pyrobnn.infer.elbo import MeanFieldELBO
    from pyrobnn.infer.schedules import Constant
    from pyrobnn.infer.svi import fit
    from pyrobnn.model.likelihoods import Categorical
    from pyrobnn.networks import ViT

    pyro.set_rng_seed(0)
    x = torch.rand(64, 1, 28, 28)
    y = (x[:, 0, :14].mean((1, 2)) > x[:, 0, 14:].mean((1, 2))).long()  # brighter top half or not
    model = BayesianNetwork(ViT(dim=16, depth=1, heads=2, mlp_dim=32), Categorical(vdp_objective="cross_entropy"))
    guide = NormalGuide(model, init_rho=-5.0, share="row")
    history = fit(model, guide, x, y, epochs=15, batch_size=32, optimizer=Optim(lr=3e-3),
                  elbo=MeanFieldELBO(estimator="vdp"), beta=Constant(0.01), progress=False, device="cpu")
    assert history["nll"][-1] < 0.7 * history["nll"][0]
