"""The contracts written down: a guide family that leaves out its methods cannot be built, an objective and an
optimizer factory are recognised by their Protocols, a callback that reads the model is set up once, a joint
posterior's factors are recognised as such, and an optimiser that perturbs its parameters is stepped around a draw."""

from __future__ import annotations

import contextlib

import pytest
import torch

from pyrobnn import BayesianNetwork, MeanFieldELBO, NormalGuide, PointGuide
from pyrobnn.distributions import JointFactor
from pyrobnn.guides import SiteGuide
from pyrobnn.infer.elbo import Objective
from pyrobnn.infer.optim import Optim, OptimizerFactory, PerturbingOptimizer, ScheduledFactory, StepDecay, schedule_of
from pyrobnn.infer.svi import ModelCallback, fit
from pyrobnn.model import Gaussian
from pyrobnn.networks import MLP


def test_a_guide_family_without_its_methods_cannot_be_built():
    class Incomplete(SiteGuide):
        def setup_site(self, site, loc):
            self.add_param(site.name, "locs", loc)

    with pytest.raises(TypeError, match="abstract method.*get_posterior"):
        Incomplete(BayesianNetwork(MLP(2, (3,), 2), num_data=4))


def test_objectives_and_optimizer_factories_are_recognised_by_their_protocols():
    assert isinstance(MeanFieldELBO(), Objective) and not isinstance(torch.nn.MSELoss(), Objective)
    with pytest.raises(TypeError, match="Objective"):
        fit(BayesianNetwork(MLP(2, (3,), 2)), PointGuide(BayesianNetwork(MLP(2, (3,), 2))), torch.zeros(4, 2),
            torch.zeros(4, dtype=torch.long), elbo=torch.nn.MSELoss(), progress=False)
    scheduled = Optim(schedule=StepDecay(2, 0.5), warmup_steps=3)
    assert isinstance(scheduled, ScheduledFactory) and schedule_of(scheduled) == (StepDecay(2, 0.5), 3)

    def plain(model, guide):
        return torch.optim.SGD(guide.parameters(), lr=0.1)

    assert isinstance(plain, OptimizerFactory) and schedule_of(plain) == (None, 0)


def test_a_model_callback_is_set_up_once_before_the_first_epoch():
    calls = []

    class Recording:
        def setup(self, model, guide):
            calls.append(("setup", type(guide).__name__))

        def __call__(self, epoch, record):
            calls.append(("epoch", epoch))

    assert isinstance(Recording(), ModelCallback)
    model = BayesianNetwork(MLP(2, (3,), 2), num_data=8)
    fit(model, PointGuide(model), torch.randn(8, 2), torch.randint(0, 2, (8,)), epochs=2, batch_size=4,
        on_epoch_end=Recording(), progress=False)
    assert calls == [("setup", "PointGuide"), ("epoch", 0), ("epoch", 1)]


def test_the_factors_of_a_joint_normal_are_joint_factors():
    model = BayesianNetwork(MLP(2, (3,), 2), num_data=4)
    guide = NormalGuide(model)
    guide(torch.zeros(1, 2))
    site = model.sites()[0]
    factor = guide.joint_posterior().factors()[0].base_dist
    assert isinstance(factor, JointFactor) and factor.joint.variance(factor.index).shape == site.shape
    assert not isinstance(torch.distributions.Normal(0.0, 1.0), JointFactor)


def test_a_perturbing_optimizer_is_stepped_on_the_gradient_at_its_draw():
    """An optimiser with ``sampled_params`` gets the loss's gradient computed at the perturbed parameters. Here it
    moves the one weight w to w + 1 for the step; the MAP loss of y = 2 at x = 1 (unit noise, N(0, 1) prior) is
    (w - 2)^2 / 2 + w^2 / 2, whose gradient at the draw is 2 (w + 1) - 2 = 2 w, not 2 w - 2 at the mean."""

    class Shifted(torch.optim.SGD):
        def __init__(self, params):
            super().__init__(params, lr=0.0)
            self.seen = []

        @contextlib.contextmanager
        def sampled_params(self, train=False):
            params = [p for group in self.param_groups for p in group["params"]]
            with torch.no_grad():
                for p in params:
                    p.add_(1.0)
            yield
            with torch.no_grad():
                for p in params:
                    p.sub_(1.0)
            self.seen += [p.grad.clone() for p in params]

    made = []

    def factory(model, guide):
        made.append(Shifted(list(guide.parameters())))
        return made[-1]

    model = BayesianNetwork(torch.nn.Linear(1, 1, bias=False), Gaussian(scale=1.0), num_data=1)
    guide = PointGuide(model)
    fit(model, guide, torch.ones(1, 1), torch.full((1, 1), 2.0), epochs=1, batch_size=1, optimizer=factory,
        compile="none", progress=False)
    assert isinstance(made[0], PerturbingOptimizer)
    w = next(iter(guide.parameters())).detach()
    torch.testing.assert_close(made[0].seen[0], 2 * w)
