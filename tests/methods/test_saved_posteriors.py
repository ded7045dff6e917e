"""A saved posterior predicts as the fitted one did: it keeps its number of predictive draws; and predicting with a
Pyro autoguide that has not met its model is one clear error."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from pyro.infer.autoguide import AutoNormal
from torch import nn

import pyrobnn
from pyrobnn.methods import METHODS, load_posterior


def data():
    generator = torch.Generator().manual_seed(0)
    return torch.randn(32, 4, generator=generator), torch.randint(0, 3, (32,), generator=generator)


def network():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


@pytest.mark.parametrize("name", ["bbb", "ensemble-5"])
def test_a_posterior_keeps_its_number_of_predictive_draws_across_save_and_load(name, tmp_path):
    x, y = data()
    method = dataclasses.replace(METHODS[name], num_samples=7, batch_size=16,
                                 **({"members": 2} if name.startswith("ensemble") else {}))
    posterior = method.fit(network(), x, y, epochs=1)
    posterior.num_samples = 7 if posterior.kind == "variational" else 1
    posterior.save(tmp_path / "posterior.pt")
    fresh = method.build(network(), num_data=len(x))
    guide = fresh[1] if posterior.kind == "variational" else None
    loaded = load_posterior(tmp_path / "posterior.pt", fresh[0], guide)
    assert loaded.num_samples == posterior.num_samples
    assert load_posterior(tmp_path / "posterior.pt", fresh[0], guide, num_samples=2).num_samples == 2


def test_predicting_with_an_autoguide_that_never_met_its_model_is_one_clear_error():
    model = pyrobnn.BayesianNetwork(nn.Linear(4, 3), num_data=10)
    with pytest.raises(ValueError, match="AutoNormal has not met the model yet.*train it first"):
        pyrobnn.predict(model, AutoNormal(model), torch.randn(5, 4), num_samples=3)
