"""
Training on a GPU
=================

The same code runs on a CPU and a GPU: ``fit(..., device="auto")`` moves the model, the guide and each batch to the
GPU when there is one; data already on the device stays there. On a GPU, ``MeanFieldELBO(precision="bf16")`` runs
the network under ``torch.autocast`` (the KL and the log-likelihood stay in float32), uint8 images can live on the
device and be augmented there per batch (:class:`~pyrobnn.data.augment.ImageAugment`), and the default
``compile="auto"`` records the training step once per batch shape and compiles it with TorchInductor there (on a CPU
it picks by the run's length and network; the run's :class:`~pyrobnn.infer.svi.History` says which, and why). The
command line says the same with ``--device cuda --precision bf16 --augment``.

This page was built on a CPU: the code picks what the machine has.

The output on this page is from its CI size (``PYROBNN_TUTORIAL_SIZE=ci``: 10,000 training images, 2 epochs); its
running time is at the foot of the page. Run the script without it for the full size (all 60,000, 5 epochs).
"""

# %%
import os

import pyro
import torch

from pyrobnn import (
    BayesianNetwork,
    DropoutGuide,
    MeanFieldELBO,
    Optim,
    evaluate,
    fit,
)
from pyrobnn.data import load_dataset
from pyrobnn.data.augment import ImageAugment
from pyrobnn.networks import LeNet5

CI = os.environ.get("PYROBNN_TUTORIAL_SIZE") == "ci"
TRAIN, TEST, EPOCHS = (10000, 2000, 2) if CI else (60000, 10000, 5)

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
precision = (
    "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "fp32"
)
print("device:", device, " precision:", precision)

# %%
# Images as stored (uint8) on the device: a quarter of float32's memory, and no copy
# per batch.
pyro.set_rng_seed(0)
data = load_dataset("mnist", train_size=TRAIN, test_size=TEST, dtype=torch.uint8)
x_train, y_train = data.x_train.to(device), data.y_train.to(device)
# uint8 -> normalised float, no crops
augment = ImageAugment.for_dataset("mnist", crop_padding=0, flip=False)
print(x_train.dtype, x_train.device, f"{x_train.nbytes / 1e6:.1f} MB")

# %%
# MC dropout on LeNet-5: the same ``fit`` as on a CPU, with the device and the
# precision.
model = BayesianNetwork(LeNet5(), num_data=len(x_train))
guide = DropoutGuide(model, rate=0.1)
history = fit(
    model,
    guide,
    x_train,
    y_train,
    epochs=EPOCHS,
    elbo=MeanFieldELBO(estimator="local", precision=precision),
    optimizer=Optim(lr=3e-3),
    transform=augment,
    device=device,
    progress=False,
)
print(
    f"{history.last['seconds']:.1f} s for the last epoch, "
    f"compile={history.compile} ({history.compile_reason})"
)
metrics = evaluate(
    model,
    guide,
    augment(data.x_test.to(device), train=False),
    data.y_test.to(device),
    num_samples=20,
)
print(", ".join(f"{k} {metrics[k]:.4f}" for k in ("accuracy", "nll", "ece")))

# The page's claim, checked as it runs: the LeNet trained on whichever device the
# machine has.
assert metrics["accuracy"] > 0.9, metrics["accuracy"]

# %%
# The predictive on the device, moved to the CPU to plot: how sure the network is of
# the digits it gets right and of those it gets wrong.
import matplotlib.pyplot as plt  # noqa: E402

from pyrobnn import predict  # noqa: E402

x_test = augment(data.x_test.to(device), train=False)
probs = predict(model, guide, x_test, num_samples=20)["probs"].cpu()
confidence, label = probs.max(-1)
right = label == data.y_test
fig, ax = plt.subplots(figsize=(6, 3.2))
bins = torch.linspace(0, 1, 21).numpy()
for subset, name in [(right, "right"), (~right, "wrong")]:
    ax.hist(
        confidence[subset].numpy(), bins=bins, alpha=0.7, density=True, label=name
    )
ax.set_xlabel("predictive probability of the predicted digit")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()
