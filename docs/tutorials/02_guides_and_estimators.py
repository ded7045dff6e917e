"""
Swapping guides and estimators
==============================

A method is a prior, a guide (the posterior family q) and an estimator (how a training step draws from q). In
pyrobnn each is one argument: the same network, the same ``fit`` and ``evaluate``, and the method changes. Here on
two moons (200 training points): Bayes by Backprop under weight sampling, local reparameterization and flipout; MC
dropout; sparse variational dropout; and the MAP baseline.

The output on this page is from its CI size (``PYROBNN_TUTORIAL_SIZE=ci``: fewer predictive draws and a coarser
grid, the same training); its running time is at the foot of the page. Run the script without it for the full size.
"""

# %%
import os

import matplotlib.pyplot as plt
import pyro
import torch

from pyrobnn import (
    AdditiveDropoutGuide,
    BayesianNetwork,
    DropoutGuide,
    GaussianPrior,
    LogUniformPrior,
    MeanFieldELBO,
    NormalGuide,
    Optim,
    PointGuide,
    evaluate,
    fit,
    predict,
)
from pyrobnn.analysis.prune import log_alpha_masks, sparsity
from pyrobnn.data import two_moons
from pyrobnn.infer import LinearWarmup
from pyrobnn.networks import MLP

CI = os.environ.get("PYROBNN_TUTORIAL_SIZE") == "ci"
EPOCHS = 200  # 400 steps of 100 points at either size
SAMPLES, GRID = (50, 40) if CI else (200, 80)
data = two_moons(n=1200, n_train=200)

# %%
# One line per method: the prior, the guide built on the model, and the estimator
# (MAP draws nothing). A guide is built on the model it approximates; ``fit`` draws
# ``num_particles`` weight samples per step in one pass. The KL is ramped in over the
# first half of the run (``LinearWarmup``): sparse variational dropout needs it (see
# the gotchas page), and it costs the others nothing.
METHODS = {
    "BBB, weight sampling": (
        GaussianPrior(),
        lambda m: NormalGuide(m, init_rho=-4.0),
        "sample",
    ),
    "BBB, local reparameterization": (
        GaussianPrior(),
        lambda m: NormalGuide(m, init_rho=-4.0),
        "local",
    ),
    "BBB, flipout": (
        GaussianPrior(),
        lambda m: NormalGuide(m, init_rho=-4.0),
        "flipout",
    ),
    "MC dropout": (GaussianPrior(), lambda m: DropoutGuide(m, rate=0.1), "local"),
    "sparse variational dropout": (LogUniformPrior(), AdditiveDropoutGuide, "local"),
    "MAP": (GaussianPrior(), PointGuide, None),
}

results, fits = {}, {}
for name, (prior, make_guide, estimator) in METHODS.items():
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    model = BayesianNetwork(
        MLP(2, (32, 32), 2), prior=prior, num_data=len(data.x_train)
    )
    guide = make_guide(model)
    fit(
        model,
        guide,
        data.x_train,
        data.y_train,
        epochs=EPOCHS,
        batch_size=100,
        elbo=MeanFieldELBO(
            4 if estimator else 1,
            vectorize_particles=True,
            estimator=estimator or "sample",
        ),
        optimizer=Optim(lr=1e-2),
        beta=LinearWarmup(anneal=EPOCHS // 2),
        progress=False,
    )
    results[name] = evaluate(
        model, guide, data.x_test, data.y_test, num_samples=SAMPLES
    )
    fits[name] = (model, guide)

# %%
# Away from the data a Bayesian posterior should be unsure: its draws disagree there.
# The epistemic part of the predictive uncertainty (the mutual information between
# the prediction and the weights, in nats) is averaged over the points of the plane
# farther than 1 from every training point; a point estimate (MAP) has none.
grid = torch.stack(
    torch.meshgrid(
        torch.linspace(-2, 3, GRID), torch.linspace(-1.5, 2, GRID), indexing="xy"
    ),
    -1,
)
points = grid.reshape(-1, 2)
far = torch.cdist(points, data.x_train).min(-1).values > 1.0
predictions = {
    name: predict(model, guide, points, num_samples=SAMPLES)
    for name, (model, guide) in fits.items()
}
far_epistemic = {
    name: float(out["epistemic"][far].mean()) for name, out in predictions.items()
}

print(
    f"{'method':32s} {'accuracy':>9s} {'NLL':>7s} {'ECE':>7s} "
    f"{'epistemic far from the data':>28s}"
)
for name, m in results.items():
    print(
        f"{name:32s} {m['accuracy']:9.3f} {m['nll']:7.3f} {m['ece']:7.3f} "
        f"{far_epistemic[name]:28.3f}"
    )
pruned = sparsity(log_alpha_masks(fits["sparse variational dropout"][1]))["total"]
print(
    f"sparse variational dropout: {pruned:.1%} of the weights have log alpha > 3 "
    "(prunable)"
)

# The page's claims, checked as it runs: every method fits the moons; every posterior
# with a spread (BBB under each estimator, MC dropout) is less sure away from the
# data than MAP, which has no spread; sparse variational dropout marks most weights
# as prunable.
assert pruned > 0.5, pruned
assert all(m["accuracy"] >= 0.9 for m in results.values()), {
    k: m["accuracy"] for k, m in results.items()
}
assert far_epistemic["MAP"] < 1e-4, far_epistemic["MAP"]
for name in [
    "BBB, weight sampling",
    "BBB, local reparameterization",
    "BBB, flipout",
    "MC dropout",
]:
    assert far_epistemic[name] > 0.05, (name, far_epistemic[name])

# %%
# The predictive probability of the lower moon over the plane, one panel a method:
# every method draws the same boundary through the data; away from it the sampled
# posteriors fade towards 0.5 where MAP stays sure.
fig, axes = plt.subplots(2, 3, figsize=(10, 6), sharex=True, sharey=True)
for ax, (name, out) in zip(axes.flat, predictions.items()):
    ax.contourf(
        grid[..., 0],
        grid[..., 1],
        out["probs"][:, 1].reshape(GRID, GRID),
        levels=20,
        cmap="RdBu_r",
        vmin=0,
        vmax=1,
    )
    ax.scatter(
        *data.x_train.T,
        c=data.y_train,
        cmap="RdBu_r",
        edgecolors="w",
        linewidths=0.8,
        s=12,
    )
    ax.set_title(name, fontsize=9)
fig.tight_layout()
plt.show()

# %%
# The epistemic uncertainty itself, on one colour scale for all six: zero for MAP;
# for the methods with a weight posterior it is where their draws disagree on the
# class, away from the training points and most along the boundary's extension.
top = max(float(out["epistemic"].max()) for out in predictions.values())
levels = torch.linspace(0, top, 21).numpy()
fig, axes = plt.subplots(2, 3, figsize=(10, 6), sharex=True, sharey=True)
for ax, (name, out) in zip(axes.flat, predictions.items()):
    image = ax.contourf(
        grid[..., 0],
        grid[..., 1],
        out["epistemic"].reshape(GRID, GRID),
        levels=levels,
        cmap="viridis",
    )
    ax.scatter(*data.x_train.T, c="w", s=4)
    ax.set_title(name, fontsize=9)
fig.colorbar(image, ax=axes, label="epistemic uncertainty (nats)")
plt.show()
