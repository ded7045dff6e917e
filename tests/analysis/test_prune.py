"""Pruning of a trained posterior: SNR, log-alpha, magnitude and random masks, sparsity, apply_masks."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from pyrobnn import (
    AdditiveDropoutGuide,
    BayesianNetwork,
    GaussianPrior,
    LogUniformPrior,
    MultiplicativeDropoutGuide,
    NormalGuide,
)
from pyrobnn.analysis.prune import apply_masks, log_alpha_masks, magnitude_masks, random_masks, snr_masks, sparsity
from pyrobnn.infer.predict import predict

WEIGHTS = ("net.0.weight", "net.2.weight")
BIASES = ("net.0.bias", "net.2.bias")


def make_net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def make_model(prior=None, seed=0):
    return BayesianNetwork(make_net(seed), prior=prior or GaussianPrior(), num_data=50)


def set_param(guide, name, role, value):
    with torch.no_grad():
        param = guide.param(name, role)
        param.copy_(torch.as_tensor(value, dtype=param.dtype).expand_as(param))


def inv_softplus(sigma):
    return sigma.expm1().log()


def shapes(guide):
    return {name: guide.param(name, "locs").shape
            for name in guide.site_names}


def hand_set_normal_guide(seed=1):
    """A NormalGuide whose |μ|/σ and log α are known exactly (float64 reference values)."""
    guide = NormalGuide(make_model(), init_rho=-3.0)
    gen = torch.Generator().manual_seed(seed)
    ref = {}
    for name, shape in shapes(guide).items():
        mu = torch.randn(shape, generator=gen) * 2
        # σ chosen so the SNR |μ|/σ spreads over [0.1, 10] on a log scale, away from λ = 0.83 by 5 %
        snr = torch.exp(torch.empty(shape).uniform_(math.log(0.1), math.log(10.0), generator=gen))
        snr = torch.where((snr / 0.83 - 1).abs() < 0.05, snr * 1.2, snr)
        sigma = mu.abs() / snr
        set_param(guide, name, "locs", mu)
        set_param(guide, name, "rhos", inv_softplus(sigma.double()))
        loc, scale = guide.loc_scale(name)
        ref[name] = (loc.detach().double(), scale.detach().double())
    return guide, ref


# --------------------------------------------------------------------------- SNR and log α masks


def test_snr_masks_keep_exactly_the_weights_above_lambda():
    guide, ref = hand_set_normal_guide()
    for lam in (0.83, 0.3, 2.0):
        masks = snr_masks(guide, threshold=lam)
        assert set(masks) == set(WEIGHTS)  # biases excluded by default
        for name, keep in masks.items():
            mu, sigma = ref[name]
            assert keep.dtype == torch.bool and keep.shape == mu.shape
            assert torch.equal(keep, mu.abs() / sigma >= lam)
        # a non-trivial split at each λ
        removed = sum(int((~k).sum()) for k in masks.values())
        assert 0 < removed < 56
    masks = snr_masks(guide, threshold=0.83, include_biases=True)
    assert set(masks) == set(WEIGHTS) | set(BIASES)
    assert torch.equal(masks["net.2.bias"], ref["net.2.bias"][0].abs() / ref["net.2.bias"][1] >= 0.83)
    # λ = 0 keeps everything
    assert all(k.all() for k in snr_masks(guide, threshold=0).values())


def test_snr_masks_deterministic_case():
    guide = NormalGuide(make_model(), init_rho=-3.0)
    for name, shape in shapes(guide).items():
        set_param(guide, name, "locs", torch.ones(shape))
        set_param(guide, name, "rhos", inv_softplus(torch.full(shape, 0.5, dtype=torch.float64)))  # SNR 2
    set_param(guide, "net.0.weight", "rhos", inv_softplus(torch.tensor(2.0, dtype=torch.float64)))  # SNR 0.5
    with torch.no_grad():
        guide.param("net.2.weight", "locs")[1, 3] = 0.1  # SNR 0.2
    masks = snr_masks(guide, threshold=0.83)
    assert not masks["net.0.weight"].any()
    expected = torch.ones(3, 8, dtype=torch.bool)
    expected[1, 3] = False
    assert torch.equal(masks["net.2.weight"], expected)


def test_log_alpha_masks_on_each_guide_family():
    # NormalGuide: log α = log σ² - log μ²
    guide, ref = hand_set_normal_guide()
    for t in (3.0, 0.0, -2.0):
        masks = log_alpha_masks(guide, threshold=t)
        assert set(masks) == set(WEIGHTS)
        for name, keep in masks.items():
            mu, sigma = ref[name]
            assert torch.equal(keep, 2 * (sigma.log() - mu.abs().log()) <= t)

    # AdditiveDropoutGuide: log α = log σ² - log θ², hand-set to known values
    add = AdditiveDropoutGuide(make_model(LogUniformPrior()))
    set_param(add, "net.0.weight", "locs", 1.0)
    la0 = torch.tensor([-6.0, 1.0, 2.9, 3.1, 5.0, 7.5, -1.0, 4.0]).repeat(4, 1).t()  # rows 3, 4, 5, 7 pruned
    set_param(add, "net.0.weight", "log_variances", la0)  # θ = 1: log α = log σ²
    set_param(add, "net.2.weight", "locs", 0.5)
    la2 = torch.full((3, 8), -4.0)
    la2[2, 5] = 3.5
    set_param(add, "net.2.weight", "log_variances", la2 + 2 * math.log(0.5))
    masks = log_alpha_masks(add)
    assert torch.equal(masks["net.0.weight"], la0 <= 3)
    assert int((~masks["net.0.weight"]).sum()) == 16
    expected = torch.ones(3, 8, dtype=torch.bool)
    expected[2, 5] = False
    assert torch.equal(masks["net.2.weight"], expected)

    # MultiplicativeDropoutGuide with per-row α: a row is removed or kept as a whole
    mult = MultiplicativeDropoutGuide(make_model(LogUniformPrior()), share="row", max_log_alpha=8.0)
    set_param(mult, "net.0.weight", "log_alphas", torch.tensor([-1.0, 4.0, 2.0, 3.5, 0.0, 9.0, -3.0, 2.99]).view(8, 1))
    set_param(mult, "net.2.weight", "log_alphas", torch.tensor([[5.0], [-5.0], [1.0]]))
    masks = log_alpha_masks(mult, threshold=3.0)
    row0 = torch.tensor([True, False, True, False, True, False, True, True])
    assert torch.equal(masks["net.0.weight"], row0.view(8, 1).expand(8, 4))
    assert torch.equal(masks["net.2.weight"], torch.tensor([False, True, True]).view(3, 1).expand(3, 8))
    # the default max_log_alpha = 0 clips α at 1, so nothing exceeds log α = 3
    clipped = MultiplicativeDropoutGuide(make_model(LogUniformPrior()), share="weight")
    set_param(clipped, "net.0.weight", "log_alphas", 5.0)
    assert all(k.all() for k in log_alpha_masks(clipped).values())


@pytest.mark.parametrize("family", ["normal", "additive", "multiplicative"])
def test_log_alpha_pruned_weights_stay_pruned(family):
    gen = torch.Generator().manual_seed(7)
    if family == "normal":
        guide = NormalGuide(make_model(), init_rho=-3.0)
        for name, shape in shapes(guide).items():
            set_param(guide, name, "locs", torch.randn(shape, generator=gen))
            set_param(guide, name, "rhos", torch.empty(shape).uniform_(-4, 1, generator=gen))
    elif family == "additive":
        guide = AdditiveDropoutGuide(make_model(LogUniformPrior()))
        for name, shape in shapes(guide).items():
            set_param(guide, name, "locs", torch.randn(shape, generator=gen))
            set_param(guide, name, "log_variances", torch.empty(shape).uniform_(-6, 6, generator=gen))
    else:
        guide = MultiplicativeDropoutGuide(make_model(LogUniformPrior()), max_log_alpha=8.0)
        for name, shape in shapes(guide).items():
            set_param(guide, name, "log_alphas", torch.empty(shape).uniform_(-4, 8, generator=gen))
    first = log_alpha_masks(guide)
    assert 0 < sum(int((~k).sum()) for k in first.values()) < 56
    apply_masks(guide, first)
    again = log_alpha_masks(guide)
    for name in first:
        removed_before, removed_after = ~first[name], ~again[name]
        assert (removed_after[removed_before]).all(), (
            f"{family}: pruned weights of {name} came back; their log alpha after pruning is "
            f"{guide.log_alpha(name).expand_as(first[name])[removed_before].unique().tolist()}")
    # the same holds for the SNR rule
    snr_first = snr_masks(guide)
    for name in first:
        assert not snr_first[name][~first[name]].any()


# --------------------------------------------------------------------------- magnitude and random masks


def magnitude_guide():
    """Two layers (32 + 24 weights) whose |μ| is a random permutation of distinct values."""
    guide = NormalGuide(make_model())
    gen = torch.Generator().manual_seed(11)
    mags = (torch.randperm(56, generator=gen).double() + 1) / 10
    signs = torch.where(torch.rand(56, generator=gen) < 0.5, -1.0, 1.0).double()
    values = (mags * signs).float()
    set_param(guide, "net.0.weight", "locs", values[:32].view(8, 4))
    set_param(guide, "net.2.weight", "locs", values[32:].view(3, 8))
    set_param(guide, "net.0.bias", "locs", torch.full((8,), 0.01))  # smaller than every weight
    set_param(guide, "net.2.bias", "locs", torch.full((3,), 0.01))
    return guide, values.abs()


@pytest.mark.parametrize("fraction", [0.0, 0.3, 0.9, 1.0])
def test_magnitude_masks_remove_the_globally_smallest_weights(fraction):
    guide, mags = magnitude_guide()
    masks = magnitude_masks(guide, fraction=fraction)
    assert set(masks) == set(WEIGHTS)  # biases excluded
    keep = torch.cat([masks["net.0.weight"].flatten(), masks["net.2.weight"].flatten()])
    n_removed = round(fraction * 56)
    assert int((~keep).sum()) == n_removed
    # exactly the n_removed smallest |μ| over both layers
    expected = torch.ones(56, dtype=torch.bool)
    expected[mags.argsort()[:n_removed]] = False
    assert torch.equal(keep, expected)
    if 0 < n_removed < 56:
        assert mags[~keep].max() < mags[keep].min()


def test_magnitude_masks_with_biases():
    guide, _ = magnitude_guide()
    masks = magnitude_masks(guide, fraction=0.1, include_biases=True)
    assert set(masks) == set(WEIGHTS) | set(BIASES)
    # n = 56 + 11 = 67 entries, round(6.7) = 7 removed: the 11 biases (0.01) come first, so 7 biases go
    removed = {name: int((~k).sum()) for name, k in masks.items()}
    assert sum(removed.values()) == 7
    assert removed["net.0.weight"] == removed["net.2.weight"] == 0


def test_random_masks_keep_per_layer_counts():
    guide, ref = hand_set_normal_guide()
    principled = snr_masks(guide)
    rand = random_masks(principled, seed=3)
    assert set(rand) == set(principled)
    for name in principled:
        assert rand[name].shape == principled[name].shape and rand[name].dtype == torch.bool
        assert int((~rand[name]).sum()) == int((~principled[name]).sum())
    assert any(not torch.equal(rand[n], principled[n]) for n in principled)
    again = random_masks(principled, seed=3)
    assert all(torch.equal(rand[n], again[n]) for n in principled)
    other = random_masks(principled, seed=4)
    assert any(not torch.equal(rand[n], other[n]) for n in principled)
    assert sparsity(rand) == sparsity(principled)


def test_sparsity_counts_and_weighted_total():
    masks = {
        "a": torch.tensor([[True, False, False, True]]),  # 2 of 4 removed
        "b": torch.ones(10, 10, dtype=torch.bool),  # 0 of 100 removed
        "c": torch.zeros(6, dtype=torch.bool),  # 6 of 6 removed
    }
    s = sparsity(masks)
    assert s["a"] == pytest.approx(0.5)
    assert s["b"] == 0.0
    assert s["c"] == 1.0
    assert s["total"] == pytest.approx(8 / 110)  # not the unweighted mean (0.5 + 0 + 1) / 3
    guide, _ = magnitude_guide()
    s = sparsity(magnitude_masks(guide, fraction=0.3))
    assert s["total"] == pytest.approx(17 / 56)
    assert s["net.0.weight"] * 32 + s["net.2.weight"] * 24 == pytest.approx(17)


# --------------------------------------------------------------------------- apply_masks


GUIDES = {
    "normal-softplus": lambda m, tiny: NormalGuide(m, init_rho=-30.0 if tiny else -2.0),
    "normal-log-variance": lambda m, tiny: NormalGuide(m, init_rho=-30.0 if tiny else -2.0,
                                                       parameterization="log_variance"),
    "additive": lambda m, tiny: AdditiveDropoutGuide(m, init_log_sigma2=-60.0 if tiny else -2.0),
    "multiplicative": lambda m, tiny: MultiplicativeDropoutGuide(m, init_log_alpha=-60.0 if tiny else -1.0),
    "multiplicative-row": lambda m, tiny: MultiplicativeDropoutGuide(m, share="row",
                                                                     init_log_alpha=-60.0 if tiny else -1.0),
}


def prior_for(kind):
    return GaussianPrior() if kind.startswith("normal") else LogUniformPrior()


def some_mask(seed=5):
    gen = torch.Generator().manual_seed(seed)
    masks = {"net.0.weight": torch.rand(8, 4, generator=gen) < 0.6,
             "net.2.weight": torch.rand(3, 8, generator=gen) < 0.6}
    masks["net.2.weight"][0] = False  # a whole output unit's weights removed
    return masks


@pytest.mark.parametrize("kind", list(GUIDES))
def test_apply_masks_makes_removed_weights_point_masses_at_zero(kind):
    model = make_model(prior_for(kind))
    guide = GUIDES[kind](model, False)
    masks = some_mask()
    before = {name: guide.loc_scale(name)[0].detach().clone() for name in guide.site_names}
    apply_masks(guide, masks)
    for _ in range(20):
        draw = {name: value.detach() for name, value in guide().items()}
        for name, keep in masks.items():
            assert (draw[name][~keep].abs() < 1e-12).all(), name
            # kept weights still vary (the posterior is not collapsed by pruning)
            assert (draw[name][keep] != before[name][keep]).any()
    for name, keep in masks.items():
        loc, scale = guide.loc_scale(name)
        assert (loc[~keep] == 0).all() and (scale[~keep] < 1e-12).all()
        assert torch.equal(loc[keep], before[name][keep])  # kept means untouched
    # biases not in the mask are untouched
    for name in BIASES:
        assert torch.equal(guide.loc_scale(name)[0], before[name])


@pytest.mark.parametrize("kind", list(GUIDES))
def test_pruned_predictive_equals_the_zeroed_deterministic_network(kind):
    model = make_model(prior_for(kind))
    guide = GUIDES[kind](model, True)
    masks = some_mask()
    apply_masks(guide, masks)
    reference = make_net(seed=0).eval()
    with torch.no_grad():
        for name in guide.site_names:
            target = reference.get_parameter(name[len("net."):])
            loc = guide.loc_scale(name)[0]
            target.copy_(loc * masks[name] if name in masks else loc)
        # the reference's removed weights are zero, the kept ones the original initial weights
        original = make_net(seed=0)
        assert torch.equal(reference[0].weight, original[0].weight * masks["net.0.weight"])
    x = torch.randn(17, 4, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = reference(x).softmax(-1)
    for vectorized in (False, True):
        probs = predict(model, guide, x, num_samples=3, vectorized=vectorized)["probs"]
        assert torch.allclose(probs, expected, atol=1e-5, rtol=0), (kind, vectorized)
    # the unpruned network's predictions differ, so the comparison is not vacuous
    with torch.no_grad():
        unpruned = original.eval()(x).softmax(-1)
    assert (unpruned - expected).abs().max() > 1e-2


# --------------------------------------------------------------------------- bad inputs


def test_bad_inputs_raise_value_errors_naming_the_argument():
    guide, _ = hand_set_normal_guide()
    with pytest.raises(ValueError, match="threshold"):
        snr_masks(guide, threshold=float("nan"))
    with pytest.raises(ValueError, match="threshold"):
        snr_masks(guide, threshold=-0.5)
    with pytest.raises(ValueError, match="threshold"):
        log_alpha_masks(guide, threshold=float("nan"))
    for fraction in (1.5, -0.1, float("nan")):
        with pytest.raises(ValueError, match="fraction"):
            magnitude_masks(guide, fraction=fraction)
    with pytest.raises(ValueError, match="masks"):
        apply_masks(guide, {"net.5.weight": torch.ones(3, 3, dtype=torch.bool)})
    loc_before = guide.param("net.0.weight", "locs").detach().clone()
    with pytest.raises(ValueError, match="mask"):
        apply_masks(guide, {"net.0.weight": torch.zeros(4, 8, dtype=torch.bool)})
    with pytest.raises(ValueError, match="mask"):
        apply_masks(guide, {"net.0.weight": torch.zeros(8, dtype=torch.bool)})  # broadcastable, still refused
    assert torch.equal(guide.param("net.0.weight", "locs"), loc_before)  # nothing was pruned
