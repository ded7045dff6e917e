"""
The implicit BNN: node latents instead of weight posteriors
===========================================================

Trinh et al. (2020, 2022) keep every weight a point estimate and put the uncertainty on the nodes: each layer's
inputs are multiplied by a latent z ~ N(1, s²) (:class:`~pyrobnn.NodePrior`), whose posterior is a mixture of K
Gaussians (:class:`~pyrobnn.MixtureNodeGuide`); row r of a batch uses component r mod K. Two arguments change from
Bayes by Backprop: the prior and the guide. On y = x³ (Hernández-Lobato & Adams, 2015) with a 1-100-100-1 network,
mean-field BBB against the implicit BNN, both tested on [-6, 6], beyond the training range [-4, 4].

The output on this page is from its CI size (``PYROBNN_TUTORIAL_SIZE=ci``: 1,000 full-batch epochs); its running
time is at the foot of the page. Run the script without it for the full size (2,000 epochs).
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
    MeanFieldELBO,
    MixtureNodeGuide,
    NodePrior,
    NormalGuide,
    Optim,
    evaluate,
    fit,
    predict,
)
from pyrobnn.data import cubic
from pyrobnn.infer import LinearWarmup
from pyrobnn.networks import MLP

CI = os.environ.get("PYROBNN_TUTORIAL_SIZE") == "ci"
EPOCHS = 1000 if CI else 2000

data = cubic(n_train=30, n_test=300)
y_mean, y_std = data.y_train.mean(), data.y_train.std()
y = (data.y_train - y_mean) / y_std
x = data.x_train / 4
noise = Gaussian(scale=float(3 / y_std))  # the data's noise, N(0, 3²), standardised

METHODS = {
    "BBB (weights)": (GaussianPrior(), lambda m: NormalGuide(m, init_rho=-5.0)),
    "implicit BNN (nodes, K = 4)": (
        NodePrior(0.3),
        lambda m: MixtureNodeGuide(m, num_components=4),
    ),
}
fits = {}
for name, (prior, make_guide) in METHODS.items():
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    model = BayesianNetwork(
        MLP(1, (100, 100), 1), noise, prior=prior, num_data=len(x)
    )
    guide = make_guide(model)
    fit(
        model,
        guide,
        x,
        y,
        epochs=EPOCHS,
        batch_size=len(x),
        elbo=MeanFieldELBO(4, vectorize_particles=True, estimator="local"),
        optimizer=Optim(lr=1e-2),
        beta=LinearWarmup(anneal=EPOCHS // 2),
        progress=False,
    )
    metrics = evaluate(
        model,
        guide,
        data.x_test / 4,
        (data.y_test - y_mean) / y_std,
        num_samples=100,
        target_scale=(y_mean, y_std),
    )
    print(
        f"{name:28s} test log-likelihood on [-6, 6]: {metrics['log_likelihood']:.2f}"
    )
    fits[name] = (model, guide)

# %%
# The predictive bands, and for each method the mean of ±2 standard deviations inside
# the training range [-4, 4] and outside it, printed under the figure: a posterior
# that knows where it has no data widens outside. How much it widens decides the
# log-likelihood on [-6, 6] printed above: the wider band pays less for the points
# beyond the data, the narrower one fits the points inside the range more tightly.
grid = torch.linspace(-6, 6, 200).unsqueeze(-1)
inside = grid.squeeze(-1).abs() <= 4
train_rmse, bands = {}, {}
fig, axes = plt.subplots(1, 2, figsize=(10, 3.5), sharey=True)
for ax, (name, (model, guide)) in zip(axes, fits.items()):
    out = predict(model, guide, grid / 4, num_samples=100)
    mean = out["mean"].squeeze(-1) * y_std + y_mean
    std = out["std"].squeeze(-1) * y_std
    ax.fill_between(grid.squeeze(-1), mean - 2 * std, mean + 2 * std, alpha=0.3)
    ax.plot(grid, mean)
    ax.plot(grid, grid**3, "k--", lw=1)
    ax.scatter(data.x_train, data.y_train, c="k", s=10)
    ax.set_title(name)
    ax.set_ylim(-200, 200)
    bands[name] = (float(2 * std[inside].mean()), float(2 * std[~inside].mean()))
    train_rmse[name] = float(
        evaluate(model, guide, x, y, num_samples=100, target_scale=(y_mean, y_std))[
            "rmse"
        ]
    )
    print(
        f"{name:28s} ±2 sd: {bands[name][0]:.1f} inside [-4, 4], "
        f"{bands[name][1]:.1f} outside; "
        f"RMSE on the training points {train_rmse[name]:.1f} (the noise's s.d. is 3)"
    )
fig.tight_layout()
plt.show()

# The page's claims, checked as it runs: both fit the 30 points, and both bands widen
# outside the training range.
for name, (width_inside, width_outside) in bands.items():
    assert train_rmse[name] < 10, (name, train_rmse[name])
    assert width_outside > 1.5 * width_inside, (name, width_inside, width_outside)
