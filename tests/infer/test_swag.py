"""SWAG and MultiSWAG (``pyrobnn.infer.swag``): the moments are the SGD iterates' sample moments computed here by
hand (the running mean, mean square and the last K deviations from the running mean, Maddox et al.'s Algorithm 1),
the draws have the covariance ½ diag(σ²) + D Dᵀ / (2(K - 1)), BatchNorm statistics are those of each draw's
network on the training data, MultiSWAG's members are SWAGs of their own seeds, and bad settings are refused in one
line before anything trains."""

from __future__ import annotations

import pyro
import pytest
import torch
from torch import nn

from pyrobnn import BayesianNetwork, NormalGuide, PointGuide, predict
from pyrobnn.guides.empirical import StatefulDraws
from pyrobnn.guides.point import point_values
from pyrobnn.infer.iterates import Recorded
from pyrobnn.infer.optim import Optim
from pyrobnn.infer.replicas import fit_replicas
from pyrobnn.infer.svi import Checkpoint, TrainingDiverged
from pyrobnn.infer.swag import SWAGCollector, fit_swag, replicas, swa_schedule
from pyrobnn.model.likelihoods import Gaussian
from pyrobnn.model.priors import GaussianPrior

N = 64
OPTIONS = dict(epochs=12, batch_size=16, optimizer=Optim("sgd", 0.02), progress=False)


@pytest.fixture(scope="module")
def regression():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(N, 3, generator=generator)
    y = x @ torch.tensor([1.0, -0.5, 0.3]) + 0.5 + 0.3 * torch.randn(N, generator=generator)
    return x, y[:, None]


def linear(m: int = 0):
    """Bayesian linear regression as a network: weights (1, 3) and a bias, N(0, 1) prior, noise σ = 0.3."""
    model = BayesianNetwork(nn.Linear(3, 1), Gaussian(0.3), prior=GaussianPrior(scale=1.0), num_data=N)
    return model, PointGuide(model)


def iterates(guide) -> tuple[list, callable]:
    """A callback that keeps the guide's point values after every epoch, and the list they go to."""
    kept = []

    def keep(epoch, record):
        values = point_values(guide)
        kept.append(torch.cat([values["net.weight"].flatten(), values["net.bias"].flatten()]))

    return kept, keep


def test_moments_are_the_iterates_sample_moments(regression):
    """12 epochs, T = 4, K = 5: the 8 iterates after epochs 5..12; mean and mean square are theirs, and D holds the
    last 5 deviations θ_i - θ̄_i from the running mean (ring order: iterate i in column (i - 1) mod K)."""
    x, y = regression
    pyro.set_rng_seed(0)
    model, guide = linear()
    kept, keep = iterates(guide)
    result = fit_swag(model, guide, x, y, start=4, rank=5, num_samples=10, on_epoch_end=keep, **OPTIONS)
    theta = torch.stack(kept[4:])  # (8, 4): weight then bias
    (moments,) = result.moments
    assert moments.count == 8 and moments.columns == 5 and moments.names == ["net.weight", "net.bias"]
    mean = torch.cat([moments.mean[0].flatten(), moments.mean[1].flatten()])
    variance = torch.cat([v.flatten() for v in moments.variance()])
    torch.testing.assert_close(mean, theta.mean(0))
    torch.testing.assert_close(variance, (theta ** 2).mean(0) - theta.mean(0) ** 2, rtol=1e-3, atol=1e-9)
    running = torch.cumsum(theta, 0) / torch.arange(1, 9)[:, None]
    deviations = torch.cat([moments.deviations[0].reshape(5, -1), moments.deviations[1].reshape(5, -1)], 1)
    for i in range(3, 8):  # iterates 4..8 (from 1), the last five
        torch.testing.assert_close(deviations[i % 5], theta[i] - running[i])
    assert result.draws["net.weight"].shape == (1, 10, 1, 3) and result.draws["net.bias"].shape == (1, 10, 1)
    assert not result.state and isinstance(result.guide(), type(result.guide())) and len(result) == 10


def test_draws_have_the_swag_covariance(regression):
    """θ = θ̄ + σ z₁ / √2 + D z₂ / √(2(K-1)): 40,000 draws have the mean θ̄ and the covariance
    ½ diag(σ²) + D Dᵀ / (2(K-1)) built by hand, within Monte-Carlo error."""
    x, y = regression
    pyro.set_rng_seed(0)
    result = fit_swag(*linear(), x, y, start=4, rank=5, num_samples=2, **OPTIONS)
    (moments,) = result.moments
    draws = moments.sample(40_000, torch.Generator().manual_seed(1))
    flat = torch.cat([d[0].reshape(40_000, -1) for d in draws], 1).double()
    mean = torch.cat([m[0].flatten() for m in moments.mean]).double()
    variance = torch.cat([v[0].flatten() for v in moments.variance()]).double()
    deviations = torch.cat([d[:, 0].reshape(5, -1) for d in moments.deviations], 1).double()  # (K, d)
    covariance = torch.diag(variance) / 2 + deviations.T @ deviations / (2 * (5 - 1))
    scale = covariance.diag().sqrt()
    assert ((flat.mean(0) - mean).abs() < 5 * scale / 200).all()
    correlation = (flat - mean).T @ (flat - mean) / 40_000 / torch.outer(scale, scale)
    torch.testing.assert_close(correlation, covariance / torch.outer(scale, scale), atol=0.03, rtol=0)


def test_multiswag_is_a_mixture_of_swags_of_their_own_seeds(regression):
    x, y = regression
    pyro.set_rng_seed(3)
    model, guide = linear()
    result = fit_swag(model, guide, x, y, start=6, rank=3, num_samples=4, members=2, make_member=linear, seed=3,
                      **OPTIONS)
    assert result.draws["net.weight"].shape == (2, 4, 1, 3) and len(result) == 8
    assert [record["member"] for record in result.epochs] == [0] * 12 + [1] * 12
    pyro.set_rng_seed(4)  # member 1 alone: its initialisation, batches and draws from seed 4
    alone = fit_swag(*linear(), x, y, start=6, rank=3, num_samples=4, seed=4, **OPTIONS)
    torch.testing.assert_close(result.moments[1].mean[0], alone.moments[0].mean[0])
    torch.testing.assert_close(result.draws["net.weight"][1], alone.draws["net.weight"][0])
    assert not torch.allclose(result.moments[0].mean[0], result.moments[1].mean[0])
    assert alone.moments[0].count == 6
    posterior = result.guide()
    assert len(posterior) == 8 and torch.equal(posterior.draws()["net.weight"][4:], result.draws["net.weight"][1])


def test_stacked_replicas_each_collect_their_own_moments(regression):
    """The optimiser reads the parameters where it holds them: under ``fit_replicas`` (3 stacked networks) each row
    has the moments its network trained alone gets (the same batches and seed)."""
    x, y = regression
    factory = Recorded(SWAGCollector(start=6, rank=3, steps_per_epoch=4, optimizer=Optim("sgd", 0.02)))
    pairs = []
    for r in range(3):
        pyro.set_rng_seed(r)
        pairs.append(linear())
    fit_replicas(pairs, x, y, epochs=12, batch_size=16, optimizer=factory, seed=0)
    rows = replicas(factory)
    assert len(rows) == 3 and [row for _, row in rows] == [0, 1, 2]
    for r in range(3):
        pyro.set_rng_seed(r)
        alone = Recorded(SWAGCollector(start=6, rank=3, steps_per_epoch=4, optimizer=Optim("sgd", 0.02)))
        fit_replicas([linear()], x, y, epochs=12, batch_size=16, optimizer=alone, seed=0)
        moments, row = rows[r]
        torch.testing.assert_close(moments.mean[0][row], alone.made[0].swag.mean[0][0], rtol=1e-4, atol=1e-5)


class BatchNormNet(nn.Module):
    """Linear(3, 4), BatchNorm1d(4), ReLU, Linear(4, 1)."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 1))

    def forward(self, x):
        return self.net(x)


def batchnorm(m: int = 0):
    model = BayesianNetwork(BatchNormNet(), Gaussian(0.3), num_data=N)
    return model, PointGuide(model)


def test_batchnorm_statistics_are_recomputed_for_each_draw(regression):
    """Each draw's running mean and variance are the mean and (unbiased) variance over the training rows of the first
    layer's output under that draw's weights; the BatchNorm's own weight and bias are sampled with the rest; the
    predictive replays each draw with its own state (the network written out by hand)."""
    x, y = regression
    pyro.set_rng_seed(0)
    model, guide = batchnorm()
    result = fit_swag(model, guide, x, y, start=4, rank=3, num_samples=5, **OPTIONS)
    assert set(result.state) == {"net.net.1.weight", "net.net.1.bias", "net.net.1.running_mean",
                                 "net.net.1.running_var", "net.net.1.num_batches_tracked"}
    assert result.batchnorm and result.state["net.net.1.weight"].shape == (1, 5, 4)
    for s in range(5):
        hidden = x @ result.draws["net.net.0.weight"][0, s].T + result.draws["net.net.0.bias"][0, s]
        torch.testing.assert_close(result.state["net.net.1.running_mean"][0, s], hidden.mean(0))
        torch.testing.assert_close(result.state["net.net.1.running_var"][0, s], hidden.var(0), rtol=1e-4, atol=1e-6)
    posterior = result.guide()
    assert isinstance(posterior, StatefulDraws)
    means = predict(model, posterior, x[:7], num_samples=5)["mean"]
    by_hand = []
    for s in range(5):
        draw = {name: value[0, s] for name, value in {**result.draws, **result.state}.items()}
        hidden = x[:7] @ draw["net.net.0.weight"].T + draw["net.net.0.bias"]
        hidden = (hidden - draw["net.net.1.running_mean"]) / (draw["net.net.1.running_var"] + 1e-5).sqrt()
        hidden = torch.relu(hidden * draw["net.net.1.weight"] + draw["net.net.1.bias"])
        by_hand.append(hidden @ draw["net.net.3.weight"].T + draw["net.net.3.bias"])
    torch.testing.assert_close(means, torch.stack(by_hand).mean(0), rtol=1e-4, atol=1e-5)


def test_swa_schedule_is_maddox_et_als():
    schedule = swa_schedule(10, 0.2)
    assert [round(schedule(e), 4) for e in range(12)] == [1, 1, 1, 1, 1, 1, 0.8, 0.6, 0.4, 0.2, 0.2, 0.2]
    assert swa_schedule(0, 0.2)(0) == pytest.approx(0.2)


@pytest.mark.parametrize("options, message", [
    (dict(rank=0), r"rank \(K, the deviations kept\) must be at least 2"),
    (dict(rank=1), "must be at least 2"),
    (dict(start=12), "start 12 is at or after the last epoch"),
    (dict(start=20), "start 20 is at or after the last epoch"),
    (dict(start=11), "leaves one epoch of the 12"),
    (dict(checkpoint=Checkpoint("never-written.pt", resume=True)), "cannot be resumed"),
    (dict(members=2), "needs make_member"),
])
def test_bad_settings_are_one_line_before_anything_trains(regression, options, message):
    x, y = regression
    model, guide = linear()
    before = {k: v.clone() for k, v in guide.state_dict().items()}
    with pytest.raises(ValueError, match=message) as error:
        fit_swag(model, guide, x, y, **{"start": 4, "rank": 5, "num_samples": 2, **OPTIONS, **options})
    assert "\n" not in str(error.value)
    assert all(torch.equal(before[k], v) for k, v in guide.state_dict().items())


def test_a_learning_rate_that_diverges_stops_and_says_so_and_other_guides_are_refused(regression):
    x, y = regression
    with pytest.raises(TrainingDiverged, match="Lower the learning rate"):
        fit_swag(*linear(), x, y, start=4, rank=5, num_samples=2, **{**OPTIONS, "optimizer": Optim("sgd", 1e3)})
    model = linear()[0]
    with pytest.raises(ValueError, match="NormalGuide is no point estimate"):
        fit_swag(model, NormalGuide(model), x, y, start=4, rank=5, num_samples=2, **OPTIONS)
