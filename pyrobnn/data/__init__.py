"""Datasets as in-memory tensors.

Every loader returns a :class:`DataSplits` holding whole tensors (no
``DataLoader``): on CPU, slicing a tensor per mini-batch is the fastest way to
feed a training loop. Images are float32 in ``[0, 1]`` with shape
``(N, C, H, W)``; class labels are int64; regression inputs and targets are
float32 of shape ``(N, D)``.

:func:`load_dataset` looks a name up in :data:`DATASETS` (one loader per
name; its keys are the names a CLI can offer) or loads ``"folder:<path>"``, any ImageFolder
tree with ``train/`` and ``test/`` (or of class folders alone, split as a table), ``"uci:<path>"``, any folder in the
UCI regression layout, or your own table or arrays: ``"csv:<path>"``, ``"parquet:<path>"``, ``"npz:<path>"`` (or a
bare path with one of these endings) and ``"py:<module>:<function>"`` (:mod:`~pyrobnn.data.tables`).
:func:`check_dataset` checks a name and its options before a run (a table is read and split; an image folder's
layout is looked at).

Modules
-------
* :mod:`~pyrobnn.data.sources` -- where files live: the data root (``root``
  argument / ``--data-root``, else ``$PYROBNN_DATA``, else
  ``~/.cache/pyrobnn/data``; only ever read), the cache directory for derived
  files (``$PYROBNN_CACHE``, else ``~/.cache/pyrobnn``), download attempts
  (fail fast offline, leave no trace) and the "not found: looked for ... in
  ..." error.
* :mod:`~pyrobnn.data.formats` -- file formats: IDX arrays, atomic archive
  extraction (derived files such as the decoded-array ``.npz`` cache are
  written with :func:`pyrobnn.files.atomic_write`).
* :mod:`~pyrobnn.data.images` -- MNIST, Fashion-MNIST, CIFAR-10 and
  ImageFolder decoding, with the layout they expect under the data root.
* :mod:`~pyrobnn.data.toys` -- synthetic problems: two moons, the cubic
  y = x^3 and the sinusoid.
* :mod:`~pyrobnn.data.splits` -- :class:`DataSplits`, seeded train/test
  subsets and the validation split (:func:`make_splits`), the seeded test fraction or K-fold split of a data set
  without a test set (:func:`~pyrobnn.data.splits.split_rows`), standardisation on the training rows.
* :mod:`~pyrobnn.data.tables` -- your own data: CSV, Parquet and ``.npz`` tables and arrays, a Python function's
  arrays (:class:`Columns`: target, task, features, categorical columns; :func:`save_arrays`).

* :mod:`~pyrobnn.data.augment` -- uint8 image batches to normalised, randomly
  cropped and flipped float batches on the device (:class:`ImageAugment`).
* :mod:`~pyrobnn.data.corruptions` -- the CIFAR-10-C corruptions generated in
  code, and paper 004's blend and salt-and-pepper (applied at evaluation time:
  :func:`pyrobnn.analysis.shift.evaluate_corruptions`).
* :mod:`~pyrobnn.data.text` -- IMDB reviews, tokenised (the ``text`` extra).
* :mod:`~pyrobnn.data.uci` -- the UCI regression benchmark (``uci-boston``, ... or ``"uci:<path>"``), its 20 fixed
  splits (``split=``) and protocol, standardised on the training rows.
"""

from __future__ import annotations

import functools
import os
from typing import Protocol

import torch

from pyrobnn.data.augment import NORMALIZATION, ImageAugment
from pyrobnn.data.corruptions import CORRUPTIONS, corrupt
from pyrobnn.data.formats import read_idx
from pyrobnn.data.images import (
    CIFAR10_CLASSES,
    FASHION_MNIST_CLASSES,
    MNIST_CLASSES,
    decode_image_folder,
    folder_layout,
    load_cifar10,
    load_fashion_mnist,
    load_folder,
    load_mnist,
)
from pyrobnn.data.sources import CACHE_ENV, DATA_ENV, cache_dir, data_root
from pyrobnn.data.splits import DataSplits, holdout_splits, make_splits
from pyrobnn.data.tables import TASKS, Columns, load_table, save_arrays, table_source
from pyrobnn.data.text import load_imdb, load_rotten_tomatoes_dataset
from pyrobnn.data.toys import cubic, load_cubic, load_sinusoid, load_two_moons, sinusoid, two_moons
from pyrobnn.data.uci import UCI_FOLDERS, UCIProtocol, load_uci, read_protocol, uci_folder

__all__ = [
    "CACHE_ENV",
    "CIFAR10_CLASSES",
    "Columns",
    "TASKS",
    "CORRUPTIONS",
    "DATASETS",
    "REGRESSION_DATASETS",
    "TOY_DATASETS",
    "TEXT_DATASETS",
    "UCI_DATASETS",
    "DATA_ENV",
    "FASHION_MNIST_CLASSES",
    "MNIST_CLASSES",
    "DataSplits",
    "ImageAugment",
    "Loader",
    "NORMALIZATION",
    "cache_dir",
    "canonical_name",
    "check_dataset",
    "corrupt",
    "cubic",
    "data_root",
    "decode_image_folder",
    "load_dataset",
    "make_splits",
    "read_idx",
    "save_arrays",
    "sinusoid",
    "two_moons",
    "uci_protocol",
]


class Loader(Protocol):
    """What :data:`DATASETS` maps a name to: files under ``root`` (fetched if ``download``) as splits."""

    def __call__(self, root: str | os.PathLike | None = None, download: bool = True, *,
                 train_size: int | None = None, test_size: int | None = None, val_size: int = 0,
                 seed: int = 0) -> DataSplits: ...


DATASETS: dict[str, Loader] = {
    "mnist": load_mnist,
    "fashion-mnist": load_fashion_mnist,
    "cifar10": load_cifar10,
    "two-moons": load_two_moons,
    "cubic": load_cubic,
    "sinusoid": load_sinusoid,
    "imdb": load_imdb,
    "rotten-tomatoes": load_rotten_tomatoes_dataset,
    **{f"uci-{short}": functools.partial(load_uci, short) for short in UCI_FOLDERS},
}
"""Dataset names accepted by :func:`load_dataset` and their loaders (besides ``"folder:<path>"`` and
``"uci:<path>"``); the UCI loaders also take ``split`` and ``validation`` (:func:`~pyrobnn.data.uci.load_uci`)."""

TOY_DATASETS = ("two-moons", "cubic", "sinusoid")
"""The datasets generated in code (small, for full-batch NUTS and quick checks)."""

UCI_DATASETS = tuple(f"uci-{short}" for short in UCI_FOLDERS)
"""The UCI regression data sets by name (:mod:`~pyrobnn.data.uci`; any folder in their layout is ``"uci:<path>"``)."""

REGRESSION_DATASETS = ("cubic", "sinusoid", *UCI_DATASETS)
"""The registered data sets with a real-valued target (the others are classified)."""

TEXT_DATASETS = ("imdb", "rotten-tomatoes")
"""The datasets of texts (token ids; ``max_length`` and ``tokenizer`` apply)."""

_NOT_IMAGES = (*TOY_DATASETS, *TEXT_DATASETS)
"""The datasets that are not images (no image ``dtype``)."""

_ALIASES = {"fashionmnist": "fashion-mnist", "cifar-10": "cifar10", "twomoons": "two-moons",
            "moons": "two-moons",
            **{f"uci-{folder.lower()}": f"uci-{short}" for short, folder in UCI_FOLDERS.items() if folder != short}}
"""Other spellings accepted, after lower-casing and turning ``_`` into ``-``."""


def canonical_name(name: str) -> str:
    """A dataset's name as :data:`DATASETS` spells it (lower case, hyphens, aliases resolved)."""
    key = name.strip().lower().replace("_", "-")
    return _ALIASES.get(key, key)


SPLITS_HINT = "'folder:<path>', 'uci:<path>', 'csv:<path>', 'parquet:<path>', 'npz:<path>' or 'py:<module>:<function>'"
"""The dataset names besides :data:`DATASETS`, as error messages list them."""


def _route(name, split: int | None, folds: int | None, test_fraction: float | None, split_seed: int | None,
           columns: Columns | None) -> tuple[str, str]:
    """``(kind, what its loader takes)`` of dataset ``name``: ``("table", name)``, ``("folder", path)``, ``("uci",
    short name or path)`` or ``("registered", key)``; options the dataset does not take are a ``ValueError``."""
    if not isinstance(name, str):
        raise ValueError(f"dataset must be a string, one of {list(DATASETS)}, {SPLITS_HINT}; got {name!r}")
    splitting = {"folds": folds, "test_fraction": test_fraction, "split_seed": split_seed}
    if table_source(name) is not None:
        return "table", name
    if columns is not None and not columns.is_default():
        raise ValueError(f"target, task, features and categorical (--data.target, ...) apply to tables, not to "
                         f"{name!r}")
    if name.startswith("folder:"):
        path = name[len("folder:"):]
        if not path:
            raise ValueError("dataset 'folder:' needs a path, e.g. 'folder:/data/my-images'")
        return "folder", path
    given = [f"{key}={value}" for key, value in splitting.items() if value is not None]
    uci = _uci_name(name)
    if given:
        raise ValueError(f"{', '.join(given)} (--data.folds, --data.test-fraction, --data.seed) split tables, arrays "
                         f"and folders of class folders, not {name!r}"
                         + (", whose splits are fixed: choose one with split" if uci is not None else ""))
    if uci is not None:
        return "uci", uci
    if split is not None:
        raise ValueError(f"split applies to the UCI data sets ({', '.join(UCI_DATASETS)} or 'uci:<path>'), tables "
                         f"and folders of class folders, not to {name!r}")
    key = canonical_name(name)
    if key not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}: dataset must be one of {list(DATASETS)}, {SPLITS_HINT}")
    return "registered", key


def load_dataset(name: str, root: str | os.PathLike | None = None, *, train_size: int | None = None,
                 test_size: int | None = None, val_size: int = 0, seed: int = 0,
                 download: bool = True, dtype: torch.dtype = torch.float32, split: int | None = None,
                 validation: bool = False, folds: int | None = None, test_fraction: float | None = None,
                 split_seed: int | None = None, columns: Columns | None = None, max_length: int | None = None,
                 tokenizer=None) -> DataSplits:
    """Load a dataset by name (see :data:`DATASETS`, ``"folder:<path>"``, ``"uci:<path>"`` or a table,
    :mod:`~pyrobnn.data.tables`) as in-memory tensors.

    ``train_size`` / ``test_size`` pick a seeded random subset (order kept);
    ``val_size`` examples are then split off the training set. For the
    synthetic datasets ``train_size`` / ``test_size`` set how many points are
    generated (defaults: see :mod:`~pyrobnn.data.toys`). Image sets take ``dtype=torch.uint8``
    (the stored bytes, for :class:`~pyrobnn.data.augment.ImageAugment`); the default is float32 in [0, 1].
    ``split`` picks one of a UCI data set's fixed train/test splits (default 0; :mod:`~pyrobnn.data.uci`); for a
    table, arrays or a folder of class folders, fold ``split`` of ``folds`` (default 5) is the test set, and without
    ``split`` a ``test_fraction`` (default 0.2) is, both drawn with ``split_seed`` (default 0;
    :func:`~pyrobnn.data.splits.split_rows`). ``columns`` says what a table's columns are
    (:class:`~pyrobnn.data.tables.Columns`: target, task, features, categorical).
    ``validation=True`` returns the training set's 80/20 split as train and test, for choosing hyper-parameters
    (:func:`~pyrobnn.data.splits.holdout`; a UCI data set's test split is then not read; a table is standardised on
    the 80 %). A text data set (imdb, rotten-tomatoes) takes ``max_length`` (tokens per text, default 256) and
    ``tokenizer`` (a network's own, :class:`~pyrobnn.data.text.Tokenizer`; default: a word tokenizer fitted on the
    training texts).
    """
    kind, what = _route(name, split, folds, test_fraction, split_seed, columns)
    text = {key: value for key, value in (("max_length", max_length), ("tokenizer", tokenizer)) if value is not None}
    if text and what not in TEXT_DATASETS:
        raise ValueError(f"{' and '.join(text)} (--data.max-length, --model hf:NAME) apply to text datasets "
                         f"({', '.join(TEXT_DATASETS)}), not to {name!r}")
    sizes = dict(train_size=train_size, test_size=test_size, val_size=val_size, seed=seed)
    if dtype != torch.float32 and (kind in ("uci", "table") or what in _NOT_IMAGES):
        raise ValueError(f"dtype applies to image datasets, not to {what!r}")
    splitting = dict(split=split, folds=folds, test_fraction=test_fraction, split_seed=split_seed)
    if kind == "uci":
        return load_uci(what, root, download, split=0 if split is None else split, validation=validation, **sizes)
    if kind == "table":
        return load_table(what, columns=columns, validation=validation, **splitting, **sizes)
    if dtype != torch.float32:
        sizes["dtype"] = dtype
    if kind == "folder":
        data = load_folder(what, **splitting, **sizes)
    else:
        data = DATASETS[what](root, download, **sizes, **text)
    return holdout_splits(data) if validation else data


def check_dataset(name: str, root: str | os.PathLike | None = None, *, split: int | None = None,
                  folds: int | None = None, test_fraction: float | None = None, split_seed: int | None = None,
                  columns: Columns | None = None) -> str:
    """Check, before a run, what :func:`load_dataset` would refuse: the name and the options it takes; a table is
    read (once per process, :mod:`~pyrobnn.data.tables`) and split, so a bad cell, column or split is found here;
    an image folder's layout is looked at (its images are not decoded); a registered or UCI data set is not read.
    Returns the data set's task, ``"classification"`` or ``"regression"`` (a table's, as it was read; a registered
    one's by :data:`REGRESSION_DATASETS`). Raises the ``ValueError`` (``FileNotFoundError``) that loading would."""
    kind, what = _route(name, split, folds, test_fraction, split_seed, columns)
    if kind == "table":
        return load_table(what, columns=columns, split=split, folds=folds, test_fraction=test_fraction,
                          split_seed=split_seed).task
    if kind == "folder":
        folder_layout(what, split=split, folds=folds, test_fraction=test_fraction, split_seed=split_seed)
    return "regression" if kind == "uci" or what in REGRESSION_DATASETS else "classification"


def _uci_name(name: str) -> str | None:
    """What :func:`~pyrobnn.data.uci.load_uci` takes for dataset ``name`` (``uci-boston`` -> ``boston``,
    ``uci:<path>`` -> the path), or None for a dataset that is not a UCI one."""
    if name.startswith("uci:"):
        if not name[len("uci:"):]:
            raise ValueError("dataset 'uci:' needs a folder or a name, e.g. 'uci:/data/kin8nm' or 'uci:boston'")
        return name[len("uci:"):]
    key = canonical_name(name)
    return key[len("uci-"):] if key in UCI_DATASETS else None


def uci_protocol(name: str, root: str | os.PathLike | None = None, download: bool = True) -> UCIProtocol:
    """The protocol files of UCI data set ``name`` (network, epochs, hyper-parameter grid:
    :class:`~pyrobnn.data.uci.UCIProtocol`); a ``ValueError`` for a dataset that has none."""
    uci = _uci_name(name) if isinstance(name, str) else None
    if uci is None:
        raise ValueError(f"dataset {name!r} has no protocol files: the UCI data sets ({', '.join(UCI_DATASETS)} or "
                         "'uci:<path>') do")
    return read_protocol(uci_folder(uci, root, download))
