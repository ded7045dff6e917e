"""Paper 002's analyses of a trained network: noise robustness (Fig. 3) and self-compression (Fig. 2)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from pyrobnn import BayesianNetwork, GaussianPrior, NormalGuide
from pyrobnn.analysis.prune import magnitude_prune_module, pruning_curve
from pyrobnn.analysis.robustness import (
    add_noise,
    deterministic_predictor,
    moment_predictor,
    noise_robustness,
    sampling_predictor,
)
from pyrobnn.infer.predict import predict_moments, predictive_outputs
from pyrobnn.networks import MLP

DB = 10 / math.log(10)  # d(10 log10 r) / d(r) at r = 1


def _gen(seed):
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------- add_noise


def test_add_noise_reaches_the_requested_snr_per_example_with_zero_mean():
    x = torch.rand(8, 3, 32, 32, generator=_gen(0), dtype=torch.float64)
    x = x * torch.linspace(0.1, 1.0, 8, dtype=torch.float64).view(8, 1, 1, 1)  # different signal powers
    d = x[0].numel()
    signal = x.pow(2).flatten(1).mean(1)
    for snr_db in (-6.0, 0.0, 3.0, 20.0):
        noise = (add_noise(x, snr_db, _gen(1)) - x).flatten(1)
        sigma2 = signal / 10 ** (snr_db / 10)
        # the empirical noise power has relative s.d. sqrt(2/D): its SNR in dB is within 5 of those
        measured = 10 * torch.log10(signal / noise.pow(2).mean(1))
        assert (measured - snr_db).abs().max() < 5 * DB * math.sqrt(2 / d), (snr_db, measured)
        # zero mean: per-example mean within 5 standard errors sigma/sqrt(D)
        assert (noise.mean(1).abs() / (sigma2 / d).sqrt()).max() < 5
    # the noise scales with each example's power: a zero example stays exactly zero
    x[3] = 0
    assert torch.equal(add_noise(x, 0.0, _gen(2))[3], x[3])


def test_add_noise_is_reproducible_and_not_clipped():
    x = torch.rand(4, 1, 28, 28, generator=_gen(0))
    a, b = add_noise(x, -3, _gen(5)), add_noise(x, -3, _gen(5))
    assert torch.equal(a, b)
    assert not torch.equal(a, add_noise(x, -3, _gen(6)))
    assert a.min() < 0 and a.max() > 1  # pixels in [0, 1] are not clipped
    assert a.dtype == x.dtype and a.shape == x.shape
    # the same standard-normal draw at every level: the noise scales by 10^(-dB/20)
    x = x.double()
    ratio = (add_noise(x, 10, _gen(5)) - x) / (add_noise(x, -3, _gen(5)) - x)
    assert torch.allclose(ratio, torch.full_like(ratio, 10 ** (-13 / 20)), rtol=1e-9)


@pytest.mark.parametrize("snr", [float("nan"), float("inf"), "3", None])
def test_add_noise_rejects_bad_snr(snr):
    with pytest.raises(ValueError, match="snr_db"):
        add_noise(torch.rand(2, 3), snr)


def test_add_noise_rejects_bad_x():
    for x in (torch.rand(5), torch.ones(2, 3, dtype=torch.long), torch.rand(0, 3), [[0.5]]):
        with pytest.raises(ValueError, match="x must"):
            add_noise(x, 0.0)


# --------------------------------------------------------------------------- noise_robustness

D, C, N = 16, 3, 600


def blobs():
    """Three prototype "images" in [0, 1]^16 with small within-class noise."""
    g = _gen(0)
    protos = torch.rand(C, D, generator=g)
    y = torch.arange(N) % C
    x = (protos[y] + 0.1 * torch.randn(N, D, generator=g)).clamp(0, 1)
    return protos, x, y


def nearest_prototype(protos, scale=1.0):
    """The linear nearest-prototype classifier: logits w_c.x - |w_c|^2/2 (scaled)."""
    net = nn.Linear(D, C)
    with torch.no_grad():
        net.weight.copy_(scale * protos)
        net.bias.copy_(-0.5 * scale * protos.pow(2).sum(1))
    return net


def bayesian_linear(protos, rho=-3.0):
    """A Bayesian single-layer softmax classifier (MLP with no hidden layer) around the same means."""
    mlp = MLP(D, (), C)
    mlp[1].load_state_dict(nearest_prototype(protos, 4.0).state_dict())
    model = BayesianNetwork(mlp, prior=GaussianPrior(), num_data=N)
    return model, NormalGuide(model, init_rho=rho)


def test_noise_robustness_of_a_deterministic_net_matches_an_independent_computation():
    protos, x, y = blobs()
    net = nearest_prototype(protos)
    levels = (-6, -3, 0, 3, 6, 10, 20, 30)
    rows = noise_robustness(deterministic_predictor(net), x, y, snr_db=levels, seed=3, batch_size=128)
    assert [r["snr_db"] for r in rows] == list(levels)
    for row in rows:
        noisy = add_noise(x, row["snr_db"], _gen(3))
        with torch.no_grad():
            expected = int((net(noisy).argmax(-1) == y).sum()) / N
        assert row["accuracy"] == expected
        assert row["variance"] is None and row["normalized_variance"] is None
    accuracy = [r["accuracy"] for r in rows]
    assert accuracy[-1] == 1.0 and accuracy[0] < 0.7  # nearly chance at -6 dB
    assert all(lo <= hi for lo, hi in zip(accuracy, accuracy[1:])), accuracy  # falls with the SNR
    # the seed, not the batch size, decides the noise; another seed gives another draw
    assert noise_robustness(deterministic_predictor(net), x, y, snr_db=levels, seed=3, batch_size=1000) == rows
    assert noise_robustness(deterministic_predictor(net), x, y, snr_db=levels, seed=4)[0] != rows[0]


def test_every_predictor_sees_the_same_noise():
    protos, x, y = blobs()
    seen = {"a": [], "b": []}

    def recording(key):
        def predictor(chunk):
            seen[key].append(chunk.clone())
            return torch.full((len(chunk), C), 1 / C), None
        return predictor

    noise_robustness(recording("a"), x, y, snr_db=(0, -6), seed=7, batch_size=250)
    noise_robustness(recording("b"), x, y, snr_db=(0, -6), seed=7, batch_size=250)
    assert len(seen["a"]) == 6 and all(torch.equal(a, b) for a, b in zip(seen["a"], seen["b"]))


def test_moment_and_sampling_predictors_agree_on_the_predicted_class_variance():
    protos, x, y = blobs()
    model, guide = bayesian_linear(protos)
    # one Linear layer: the logits' moments are exact under VDP (no linearisation); check them first
    xs = add_noise(x[:60], 0.0, _gen(1))
    moments = predict_moments(model, guide, xs)
    samples = predictive_outputs(model, guide, xs, num_samples=4000)
    rel_se = math.sqrt(2 / 3999)  # sample variance of Gaussian logits
    assert ((samples.var(0) / moments["var"] - 1).abs() / rel_se).max() < 5
    assert ((samples.mean(0) - moments["mean"]).abs() / (moments["var"] / 4000).sqrt()).max() < 5

    levels = (-6, 0, 10, 30)
    vdp = noise_robustness(moment_predictor(model, guide), x, y, snr_db=levels, batch_size=300)
    mc = noise_robustness(sampling_predictor(model, guide, num_samples=2000), x, y, snr_db=levels, batch_size=300)
    for a, b in zip(vdp, mc):
        # the softmax variance is first order in VDP; here (logit s.d. ~0.1-0.3) it is within ~1 %
        # of Monte Carlo; 5 % leaves room for the MC error of 2000 draws averaged over 600 examples
        assert a["variance"] == pytest.approx(b["variance"], rel=0.05), (a, b)
        assert abs(a["accuracy"] - b["accuracy"]) <= 0.01
    # the variance of the predicted class, recomputed from the predictor by hand
    noisy = add_noise(x, 10, _gen(0))
    probs, var = moment_predictor(model, guide)(noisy)
    assert vdp[2]["variance"] == pytest.approx(float(var.gather(1, probs.argmax(1, keepdim=True)).mean()), rel=1e-6)
    # normalised by the lowest SNR (-6 dB): 1 there, and the variance falls as the SNR rises
    normalized = [r["normalized_variance"] for r in vdp]
    assert normalized[0] == 1.0 and all(a > b for a, b in zip(normalized, normalized[1:])), normalized
    assert all(r["normalized_variance"] == pytest.approx(r["variance"] / vdp[0]["variance"]) for r in vdp)
    # the lowest level is found wherever it is listed
    shuffled = noise_robustness(moment_predictor(model, guide), x, y, snr_db=(10, -6, 30), batch_size=300)
    assert shuffled[1]["normalized_variance"] == 1.0 and shuffled[0]["normalized_variance"] < 1.0


def test_noise_robustness_rejects_bad_arguments():
    protos, x, y = blobs()
    predictor = deterministic_predictor(nearest_prototype(protos))
    with pytest.raises(ValueError, match="snr_db"):
        noise_robustness(predictor, x, y, snr_db=(0, float("nan")))
    with pytest.raises(ValueError, match="snr_db"):
        noise_robustness(predictor, x, y, snr_db=())
    with pytest.raises(ValueError, match="batch_size"):
        noise_robustness(predictor, x, y, batch_size=0)
    with pytest.raises(ValueError, match="y must"):
        noise_robustness(predictor, x, y[:-1])


# --------------------------------------------------------------------------- pruning_curve

FRACTIONS = (0.0, 0.5, 0.8, 0.9, 0.99)


def mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(D, 12), nn.ReLU(), nn.Linear(12, C))


def labelled_by(net):
    x = torch.rand(300, D, generator=_gen(9))
    with torch.no_grad():
        return x, net(x).argmax(-1)


def snapshot(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


@pytest.mark.recorded
def test_pruning_curve_of_a_guide():
    x, y = labelled_by(mlp())  # labels of the unpruned mean network: accuracy 1 before pruning
    model = BayesianNetwork(mlp(), prior=GaussianPrior(), num_data=300)
    guide = NormalGuide(model, init_rho=-4.0)
    before = snapshot(guide)
    weights = ("net.0.weight", "net.2.weight")
    n = sum(guide.param(name, "locs").numel() for name in weights)
    seen = []

    def score(g):
        probs = predict_moments(model, g, x)["probs"]
        zeros = sum(int((g.param(name, "locs") == 0).sum()) for name in weights)
        return {"accuracy": int((probs.argmax(-1) == y).sum()) / len(y), "zeros": zeros / n}

    def evaluate_fn(pruned):
        assert pruned is not guide
        seen.append(pruned)
        return score(pruned)

    rows = pruning_curve(evaluate_fn, guide, FRACTIONS)
    assert [r["fraction"] for r in rows] == list(FRACTIONS)
    assert rows[0]["accuracy"] == 1.0 == score(guide)["accuracy"]
    for row in rows:
        assert abs(row["sparsity"] - row["fraction"]) <= 0.5 / n
        assert row["zeros"] == pytest.approx(row["sparsity"], abs=1e-12)
    assert rows[-1]["accuracy"] < 0.9  # 99 % removed hurts an untrained network
    # the removed weights have vanishing variance, the biases are untouched
    loc, scale = seen[-1].loc_scale("net.0.weight")
    assert (scale[loc == 0] < 1e-15).all()
    assert torch.equal(seen[-1].param("net.0.bias", "locs"), before["locs.net.0.bias_unconstrained"])
    # the original guide is left untouched
    after = snapshot(guide)
    assert all(torch.equal(before[k], after[k]) for k in before)

    # the deterministic network with the guide's means prunes the same weights: the same curve
    # (VDP's mean pass is the mean network's pass) and the same predictions
    net_rows = pruning_curve(lambda pruned: int((pruned(x).argmax(-1) == y).sum()) / len(y), mlp(), FRACTIONS)
    assert [r["accuracy"] for r in net_rows] == [r["accuracy"] for r in rows]
    assert [r["sparsity"] for r in net_rows] == [r["sparsity"] for r in rows]
    with torch.no_grad():
        expected = magnitude_prune_module(mlp(), 0.9)(x).softmax(-1)
    assert torch.allclose(predict_moments(model, seen[3], x)["probs"], expected, atol=1e-6)


def test_magnitude_prune_module_is_global_l1_over_weight_tensors():
    net = nn.Sequential(nn.Linear(D, 12), nn.BatchNorm1d(12), nn.ReLU(), nn.Linear(12, C))
    with torch.no_grad():
        net[3].weight.mul_(5)  # a layer of larger weights: global pruning spares it more
        net[1].weight.uniform_(-0.01, 0.01)  # tiny normalisation scales, never pruned
    before = snapshot(net)
    pruned = magnitude_prune_module(net, 0.75)
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())  # a copy was pruned
    first, last = pruned[0].weight, pruned[3].weight
    removed = torch.cat([before["0.weight"][first == 0], before["3.weight"][last == 0]]).abs()
    kept = torch.cat([first[first != 0], last[last != 0]]).abs()
    assert len(removed) == round(0.75 * (D * 12 + 12 * C)) and removed.max() <= kept.min()
    assert (first == 0).float().mean() > 0.75 > (last == 0).float().mean()
    for key in ("0.bias", "1.weight", "1.bias", "3.bias"):
        assert torch.equal(pruned.state_dict()[key], before[key])
    assert torch.equal(pruned[0].weight[first != 0], before["0.weight"][first != 0])


def test_pruning_curve_rejects_bad_arguments():
    net = mlp()
    with pytest.raises(ValueError, match="fraction"):
        pruning_curve(lambda m: 1.0, net, (0.5, 1.5))
    with pytest.raises(ValueError, match="fraction"):
        pruning_curve(lambda m: 1.0, net, ())
    with pytest.raises(TypeError, match="guide"):
        pruning_curve(lambda m: 1.0, {"w": torch.ones(2, 2)}, (0.5,))
    with pytest.raises(ValueError, match="weight"):
        magnitude_prune_module(nn.BatchNorm1d(4), 0.5)
    with pytest.raises(ValueError, match="fraction"):
        magnitude_prune_module(net, float("nan"))
