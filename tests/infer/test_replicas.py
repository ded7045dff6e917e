"""Stacked training (``pyrobnn.infer.replicas.fit_replicas``): R networks of one architecture trained as one, each as
``fit`` trains it alone (exactly for a deterministic step, in distribution for a stochastic one)."""

from __future__ import annotations

import pyro
import pytest
import torch

from pyrobnn import BayesianNetwork, DropoutGuide, NormalGuide, PointGuide, ScaleMixturePrior, fit
from pyrobnn.cli.grid import replica_groups
from pyrobnn.infer import step as step_module
from pyrobnn.infer.elbo import MeanFieldELBO
from pyrobnn.infer.optim import Optim
from pyrobnn.infer.replicas import fit_replicas
from pyrobnn.infer.step import tensors
from pyrobnn.infer.svi import TrainingDiverged
from pyrobnn.model.likelihoods import Gaussian
from pyrobnn.networks import MLP

OPTIONS = dict(epochs=4, batch_size=32, optimizer=Optim(lr=0.02), seed=3, device="cpu")


def _data(rows=70):
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(rows, 5, generator=generator)
    return x, x[:, :1].sin() + 0.1 * torch.randn(rows, 1, generator=generator)


def _pair(guide: str, seed: int, scale: float = 0.5, hidden: int = 16):
    torch.manual_seed(seed)
    model = BayesianNetwork(MLP(5, (hidden,), 1), Gaussian(scale=scale),
                            prior=ScaleMixturePrior() if guide == "normal-mixture" else None)
    if guide == "point":
        return model, PointGuide(model)
    if guide == "dropout":
        return model, DropoutGuide(model, rate=0.1)
    return model, NormalGuide(model, init_rho=-3.0)


def _values(pair) -> list[torch.Tensor]:
    return [t.detach().clone() for t in tensors(*pair)]


def test_a_deterministic_step_trains_each_replica_as_fit_trains_it_alone():
    # different initialisations and noise scales (a buffer of the likelihood, an input of the stacked step)
    x, y = _data()
    settings = [(0, 0.5), (1, 0.5), (2, 0.2)]
    pyro.clear_param_store()
    alone = []
    for seed, scale in settings:
        pair = _pair("point", seed, scale)
        history = fit(*pair, x, y, **OPTIONS, elbo=MeanFieldELBO(estimator="sample"), progress=False)
        alone.append((_values(pair), history))
    pyro.clear_param_store()
    stacked_pairs = [_pair("point", seed, scale) for seed, scale in settings]
    histories = fit_replicas(stacked_pairs, x, y, **OPTIONS, elbo=MeanFieldELBO(estimator="sample"))
    assert len(histories) == 3
    for pair, history, (values, reference) in zip(stacked_pairs, histories, alone):
        for got, want in zip(_values(pair), values):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        for got, want in zip(history.epochs, reference.epochs):
            assert got["loss"] == pytest.approx(want["loss"], rel=1e-4)
            assert got["kl"] == pytest.approx(want["kl"], rel=1e-4)
            assert got["beta"] == want["beta"] and got["lr"] == want["lr"]
    assert histories[0].last["loss"] != pytest.approx(histories[2].last["loss"], rel=1e-3)  # the scales differ


@pytest.mark.parametrize("guide,estimator,num_particles", [
    ("normal", "sample", 2), ("normal-mixture", "sample", 1), ("normal", "local", 1), ("dropout", "local", 1)])
def test_replicas_of_one_initialisation_draw_their_own_noise_and_train_alike(guide, estimator, num_particles):
    # each replica's loss stays that of a lone fit (a gradient applied to the wrong replica's slice, as a fused
    # optimiser does with a gradient laid out unlike its parameter, made the second replica diverge 10^6-fold)
    x, y = _data(140)
    options = {**OPTIONS, "epochs": 15,
               "elbo": MeanFieldELBO(num_particles, vectorize_particles=True, estimator=estimator)}
    pyro.clear_param_store()
    alone = fit(*_pair(guide, 0), x, y, **options, progress=False).last["loss"]
    pyro.clear_param_store()
    pairs = [_pair(guide, 0) for _ in range(3)]
    start = _values(pairs[0])
    histories = fit_replicas(pairs, x, y, **options)
    losses = [history.last["loss"] for history in histories]
    for loss in losses:
        assert loss == pytest.approx(alone, rel=0.5), (losses, alone)  # one epoch's draws: within noise
    moved = [max(float((a - b).abs().max()) for a, b in zip(_values(pair), start)) for pair in pairs]
    assert min(moved) > 1e-3  # every replica's own modules hold its trained values
    first, second = _values(pairs[0]), _values(pairs[1])
    assert any(not torch.equal(a, b) for a, b in zip(first, second))  # own draws: the replicas part


def test_the_pairs_must_be_replicas_of_one_network():
    x, y = _data()
    with pytest.raises(ValueError, match=r"pairs\[1\] is not a replica of pairs\[0\]"):
        fit_replicas([_pair("point", 0), _pair("point", 0, hidden=8)], x, y, **OPTIONS)
    with pytest.raises(ValueError, match="at least one"):
        fit_replicas([], x, y, **OPTIONS)


def test_a_diverging_replica_stops_training_and_is_named():
    x, y = _data()
    y_bad = y.clone()
    pairs = [_pair("point", 0), _pair("point", 1, scale=1e-30)]  # log-likelihood overflows to -inf
    with pytest.raises(TrainingDiverged, match="replica 1: loss became"):
        fit_replicas(pairs, x, y_bad, **OPTIONS, elbo=MeanFieldELBO(estimator="sample"))


def test_a_step_that_cannot_be_recorded_trains_the_replicas_one_after_another(monkeypatch):
    x, y = _data()
    pyro.clear_param_store()
    reference = [fit(*_pair("point", s), x, y, **OPTIONS, elbo=MeanFieldELBO(estimator="sample"), compile="trace",
                     progress=False)
                 for s in (0, 1)]

    def unrecordable(*args, **kwargs):
        raise RuntimeError("a value read on the host")

    monkeypatch.setattr(step_module, "record", unrecordable)
    pyro.clear_param_store()
    histories = fit_replicas([_pair("point", s) for s in (0, 1)], x, y, **OPTIONS,
                             elbo=MeanFieldELBO(estimator="sample"))
    assert [h.last["loss"] for h in histories] == [h.last["loss"] for h in reference]


def test_grid_points_that_differ_only_in_the_noise_precision_share_a_stack():
    points = [{"guide.rate": r, "tau": t} for r in ("0.01", "0.05") for t in ("0.1", "0.2", "0.3")]
    assert replica_groups(points) == [[0, 1, 2], [3, 4, 5]]
    assert replica_groups([{"lr": "0.1"}, {"lr": "0.2"}]) == [[0], [1]]
    assert replica_groups([{"likelihood.scale": "0.1"}, {"likelihood.scale": "0.2"}]) == [[0, 1]]


def test_an_autoguide_is_refused_its_replicas_would_share_the_param_store():
    from pyro.infer.autoguide import AutoNormal

    x, y = _data()
    model, _ = _pair("point", 0)
    with pytest.raises(ValueError, match=r"pairs\[0\]: fit_replicas trains a BayesianNetwork with a pyrobnn guide"):
        fit_replicas([(model, AutoNormal(model)), (model, AutoNormal(model))], x, y, **OPTIONS)
