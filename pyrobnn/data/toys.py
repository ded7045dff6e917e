"""Synthetic toy problems, generated from a seed: two moons, the cubic y = x^3, the sinusoid.

Each generator returns a :class:`DataSplits` without a validation set; the
``load_*`` functions are their entries in :data:`pyrobnn.data.DATASETS`
(``train_size`` / ``test_size`` set how many points are generated, and
``val_size`` of the training points are split off).
"""

from __future__ import annotations

import os

import torch

from pyrobnn.data.splits import DataSplits, check_size, make_splits


def _split_generated(x: torch.Tensor, y: torch.Tensor, n_train: int, name: str, task: str,
                     num_outputs: int, g: torch.Generator, shuffle: bool) -> DataSplits:
    if shuffle:
        perm = torch.randperm(len(x), generator=g)
        x, y = x[perm], y[perm]
    return DataSplits(x[:n_train], y[:n_train], None, None, x[n_train:], y[n_train:],
                      input_shape=tuple(x.shape[1:]), num_outputs=num_outputs, task=task, name=name)


def two_moons(n: int = 1000, n_train: int = 50, noise: float = 0.1, seed: int = 0) -> DataSplits:
    """Two interleaving half-circles, as scikit-learn's ``make_moons`` (Pedregosa et al., 2011),
    randomly split into train/test.

    Inputs (N, 2) float32, labels (N,) int64 (0 = upper moon, 1 = lower moon).
    """
    check_size("n", n, 2, None)
    check_size("n_train", n_train, 1, n - 1)
    g = torch.Generator().manual_seed(seed)
    n_out = n // 2
    n_in = n - n_out
    t_out = torch.linspace(0, torch.pi, n_out, dtype=torch.float64)
    t_in = torch.linspace(0, torch.pi, n_in, dtype=torch.float64)
    x = torch.cat([torch.stack([t_out.cos(), t_out.sin()], 1),
                   torch.stack([1 - t_in.cos(), 0.5 - t_in.sin()], 1)])
    x = x + noise * torch.randn(x.shape, generator=g, dtype=torch.float64)
    y = torch.cat([torch.zeros(n_out, dtype=torch.long), torch.ones(n_in, dtype=torch.long)])
    return _split_generated(x.float(), y, n_train, "two-moons", "classification", 2, g, shuffle=True)


def cubic(n_train: int = 30, n_test: int = 1000, seed: int = 0) -> DataSplits:
    """Toy regression y = x^3 + N(0, 3^2) (the problem of Hernández-Lobato & Adams, 2015):
    train x ~ U[-4, 4]; test on a grid over [-6, 6] (extrapolation)."""
    check_size("n_train", n_train, 1, None)
    check_size("n_test", n_test, 1, None)
    g = torch.Generator().manual_seed(seed)
    x_tr = torch.empty(n_train, 1, dtype=torch.float64).uniform_(-4.0, 4.0, generator=g)
    x_te = torch.linspace(-6.0, 6.0, n_test, dtype=torch.float64)[:, None]
    x = torch.cat([x_tr, x_te])
    y = x**3 + 3.0 * torch.randn(x.shape, generator=g, dtype=torch.float64)
    return _split_generated(x.float(), y.float(), n_train, "cubic", "regression", 1, g, shuffle=False)


def sinusoid(n: int = 500, n_train: int = 40, seed: int = 0) -> DataSplits:
    """Blundell et al. (2015) curve: y = x + 0.3 sin(2π(x+ε)) + 0.3 sin(4π(x+ε)) + ε, ε ~ N(0, 0.02²), x ~ U[0, 0.5]."""
    check_size("n", n, 2, None)
    check_size("n_train", n_train, 1, n - 1)
    g = torch.Generator().manual_seed(seed)
    x = torch.empty(n, 1, dtype=torch.float64).uniform_(0.0, 0.5, generator=g)
    eps = 0.02 * torch.randn(x.shape, generator=g, dtype=torch.float64)
    y = x + 0.3 * torch.sin(2 * torch.pi * (x + eps)) + 0.3 * torch.sin(4 * torch.pi * (x + eps)) + eps
    return _split_generated(x.float(), y.float(), n_train, "sinusoid", "regression", 1, g, shuffle=False)


# --------------------------------------------------------------------------- registry entries


def _sizes(train_size: int | None, test_size: int | None, default_train: int, default_test: int
           ) -> tuple[int, int]:
    """How many train / test points to generate: the given sizes (checked) or the defaults."""
    if train_size is not None:
        check_size("train_size", train_size, 1, None)
    if test_size is not None:
        check_size("test_size", test_size, 1, None)
    return (default_train if train_size is None else train_size,
            default_test if test_size is None else test_size)


def _with_val(d: DataSplits, val_size: int, seed: int) -> DataSplits:
    """``d`` with ``val_size`` training points split off as the validation set."""
    return make_splits(d.x_train, d.y_train, d.x_test, d.y_test, name=d.name, task=d.task,
                       num_outputs=d.num_outputs, val_size=val_size, seed=seed)


def load_two_moons(root: str | os.PathLike | None = None, download: bool = True, *,
                   train_size: int | None = None, test_size: int | None = None, val_size: int = 0,
                   seed: int = 0) -> DataSplits:
    """:func:`two_moons` with 50 train / 950 test points by default (``root``, ``download`` unused)."""
    n_tr, n_te = _sizes(train_size, test_size, 50, 950)
    return _with_val(two_moons(n_tr + n_te, n_tr, seed=seed), val_size, seed)


def load_cubic(root: str | os.PathLike | None = None, download: bool = True, *,
               train_size: int | None = None, test_size: int | None = None, val_size: int = 0,
               seed: int = 0) -> DataSplits:
    """:func:`cubic` with 30 train / 1000 test points by default (``root``, ``download`` unused)."""
    n_tr, n_te = _sizes(train_size, test_size, 30, 1000)
    return _with_val(cubic(n_tr, n_te, seed=seed), val_size, seed)


def load_sinusoid(root: str | os.PathLike | None = None, download: bool = True, *,
                  train_size: int | None = None, test_size: int | None = None, val_size: int = 0,
                  seed: int = 0) -> DataSplits:
    """:func:`sinusoid` with 40 train / 460 test points by default (``root``, ``download`` unused)."""
    n_tr, n_te = _sizes(train_size, test_size, 40, 460)
    return _with_val(sinusoid(n_tr + n_te, n_tr, seed=seed), val_size, seed)
