"""
NUTS on a small network, and its diagnostics
============================================

The exact posterior of a small network, as a reference for the variational methods: ``sample_posterior`` runs
NUTS with all chains in one batched pass of the network, started at the MAP estimate (``map_steps``), and reports
split R-hat and bulk ESS on the weights and on the predictions (weight-space R-hat is inflated by a network's
symmetries, so the predictions are what to check). On y = x³ with 30 training points, a 1-50-1 network.

Two settings make the chains mix here (as on UCI Boston, on the results page): the prior scales with each layer's
fan-in (N(0, 2/fan-in) on the weights, ``GaussianPrior(scale=1.41, fan_in=True)``; the command line's
``--prior.fan-in --prior.scale 1.41``), and every chain starts at the MAP estimate, 2,000 full-batch Adam steps
(``map_steps=2000``; ``--map-steps 2000``). A longer warm-up is not what helps: with an N(0, 1) prior and chains
started at random weights, 1,000 warm-up steps left Boston's chains unmixed.

The output on this page is from its CI size (``PYROBNN_TUTORIAL_SIZE=ci``: 4 chains of 200 warm-up steps and 200
draws, trees of depth at most 6); its running time is at the foot of the page. Run the script without it for the
full size (8 chains of 500 + 1,000, depth 10).
"""

# %%
import os

import matplotlib.pyplot as plt
import pyro
import torch

from pyrobnn import (
    BayesianNetwork,
    Gaussian,
    GaussianPrior,
    predict,
    sample_posterior,
)
from pyrobnn.data import cubic
from pyrobnn.networks import MLP

CI = os.environ.get("PYROBNN_TUTORIAL_SIZE") == "ci"
SAMPLES, WARMUP, CHAINS, DEPTH = (200, 200, 4, 6) if CI else (1000, 500, 8, 10)

data = cubic(n_train=30, n_test=200)
x_mean, x_std = data.x_train.mean(), data.x_train.std()
y_mean, y_std = data.y_train.mean(), data.y_train.std()
x, y = (data.x_train - x_mean) / x_std, (data.y_train - y_mean) / y_std

pyro.set_rng_seed(0)
# N(0, 2/fan-in) on the weights, N(0, 1) on the biases
prior = GaussianPrior(scale=1.41, fan_in=True, bias_scale=1.0)
model = BayesianNetwork(
    MLP(1, (50,), 1), Gaussian(scale=float(3 / y_std)), prior=prior, num_data=len(x)
)
result = sample_posterior(
    model,
    x,
    y,
    num_samples=SAMPLES,
    warmup=WARMUP,
    num_chains=CHAINS,
    map_steps=2000,
    max_tree_depth=DEPTH,
)

# %%
# The diagnostics. On the predictions (the network's output at training inputs, which
# the hidden units' permutations leave unchanged): R-hat near 1 and a bulk ESS of
# hundreds say the chains agree. On the weights R-hat stays above 1: the chains sit
# in one basin of a posterior with many equivalent ones, so weight-space R-hat is not
# the check for a network (the sampler's warnings say so when it is large).
# Divergences after warm-up would mean the step size is too large for the posterior's
# curvature.
d = result.diagnostics
print(
    f"predictions: R-hat max {d['prediction_r_hat_max']:.3f}, "
    f"bulk ESS min {d['prediction_ess_min']:.0f}"
)
print(
    f"weights:     R-hat max {d['r_hat_max']:.2f}, bulk ESS min {d['ess_min']:.1f}"
)
print(
    f"divergences after warm-up: {d['divergences']}; "
    f"leapfrog steps a draw: {d['leapfrog_steps']:.0f}; "
    f"{d['seconds']:.1f} s of sampling"
)
print("warnings:", "; ".join(d["warnings"]) or "none")

# The page's claim, checked as it runs: the chains mix in function space.
assert d["prediction_r_hat_max"] < 1.05, d["prediction_r_hat_max"]
assert d["prediction_ess_min"] > 100, d["prediction_ess_min"]

# %%
# The posterior predictive: each draw of the chains is one network;
# ``result.guide()`` is an empirical guide that ``predict`` and ``evaluate`` take as
# they take a variational one.
posterior = result.guide()
grid = torch.linspace(-6, 6, 200).unsqueeze(-1)
out = predict(model, posterior, (grid - x_mean) / x_std, num_samples=len(posterior))
mean = out["mean"].squeeze(-1) * y_std + y_mean
std = out["std"].squeeze(-1) * y_std
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.fill_between(
    grid.squeeze(-1), mean - 2 * std, mean + 2 * std, alpha=0.3, label="±2 s.d."
)
ax.plot(grid, mean, label="NUTS predictive mean")
ax.plot(grid, grid**3, "k--", lw=1, label="y = x³")
ax.scatter(data.x_train, data.y_train, c="k", s=10, label="training points")
ax.set_ylim(-150, 150)
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()
