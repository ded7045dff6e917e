"""
SNGP: uncertainty that grows away from the data
===============================================

SNGP (Liu et al., NeurIPS 2020, *Simple and Principled Uncertainty Estimation with
Deterministic Deep Learning via Distance Awareness*) keeps one deterministic network
and makes it aware of how far an input lies from the training data: its hidden layers
are spectrally normalised, so that distances survive them, and its output layer is a
Gaussian process (random Fourier features of the last hidden layer) whose Laplace
variance is collected in the last epoch. Its predictive is one pass, the logits shrunk
by that variance, :math:`\\mathrm{softmax}(g(x) / \\sqrt{1 + \\pi\\sigma^2(x)/8})`.

Here SNGP and MAP, the same MLP trained the same way on two moons: both separate the
moons; far from them MAP stays certain and SNGP does not. ``METHODS["sngp"]`` is a
method like the others (``pyrobnn train --method sngp``, ``--vary method=map,sngp``),
and its posterior predicts, evaluates, saves and loads as theirs do
(``pyrobnn.methods.sngp``).
"""

# %%
import dataclasses
import math

import matplotlib.pyplot as plt
import torch

from pyrobnn.data import load_dataset
from pyrobnn.methods import METHODS
from pyrobnn.networks import MLP

data = load_dataset("two-moons", train_size=200, test_size=200, seed=0)
x, y = data.x_train, data.y_train

# %%
# Each method trains the MLP 2-64-64-2 for 50 epochs in batches of 32 (Adam at 1e-3,
# a N(0, 1) prior); SNGP's copy has its hidden layers spectrally normalised and its
# output layer a GP of 1,024 random Fourier features.
posteriors = {}
for name in ("map", "sngp"):
    method = dataclasses.replace(METHODS[name], batch_size=32)
    posteriors[name] = method.fit(
        lambda: MLP(2, (64, 64), 2), x, y, epochs=50, seed=0
    )
    metrics = posteriors[name].evaluate(data.x_test, data.y_test)
    print(f"{name:5s} accuracy {metrics['accuracy']:.3f}  nll {metrics['nll']:.4f}")
    assert metrics["accuracy"] > 0.95


# %%
# The predictive entropy (nats; log 2 = 0.69 is "no idea") over the plane, and at 64
# points exactly 3 units from the nearest training point.
def entropy(probs):
    return -(probs * probs.clamp_min(1e-30).log()).sum(-1)


def far_points(x, distance=3.0, count=64):
    """Points at ``distance`` from the nearest of ``x``, around its centre."""
    angles = torch.arange(count) * (2 * math.pi / count)
    rays = torch.stack([angles.cos(), angles.sin()], 1)
    points = []
    for ray in rays:
        low, high = 0.0, 100.0
        for _ in range(60):  # bisect the ray to the distance
            mid = (low + high) / 2
            near = torch.cdist((x.mean(0) + mid * ray)[None], x).min() < distance
            low, high = (mid, high) if near else (low, mid)
        points.append(x.mean(0) + high * ray)
    return torch.stack(points)


far = far_points(x)
grid = torch.stack(
    torch.meshgrid(torch.linspace(-6, 7, 131), torch.linspace(-6, 6, 121),
                   indexing="xy"), -1
).reshape(-1, 2)
far_entropy = {}
fig, axes = plt.subplots(1, 2, figsize=(10, 4.2), sharey=True)
for ax, (name, posterior) in zip(axes, posteriors.items()):
    surface = entropy(posterior.predict(grid)["probs"]).reshape(121, 131)
    far_entropy[name] = entropy(posterior.predict(far)["probs"]).mean().item()
    image = ax.contourf(grid[:131, 0], grid[::131, 1], surface, levels=20,
                        vmin=0, vmax=math.log(2), cmap="viridis")
    ax.scatter(*x.T, c=y, s=6, cmap="coolwarm", edgecolors="white", linewidths=0.3)
    ax.plot(*far.T, "w.", markersize=3)
    ax.set_title(f"{name}: {far_entropy[name]:.2f} nats at 3 units (white)")
fig.colorbar(image, ax=axes, label="predictive entropy (nats)")
plt.show()
print({name: round(value, 3) for name, value in far_entropy.items()})

# %%
# MAP's entropy is near 0 wherever the plane is far from the boundary, however far
# from the data; SNGP's rises towards log 2 away from the moons. The test of the same
# claim: ``tests/methods/test_sngp.py``.
assert far_entropy["sngp"] > far_entropy["map"] + 0.3
