"""The CIFAR model zoo (pyrobnn.networks) under every estimator, and the moment rules VDP++ needs for it
(pyrobnn.handlers.moments: adaptive pooling, sums, concatenation, in-place forms) against Monte Carlo."""

import math

import pytest
import torch
import torch.nn.functional as F
from pyro import poutine
from torch import nn

from pyrobnn import BayesianNetwork, MeanFieldELBO, NormalGuide
from pyrobnn.handlers import estimator, kl_annealing, vdp
from pyrobnn.handlers.moments import Moments
from pyrobnn.infer.optim import make_optimizer
from pyrobnn.infer.predict import prediction_mode, predictive_outputs
from pyrobnn.infer.svi import svi_step
from pyrobnn.networks import NETWORKS, build_net
from tests.handlers.test_vdp import S, _draw, _exact, _gaussian

CIFAR = (3, 32, 32)
TINY = {"lenet5-cifar": 0.5, "alexnet": 1 / 32, "resnet18": 1 / 16, "resnet50": 1 / 16, "vgg16": 1 / 16,
        "wrn28-10": 0.05, "vit": 0.25}
"""Every CIFAR architecture at a width that makes one step take milliseconds."""


def _batch(n=3):
    g = torch.Generator().manual_seed(1)
    return torch.rand((n,) + CIFAR, generator=g), torch.randint(0, 10, (n,), generator=g)


# -- the architectures ------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("method", ["sample", "local", "flipout", "vdp"])
@pytest.mark.parametrize("name", list(TINY))
def test_every_cifar_model_trains_under_every_estimator(name, method):
    """Converted, one SVI step with a finite loss, and the likelihood's gradient reaches the mean and the
    scale of every Bayesian tensor through the network (the KL alone would reach them too)."""
    model = BayesianNetwork(build_net(name, CIFAR, 10, width=TINY[name]), num_data=1000, input_shape=CIFAR)
    guide = NormalGuide(model, init_rho=-4.0)
    x, y = _batch()
    before = {k: v.detach().clone() for k, v in guide.named_parameters()}
    terms = svi_step(model, guide, make_optimizer(guide.parameters(), lr=1e-2), x, y,
                     elbo=MeanFieldELBO(estimator=method))
    assert torch.isfinite(terms.loss) and torch.isfinite(terms.nll) and terms.nll > 0
    assert all(not torch.equal(before[k], v) for k, v in guide.named_parameters()), "a parameter did not move"
    with kl_annealing(beta=0.0), estimator(method, 1, len(x)):
        nll = MeanFieldELBO().terms(model, guide, x, y).loss  # the KL switched off
    for site in guide.site_names:
        loc, scale = guide.param(site, "locs"), guide.param(site, "rhos")
        grad_loc, grad_scale = torch.autograd.grad(nll, (loc, scale), retain_graph=True)
        assert torch.isfinite(grad_loc).all() and torch.isfinite(grad_scale).all(), site
        assert grad_loc.abs().sum() > 0 and grad_scale.abs().sum() > 0, f"{site}: no gradient from the likelihood"


def test_torchvision_resnet18_trains_under_vdp():
    """torchvision's ImageNet ResNet-18 (in-place ReLU, ``out += identity``, adaptive average pooling)."""
    model = BayesianNetwork(build_net("tv:resnet18", CIFAR, 10), num_data=1000)
    guide = NormalGuide(model)
    x, y = _batch(2)
    terms = svi_step(model, guide, make_optimizer(guide.parameters()), x, y, elbo=MeanFieldELBO(estimator="vdp"))
    assert torch.isfinite(terms.loss)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in guide.parameters())


def test_resnet_under_vdp_agrees_with_weight_sampling():
    """The whole pipeline (torchvision blocks with in-place ops, BatchNorm in eval mode, global pooling):
    means agree with Monte Carlo; variances only roughly, since VDP++ drops the covariances that shared
    convolution weights create between positions (its approximation), so the median ratio is bounded loosely."""
    model = BayesianNetwork(build_net("resnet18", CIFAR, 10, width=1 / 16))
    guide = NormalGuide(model, init_rho=-6.0)
    x, _ = _batch(2)
    with torch.no_grad(), prediction_mode(model), vdp():
        out = poutine.replay(model.net, trace=poutine.trace(guide).get_trace())(x)
    samples = predictive_outputs(model, guide, x, num_samples=500)
    assert torch.allclose(out.loc, samples.mean(0), atol=5e-3)
    assert 0.5 < (out.variance / samples.var(0)).median() < 2


def test_architectures_have_their_published_sizes():
    """Parameter counts at width 1 (built on the meta device: nothing allocated) against the published or
    hand-computed ones, and paper 000's CIFAR LeNet uses sigmoid and average pooling."""
    lenet = (3 * 25 + 1) * 6 + (6 * 25 + 1) * 16 + (400 + 1) * 120 + (120 + 1) * 84 + (84 + 1) * 10
    alexnet = ((3 * 121 + 1) * 96 + (96 * 25 + 1) * 256 + (256 * 9 + 1) * 384 + (384 * 9 + 1) * 384
               + (384 * 9 + 1) * 256 + (256 + 1) * 4096 + (4096 + 1) * 4096 + (4096 + 1) * 10)
    expected = {"lenet5-cifar": lenet, "alexnet": alexnet, "resnet18": 11_173_962, "resnet50": 23_520_842,
                "vgg16": 15_253_578, "wrn28-10": 36_479_194}  # torchvision / Zagoruyko & Komodakis' counts
    with torch.device("meta"):
        for name, count in expected.items():
            net = build_net(name, CIFAR, 10)
            assert sum(p.numel() for p in net.parameters()) == count, name
            assert net(torch.empty((2,) + CIFAR)).shape == (2, 10), name
    kinds = {type(m) for m in build_net("lenet5-cifar", CIFAR, 10).modules()}
    assert nn.Sigmoid in kinds and nn.AvgPool2d in kinds and not {nn.ReLU, nn.MaxPool2d} & kinds


def test_alexnet_keeps_the_11x11_stride_4_stem_and_pools_32_to_1():
    net = build_net("alexnet", CIFAR, 10, width=1 / 32, dropout=0.5)
    assert (net.conv1.kernel_size, net.conv1.stride) == ((11, 11), (4, 4))
    sizes = []
    for module in (net.pool1, net.pool2, net.pool5):
        module.register_forward_hook(lambda m, i, o: sizes.append(o.shape[-1]))
    net(torch.rand((1,) + CIFAR))
    assert sizes == [4, 2, 1]
    assert sum(isinstance(m, nn.Dropout) and m.p == 0.5 for m in net.modules()) == 2


def test_cifar_models_refuse_other_inputs_and_bad_options():
    for name in ("lenet5-cifar", "alexnet", "resnet18", "resnet50", "vgg16", "wrn28-10"):
        with pytest.raises(ValueError, match=rf"network '{name}' needs 3x32x32 \(CIFAR\) images, got input shape "
                                             r"\(1, 28, 28\)"):
            build_net(name, (1, 28, 28), 10)
    with pytest.raises(ValueError, match="unknown network 'resnet9000'"):
        build_net("resnet9000", CIFAR, 10)
    with pytest.raises(ValueError, match="dropout: resnet18 has no dropout layers"):
        build_net("resnet18", CIFAR, 10, dropout=0.1)
    with pytest.raises(ValueError, match="width must be a finite number > 0"):
        build_net("vgg16", CIFAR, 10, width=0)
    with pytest.raises(ValueError, match="depth must be 6n"):
        build_net("wrn27-2", CIFAR, 10)
    with pytest.raises(ValueError, match="width: torchvision models have no width multiplier"):
        build_net("tv:resnet18", CIFAR, 10, width=0.5)


def test_registry_names_and_aliases():
    assert {"lenet5-cifar", "alexnet", "resnet18", "resnet50", "vgg16", "wrn28-10"} <= set(NETWORKS)
    net = build_net("WRN-16-2", CIFAR, 10, dropout=0.3)
    assert [len(stage) for stage in (net.layer1, net.layer2, net.layer3)] == [2, 2, 2]
    assert net.fc.in_features == 128 and net.layer1[0].dropout.p == 0.3
    assert build_net("resnet18", CIFAR, 7, width=0.25).fc.out_features == 7


# -- the moment rules -------------------------------------------------------------------------------


@pytest.mark.parametrize("nd, shape, output_size", [
    (1, (2, 3, 7), 3), (2, (2, 3, 5, 7), (3, 4)), (2, (2, 3, 4, 4), 1), (2, (2, 3, 6, 5), (None, 2)),
    (3, (1, 2, 3, 4, 5), (2, 3, 2)),
], ids=["1d", "2d-uneven", "2d-global", "2d-none", "3d"])
def test_adaptive_average_pooling_is_exact(nd, shape, output_size):
    """Uneven (overlapping) regions, a kept dimension (None) and global pooling: exact moments."""
    pool = getattr(F, f"adaptive_avg_pool{nd}d")
    mean, std = _gaussian(shape, 50)
    samples = pool(_draw(mean, std, seed=51).flatten(0, 1), output_size).unflatten(0, (S, shape[0]))
    _exact(samples, pool(Moments(mean, std**2), output_size), f"adaptive_avg_pool{nd}d")
    _exact(samples, getattr(nn, f"AdaptiveAvgPool{nd}d")(output_size)(Moments(mean, std**2)), "module")


@pytest.mark.parametrize("nd", [1, 2, 3])
def test_adaptive_max_pooling_co_pools(nd):
    """Well-separated means make the argmax certain, so co-pooling (the variance at the argmax) is exact;
    ``return_indices`` gives the indices of the maxima of the means."""
    shape = (2, 3) + (6, 5, 4)[:nd]
    numel = math.prod(shape)
    mean = (torch.randperm(numel, generator=torch.Generator().manual_seed(52)).double() * 2).view(shape)
    std = 0.05 + 0.1 * torch.rand(shape, generator=torch.Generator().manual_seed(53), dtype=torch.float64)
    size = (3, 2, 2)[:nd]
    pool = getattr(F, f"adaptive_max_pool{nd}d")
    out, indices = pool(Moments(mean, std**2), size, return_indices=True)
    assert torch.equal(indices, pool(mean, size, return_indices=True)[1])
    expected = (std**2).flatten(-nd).gather(-1, indices.flatten(-nd)).view_as(out.loc)
    assert torch.equal(out.variance, expected)
    samples = pool(_draw(mean, std, seed=54).flatten(0, 1), size).unflatten(0, (S, 2))
    _exact(samples, pool(Moments(mean, std**2), size), f"adaptive_max_pool{nd}d")


def test_max_pool_returns_indices():
    mean, std = _gaussian((2, 3, 4, 4), 55)
    out, indices = F.max_pool2d(Moments(mean, std**2), 2, return_indices=True)
    assert isinstance(out, Moments) and torch.equal(indices, F.max_pool2d(mean, 2, return_indices=True)[1])


def test_sums_and_concatenation_are_exact():
    (ma, sa), (mb, sb) = _gaussian((2, 3, 4), 56), _gaussian((2, 5, 4), 57)
    a, b = Moments(ma, sa**2), Moments(mb, sb**2)
    xa, xb = _draw(ma, sa, seed=58), _draw(mb, sb, seed=59)
    _exact(xa.sum((2, 3)), a.sum((1, 2)), "sum over dimensions")
    _exact(xa.sum(3, keepdim=True), torch.sum(a, 2, keepdim=True), "sum, keepdim")
    _exact(torch.cat([xa, xb], 2), torch.cat([a, b], 1), "concatenation")
    deterministic = torch.randn(2, 1, 4, dtype=torch.float64)
    mixed = torch.cat([a, deterministic], dim=1)
    assert torch.equal(mixed.loc[:, 3:], deterministic) and not mixed.variance[:, 3:].any()
    _exact(xa, torch.concat([a, deterministic], 1)[:, :3], "concatenation with a deterministic tensor")


def test_in_place_forms_write_the_moments_into_their_target():
    (ma, sa), (mb, sb) = _gaussian((2, 3, 4), 60), _gaussian((2, 3, 4), 61)
    a, b = Moments(ma, sa**2), Moments(mb, sb**2)
    expected = F.relu(a + b)
    target = a
    target += b
    assert target is a
    assert F.relu(a, inplace=True) is a and torch.equal(a.loc, expected.loc)
    assert torch.equal(a.variance, expected.variance)
    c = Moments(ma, sa**2)
    assert c.add_(b, alpha=2).relu_() is c and torch.equal(c.loc, F.relu(ma + 2 * mb))
    assert torch.equal(c.variance, (sa**2 + 4 * sb**2) * (ma + 2 * mb > 0))
    assert torch.relu_(Moments(ma, sa**2)).variance.equal(F.relu(Moments(ma, sa**2)).variance)
    plain = ma.clone()
    with pytest.raises(TypeError, match="vdp: .* would write moments into a deterministic tensor"):
        plain.add_(b)
    plain += b  # Python's fallback when += is not implemented: plain = plain + b
    assert isinstance(plain, Moments) and torch.equal(plain.loc, ma + mb) and torch.equal(plain.variance, sb**2)
