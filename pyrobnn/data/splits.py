"""Train / validation / test splits: the :class:`DataSplits` container, seeded subsets, the validation split, the
seeded test fraction or K-fold split of data sets without a test set of their own (:func:`split_rows`), and the
standardisation on the training rows (:func:`standardized`)."""

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
    features: tuple[str, ...] | None = None  # the input columns' names (tables; one-hot columns as "column=value")


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


DEFAULT_FOLDS = 5
"""K of the K-fold split when a split is asked for without ``folds`` (:func:`split_rows`)."""

DEFAULT_TEST_FRACTION = 0.2
"""The share of the rows tested on when no split is asked for (:func:`split_rows`)."""


def split_rows(num_examples: int, *, split: int | None = None, folds: int | None = None,
               test_fraction: float | None = None, seed: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(training rows, test rows)`` of a data set of ``num_examples`` rows that has no test set of its own.

    The rows are put in a random order drawn from ``seed`` (default 0, independent of a run's seed: every method
    and every seed of a study see the same split). With ``split = i`` that order is cut into ``folds`` (default
    :data:`DEFAULT_FOLDS`) near-equal parts and part ``i`` is the test set (K-fold cross-validation: the splits
    0..K-1 test every row once); without it the last ``round(test_fraction * N)`` rows (default
    :data:`DEFAULT_TEST_FRACTION`) are. The training rows keep the drawn order (so :func:`holdout`'s last 20 % are a
    random fifth). A ``ValueError`` names the argument that is out of range.
    """
    seed = 0 if seed is None else seed
    check_size("split seed", seed, 0, None)
    order = np.random.default_rng(seed).permutation(num_examples)
    if split is None:
        if folds is not None:
            raise ValueError(f"folds={folds} needs a split: which of the {folds} folds to test on (--split i)")
        fraction = DEFAULT_TEST_FRACTION if test_fraction is None else test_fraction
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
            raise ValueError(f"test_fraction must be a number in (0, 1), got {fraction!r}")
        if num_examples < 2:
            raise ValueError(f"{num_examples} example(s) cannot be split into training and test rows")
        tested = min(max(round(fraction * num_examples), 1), num_examples - 1)
        return order[:num_examples - tested], order[num_examples - tested:]
    if test_fraction is not None:
        raise ValueError(f"test_fraction={test_fraction} and split={split} are two ways to choose the test rows: "
                         "give one (a split tests fold i of the folds, a fraction tests a random share)")
    folds = DEFAULT_FOLDS if folds is None else folds
    check_size("folds", folds, 2, max(2, num_examples))
    check_size(f"split (one of the {folds} folds)", split, 0, folds - 1)
    parts = np.array_split(order, folds)
    return np.concatenate(parts[:split] + parts[split + 1:]), parts[split]


def check_training_classes(labels: np.ndarray, train: np.ndarray, classes: tuple[str, ...], source: str,
                           what: str, *, split: int | None = None, folds: int | None = None,
                           test_fraction: float | None = None, seed: int | None = None) -> None:
    """A ``ValueError`` naming the first class (of ``what``, e.g. ``"the target column 'y'"``) that has no row among
    the ``train`` rows of the split :func:`split_rows` drew with these arguments, and the fix: a class never seen in
    training cannot be learned, and its test rows would be scored against it."""
    counts = np.bincount(labels[train], minlength=len(classes))
    absent = np.flatnonzero(counts == 0)
    if not absent.size:
        return
    label = int(absent[0])
    if split is not None:
        which = f"split {split} (fold {split} of --data.folds {folds or DEFAULT_FOLDS} is its test set)"
    else:
        which = (f"the --data.test-fraction {test_fraction or DEFAULT_TEST_FRACTION} split drawn with --data.seed "
                 f"{seed or 0}")
    count = int(np.sum(labels == label))
    raise ValueError(f"{source}: class {classes[label]!r} of {what} has no row among the training rows of {which}; "
                     f"all {count} of its rows are test rows: give the class more rows, drop or merge them, or "
                     "choose another --data.seed (another random order of the rows)")


def standardize(reference: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The column means and population standard deviations of ``reference`` (a column of zero deviation gets
    ``std = 1``, as in Gal's ``net.py``): standardised values are ``(x - mean) / std``."""
    std = reference.std(0, unbiased=False)
    return reference.mean(0), torch.where(std > 0, std, torch.ones_like(std))


def _scaled(value: torch.Tensor | None, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor | None:
    return None if value is None else ((value - mean) / std).float()


def standardized(data: DataSplits, inputs: bool = True, target: bool = True) -> DataSplits:
    """``data`` with its inputs (``inputs``) and its targets (``target``) standardised by :func:`standardize` with
    the statistics of its training rows alone, as float32; the target's statistics are kept as ``y_mean`` and
    ``y_std`` so that metrics are reported in its original units (original = ``y_mean + y_std * y``)."""
    axes = ("x",) * inputs + ("y",) * target
    statistics = {axis: standardize(getattr(data, f"{axis}_train").double()) for axis in axes}
    scaled = {f"{axis}_{part}": _scaled(getattr(data, f"{axis}_{part}"), *statistics[axis])
              for axis in axes for part in ("train", "val", "test")}
    if not target:
        return dataclasses.replace(data, **scaled)
    y_mean, y_std = statistics["y"]
    return dataclasses.replace(data, **scaled, y_mean=y_mean.float(), y_std=y_std.float())
