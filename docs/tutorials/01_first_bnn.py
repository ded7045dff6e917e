"""
A first Bayesian neural network on MNIST
========================================

Bayes by Backprop (Blundell et al., 2015) on a 784-400-10 network, written as a plain Pyro SVI loop: a prior on
every weight (:class:`~pyrobnn.BayesianNetwork`), a posterior family (:class:`~pyrobnn.NormalGuide`), the
mean-field ELBO (:class:`~pyrobnn.MeanFieldELBO`) and Pyro's ``SVI``. Then the predictive: its accuracy, and how
its uncertainty separates the digits it gets right from those it gets wrong.

Run it as it is: ``python 01_first_bnn.py --data-root DIR`` (``DIR/MNIST/raw`` holds the four MNIST files; default
``$PYROBNN_DATA``, else ``~/.cache/pyrobnn/data``, downloaded there when missing).

The output on this page is from its CI size (``PYROBNN_TUTORIAL_SIZE=ci``: 2,000 training images, 4 epochs); its
running time is at the foot of the page. Run the script without it for the full size (10,000 images, 3 epochs).
"""

# %%
# The data and the size of the run -------------------------------- ``load_dataset``
# returns tensors: images as floats in [0, 1], labels as integers. The environment
# variable ``PYROBNN_TUTORIAL_SIZE=ci`` shrinks the run (the documentation's CI runs
# it so).
import argparse
import os

import matplotlib.pyplot as plt
import pyro
import torch
from pyro.infer import SVI

from pyrobnn import (
    BayesianNetwork,
    MeanFieldELBO,
    NormalGuide,
    ScaleMixturePrior,
    kl_annealing,
    predict,
)
from pyrobnn.data import load_dataset
from pyrobnn.networks import MLP

parser = argparse.ArgumentParser(
    description="A first Bayesian neural network on MNIST"
)
parser.add_argument(
    "--data-root",
    default=None,
    help="folder holding MNIST/ (default: $PYROBNN_DATA)",
)
args, _ = parser.parse_known_args()

CI = os.environ.get("PYROBNN_TUTORIAL_SIZE") == "ci"
TRAIN, TEST, EPOCHS = (2000, 500, 4) if CI else (10000, 10000, 3)

pyro.set_rng_seed(0)
data = load_dataset("mnist", args.data_root, train_size=TRAIN, test_size=TEST)
print(data.x_train.shape, data.y_train.shape, data.x_test.shape)

# %%
# The model, the guide, the loop ------------------------------ ``BayesianNetwork``
# puts Blundell's scale-mixture prior on every weight of a plain ``nn.Module``;
# ``NormalGuide`` is q(w) = N(μ, softplus(ρ)²), one (μ, ρ) per weight, μ starting at
# the network's weights. ``kl_annealing`` weighs the KL term only (β = 1 here: the
# exact ELBO, the likelihood scaled by N/B).
model = BayesianNetwork(
    MLP(784, (400,), 10), prior=ScaleMixturePrior(), num_data=len(data.x_train)
)
guide = NormalGuide(model)
svi = SVI(model, guide, pyro.optim.Adam({"lr": 1e-3}), loss=MeanFieldELBO())
for epoch in range(EPOCHS):
    losses = []
    for idx in torch.randperm(len(data.x_train)).split(128):
        with kl_annealing(beta=1.0):
            losses.append(svi.step(data.x_train[idx], data.y_train[idx]))
    # each step's loss estimates the full-data negative ELBO: their mean over N is
    # the loss per example (docs/conventions.rst); most of it is the KL of the
    # 318,010 weights divided by N
    print(
        f"epoch {epoch}: loss per example "
        f"{sum(losses) / len(losses) / len(data.x_train):.3f}"
    )

# %%
# The predictive -------------- ``predict`` averages the softmax over weight samples
# and splits the uncertainty: total (predictive entropy) = aleatoric (expected
# entropy) + epistemic (mutual information), in nats.
out = predict(model, guide, data.x_test, num_samples=20 if CI else 50)
correct = out["probs"].argmax(-1) == data.y_test
print(f"test accuracy {correct.float().mean():.4f}")
print(
    f"epistemic uncertainty: right {out['epistemic'][correct].mean():.4f}, "
    f"wrong {out['epistemic'][~correct].mean():.4f} nats"
)

# %%
# The digits a BNN is unsure of are mostly those it gets wrong: the mean predictive
# entropy of the misclassified test digits is well above that of the others.
right, wrong = (
    float(out["total"][correct].mean()),
    float(out["total"][~correct].mean()),
)
print(f"predictive entropy: right {right:.2f}, wrong {wrong:.2f} nats")

# The page's claims, checked as it runs: the BNN has learnt the digits, and it is
# less sure of those it gets wrong.
assert correct.float().mean() > 0.85, correct.float().mean()
assert wrong > 1.5 * right, (right, wrong)
fig, ax = plt.subplots(figsize=(6, 3.5))
bins = torch.linspace(0, float(out["total"].max()), 30)
ax.hist(
    out["total"][correct].numpy(),
    bins=bins.numpy(),
    alpha=0.7,
    density=True,
    label="right",
)
ax.hist(
    out["total"][~correct].numpy(),
    bins=bins.numpy(),
    alpha=0.7,
    density=True,
    label="wrong",
)
ax.set_xlabel("predictive entropy (nats)")
ax.set_ylabel("density")
ax.legend()
fig.tight_layout()
plt.show()
