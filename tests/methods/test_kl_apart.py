"""The KL stepped apart from the likelihood (``Optim(kl_lr=...)``): Adam steps the likelihood's gradient alone and
plain SGD the β-weighted KL's, under every executor, as a hand-written loop does; for MAP under a Gaussian prior
that is decoupled weight decay."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pyrobnn import BayesianNetwork, NormalGuide, fit
from pyrobnn.guides import PointGuide
from pyrobnn.infer.optim import Optim, StepDecay, kl_step, make_scheduler, splits_kl
from pyrobnn.infer.schedules import Constant
from pyrobnn.infer.step import SplitGradients, Step
from pyrobnn.model import GaussianPrior

N, SCALE, LR, KL_LR = 32, 0.5, 0.05, 2.0


def data():
    generator = torch.Generator().manual_seed(1)
    return torch.randn(N, 5, generator=generator, dtype=torch.float64), torch.randint(0, 3, (N,), generator=generator)


def map_model():
    torch.manual_seed(0)
    model = BayesianNetwork(nn.Linear(5, 3).double(), prior=GaussianPrior(scale=SCALE), num_data=N)
    return model, PointGuide(model)


def by_hand(steps: int) -> list[torch.Tensor]:
    """Adam (Kingma & Ba 2015, eps / N as on the summed loss) on the summed log-likelihood's gradient, then SGD at
    ``KL_LR / N`` on the prior's, ``theta / SCALE^2`` at the step's start: decoupled weight decay."""
    torch.manual_seed(0)
    layer = nn.Linear(5, 3).double()
    params = [layer.weight.detach().clone(), layer.bias.detach().clone()]
    (x, y), (beta1, beta2), eps = data(), (0.9, 0.999), 1e-8
    m, v = [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]
    for t in range(1, steps + 1):
        leaves = [p.clone().requires_grad_() for p in params]
        grads = torch.autograd.grad(F.cross_entropy(F.linear(x, *leaves), y, reduction="sum"), leaves)
        m = [beta1 * a + (1 - beta1) * g for a, g in zip(m, grads)]
        v = [beta2 * b + (1 - beta2) * g**2 for b, g in zip(v, grads)]
        adam = [p - LR * (a / (1 - beta1**t)) / ((b / (1 - beta2**t)).sqrt() + eps)
                for p, a, b in zip(params, m, v)]
        params = [q - KL_LR / N * p / SCALE**2 for q, p in zip(adam, params)]
    return params


@pytest.mark.parametrize("compile", ["none", "trace"])
def test_map_with_the_kl_apart_is_adam_on_the_likelihood_and_decoupled_weight_decay(compile):
    model, guide = map_model()
    x, y = data()
    history = fit(model, guide, x, y, epochs=3, batch_size=N, optimizer=Optim("adam", LR, kl_lr=KL_LR),
                  beta=Constant(), compile=compile, progress=False)
    assert history.compile == compile
    for actual, expected in zip(guide.median().values(), by_hand(3)):
        torch.testing.assert_close(actual.detach(), expected, rtol=1e-9, atol=1e-11)
    in_the_loss = map_model()
    fit(*in_the_loss, x, y, epochs=3, batch_size=N, optimizer=Optim("adam", LR), beta=Constant(), compile=compile,
        progress=False)
    assert not torch.allclose(next(iter(in_the_loss[1].median().values())), by_hand(3)[0], rtol=1e-3)


def test_every_executor_splits_a_variational_steps_gradient_alike():
    """A Bayes by Backprop step on the same draw: the likelihood's and the KL's gradients, eager and recorded."""
    x, y = (t.float() if t.is_floating_point() else t for t in data())
    parts = {}
    for compile in ("none", "trace"):
        torch.manual_seed(0)
        model = BayesianNetwork(nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3)), num_data=N)
        guide = NormalGuide(model, init_rho=-3.0)
        guide(x[:4], y[:4])
        step = Step(model, guide, compile=compile, split_kl=True)
        for _ in range(2):  # the second call replays the recording
            torch.manual_seed(1)
            terms, gradients = step(x, y, 0.5)
        assert isinstance(gradients, SplitGradients) and step.executor == compile
        parts[compile] = [[g.detach().clone() for _, g in part] for part in gradients]
    for eager, recorded in zip(parts["none"], parts["trace"]):
        assert len(eager) == len(recorded) > 0
        for a, b in zip(eager, recorded):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_the_kls_step_follows_the_likelihoods_schedule():
    model, guide = map_model()
    guide(*data())
    optim = Optim("adam", LR, kl_lr=KL_LR)(model, guide)
    make_scheduler(optim, StepDecay(1, 0.5))
    assert splits_kl(optim) and not splits_kl(Optim("adam", LR)(model, guide))
    param = optim.param_groups[0]["params"][0]
    before = param.detach().clone()
    optim.param_groups[0]["lr"] *= 0.5  # the schedule's second epoch, or half-way through a warm-up
    kl_step(optim, [(param, torch.ones_like(param))])
    torch.testing.assert_close(param.detach(), before - 0.5 * KL_LR / N)


def test_a_negative_kl_rate_is_one_clear_error():
    with pytest.raises(ValueError, match="kl_lr"):
        Optim(kl_lr=-1.0)
