"""IVON through the new door: pyrobnn's IVON optimiser (written in place) takes the authors' steps (ivon-opt's
``ivon.IVON`` in their README's training loop on the mean loss) step for step, its posterior's standard deviation is
theirs, and its name works on the command line and in studies."""

from __future__ import annotations

import json

import pytest
import torch

from pyrobnn import BayesianNetwork, PointGuide
from pyrobnn.infer.ivon import IVONOptimizer
from pyrobnn.methods import IVON, METHODS
from pyrobnn.methods.ivon import IVONResult
from pyrobnn.model import Gaussian
from pyrobnn.studies.cells import make_cell
from tests.support import MOONS, run_cli

ivon = pytest.importorskip("ivon")

N, STEPS, NOISE = 40, 6, 0.5


def _data():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(N, 3, generator=generator)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5]]) + 0.3 + NOISE * torch.randn(N, 1, generator=generator)
    return x, y


def test_ivon_is_the_authors_optimizer_on_the_mean_loss_step_for_step():
    """The authors' loop (their README): ``with optimizer.sampled_params(train=True)``, the mean loss's gradient,
    ``optimizer.step()``, at ess = N; pyrobnn's IVON on the same data, one full batch a step, draws the same noise
    (the global RNG seeded alike) and must end at the same mean and the same posterior standard deviation."""
    x, y = _data()
    torch.manual_seed(0)
    linear = torch.nn.Linear(3, 1)
    start = {name: value.detach().clone() for name, value in linear.state_dict().items()}
    authors = ivon.IVON(linear.parameters(), lr=0.05, ess=N, hess_init=0.5, weight_decay=1e-2)
    torch.manual_seed(7)
    for _ in range(STEPS):
        with authors.sampled_params(train=True):
            authors.zero_grad()
            mean_nll = 0.5 * ((linear(x) - y) / NOISE).square().mean()  # -log N(y; f, NOISE^2) up to a constant
            mean_nll.backward()
        authors.step()

    net = torch.nn.Linear(3, 1)
    net.load_state_dict(start)
    model = BayesianNetwork(net, Gaussian(scale=NOISE), num_data=N)
    guide = PointGuide(model)
    method = IVON(lr=0.05, hess_init=0.5, weight_decay=1e-2, batch_size=N, num_samples=4)
    from pyrobnn.infer.iterates import Recorded
    from pyrobnn.infer.svi import fit

    factory = Recorded(method.optimizer_factory(STEPS))
    torch.manual_seed(7)
    fit(model, guide, x, y, epochs=STEPS, batch_size=N, optimizer=factory, beta=method.beta, seed=7, compile="none",
        progress=False)
    ours = [p.detach() for p in guide.parameters()]
    torch.testing.assert_close(ours[0], linear.weight.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours[1], linear.bias.detach(), rtol=1e-5, atol=1e-6)
    ours_optimizer = factory.made[-1]
    assert isinstance(ours_optimizer, IVONOptimizer) and not isinstance(ours_optimizer, ivon.IVON)
    result = IVONResult.of(model, guide, ours_optimizer, 4, seed=0)
    theirs = 1.0 / (authors.param_groups[0]["ess"] * (authors.param_groups[0]["hess"]
                                                     + authors.param_groups[0]["weight_decay"])).sqrt()
    torch.testing.assert_close(torch.cat([result.std[name].flatten() for name in result.std]), theirs, rtol=1e-5,
                               atol=1e-7)


def test_ivon_trains_from_the_command_line_and_writes_its_draws(tmp_path):
    out = tmp_path / "run"
    assert run_cli(["train", *MOONS, "--method", "ivon", "--epochs", 3, "--out", out]) == 0
    report = json.loads((out / "metrics.json").read_text())
    assert report["ivon"]["draws"] == 5 and report["ivon"]["ess"] == 100.0  # MOONS' --num-samples 5
    assert 0 < report["test"]["nll"] < 1
    assert report["config"]["method"] == "ivon" and report["history"][-1]["lr"] == pytest.approx(0.1)
    eval_json = tmp_path / "eval.json"
    assert run_cli(["evaluate", "--checkpoint", out / "draws.pt", "--json", eval_json, "--no-progress"]) == 0
    assert json.loads(eval_json.read_text())["test"] == report["test"]


def test_ivon_is_a_study_cell_and_a_rate_in_the_base_reaches_it():
    base = ["--dataset", "two-moons", "--train-size", "64", "--lr", "0.003"]
    cell = make_cell(base, {"method": "ivon"}, {"seed": 0}, "method=ivon")
    assert cell.command == "train" and cell.argv.count("--lr") == 1  # the rate the user wrote reaches IVON
    assert make_cell(base, {"method": "map"}, {"seed": 0}, "method=map").argv.count("--lr") == 1
    assert METHODS["ivon"].lr == 0.1
