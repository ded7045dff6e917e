"""Deep ensembles (``pyrobnn.infer.ensemble``, ``pyrobnn train --ensemble M``): members are the MAP fits of their own
seeds, their predictive is the average of the members' softmax (computed here by hand with plain torch networks), the
command line writes draws that ``pyrobnn evaluate`` reads back with the same numbers, and networks whose members would
need their own deterministic state are refused."""

from __future__ import annotations

import json

import pyro
import pytest
import torch
from torch import nn

from pyrobnn import BayesianNetwork, NormalGuide, PointGuide, fit, predict
from pyrobnn.checkpoint import load_checkpoint
from pyrobnn.data import load_dataset
from pyrobnn.guides.point import point_values
from pyrobnn.infer.ensemble import fit_ensemble, member_checkpoint
from pyrobnn.model.likelihoods import Gaussian
from pyrobnn.networks import MLP
from tests.support import MOONS, error_line, run_cli

OPTIONS = dict(epochs=4, batch_size=25, progress=False)


@pytest.fixture(scope="module")
def moons():
    return load_dataset("two-moons", train_size=100, test_size=60, seed=0)


def member(m=0):
    model = BayesianNetwork(MLP(2, (16,), 2), num_data=100)
    return model, PointGuide(model)


def ensemble(moons, members=3, seed=5):
    pyro.set_rng_seed(seed)
    model, guide = member()
    return fit_ensemble(model, guide, moons.x_train, moons.y_train, members=members, make_member=member, seed=seed,
                        **OPTIONS)


def test_members_are_the_map_fits_of_their_own_seeds(moons):
    result = ensemble(moons)
    assert len(result) == 3 and len(result.histories) == 3 and len(result.epochs) == 3 * OPTIONS["epochs"]
    assert [record["member"] for record in result.epochs] == [m for m in range(3) for _ in range(OPTIONS["epochs"])]
    for m in range(3):  # member m is exactly one fit from seed 5 + m
        pyro.set_rng_seed(5 + m)
        model, guide = member()
        fit(model, guide, moons.x_train, moons.y_train, seed=5 + m, **OPTIONS)
        for name, value in point_values(guide).items():
            assert torch.equal(result.draws[name][m, 0], value), (m, name)
    weights = result.draws["net.1.weight"][:, 0]
    assert not torch.allclose(weights[0], weights[1]) and not torch.allclose(weights[1], weights[2])


def test_the_predictive_is_the_average_of_the_members_softmax(moons):
    result = ensemble(moons)
    probs = predict(result.model, result.guide(), moons.x_test, num_samples=len(result))["probs"]
    by_hand = []
    for m in range(len(result)):  # each member as a plain torch network, its weights loaded by name
        net = MLP(2, (16,), 2)
        net.load_state_dict({name.removeprefix("net."): value[m, 0] for name, value in result.draws.items()})
        by_hand.append(net(moons.x_test).softmax(-1))
    torch.testing.assert_close(probs, torch.stack(by_hand).mean(0))
    single = predict(result.model, result.guide(), moons.x_test, num_samples=1)["probs"]
    assert not torch.allclose(single, probs)  # one member alone predicts otherwise


def test_the_same_seed_gives_the_same_ensemble(moons):
    first, second = ensemble(moons, members=2), ensemble(moons, members=2)
    assert all(torch.equal(first.draws[k], second.draws[k]) for k in first.draws)


def test_member_checkpoints_sit_beside_member_zeros(tmp_path):
    assert member_checkpoint(tmp_path / "checkpoint.pt", 0) == tmp_path / "checkpoint.pt"
    assert member_checkpoint(tmp_path / "checkpoint.pt", 2) == tmp_path / "checkpoint-member2.pt"


def test_deterministic_state_and_guides_without_point_values_are_refused(moons):
    bn = BayesianNetwork(nn.Sequential(nn.Linear(2, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2)), num_data=100)
    with pytest.raises(ValueError, match=r"trained deterministic state \(net.1.weight, net.1.bias, net.1.running_mean"):
        fit_ensemble(bn, PointGuide(bn), moons.x_train, moons.y_train, members=2, make_member=member, **OPTIONS)
    noisy = BayesianNetwork(MLP(2, (4,), 1), Gaussian(0.1, learn_scale=True), num_data=100)
    with pytest.raises(ValueError, match="likelihood.log_scale"):
        fit_ensemble(noisy, PointGuide(noisy), moons.x_train, moons.y_train.float()[:, None], members=2,
                     make_member=member, **OPTIONS)
    model = member()[0]
    with pytest.raises(ValueError, match="NormalGuide is no point estimate"):
        fit_ensemble(model, NormalGuide(model), moons.x_train, moons.y_train, members=2, make_member=member,
                     **OPTIONS)
    with pytest.raises(ValueError, match="members"):
        fit_ensemble(*member(), moons.x_train, moons.y_train, members=0, make_member=member, **OPTIONS)


@pytest.fixture(scope="module")
def ensemble_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ensemble") / "run"
    assert run_cli(["train", *MOONS, "--epochs", 3, "--lr", 0.01, "--guide", "point", "--ensemble", 2, "--seed", 4,
                    "--out", out]) == 0
    return out


def test_cli_ensemble_writes_members_and_draws_that_evaluate_reads_back(ensemble_run, tmp_path, capsys):
    assert {path.name for path in ensemble_run.iterdir()} >= {"checkpoint.pt", "checkpoint-member1.pt", "draws.pt",
                                                               "metrics.json"}
    report = json.loads((ensemble_run / "metrics.json").read_text())
    assert report["ensemble"] == {"members": 2} and [r["member"] for r in report["history"]] == [0, 0, 0, 1, 1, 1]
    state = load_checkpoint(ensemble_run / "draws.pt")
    assert state["kind"] == "ensemble" and state["draws"]["net.1.weight"].shape == (2, 1, 8, 2)
    for m, name in enumerate(("checkpoint.pt", "checkpoint-member1.pt")):  # draw m is member m's MAP fit
        member_state = load_checkpoint(ensemble_run / name)["guide"]
        assert torch.equal(state["draws"]["net.1.weight"][m, 0], member_state["locs.net.1.weight_unconstrained"])
    assert_evaluate_reproduces(ensemble_run, "ensemble", 2, tmp_path, capsys)


def assert_evaluate_reproduces(run, kind: str, draws: int, tmp_path, capsys) -> None:
    """``pyrobnn evaluate`` of the run's draws.pt reports the test metrics ``train`` wrote, every draw once."""
    out = tmp_path / "eval.json"
    capsys.readouterr()
    assert run_cli(["evaluate", "--checkpoint", run / "draws.pt", "--json", out, "--no-progress"]) == 0
    payload = json.loads(out.read_text())
    assert payload["num_samples"] == draws
    assert payload["test"] == json.loads((run / "metrics.json").read_text())["test"]
    assert f"({kind}, {draws} draws)" in " ".join(capsys.readouterr().out.split())


def test_cli_ensemble_resumed_when_finished_trains_nothing_and_gives_the_same_draws(ensemble_run, tmp_path):
    again = tmp_path / "again"
    again.mkdir()
    for name in ("checkpoint.pt", "checkpoint-member1.pt"):
        (again / name).write_bytes((ensemble_run / name).read_bytes())
    assert run_cli(["train", *MOONS, "--epochs", 3, "--lr", 0.01, "--guide", "point", "--ensemble", 2, "--seed", 4,
                    "--out", again, "--resume"]) == 0
    first, second = (load_checkpoint(run / "draws.pt")["draws"] for run in (ensemble_run, again))
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_prune_refuses_draws_in_one_line(ensemble_run, capsys):
    assert run_cli(["prune", "--checkpoint", ensemble_run / "draws.pt", "--method", "snr"]) == 2
    assert "the members of a deep ensemble" in error_line(capsys)
