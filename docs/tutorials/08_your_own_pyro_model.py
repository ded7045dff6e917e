"""
Your own Pyro model
===================

A Bayesian network already written in Pyro, the way Pyro's tutorials write one, works as it is: no
``BayesianNetwork``, no change to the model. pyrobnn reads it by tracing it once, as Pyro's autoguides do
(:class:`~pyrobnn.model.TracedModel`): its ``PyroSample`` weights get the guide's posterior family, any other latent
(the noise scale ``sigma``) a mean-field Normal of its unconstrained space, and the estimators act on its
``nn.Linear`` layers. The model below is :class:`pyrobnn.networks.PyroBNN`, written out.

The output on this page is from its CI size (``PYROBNN_TUTORIAL_SIZE=ci``: 1,000 steps); its running time is at the
foot of the page. Run the script without it for the full size (3,000 steps).
"""

# %%
import os

import matplotlib.pyplot as plt
import pyro
import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pyro.infer import SVI
from pyro.infer.autoguide import AutoNormal
from pyro.nn import PyroModule, PyroSample
from torch import nn

from pyrobnn import (
    MeanFieldELBO,
    NormalGuide,
    evaluate,
    local_reparameterization,
    predict,
)
from pyrobnn.data import sinusoid


class BNN(PyroModule):
    def __init__(self, hidden=32, prior_scale=1.0):
        super().__init__()
        self.layer1 = PyroModule[nn.Linear](1, hidden)
        self.layer1.weight = PyroSample(
            dist.Normal(0.0, prior_scale).expand([hidden, 1]).to_event(2)
        )
        self.layer1.bias = PyroSample(
            dist.Normal(0.0, prior_scale).expand([hidden]).to_event(1)
        )
        self.layer2 = PyroModule[nn.Linear](hidden, 1)
        self.layer2.weight = PyroSample(
            dist.Normal(0.0, prior_scale).expand([1, hidden]).to_event(2)
        )
        self.layer2.bias = PyroSample(
            dist.Normal(0.0, prior_scale).expand([1]).to_event(1)
        )

    def forward(self, x, y=None):
        mu = self.layer2(F.relu(self.layer1(x))).squeeze(-1)
        sigma = pyro.sample("sigma", dist.LogNormal(-1.0, 0.5))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Normal(mu, sigma), obs=y)
        return mu


# %%
# Blundell et al.'s sinusoid: 200 training points on [0, 0.5], inputs and targets
# standardised on them. (With 40 points the KL of these 97 weights against their N(0,
# 1) prior outweighs the data: the posterior stays near its prior, and its test error
# near the training mean's; see "The KL at small N" on the gotchas page.)
CI = os.environ.get("PYROBNN_TUTORIAL_SIZE") == "ci"
STEPS = 1000 if CI else 3000
data = sinusoid(n=700, n_train=200)
x_mean, x_std = data.x_train.mean(), data.x_train.std()
y_mean, y_std = data.y_train.mean(), data.y_train.std()
x, y = (data.x_train - x_mean) / x_std, ((data.y_train - y_mean) / y_std).squeeze(-1)
x_test, y_test = (
    (data.x_test - x_mean) / x_std,
    ((data.y_test - y_mean) / y_std).squeeze(-1),
)
print(
    f"predicting the training mean: test RMSE "
    f"{float(y_test.pow(2).mean().sqrt()):.3f} (standardised)"
)

# %%
# Pyro's loop, pyrobnn's guide and estimator: ``NormalGuide(model)`` on the model as
# it is, local reparameterization on its PyroSample weights. Pyro's own
# ``AutoNormal`` trains under the same handler.
fits = {}
for name, make_guide in {
    "NormalGuide": lambda m: NormalGuide(m, init_rho=-4.0),
    "AutoNormal (Pyro's)": lambda m: AutoNormal(m, init_scale=0.01),
}.items():
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    model = BNN()
    guide = make_guide(model)
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 1e-2}), loss=MeanFieldELBO())
    for step in range(STEPS):
        with local_reparameterization():
            svi.step(x, y)
    metrics = evaluate(model, guide, x_test, y_test, num_samples=100)
    print(
        f"{name:20s} RMSE {metrics['rmse']:.3f}  "
        f"log-likelihood {metrics['log_likelihood']:.3f} (standardised)"
    )
    fits[name] = (model, guide)
    # The page's claim, checked as it runs: the model as written trains, to well
    # under the training mean's error.
    assert metrics["rmse"] < 0.5 * float(y_test.pow(2).mean().sqrt()), (
        name,
        metrics["rmse"],
    )

# %%
# The predictive of each, on the training range and beyond it.
grid = torch.linspace(-0.2, 0.8, 200).unsqueeze(-1)
fig, axes = plt.subplots(1, 2, figsize=(10, 3.5), sharey=True)
for ax, (name, (model, guide)) in zip(axes, fits.items()):
    out = predict(model, guide, (grid - x_mean) / x_std, num_samples=100)
    mean, std = out["mean"].squeeze(-1), out["std"].squeeze(-1)
    ax.fill_between(grid.squeeze(-1), mean - 2 * std, mean + 2 * std, alpha=0.3)
    ax.plot(grid, mean)
    ax.scatter(data.x_train, y, c="k", s=6)
    ax.set_title(name)
fig.tight_layout()
plt.show()

# %%
# ``fit``, ``evaluate``, ``predict_moments`` and ``sample_posterior`` (NUTS) take the
# model the same way; ``examples/pyro_model.py`` compares three guides, two
# estimators and NUTS on it.
