r"""Your own data: tables (CSV, Parquet, ``.npz``) and arrays (an ``.npz`` file, a Python function's return value) as
data sets, split by a seeded test fraction or by K folds (:func:`~pyrobnn.data.splits.split_rows`).

Dataset names (:func:`table_source`):

* ``csv:PATH`` (or a bare ``PATH`` ending in ``.csv`` / ``.tsv``): a header row of column names, then one row per
  example; the delimiter (comma, semicolon or tab) is read off the header. Read with Python's ``csv`` module, so an
  error names the file's line.
* ``parquet:PATH`` (``.parquet``, ``.pq``): read with pyarrow (``pip install 'pyrobnn[tables]'``).
* ``npz:PATH`` (``.npz``): either arrays ``x`` and ``y`` alone, ``x`` of inputs ``(N, D)`` or images ``(N, C, H, W)``
  / ``(N, H, W)`` (uint8 0..255 or floats in [0, 1]) and ``y`` of targets ``(N,)`` or ``(N, K)``, or one 1-d array per
  column (a table; :func:`save_arrays` writes a DataFrame so). Read without pickle.
* ``py:MODULE:FUNCTION``: ``FUNCTION()`` of the importable ``MODULE``, returning ``(x, y)``, ``{"x": .., "y": ..}``,
  ``{column: values}`` or a DataFrame; run where the data is loaded (every worker of a study imports it).

A table's columns: ``target`` (default: the last column) is predicted from ``features`` (default: every other
column). A column is numeric when more than half its cells are numbers, and then every cell must be one (a cell
that is not names its row); other columns, and the numeric ones named in ``categorical``, are categories, one-hot
encoded (one input per value found in the file, named ``column=value``, in sorted order). Empty cells and
``NA``/``NaN``/``null``/``?`` are refused, naming the row: nothing is imputed. The task (``task="auto"``) is
classification when the target is text or true/false, or whole numbers with at most :data:`AUTO_MAX_CLASSES` distinct
values; regression otherwise. Classes are the target's distinct values in sorted order.

As the UCI loader does (:mod:`~pyrobnn.data.uci`), the inputs and a regression target are standardised with the
mean and standard deviation of the training rows alone (:func:`~pyrobnn.data.splits.standardized`), so metrics are
reported in the target's original units; image arrays are scaled to [0, 1] instead. ``validation=True`` is the
hyper-parameter split of ``--grid``: the training rows' first 80 % fit, their last 20 % held out
(:func:`~pyrobnn.data.splits.holdout`), standardised on the 80 %; the test rows are not used.

A file is parsed once per process and kept while it is unchanged (a study checks every cell's split before anything
runs, and a run loads the file it checked).
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import hashlib
import importlib
import io
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Union

import numpy as np
import torch

from pyrobnn.data.splits import (
    DataSplits,
    check_training_classes,
    holdout,
    make_splits,
    split_rows,
    standardized,
)
from pyrobnn.files import atomic_write

__all__ = ["KINDS", "SUFFIXES", "TASKS", "AUTO_MAX_CLASSES", "MISSING", "Columns", "Table", "Arrays",
           "table_source", "read_source", "as_data", "save_arrays", "load_table"]

KINDS = ("csv", "parquet", "npz", "py")
"""The prefixes of the dataset names this module loads (``csv:PATH``, ...)."""

SUFFIXES = {".csv": "csv", ".tsv": "csv", ".parquet": "parquet", ".pq": "parquet", ".npz": "npz"}
"""File endings read as a table without a prefix (``--dataset diabetes.csv``)."""

TASKS = ("auto", "regression", "classification")
"""``task``: ``auto`` applies the rule of the module's docstring."""

AUTO_MAX_CLASSES = 20
"""``task="auto"``: a target of whole numbers is classification up to this many distinct values."""

MISSING = frozenset({"", "na", "n/a", "nan", "null", "none", "?"})
"""Cells (stripped, lower case) that mark a missing value: refused, never imputed."""


@dataclass(frozen=True)
class Columns:
    """What a table's columns are: the ``target``, its ``task``, the ``features`` (None: every other column) and
    the numeric feature columns to one-hot encode as ``categorical``."""

    target: str | None = None
    task: str = "auto"
    features: tuple[str, ...] | None = None
    categorical: tuple[str, ...] = ()

    def is_default(self) -> bool:
        return self == Columns()


@dataclass(frozen=True)
class Table:
    """Named columns of one length, each float64 (numbers) or an object array of ``str`` (text). ``source`` names
    it in errors; ``lines`` are the file lines of the rows (CSV), else rows are named by their 0-based index."""

    source: str
    columns: dict[str, np.ndarray]
    lines: tuple[int, ...] | None = None

    def row(self, i: int) -> str:
        return f"line {self.lines[i]}" if self.lines is not None else f"row {i}"


@dataclass(frozen=True)
class Arrays:
    """Inputs ``x`` (N, ...) and targets ``y`` (N,) or (N, K), as numbers; ``source`` names them in errors."""

    source: str
    x: np.ndarray
    y: np.ndarray


Data = Union[Table, Arrays]


def table_source(name: str) -> tuple[str, str] | None:
    """``(kind, location)`` of a dataset name this module loads (``"csv:d.csv"`` -> ``("csv", "d.csv")``; a bare
    path with a known ending (:data:`SUFFIXES`) is that kind), or None for another name."""
    if not isinstance(name, str):
        return None
    kind, colon, location = name.partition(":")
    if colon and kind in KINDS:
        if not location:
            example = "py:mypackage.data:load" if kind == "py" else f"{kind}:data/mine.{kind}"
            raise ValueError(f"dataset '{kind}:' needs a {'function' if kind == 'py' else 'file'}, e.g. '{example}'")
        return kind, location
    suffix = Path(name).suffix.lower()
    return (SUFFIXES[suffix], name) if suffix in SUFFIXES else None


# --------------------------------------------------------------------------- reading


def _is_missing(cell) -> bool:
    if cell is None:
        return True
    if isinstance(cell, float):
        return math.isnan(cell)
    return isinstance(cell, str) and cell.strip().lower() in MISSING


def _number(cell) -> float | None:
    """``cell`` as a finite float, None when it is no number."""
    if isinstance(cell, (bool, np.bool_)):
        return float(cell)
    try:
        value = float(cell)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _missing_error(source: str, where: str, name: str, cell) -> ValueError:
    shown = "empty" if cell is None or (isinstance(cell, str) and not cell.strip()) else f"{str(cell).strip()!r}"
    return ValueError(f"{source} {where}, column {name!r}: the cell is {shown}, a missing value; pyrobnn does not "
                      "fill in missing values: fill the cell, or drop the row (or leave the column out with "
                      "--data.features)")


def _typed(values: np.ndarray, name: str, source: str, row) -> np.ndarray:
    """A column as float64 (numbers) or an object array of stripped ``str`` (text); a missing cell, an infinite
    number, or a cell that is no number in a column of numbers is a ``ValueError`` naming it (``row(i)``: where
    row ``i`` is, :meth:`Table.row`)."""
    if values.dtype.kind in "biuf":
        numbers = values.astype(np.float64)
        bad = np.flatnonzero(~np.isfinite(numbers))
        if bad.size:
            i = int(bad[0])
            if np.isnan(numbers[i]):
                raise _missing_error(source, row(i), name, "NaN")
            raise ValueError(f"{source} {row(i)}, column {name!r}: {numbers[i]} is not a finite number; fix the cell "
                             "or drop the row")
        return numbers
    cells = values.tolist()
    for i, cell in enumerate(cells):
        if _is_missing(cell):
            raise _missing_error(source, row(i), name, cell)
    numbers = [_number(cell) for cell in cells]
    found = sum(number is not None for number in numbers)
    if 2 * found > len(cells):
        i = next((i for i, number in enumerate(numbers) if number is None), None)
        if i is not None:
            raise ValueError(f"{source} {row(i)}, column {name!r}: {str(cells[i]).strip()!r} is not a number, and "
                             f"{found} of the column's {len(cells)} cells are; fix the cell (or pass --data.features "
                             "without the column)")
        return np.asarray(numbers, dtype=np.float64)
    return np.asarray([str(cell).strip() for cell in cells], dtype=object)


def _table(source: str, columns: Mapping, lines: tuple[int, ...] | None = None) -> Table:
    """Check that ``columns`` are named, non-empty, of one length, and type each (:func:`_typed`)."""
    if not columns:
        raise ValueError(f"{source} holds no columns: a table needs a header of column names and rows of values")
    lengths = {name: len(values) for name, values in columns.items()}
    if len(set(lengths.values())) > 1:
        shown = ", ".join(f"{name}: {length}" for name, length in lengths.items())
        raise ValueError(f"{source}: columns of different lengths ({shown}); every column needs one value per row")
    if not next(iter(lengths.values())):
        raise ValueError(f"{source} has column names but no rows: add a row of values per example")
    table = Table(source, {}, lines)
    for name, values in columns.items():
        array = np.asarray(values)
        if array.ndim != 1:
            raise ValueError(f"{source}: column {name!r} has shape {array.shape}; a table's columns are 1-d (save "
                             "arrays x and y for inputs of several dimensions)")
        table.columns[str(name)] = _typed(array, str(name), source, table.row)
    return table


def _read_csv(path: Path) -> Table:
    text = path.read_text(encoding="utf-8-sig")
    lines = text.splitlines()
    header_at = next((i for i, line in enumerate(lines) if line.strip()), None)
    if header_at is None:
        raise ValueError(f"{path} is empty: a CSV table needs a header row of column names and one row per example")
    header_line = lines[header_at]
    delimiter = max(",;\t", key=header_line.count)
    reader = csv.reader(io.StringIO(text), delimiter=delimiter)
    rows = [(reader.line_num, row) for row in reader if any(cell.strip() for cell in row)]
    (_, header), body = rows[0], rows[1:]
    names = [name.strip() for name in header]
    if any(not name for name in names):
        raise ValueError(f"{path} line {header_at + 1}: column {names.index('') + 1} of the header has no name; "
                         "name every column")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"{path} line {header_at + 1}: the header names {', '.join(map(repr, repeated))} more than "
                         "once; give every column its own name")
    for line, row in body:
        if len(row) != len(names):
            raise ValueError(f"{path} line {line}: {len(row)} cells, but the header names {len(names)} columns; fix "
                             "the row (a cell holding the delimiter must be quoted)")
    cells = np.array([row for _, row in body], dtype=object).reshape(len(body), len(names))
    return _table(str(path), {name: cells[:, j] for j, name in enumerate(names)}, tuple(line for line, _ in body))


def _read_parquet(path: Path) -> Table:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError(f"{path}: reading Parquet needs pyarrow: pip install 'pyrobnn[tables]' (or save the table "
                         "as CSV)") from None
    try:
        table = pq.read_table(path)
    except Exception as error:  # noqa: BLE001 - pyarrow's errors: not a Parquet file, truncated, ...
        raise ValueError(f"{path} is not a readable Parquet file: {' '.join(str(error).split())[:200]}") from None
    if table.num_columns == 0:
        raise ValueError(f"{path} is empty: a table needs named columns and one row per example")
    return _table(str(path), {name: table.column(name).to_numpy(zero_copy_only=False) for name in table.column_names})


def _read_npz(path: Path) -> Data:
    try:
        with np.load(path, allow_pickle=False) as found:
            arrays = {name: found[name] for name in found.files}
    except ValueError as error:
        raise ValueError(f"{path}: not an .npz of plain arrays ({' '.join(str(error).split())[:160]}); save numbers "
                         "and strings, not Python objects") from None
    except OSError as error:
        raise ValueError(f"{path} is not a readable .npz file ({error})") from None
    if not arrays:
        raise ValueError(f"{path} is empty: save arrays x and y, or one array per column")
    return as_data(arrays, str(path))


def _call(location: str) -> Data:
    module, colon, function = location.partition(":")
    if not colon or not module or not function:
        raise ValueError(f"dataset 'py:{location}': write py:MODULE:FUNCTION, e.g. py:mypackage.data:load")
    try:
        loader = getattr(importlib.import_module(module), function)
    except ImportError as error:
        raise ValueError(f"dataset 'py:{location}': cannot import {module} ({error}); make it importable (on "
                         "PYTHONPATH, in every worker)") from None
    except AttributeError:
        raise ValueError(f"dataset 'py:{location}': {module} has no {function}") from None
    return as_data(loader(), f"py:{location}")


def as_data(data, source: str = "the arrays") -> Data:
    """In-memory data as a :class:`Table` or :class:`Arrays`: ``(x, y)`` or ``{"x": x, "y": y}`` with ``x`` of two
    or more dimensions (arrays), ``{column: 1-d values}`` or a DataFrame (anything with ``columns`` whose items are
    columns; a table); tensors and lists as numpy arrays."""
    if isinstance(data, (tuple, list)) and len(data) == 2:
        return _arrays(source, *data)
    if isinstance(data, Mapping) and set(data) == {"x", "y"} and np.ndim(_numpy(data["x"])) > 1:
        return _arrays(source, data["x"], data["y"])
    if isinstance(data, Mapping):
        return _table(source, {name: _numpy(values) for name, values in data.items()})
    if hasattr(data, "columns") and hasattr(data, "__getitem__"):  # a pandas (or similar) DataFrame
        return _table(source, {str(name): _numpy(data[name]) for name in data.columns})
    raise ValueError(f"{source}: give (x, y), {{'x': x, 'y': y}}, {{column: values}} or a DataFrame, got "
                     f"{type(data).__name__}")


def _numpy(values) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        return values.detach().cpu().numpy()
    if hasattr(values, "to_numpy"):
        return values.to_numpy()
    return np.asarray(values)


def _arrays(source: str, x, y) -> Arrays:
    x, y = _numpy(x), _numpy(y)
    for what, array in (("x", x), ("y", y)):
        if array.dtype.kind not in "biuf":
            raise ValueError(f"{source}: {what} must hold numbers, got dtype {array.dtype} (save a table of named "
                             "columns for text)")
        if array.ndim == 0 or len(array) == 0:
            raise ValueError(f"{source}: {what} is empty (shape {array.shape}); give one row per example")
    if len(x) != len(y):
        raise ValueError(f"{source}: x has {len(x)} rows and y {len(y)}; give one target per input")
    if x.ndim == 1:
        raise ValueError(f"{source}: x has shape {x.shape}; give inputs of shape (N, D) (one column: x[:, None])")
    for what, array in (("x", x), ("y", y)):
        bad = np.argwhere(~np.isfinite(array.astype(np.float64)))
        if bad.size:
            where = bad[0][0] if array.ndim == 1 else tuple(int(i) for i in bad[0])
            raise ValueError(f"{source}: {what}[{where}] is {array[tuple(bad[0])]}, not a finite number; pyrobnn does "
                             "not fill in missing values: fill or drop the row")
    if y.ndim > 2:
        raise ValueError(f"{source}: y has shape {y.shape}; give (N,) or (N, K)")
    return Arrays(source, x, y)


@functools.lru_cache(maxsize=8)
def _read(kind: str, location: str, stamp: tuple) -> Data:
    if kind == "py":
        return _call(location)
    path = Path(location).expanduser()
    return {"csv": _read_csv, "parquet": _read_parquet, "npz": _read_npz}[kind](path)


def read_source(kind: str, location: str) -> Data:
    """The table or arrays of ``kind:location`` (:func:`table_source`), parsed once per process while the file is
    unchanged (size and modification time)."""
    if kind == "py":
        return _read(kind, location, ())
    path = Path(location).expanduser()
    if not path.is_file():
        where = "" if path.is_absolute() else f" (relative paths are from the current folder, {Path.cwd()})"
        what = "a directory, not a file" if path.is_dir() else "no such file"
        raise FileNotFoundError(f"dataset {kind}:{location}: {what}{where}; give the path of a "
                                f"{'CSV' if kind == 'csv' else kind} file")
    stat = path.stat()
    return _read(kind, str(path), (stat.st_size, stat.st_mtime_ns))


def save_arrays(path: str | os.PathLike, data) -> Path:
    """Write in-memory data (anything :func:`as_data` takes) to ``path`` as an ``.npz`` that ``npz:PATH`` reads
    (numbers and text, no pickle), atomically; checked first, so bad data writes nothing. Returns ``path``."""
    found = as_data(data, str(path))
    if isinstance(found, Arrays):
        arrays = {"x": found.x, "y": found.y}
    else:
        arrays = {name: values.astype(str) if values.dtype == object else values
                  for name, values in found.columns.items()}
    return atomic_write(Path(path), lambda f: np.savez(f, **arrays))


def fingerprint(data) -> str:
    """A hash of in-memory data's content (12 hex digits), to name the file :func:`save_arrays` writes for it."""
    found = as_data(data)
    arrays = {"x": found.x, "y": found.y} if isinstance(found, Arrays) else found.columns
    digest = hashlib.sha256()
    for name, values in arrays.items():
        digest.update(f"{name}:{values.dtype.str if values.dtype != object else 'text'}:{values.shape}".encode())
        digest.update("\x00".join(values.tolist()).encode() if values.dtype == object
                      else np.ascontiguousarray(values).tobytes())
    return digest.hexdigest()[:12]


# --------------------------------------------------------------------------- columns to tensors


@dataclass(frozen=True)
class _Prepared:
    """A data set's inputs and targets before splitting: ``x`` float64 (N, D) or images, ``y`` int64 labels (N,)
    or float64 (N, K); what to call the input columns, the classes, and how the target's rows are named."""

    x: np.ndarray
    y: np.ndarray
    task: str
    classes: tuple[str, ...] | None
    features: tuple[str, ...] | None
    target: str
    images: bool = False


def _auto_task(values: np.ndarray) -> str:
    if values.dtype == object:
        return "classification"
    whole = np.all(values == np.round(values))
    return "classification" if whole and len(np.unique(values)) <= AUTO_MAX_CLASSES else "regression"


def _shown(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _target(values: np.ndarray, task: str, source: str, name: str) -> tuple[np.ndarray, str, tuple | None]:
    """``(targets, task, classes)``: int64 labels of the sorted distinct values (classification) or float64
    (N, K) values (regression); a target of one value, or text for regression, is a ``ValueError``."""
    flat = values.reshape(len(values), -1)
    distinct = np.unique(flat, axis=0) if flat.dtype != object else np.unique(flat[:, 0])
    if len(distinct) < 2:
        value = distinct[0][0] if flat.dtype != object else distinct[0]
        raise ValueError(f"{source}: the target {name} holds one value, {_shown(value)}, in all {len(values)} rows: "
                         "there is nothing to learn; name another target (--data.target)")
    task = _auto_task(flat[:, 0]) if task == "auto" and flat.shape[1] == 1 else \
        "regression" if task == "auto" else task
    if task == "classification":
        if flat.shape[1] != 1:
            raise ValueError(f"{source}: the target {name} has {flat.shape[1]} columns; classification takes one "
                             "label per example")
        classes, labels = np.unique(flat[:, 0], return_inverse=True)
        return labels.astype(np.int64), task, tuple(_shown(c) for c in classes.tolist())
    if flat.dtype == object:
        raise ValueError(f"{source}: the target {name} holds text ({flat[0, 0]!r}, ...); regression needs numbers "
                         "(or pass --data.task classification)")
    return flat.astype(np.float64), task, None


def _prepare(data: Data, columns: Columns) -> _Prepared:
    if columns.task not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)}, got {columns.task!r}")
    if isinstance(data, Arrays):
        named = [flag for flag, value in (("--data.target", columns.target), ("--data.features", columns.features),
                                          ("--data.categorical", columns.categorical)) if value]
        if named:
            raise ValueError(f"{data.source} holds arrays x and y, not named columns: {', '.join(named)} apply to "
                             "tables (drop them, or save one array per column)")
        y, task, classes = _target(data.y, columns.task, data.source, "y")
        images = data.x.ndim > 2
        x = data.x[:, None] if data.x.ndim == 3 else data.x
        if images:
            x = x.astype(np.float32) / 255.0 if x.dtype == np.uint8 else x.astype(np.float32)
        else:
            x = x.astype(np.float64)
        features = None if images else tuple(f"x{j}" for j in range(x.shape[1]))
        return _Prepared(x, y, task, classes, features, "y", images)
    names = list(data.columns)
    target = names[-1] if columns.target is None else columns.target
    if target not in data.columns:
        raise ValueError(f"{data.source} has no column {target!r} (--data.target): its columns are "
                         f"{', '.join(map(repr, names))}")
    features = [name for name in names if name != target] if columns.features is None else list(columns.features)
    for option, chosen in (("--data.features", features), ("--data.categorical", columns.categorical)):
        unknown = [name for name in chosen if name not in data.columns]
        if unknown:
            raise ValueError(f"{data.source} has no column {unknown[0]!r} ({option}): its columns are "
                             f"{', '.join(map(repr, names))}")
    if target in features:
        raise ValueError(f"{data.source}: {target!r} is the target (--data.target) and a feature (--data.features): "
                         "leave it out of the features")
    if not features:
        raise ValueError(f"{data.source}: no feature columns beside the target {target!r}; give --data.features")
    outside = [name for name in columns.categorical if name not in features]
    if outside:
        raise ValueError(f"--data.categorical {outside[0]}: not one of the features ({', '.join(features)})")
    y, task, classes = _target(data.columns[target], columns.task, data.source, f"column {target!r}")
    blocks, shown = [], []
    for name in features:
        values = data.columns[name]
        if values.dtype == object or name in columns.categorical:
            categories, codes = np.unique(values, return_inverse=True)
            blocks.append(np.eye(len(categories))[codes])
            shown += [f"{name}={_shown(c)}" for c in categories.tolist()]
        else:
            blocks.append(values[:, None])
            shown.append(name)
    return _Prepared(np.concatenate(blocks, axis=1), y, task, classes, tuple(shown), f"column {target!r}")


def load_table(name: str, *, columns: Columns | None = None, split: int | None = None, folds: int | None = None,
               test_fraction: float | None = None, split_seed: int | None = None, validation: bool = False,
               train_size: int | None = None, test_size: int | None = None, val_size: int = 0,
               seed: int = 0) -> DataSplits:
    """The data set ``name`` (``csv:PATH``, ``parquet:PATH``, ``npz:PATH``, ``py:MODULE:FUNCTION``: see the module's
    docstring) split into training and test rows by :func:`~pyrobnn.data.splits.split_rows` (``split``, ``folds``,
    ``test_fraction``, ``split_seed``), every class checked to have training rows, then ``validation``'s holdout,
    :func:`~pyrobnn.data.make_splits`' seeded subsets and validation set (``train_size``, ``test_size``,
    ``val_size``, ``seed``), then standardised on the training rows (inputs, and a regression target with
    ``y_mean``/``y_std`` kept; image arrays are scaled to [0, 1] instead). Targets: int64 labels (N,), or float32
    (N, K) for regression, (N,) targets taken as (N, 1)."""
    kind, location = table_source(name) or (None, None)
    if kind is None:
        raise ValueError(f"dataset {name!r} is not a table: give csv:PATH, parquet:PATH, npz:PATH or "
                         "py:MODULE:FUNCTION")
    data = read_source(kind, location)
    prepared = _prepare(data, columns or Columns())
    train, test = split_rows(len(prepared.y), split=split, folds=folds, test_fraction=test_fraction, seed=split_seed)
    if prepared.task == "classification":
        check_training_classes(prepared.y, train, prepared.classes, data.source, f"the target {prepared.target}",
                               split=split, folds=folds, test_fraction=test_fraction, seed=split_seed)
    x_train, y_train = torch.from_numpy(prepared.x[train]), torch.from_numpy(prepared.y[train])
    if validation:
        x_train, y_train, x_test, y_test = holdout(x_train, y_train)
    else:
        x_test, y_test = torch.from_numpy(prepared.x[test]), torch.from_numpy(prepared.y[test])
    regression = prepared.task == "regression"
    splits = make_splits(x_train, y_train, x_test, y_test, name=name, task=prepared.task,
                         num_outputs=prepared.y.shape[1] if regression else len(prepared.classes),
                         classes=prepared.classes, train_size=train_size, test_size=test_size, val_size=val_size,
                         seed=seed)
    splits = dataclasses.replace(splits, features=prepared.features)
    return standardized(splits, inputs=not prepared.images, target=regression)
