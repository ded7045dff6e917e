"""SNGP through the door (Liu et al. 2020): its uncertainty grows away from the data where MAP's does not, its
equations (the bounded spectral norm, the Laplace precision, the mean-field predictive), its posterior saved and
read back as itself, and ``pyrobnn train --method sngp`` with its own options."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from torch import nn

from pyrobnn.data import load_dataset
from pyrobnn.guides.point import point_values
from pyrobnn.infer.laplace import last_layer_inputs, last_linear
from pyrobnn.methods import METHODS, SNGP, SNGPPosterior, load_posterior
from pyrobnn.methods.sngp import RandomFeatureGP, sngp_network
from pyrobnn.networks import MLP
from tests.support import MOONS, run_cli


@pytest.fixture(scope="module")
def moons():
    return load_dataset("two-moons", train_size=200, test_size=100, seed=0)


def far_points(x: torch.Tensor, distance: float = 3.0, count: int = 64) -> torch.Tensor:
    """``count`` points at ``distance`` from the nearest of ``x``, in directions spread around its centre."""
    angles = torch.arange(count) * (2 * math.pi / count)
    directions = torch.stack([angles.cos(), angles.sin()], 1)
    centre, points = x.mean(0), []
    for direction in directions:  # the nearest point's distance grows along a ray: bisect it to `distance`
        low, high = 0.0, 100.0
        for _ in range(60):
            mid = (low + high) / 2
            low, high = (mid, high) if torch.cdist((centre + mid * direction)[None], x).min() < distance else (low, mid)
        points.append(centre + high * direction)
    return torch.stack(points)


def entropy(probs: torch.Tensor) -> torch.Tensor:
    return -(probs * probs.clamp_min(1e-30).log()).sum(-1)


def test_its_predictive_entropy_3_units_from_the_data_exceeds_maps(moons):
    points = far_points(moons.x_train)
    assert torch.cdist(points, moons.x_train).amin(1) == pytest.approx(3.0, abs=1e-6)
    entropies, accuracies = {}, {}
    for name in ("map", "sngp"):
        method = dataclasses.replace(METHODS[name], batch_size=32)
        posterior = method.fit(lambda: MLP(2, (64, 64), 2), moons.x_train, moons.y_train, epochs=50, seed=0)
        entropies[name] = entropy(posterior.predict(points)["probs"]).mean().item()
        accuracies[name] = posterior.evaluate(moons.x_test, moons.y_test)["accuracy"]
    assert min(accuracies.values()) > 0.95, accuracies  # both fit the moons
    assert entropies["sngp"] > entropies["map"] + 0.3, entropies  # of log 2 = 0.69 at most


def test_the_spectral_bound_scales_a_larger_norm_down_to_c_and_keeps_a_smaller_one():
    torch.manual_seed(0)
    net = MLP(3, (3,), 2)
    with torch.no_grad():
        net[1].weight.copy_(torch.diag(torch.tensor([4.0, 1.0, 0.5])))
    sngp_network(net, SNGP(features=8, bound=2.0))
    net.eval()
    torch.testing.assert_close(torch.linalg.matrix_norm(net[1].weight, 2), torch.tensor(2.0))
    small = MLP(3, (3,), 2)
    with torch.no_grad():
        small[1].weight.copy_(torch.diag(torch.tensor([1.5, 1.0, 0.5])))
    kept = small[1].weight.detach().clone()
    sngp_network(small, SNGP(features=8, bound=2.0))
    small.eval()
    torch.testing.assert_close(small[1].weight, kept)
    assert isinstance(net[3], RandomFeatureGP) and net[3].output.weight.shape == (2, 8)


def test_the_precision_and_the_mean_field_predictive_are_the_papers_equations(moons):
    method = dataclasses.replace(METHODS["sngp"], batch_size=32, features=64, prior=dataclasses.replace(
        METHODS["sngp"].prior, scale=0.5))
    posterior = method.fit(lambda: MLP(2, (16,), 2), moons.x_train, moons.y_train, epochs=3, seed=0)
    model, guide = posterior.model, posterior.guide
    layer = next(m for m in model.modules() if isinstance(m, RandomFeatureGP))
    beta = point_values(guide)[last_linear(model)[1]["weight"]].double()
    phi = last_layer_inputs(model, guide, moons.x_train).double()
    p = (phi @ beta.T).softmax(-1).amax(-1)
    precision = 4.0 * torch.eye(64, dtype=torch.float64) + sum(  # ridge 1/s^2 = 4, then p(1-p) phi phi^T
        p[i] * (1 - p[i]) * torch.outer(phi[i], phi[i]) for i in range(len(phi)))
    torch.testing.assert_close(layer.precision.double(), precision, rtol=1e-5, atol=1e-5)
    phi_test = last_layer_inputs(model, guide, moons.x_test).double()
    variance = (phi_test @ torch.linalg.inv(precision) * phi_test).sum(-1)
    expected = ((phi_test @ beta.T) / (1 + math.pi / 8 * variance).sqrt()[:, None]).softmax(-1)
    torch.testing.assert_close(posterior.predict(moons.x_test)["probs"].double(), expected, rtol=1e-4, atol=1e-5)
    no_mean_field = dataclasses.replace(method, mean_field=0.0).fit(lambda: MLP(2, (16,), 2), moons.x_train,
                                                                    moons.y_train, epochs=3, seed=0)
    torch.testing.assert_close(no_mean_field.predict(moons.x_test)["probs"].double(), (phi_test @ beta.T).softmax(-1),
                               rtol=1e-4, atol=1e-5)  # lambda 0: the MAP logits of the same training


def test_its_posterior_saves_and_loads_back_as_itself(moons, tmp_path):
    method = dataclasses.replace(METHODS["sngp"], batch_size=32, features=32)
    posterior = method.fit(lambda: MLP(2, (8,), 2), moons.x_train, moons.y_train, epochs=2, seed=0)
    posterior.save(tmp_path / "sngp.pt")
    model, guide = method.build(MLP(2, (8,), 2), num_data=len(moons.x_train))  # other random features, reloaded
    loaded = load_posterior(tmp_path / "sngp.pt", model, guide)
    assert type(loaded) is SNGPPosterior and loaded.kind == "sngp"
    torch.testing.assert_close(loaded.predict(moons.x_test)["probs"], posterior.predict(moons.x_test)["probs"])
    assert loaded.evaluate(moons.x_test, moons.y_test) == posterior.evaluate(moons.x_test, moons.y_test)


def test_what_it_refuses_from_python():
    with pytest.raises(ValueError, match="point estimates"):
        dataclasses.replace(METHODS["sngp"], guide=METHODS["bbb"].guide)
    with pytest.raises(ValueError, match="prior.*Gaussian"):
        dataclasses.replace(METHODS["sngp"], prior=METHODS["bbb"].prior)
    with pytest.raises(ValueError, match="features"):
        SNGP(features=0)
    with pytest.raises(ValueError, match="changes a network's layers"):
        METHODS["sngp"].fit(METHODS["map"].build(nn.Sequential(nn.Linear(2, 2)))[0], torch.zeros(4, 2),
                            torch.zeros(4, dtype=torch.long))


def test_pyrobnn_train_method_sngp_runs_with_its_options_and_evaluate_reads_it_back(tmp_path, capsys):
    out = tmp_path / "run"
    assert run_cli(["train", *MOONS, "--method", "sngp", "--epochs", 3, "--sngp.features", 48, "--sngp.bound", 3,
                    "--out", out]) == 0
    report = json.loads((out / "metrics.json").read_text())
    options = report["config"]["method_options"]
    assert report["config"]["method"] == "sngp" and options["sngp_features"] == 48 and options["sngp_bound"] == 3
    assert 0 < report["test"]["nll"] < 1
    capsys.readouterr()
    eval_json = tmp_path / "eval.json"
    assert run_cli(["evaluate", "--checkpoint", out / "checkpoint.pt", "--json", eval_json, "--no-progress"]) == 0
    evaluated = json.loads(eval_json.read_text())["test"]
    for metric in ("accuracy", "nll", "ece", "brier"):  # the checkpoint carries the collected precision
        assert evaluated[metric] == pytest.approx(report["test"][metric], rel=1e-6), metric
    assert run_cli(["train", *MOONS, "--method", "map", "--sngp.bound", 3, "--out", tmp_path / "map"]) != 0
    assert "error: --sngp.bound sets SNGP's bound: it applies to --method sngp" in capsys.readouterr().err
