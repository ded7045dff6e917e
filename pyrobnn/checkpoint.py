"""Checkpoints: everything needed to resume a run exactly, written atomically, loaded safely.

A checkpoint is a dict of tensors and plain Python values (numbers, strings, lists,
tuples, dicts, ``None``) saved with :func:`torch.save`. :func:`load_checkpoint` reads
it with ``torch.load(..., weights_only=True)``, which never runs code stored in the
file: a checkpoint that pickles any other object is refused. To make that possible,
:func:`rng_state` stores NumPy's generator state as a tensor and numbers instead of
NumPy's own tuple with an array inside.

Every way a file can fail to be a checkpoint (truncated, random bytes, a directory,
another program's file, an unsafe pickle) raises :class:`ValueError` with one line
naming the file and the problem.
"""

from __future__ import annotations

import os
import pickle
import random
import re
import warnings
from pathlib import Path

import numpy as np
import torch

from pyrobnn.checks import one_line
from pyrobnn.files import atomic_write

__all__ = ["save_checkpoint", "load_checkpoint", "rng_state", "set_rng_state", "FORMAT", "REQUIRED_KEYS"]

FORMAT = 2
"""Written under the key ``"pyrobnn"``: 2 stores every RNG state as tensors and plain values
(loadable with ``weights_only=True``); files without the key predate it."""

REQUIRED_KEYS = ("model", "guide", "epoch")
"""Keys every pyrobnn checkpoint has (with ``optimizer``, ``scheduler``, ``history``, ``rng`` and
``config`` for one written by :func:`pyrobnn.infer.svi.fit`)."""


def rng_state() -> dict:
    """The state of every random number generator a run draws from, as tensors and plain values."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {"bit_generator": str(name), "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "python": (int(version), tuple(int(v) for v in internal), gauss_next),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore :func:`rng_state`; its tensors may have been loaded onto a GPU (``map_location``).

    Also accepts the NumPy tuple of checkpoints written before :data:`FORMAT` 2.
    """
    torch.set_rng_state(state["torch"].cpu())
    numpy_state = state["numpy"]
    if isinstance(numpy_state, dict):
        keys = numpy_state["keys"]
        keys = keys.cpu().numpy() if isinstance(keys, torch.Tensor) else np.asarray(keys)
        numpy_state = (numpy_state["bit_generator"], keys.astype(np.uint32), numpy_state["pos"],
                       numpy_state["has_gauss"], numpy_state["cached_gaussian"])
    np.random.set_state(numpy_state)
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def save_checkpoint(path: str | os.PathLike, state: dict) -> Path:
    """``torch.save`` ``state`` (plus the format marker) to ``path`` with :func:`~pyrobnn.files.atomic_write`:
    a crash never leaves half a file, and the file gets the usual umask permissions."""
    state = {"pyrobnn": FORMAT, **state}
    return atomic_write(path, lambda f: torch.save(state, f))


def _unsafe_reason(message: str) -> str:
    found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", message)
    if found:
        return f"it stores a pickled {found.group(1)} object"
    found = re.search(r"WeightsUnpickler error:\s*(.+)", message)
    return f"it is not a plain tensor file ({one_line(found.group(1), 80)})" if found else "it stores pickled objects"


def load_checkpoint(path: str | os.PathLike, map_location="cpu", *, trusted: bool = False) -> dict:
    """Load a checkpoint written by :func:`save_checkpoint` (``pyrobnn train`` writes ``checkpoint.pt``).

    The file is read with ``torch.load(..., weights_only=True)``: it may hold only tensors and
    plain Python values, so loading it never runs code. ``trusted=True`` loads any pickle (only
    for a file from a source you trust, e.g. a checkpoint of an old pyrobnn version).

    :raises FileNotFoundError: when ``path`` does not exist.
    :raises ValueError: one line naming the file, when it is a directory, is truncated or not a
        PyTorch file, stores objects other than tensors and plain values, or is not a pyrobnn
        checkpoint.
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"checkpoint {path} is a directory; pass the path of the checkpoint.pt file in it")
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {path} does not exist: pass the path of a checkpoint.pt "
                                "written by `pyrobnn train`")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "Detected pickle protocol ..." of foreign files
            state = torch.load(path, map_location=map_location, weights_only=not trusted)
    except pickle.UnpicklingError as error:
        message = str(error)
        if "Weights only load failed" in message:
            raise ValueError(f"checkpoint {path} refused: {_unsafe_reason(message)}, and loading it could run "
                             "arbitrary code; pyrobnn checkpoints hold only tensors and plain values (load a "
                             "file you trust with load_checkpoint(path, trusted=True))") from None
        raise ValueError(f"checkpoint {path} is not a PyTorch checkpoint ({one_line(message, 80)})") from None
    except (RuntimeError, EOFError, ValueError, OSError, IndexError, KeyError, TypeError) as error:
        if isinstance(error, EOFError):
            detail = "the file is truncated or empty"
        elif "central directory" in str(error):
            detail = "the file is truncated or corrupt (no zip central directory)"
        else:
            detail = f"it is not a file written by torch.save ({one_line(str(error), 80) or type(error).__name__})"
        raise ValueError(f"checkpoint {path} cannot be read: {detail}") from None
    if not isinstance(state, dict):
        raise ValueError(f"checkpoint {path} is not a pyrobnn checkpoint: it holds a {type(state).__name__}, "
                         "not a dict")
    missing = [key for key in REQUIRED_KEYS if key not in state]
    if missing:
        raise ValueError(f"checkpoint {path} is not a pyrobnn checkpoint: it has no {', '.join(missing)} "
                         "entries (it was not written by `pyrobnn train` or pyrobnn.infer.svi.fit)")
    return state
