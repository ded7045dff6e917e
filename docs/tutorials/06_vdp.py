"""
VDP++: moments instead of samples
=================================

VDP++ (*Efficient Scaling of Bayesian Neural Networks*, 2024) trains and predicts without sampling: each unit's
mean and variance are propagated through the network in one deterministic pass. In pyrobnn it is an estimator like
the others, a handler around the same model and guide: ``MeanFieldELBO(estimator="vdp")`` trains by moments,
``predict_moments`` predicts by one pass. Here a LeNet-5 on MNIST, one σ per output unit (``share="row"``, the
paper's eq. 12), then the paper's robustness test: accuracy and the predicted class's variance as Gaussian noise
is added to the test images.

The output on this page is from its CI size (``PYROBNN_TUTORIAL_SIZE=ci``: 10,000 training images, 3 epochs); its
running time is at the foot of the page. Run the script without it for the full size (all 60,000, 10 epochs).
"""

# %%
import os

import matplotlib.pyplot as plt
import pyro

from pyrobnn import (
    BayesianNetwork,
    Categorical,
    MeanFieldELBO,
    NormalGuide,
    Optim,
    evaluate,
    fit,
    predict_moments,
)
from pyrobnn.analysis.robustness import moment_predictor, noise_robustness
from pyrobnn.data import load_dataset
from pyrobnn.networks import LeNet5

CI = os.environ.get("PYROBNN_TUTORIAL_SIZE") == "ci"
TRAIN, TEST, EPOCHS = (10000, 2000, 3) if CI else (60000, 10000, 10)

pyro.set_rng_seed(0)
data = load_dataset("mnist", train_size=TRAIN, test_size=TEST)
model = BayesianNetwork(
    LeNet5(), Categorical(vdp_objective="cross_entropy"), num_data=len(data.x_train)
)
guide = NormalGuide(model, share="row")
history = fit(
    model,
    guide,
    data.x_train,
    data.y_train,
    epochs=EPOCHS,
    elbo=MeanFieldELBO(estimator="vdp"),
    optimizer=Optim(lr=3e-3),
    progress=False,
)
metrics = evaluate(model, guide, data.x_test, data.y_test, moments=True)
print(
    ", ".join(f"{k} {metrics[k]:.4f}" for k in ("accuracy", "nll", "ece", "brier"))
)

# %%
# One deterministic pass gives the softmax's mean and variance.
out = predict_moments(model, guide, data.x_test[:5])
print("predicted class:", out["probs"].argmax(-1).tolist())
print(
    "its variance:   ",
    [
        f"{v:.2e}"
        for v in out["probs_var"]
        .gather(-1, out["probs"].argmax(-1, True))
        .squeeze(-1)
    ],
)

# %%
# Noise at a signal-to-noise ratio from 30 dB down to -6 dB: accuracy falls and the
# predicted class's variance rises, so the network says when its input has become
# unreliable.
rows = noise_robustness(moment_predictor(model, guide), data.x_test, data.y_test)
for r in rows:
    print(
        f"SNR {r['snr_db']:5.1f} dB: accuracy {r['accuracy']:.3f}, "
        f"variance of the predicted class {r['variance']:.2e}"
    )

# The page's claims, checked as it runs: a trained LeNet (over 90 % on clean digits),
# whose accuracy falls and whose variance rises from the cleanest to the noisiest
# input.
clean, noisiest = (
    max(rows, key=lambda r: r["snr_db"]),
    min(rows, key=lambda r: r["snr_db"]),
)
assert metrics["accuracy"] > 0.9, metrics["accuracy"]
assert (
    noisiest["accuracy"] < clean["accuracy"]
    and noisiest["variance"] > clean["variance"]
), (clean, noisiest)

snr = [r["snr_db"] for r in rows]
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(snr, [r["accuracy"] for r in rows], "o-", label="accuracy")
ax.set_xlabel("SNR (dB)")
ax.set_ylabel("accuracy")
ax2 = ax.twinx()
ax2.plot(
    snr,
    [r["variance"] for r in rows],
    "s--",
    color="tab:orange",
    label="variance of the predicted class",
)
ax2.set_ylabel("variance", color="tab:orange")
fig.legend(loc="upper center", fontsize=8)
fig.tight_layout()
plt.show()
