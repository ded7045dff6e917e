"""Figures of a posterior's predictions, and the matplotlib boilerplate every pyrobnn figure shares.

:func:`figure` makes a figure without pyplot's global state (thread-safe, no display needed) and
:func:`save_png` writes it atomically (:func:`pyrobnn.files.atomic_write`): a reader never sees half a PNG.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from pyrobnn.files import atomic_write
from pyrobnn.infer.predict import predict

__all__ = ["figure", "save_png", "boundary_plot", "predictive_plot"]


def figure(size: tuple[float, float]):
    """A matplotlib ``Figure`` of ``size`` inches at 100 dpi on the Agg canvas (matplotlib is imported here,
    on first use, not when pyrobnn is imported)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=100)
    FigureCanvasAgg(fig)
    return fig


def save_png(fig, path: str | os.PathLike) -> Path:
    """Write ``fig`` as a PNG to ``path`` atomically; returns the path."""
    return atomic_write(path, lambda f: fig.savefig(f, format="png"))


def boundary_plot(model, posterior, data, path: Path, title: str) -> Path:
    """Mean predicted probability and epistemic uncertainty (mutual information) over a grid of the input
    plane, with the training points."""

    points = torch.cat([data.x_train, data.x_test])
    low, high = points.min(0).values - 0.5, points.max(0).values + 0.5
    n = 120
    xx, yy = torch.meshgrid(torch.linspace(low[0], high[0], n), torch.linspace(low[1], high[1], n), indexing="xy")
    pred = predict(model, posterior, torch.stack([xx.reshape(-1), yy.reshape(-1)], 1), num_samples=len(posterior))
    probs = pred["probs"].cpu()
    binary = probs.shape[-1] == 2
    shown = (probs[:, 1] if binary else probs.max(-1).values).reshape(n, n).numpy()
    epistemic = pred["epistemic"].cpu().reshape(n, n).numpy()
    xx, yy = xx.numpy(), yy.numpy()
    fig = figure((11, 4.6))
    left, right = fig.subplots(1, 2, sharey=True)
    filled = left.contourf(xx, yy, shown, levels=[i / 20 for i in range(21)], cmap="RdBu_r")
    fig.colorbar(filled, ax=left, label="mean p(y = 1 | x)" if binary else "mean probability of the predicted class")
    if binary:
        left.contour(xx, yy, shown, levels=[0.5], colors="black", linewidths=1)
    filled = right.contourf(xx, yy, epistemic, levels=20, cmap="viridis")
    fig.colorbar(filled, ax=right, label="mutual information (nats)")
    x, y = data.x_train.cpu().numpy(), data.y_train.cpu().numpy()
    for ax, name in ((left, "posterior predictive probability"), (right, "epistemic uncertainty")):
        ax.scatter(x[:, 0], x[:, 1], c=y, cmap="RdBu_r", vmin=0, vmax=max(int(y.max()), 1), edgecolors="black",
                   linewidths=0.6, s=22)
        ax.set_title(name)
        ax.set_xlabel("x1")
    left.set_ylabel("x2")
    fig.suptitle(title)
    fig.tight_layout()
    return save_png(fig, path)


def predictive_plot(model, posterior, data, path: Path, title: str) -> Path:
    """Predictive mean with 95 % bands (total, and epistemic only) over the inputs' range, with the
    training points (and the test points, faint)."""

    x_all = torch.cat([data.x_train, data.x_test])[:, 0]
    y_all = torch.cat([data.y_train, data.y_test])[:, 0]
    low, high = float(x_all.min()), float(x_all.max())
    pad = 0.05 * (high - low)
    grid = torch.linspace(low - pad, high + pad, 400)[:, None]
    pred = predict(model, posterior, grid, num_samples=len(posterior))
    mean, std, epistemic = (pred[key][:, 0].cpu().numpy() for key in ("mean", "std", "epistemic_std"))
    g = grid[:, 0].numpy()
    fig = figure((8, 5))
    ax = fig.subplots()
    ax.fill_between(g, mean - 1.96 * std, mean + 1.96 * std, color="tab:blue", alpha=0.2,
                    label="95 % predictive (epistemic + noise)")
    ax.fill_between(g, mean - 1.96 * epistemic, mean + 1.96 * epistemic, color="tab:blue", alpha=0.35,
                    label="95 % epistemic")
    ax.plot(g, mean, color="tab:blue", linewidth=1.5, label="predictive mean")
    ax.scatter(data.x_test[:, 0].numpy(), data.y_test[:, 0].numpy(), s=4, color="gray", alpha=0.3, label="test points")
    ax.scatter(data.x_train[:, 0].numpy(), data.y_train[:, 0].numpy(), s=16, color="black", zorder=3,
               label="training points")
    y_low, y_high = float(y_all.min()), float(y_all.max())
    margin = 0.25 * (y_high - y_low)
    ax.set_ylim(y_low - margin, y_high + margin)
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    ax.set_title(title)
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    return save_png(fig, path)
