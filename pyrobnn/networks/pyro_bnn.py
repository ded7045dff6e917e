"""The README's "Your own Pyro model": a Bayesian network written as Pyro's tutorials write one.

Not a plain network for :class:`~pyrobnn.BayesianNetwork` but a whole Pyro model: ``PyroModule[nn.Linear]``
layers 1-H-1 (ReLU) whose ``weight`` and ``bias`` are ``PyroSample`` priors :math:`\\mathcal N(0, s^2)`, a noise
scale :math:`\\sigma \\sim \\mathrm{LogNormal}(-1, 0.5)` and the observation
:math:`y_n \\sim \\mathcal N(f(x_n), \\sigma^2)` under ``pyro.plate("data", ...)``. pyrobnn reads it by tracing
(:class:`~pyrobnn.model.TracedModel`); ``examples/pyro_model.py``, ``benchmarks/pyro_model.py`` and
``tests/model/test_pyro_model.py`` use it as a user's model.
"""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import torch.nn.functional as F
from pyro.nn import PyroModule, PyroSample
from torch import nn

__all__ = ["PyroBNN"]


class PyroBNN(PyroModule):
    """``PyroBNN(hidden, prior_scale)(x, y)``: the regression network above, ``x`` of shape ``(N, 1)``, ``y`` of
    shape ``(N,)``; returns the mean ``f(x)``."""

    def __init__(self, hidden=32, prior_scale=1.0):
        super().__init__()
        self.layer1 = PyroModule[nn.Linear](1, hidden)
        self.layer1.weight = PyroSample(dist.Normal(0., prior_scale).expand([hidden, 1]).to_event(2))
        self.layer1.bias = PyroSample(dist.Normal(0., prior_scale).expand([hidden]).to_event(1))
        self.layer2 = PyroModule[nn.Linear](hidden, 1)
        self.layer2.weight = PyroSample(dist.Normal(0., prior_scale).expand([1, hidden]).to_event(2))
        self.layer2.bias = PyroSample(dist.Normal(0., prior_scale).expand([1]).to_event(1))

    def forward(self, x, y=None):
        mu = self.layer2(F.relu(self.layer1(x))).squeeze(-1)
        sigma = pyro.sample("sigma", dist.LogNormal(-1., 0.5))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Normal(mu, sigma), obs=y)
        return mu
