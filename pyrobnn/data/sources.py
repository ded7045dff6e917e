"""Where benchmark files live: the data root, the cache directory, downloads, the "not found" error.

The data root is chosen in this order: the explicit ``root`` argument (the
CLI's ``--data-root DIR``), the environment variable ``PYROBNN_DATA``, the
default ``~/.cache/pyrobnn/data``. It is only ever read (it may be a shared,
read-only directory); derived files go to :func:`cache_dir` (``PYROBNN_CACHE``,
else ``~/.cache/pyrobnn``).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Callable

DATA_ENV = "PYROBNN_DATA"
"""The environment variable naming the data root when ``--data-root`` / ``root=`` is not given (:func:`data_root`)."""
CACHE_ENV = "PYROBNN_CACHE"
"""The environment variable naming the cache folder of decoded data (:func:`cache_dir`)."""
DEFAULT_DATA_ROOT = "~/.cache/pyrobnn/data"
DEFAULT_CACHE_DIR = "~/.cache/pyrobnn"

DOWNLOAD_TIMEOUT_S = 10.0
"""Socket timeout while torchvision downloads (so offline attempts fail fast)."""


def _root_and_source(root: str | os.PathLike | None) -> tuple[Path, str]:
    """The data root and a phrase saying how it was chosen (for error messages)."""
    if root is not None and str(root) != "":
        return Path(root).expanduser(), "the root argument (--data-root)"
    env = os.environ.get(DATA_ENV)
    if env:
        return Path(env).expanduser(), f"the {DATA_ENV} environment variable"
    return (
        Path(DEFAULT_DATA_ROOT).expanduser(),
        f"the default (no --data-root given and {DATA_ENV} unset)",
    )


def data_root(root: str | os.PathLike | None = None) -> Path:
    """Directory holding the benchmark files: ``root``, else ``$PYROBNN_DATA``, else ``~/.cache/pyrobnn/data``."""
    return _root_and_source(root)[0]


def cache_dir() -> Path:
    """Directory for derived files (extracted archives, decoded arrays): ``$PYROBNN_CACHE`` else
    ``~/.cache/pyrobnn``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env if env else DEFAULT_CACHE_DIR).expanduser()


def not_found(dataset: str, looked_in: Path, wanted: str, root: str | os.PathLike | None,
              download: bool, download_error: BaseException | None = None) -> FileNotFoundError:
    """The error for missing files: what was looked for where, how the root was chosen, how to fix it."""
    path, source = _root_and_source(root)
    if download_error is not None:
        msg = " ".join(str(download_error).split())
        why = f"Downloading them failed ({type(download_error).__name__}: {msg})."
    elif not download:
        why = "Downloading was disabled (download=False)."
    else:
        why = ""
    return FileNotFoundError(
        f"{dataset} not found: looked for {wanted} in {looked_in} "
        f"(data root {path}, chosen by {source}). {why} "
        f"Fix: put the files there, or point to a directory that has them with "
        f"`--data-root DIR` or `export {DATA_ENV}=DIR`."
    )


def try_download(fetch: Callable[[], object], dirs: list[Path]) -> BaseException | None:
    """Run a torchvision download with a short socket timeout; return the error, if any.

    ``dirs`` are the directories the download may create (outermost first);
    those that did not exist before and are left empty by a failed attempt are
    removed again, so an offline attempt leaves no trace.
    """
    outer = dirs[0]
    new = [p for p in (*reversed(outer.parents), *dirs) if not p.exists()]
    old_timeout = socket.getdefaulttimeout()
    socket.setdefaulttimeout(DOWNLOAD_TIMEOUT_S)
    try:
        fetch()
        return None
    except Exception as err:  # noqa: BLE001 - any failure means "not available"
        for d in reversed(new):  # deepest first
            if d.is_dir() and not any(d.iterdir()):
                d.rmdir()
        return err
    finally:
        socket.setdefaulttimeout(old_timeout)
