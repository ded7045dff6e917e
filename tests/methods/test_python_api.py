"""Every method of the registry from Python, in a few lines: it trains a small network and returns a posterior that
predicts, evaluates, draws, saves and loads back to the same predictions."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pyrobnn.data import load_dataset
from pyrobnn.methods import METHODS, NUTS, EmpiricalPosterior, Posterior, load_posterior
from pyrobnn.networks import MLP
from tests.support import ADAPTER_METHODS

SMALL = {"nuts": dict(num_samples=12, warmup=12), "ensemble-5": dict(members=2), "multiswag-5": dict(members=2),
         "map-ts": dict(held_out=0.25)}
"""Settings that keep a method's test to a second or two (the registry's are the papers')."""


@pytest.fixture(scope="module")
def moons():
    return load_dataset("two-moons", train_size=64, test_size=32, seed=0)


@pytest.mark.parametrize("name", sorted(set(METHODS) - ADAPTER_METHODS))
def test_each_method_trains_a_small_network_and_its_posterior_predicts_draws_saves_and_loads(name, moons, tmp_path):
    method = dataclasses.replace(METHODS[name], **SMALL.get(name, {}))
    posterior = method.fit(MLP(2, (4,) if isinstance(method, NUTS) else (8,), 2), moons.x_train, moons.y_train,
                           epochs=4, seed=1)
    probs = posterior.predict(moons.x_test)["probs"]
    assert probs.shape == (32, 2) and torch.allclose(probs.sum(-1), torch.ones(32))
    metrics = posterior.evaluate(moons.x_test, moons.y_test)
    assert 0 <= metrics["accuracy"] <= 1 and metrics["nll"] > 0 and 0 <= metrics["ece"] <= 1
    sites = {site.name: site.shape for site in posterior.model.sites()}
    draws = posterior.draw(3)
    assert {k: tuple(v.shape) for k, v in draws.items() if k in sites} == {k: (3, *s) for k, s in sites.items()}
    assert type(posterior) is Posterior.KINDS.get(posterior.kind, EmpiricalPosterior)  # its own kind's class
    posterior.save(tmp_path / "posterior.pt")
    fresh = dataclasses.replace(method).build(MLP(2, (4,) if isinstance(method, NUTS) else (8,), 2),
                                               num_data=len(moons.x_train))
    loaded = load_posterior(tmp_path / "posterior.pt", *fresh, num_samples=posterior.num_samples)
    assert loaded.kind == posterior.kind and type(getattr(loaded, "result", None)) is type(getattr(posterior, "result",
                                                                                                   None))
    loaded.save(tmp_path / "again.pt")  # a reloaded posterior saves as its kind
    assert load_posterior(tmp_path / "again.pt", *fresh).kind == posterior.kind
    torch.manual_seed(0)
    again = loaded.predict(moons.x_test)["probs"]
    torch.manual_seed(0)
    torch.testing.assert_close(again, posterior.predict(moons.x_test)["probs"])


def test_the_same_seed_gives_the_same_posterior(moons):
    first, second = (METHODS["swag"].fit(lambda: MLP(2, (8,), 2), moons.x_train, moons.y_train, epochs=4, seed=3)
                     for _ in range(2))
    for name, value in first.draw().items():
        torch.testing.assert_close(value, second.draw()[name])


def test_a_network_function_builds_each_member_and_a_module_is_copied_and_reinitialised(moons):
    method = dataclasses.replace(METHODS["ensemble-5"], members=3)
    built = method.fit(lambda: MLP(2, (8,), 2), moons.x_train, moons.y_train, epochs=2, seed=0)
    copied = method.fit(MLP(2, (8,), 2), moons.x_train, moons.y_train, epochs=2, seed=0)
    for posterior in (built, copied):
        weights = next(iter(posterior.draw().values()))
        assert len(weights) == 3 and not torch.allclose(weights[0], weights[1])  # three initialisations
