"""Train / validation / test splits: the :class:`DataSplits` container, seeded subsets, the validation split."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch


@dataclass
class DataSplits:
    """Train / (optional) validation / test tensors plus what a model needs to know."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_val: torch.Tensor | None
    y_val: torch.Tensor | None
    x_test: torch.Tensor
    y_test: torch.Tensor
    input_shape: tuple[int, ...]
    num_outputs: int
    task: str  # "classification" | "regression"
    name: str
    classes: tuple[str, ...] | None = None  # class names in label order, if known
    y_mean: torch.Tensor | None = None  # standardised targets: original = y_mean + y_std * y (the training set's)
    y_std: torch.Tensor | None = None


def check_size(arg: str, value: int | None, low: int, high: int | None) -> None:
    """A ``ValueError`` naming ``arg`` and the valid range unless ``value`` is an integer in ``[low, high]``."""
    ok = (isinstance(value, (int, np.integer)) and not isinstance(value, bool)
          and value >= low and (high is None or value <= high))
    if not ok:
        rng = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{arg} must be an integer in {rng}, got {value!r}")


def _subset_index(n: int, size: int | None, seed: int, stream: int, arg: str) -> torch.Tensor | None:
    """Sorted random subset of ``range(n)`` of ``size`` (None -> all, returns None)."""
    if size is None:
        return None
    check_size(arg, size, 1, n)
    g = torch.Generator().manual_seed(2 * seed + stream)
    return torch.randperm(n, generator=g)[:size].sort().values


HOLDOUT_FRACTION = 0.2
"""The share of a training set held out to choose hyper-parameters (the UCI protocol's 80/20 split)."""


def holdout_size(num_examples: int, fraction: float = HOLDOUT_FRACTION) -> int:
    """The rows :func:`holdout` keeps to fit out of ``num_examples``: ``int((1 - fraction) N)``."""
    return int((1 - fraction) * num_examples)


def holdout(x: torch.Tensor, y: torch.Tensor, fraction: float = HOLDOUT_FRACTION
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x_fit, y_fit, x_held, y_held)``: the first :func:`holdout_size` rows to fit, the rest held out
    (the order of Gal's UCI ``experiment.py``: the rows are already in random order)."""
    keep = holdout_size(len(x), fraction)
    if not 0 < keep < len(x):
        raise ValueError(f"holding out {fraction:g} of {len(x)} examples leaves {keep} to fit and {len(x) - keep} "
                         "held out: both need at least one")
    return x[:keep], y[:keep], x[keep:], y[keep:]


def holdout_splits(data: DataSplits, fraction: float = HOLDOUT_FRACTION) -> DataSplits:
    """``data`` with its training set split by :func:`holdout`: fit on the first part, test on the held-out rest
    (its own test set dropped)."""
    x_fit, y_fit, x_held, y_held = holdout(data.x_train, data.y_train, fraction)
    return dataclasses.replace(data, x_train=x_fit, y_train=y_fit, x_test=x_held, y_test=y_held)


def make_splits(x_train, y_train, x_test, y_test, *, name: str, task: str, num_outputs: int,
                train_size: int | None = None, test_size: int | None = None, val_size: int = 0,
                seed: int = 0, classes: tuple[str, ...] | None = None,
                to_tensor: Callable[[torch.Tensor], torch.Tensor] | None = None) -> DataSplits:
    """Subset train/test (seeded), split ``val_size`` off the training set, convert, package.

    Subsets keep the original order. ``to_tensor`` converts inputs after
    subsetting (e.g. uint8 -> float32 in [0, 1]), so full datasets are never
    converted needlessly.
    """
    x_train, y_train = torch.as_tensor(x_train), torch.as_tensor(y_train)
    x_test, y_test = torch.as_tensor(x_test), torch.as_tensor(y_test)
    idx = _subset_index(len(x_train), train_size, seed, 0, "train_size")
    if idx is not None:
        x_train, y_train = x_train[idx], y_train[idx]
    idx = _subset_index(len(x_test), test_size, seed, 1, "test_size")
    if idx is not None:
        x_test, y_test = x_test[idx], y_test[idx]
    check_size("val_size", val_size, 0, len(x_train) - 1)
    x_val = y_val = None
    if val_size > 0:
        g = torch.Generator().manual_seed(2 * seed + 2 * 7919 + 1)
        perm = torch.randperm(len(x_train), generator=g)
        vi, ti = perm[:val_size].sort().values, perm[val_size:].sort().values
        x_val, y_val = x_train[vi], y_train[vi]
        x_train, y_train = x_train[ti], y_train[ti]
    if to_tensor is not None:
        x_train, x_test = to_tensor(x_train), to_tensor(x_test)
        x_val = to_tensor(x_val) if x_val is not None else None
    return DataSplits(x_train, y_train, x_val, y_val, x_test, y_test,
                      input_shape=tuple(x_train.shape[1:]), num_outputs=num_outputs,
                      task=task, name=name, classes=classes)
