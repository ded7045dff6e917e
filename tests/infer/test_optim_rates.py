"""Per-example learning rates and weight decay: ``Optim`` and the CLI's ``--optimizer sgd --lr 0.05`` on the summed
ELBO take the steps a paper's SGD (or Adam) takes on the mean loss."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pyrobnn.cli import main
from pyrobnn.infer.optim import (
    GuideRateOptim,
    Optim,
    TwoGroupSGD,
    per_example_rate,
    split_parameters,
    summed_loss_group,
    summed_loss_rates,
    trained_parameters,
)

N = 64


class Regression(nn.Module):
    """A softmax regression holding ``num_data`` as a BayesianNetwork does; its loss sums over the examples."""

    def __init__(self, num_data=N):
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(5, 3).double()
        self.num_data = num_data


def data():
    generator = torch.Generator().manual_seed(1)
    return torch.randn(N, 5, generator=generator, dtype=torch.float64), torch.randint(0, 3, (N,), generator=generator)


def train(factory, steps=4):
    """``steps`` full-batch steps of ``factory(model, guide)`` on the summed cross-entropy; the parameters."""
    model, (x, y) = Regression(), data()
    optim = factory(model, nn.Module())
    for _ in range(steps):
        optim.zero_grad()
        F.cross_entropy(model.linear(x), y, reduction="sum").backward()
        optim.step()
    return [p.detach() for p in model.parameters()]


def mean_loss_gradient(params, x, y, weight_decay):
    """The gradient of the mean cross-entropy plus the L2 term ``weight_decay * theta``, by autograd."""
    params = [p.detach().requires_grad_() for p in params]
    loss = F.cross_entropy(F.linear(x, *params), y)
    return [g + weight_decay * p.detach() for g, p in zip(torch.autograd.grad(loss, params), params)]


def test_sgd_on_the_summed_loss_takes_the_mean_loss_nesterov_step():
    lr, weight_decay, momentum, (x, y) = 0.3, 5e-3, 0.9, data()
    params, buffers = [p.detach().clone() for p in Regression().parameters()], None
    for _ in range(4):  # Nesterov SGD by hand (Sutskever et al. 2013, torch's form): b = mu b + g, step g + mu b
        grads = mean_loss_gradient(params, x, y, weight_decay)
        buffers = grads if buffers is None else [momentum * b + g for b, g in zip(buffers, grads)]
        params = [p - lr * (g + momentum * b) for p, g, b in zip(params, grads, buffers)]
    got = train(Optim("sgd", lr, weight_decay))
    for expected, actual in zip(params, got):
        torch.testing.assert_close(actual, expected, rtol=1e-10, atol=1e-12)
    assert not torch.allclose(got[0], Regression().linear.weight.detach())  # the step moved the weights


def test_adam_on_the_summed_loss_takes_the_mean_loss_step_with_its_weight_decay():
    lr, weight_decay, (beta1, beta2), eps, (x, y) = 0.05, 0.1, (0.9, 0.999), 1e-8, data()
    params = [p.detach().clone() for p in Regression().parameters()]
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    for t in range(1, 5):  # Adam by hand (Kingma & Ba 2015), L2 in the gradient, eps / N as the sum divides it
        grads = mean_loss_gradient(params, x, y, weight_decay)
        m = [beta1 * a + (1 - beta1) * g for a, g in zip(m, grads)]
        v = [beta2 * b + (1 - beta2) * g**2 for b, g in zip(v, grads)]
        params = [p - lr * (a / (1 - beta1**t)) / ((b / (1 - beta2**t)).sqrt() + eps / N)
                  for p, a, b in zip(params, m, v)]
    got = train(Optim("adam", lr, weight_decay))
    for expected, actual in zip(params, got):
        torch.testing.assert_close(actual, expected, rtol=1e-10, atol=1e-12)
    unscaled = train(lambda model, guide: torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay))
    assert not torch.allclose(unscaled[0], params[0], rtol=1e-3)  # the decay would be N times too weak


def test_summed_loss_rates_of_each_optimiser():
    assert summed_loss_rates("sgd", 0.05, 5e-4, 50_000) == pytest.approx((1e-6, 25.0))
    assert summed_loss_rates("adam", 1e-3, 5e-4, 50_000) == pytest.approx((1e-3, 25.0))
    assert summed_loss_rates("adam", 1e-3, 0.0, None) == (1e-3, 0.0)  # nothing to scale: N is not needed
    sgd, adam = summed_loss_group("sgd", 0.05, 5e-4, 50_000), summed_loss_group("adam", 1e-3, 5e-4, 50_000)
    assert (sgd["lr"], sgd["weight_decay"], sgd["rate_scale"]) == pytest.approx((1e-6, 25.0, 50_000))
    assert (adam["lr"], adam["weight_decay"], adam["rate_scale"]) == pytest.approx((1e-3, 25.0, 1.0))


def test_parameters_are_split_between_the_network_and_the_guide_each_once():
    model, guide = Regression(), nn.Linear(2, 2)
    model.head = guide  # a parameter both hold (a guide registered in the model) is the guide's, and counted once
    ids = [id(p) for p in trained_parameters(model, guide)]
    assert ids == [id(guide.weight), id(guide.bias), id(model.linear.weight), id(model.linear.bias)]
    network, variational = split_parameters(model, guide)
    assert [id(p) for p in network] == [id(model.linear.weight), id(model.linear.bias)]
    assert [id(p) for p in variational] == [id(guide.weight), id(guide.bias)]


def test_every_factory_shares_the_scaling():
    model = Regression(num_data=100)
    (group,) = Optim("sgd", 0.05, 5e-4)(model, nn.Module()).param_groups
    assert (group["lr"], group["weight_decay"]) == pytest.approx((5e-4, 0.05))
    assert group["momentum"] == 0.9 and group["nesterov"]
    guide = nn.Linear(2, 2)
    network, variational = GuideRateOptim("sgd", 0.05, 5e-4, factor=10.0)(model, guide).param_groups
    assert (network["lr"], variational["lr"]) == pytest.approx((5e-4, 5e-3))
    assert network["weight_decay"] == variational["weight_decay"] == pytest.approx(0.05)
    deterministic, mixture = TwoGroupSGD(0.05, 1.2, 5e-4)(model, guide).param_groups
    assert (deterministic["lr"], deterministic["weight_decay"], mixture["lr"]) == pytest.approx((5e-4, 0.05, 0.012))
    # the history, the epoch line and the divergence message read the rates back in the units they were given
    assert [per_example_rate(g) for g in (group, network, variational, deterministic, mixture)] == pytest.approx(
        [0.05, 0.05, 0.5, 0.05, 1.2])


@pytest.mark.parametrize("num_data", [None, 0, 2.5, True])
def test_a_missing_training_set_size_is_one_clear_error(num_data):
    model = Regression(num_data=num_data)
    for factory in (Optim("sgd", 0.05), Optim("adam", weight_decay=1e-4), GuideRateOptim("sgd", factor=2.0)):
        with pytest.raises(ValueError, match=r"num_data=N \(fit sets it\), got num_data="):
            factory(model, nn.Module())
    Optim("adam")(model, nn.Module())  # Adam without decay does not need N


@pytest.mark.recorded
def test_cli_sgd_at_a_papers_rate_trains(tmp_path, data_root):
    """``--optimizer sgd --lr 0.05 --weight-decay 5e-4`` (a paper's recipe) on 1,000 MNIST digits: 1000x that
    step on the summed loss diverges; the per-example step learns."""
    if not (data_root / "MNIST" / "raw").is_dir():
        pytest.skip(f"no MNIST under {data_root}")
    out = tmp_path / "run"
    main(["train", "--dataset", "mnist", "--data-root", str(data_root), "--train-size", "1000", "--test-size", "500",
          "--hidden", "32", "--method", "map", "--optimizer", "sgd", "--lr", "0.05", "--weight-decay", "5e-4",
          "--epochs", "2", "--batch-size", "32", "--no-progress", "--out", str(out)])
    metrics = json.loads((out / "metrics.json").read_text())
    losses = [record["loss"] for record in metrics["history"]]
    assert [record["lr"] for record in metrics["history"]] == pytest.approx([0.05, 0.05])  # as given, not 0.05 / N
    assert all(math.isfinite(loss) for loss in losses) and losses[-1] < losses[0]
    assert metrics["test"]["accuracy"] > 0.7  # chance: 0.1
