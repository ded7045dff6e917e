"""
NUTS on a small network, and its diagnostics
============================================

The exact posterior of a small network, as a reference for the variational methods: ``sample_posterior`` runs
NUTS with all chains in one batched pass of the network, started at the MAP estimate (``map_steps``), and reports
split R-hat and bulk ESS on the weights and on the predictions (weight-space R-hat is inflated by a network's
symmetries, so the predictions are what to check). On y = x³ with 30 training points, a 1-50-1 network.

The output on this page is from its CI size (``PYROBNN_TUTORIAL_SIZE=ci``, seconds to run); run the script
without it for the full size.
"""

# %%
import os

import matplotlib.pyplot as plt
import pyro
import torch

from pyrobnn import BayesianNetwork, Gaussian, GaussianPrior, predict, sample_posterior
from pyrobnn.data import cubic
from pyrobnn.networks import MLP

CI = os.environ.get("PYROBNN_TUTORIAL_SIZE") == "ci"
SAMPLES, WARMUP, CHAINS, DEPTH, MAP = (20, 20, 2, 4, 50) if CI else (500, 500, 4, 10, 500)

data = cubic(n_train=30, n_test=200)
x_mean, x_std = data.x_train.mean(), data.x_train.std()
y_mean, y_std = data.y_train.mean(), data.y_train.std()
x, y = (data.x_train - x_mean) / x_std, (data.y_train - y_mean) / y_std

pyro.set_rng_seed(0)
model = BayesianNetwork(MLP(1, (50,), 1), Gaussian(scale=float(3 / y_std)), prior=GaussianPrior(),
                        num_data=len(x))
result = sample_posterior(model, x, y, num_samples=SAMPLES, warmup=WARMUP, num_chains=CHAINS, map_steps=MAP,
                          max_tree_depth=DEPTH)

# %%
# The diagnostics: R-hat near 1 and a bulk ESS of hundreds on the predictions say the chains agree; divergences
# and warnings say when they do not. At the CI size this page runs (2 chains of 20 warm-up and 20 draws, trees of
# depth at most 4) they say the chains have NOT mixed: R-hat far above 1, an ESS near 1 and many divergences. That
# is what the diagnostics are for: do not use such draws; run the full size (4 chains of 500 + 500, depth 10).
d = result.diagnostics
for key in ["r_hat_max", "prediction_r_hat_max", "ess_min", "prediction_ess_min", "divergences", "seconds"]:
    print(f"{key:22s} {d.get(key)}")
print("warnings:", d["warnings"] or "none")

# %%
# The posterior predictive: each draw of the chains is one network; ``result.guide()`` is an empirical guide
# that ``predict`` and ``evaluate`` take as they take a variational one.
posterior = result.guide()
grid = torch.linspace(-6, 6, 200).unsqueeze(-1)
out = predict(model, posterior, (grid - x_mean) / x_std, num_samples=len(posterior))
mean = out["mean"].squeeze(-1) * y_std + y_mean
std = out["std"].squeeze(-1) * y_std
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.fill_between(grid.squeeze(-1), mean - 2 * std, mean + 2 * std, alpha=0.3, label="±2 s.d.")
ax.plot(grid, mean, label="NUTS predictive mean")
ax.plot(grid, grid ** 3, "k--", lw=1, label="y = x³")
ax.scatter(data.x_train, data.y_train, c="k", s=10, label="training points")
ax.set_ylim(-150, 150)
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()
