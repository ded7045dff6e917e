"""Writing files so that a crash or a full disk never leaves half a file behind.

:func:`atomic_write` is the one way pyrobnn writes its outputs (checkpoints,
``metrics.json``, evaluation and pruning reports): the bytes go to a temporary
file in the target's directory, which is flushed to disk and then renamed over
the target with :func:`os.replace` (atomic on POSIX and Windows). The file is
created with mode ``0o666`` filtered by the process umask, like any file a
program opens for writing, not the ``0o600`` of :func:`tempfile.mkstemp`.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import IO, Callable, Union

__all__ = ["atomic_write", "write_json", "check_writable"]

Content = Union[bytes, str, Callable[[IO[bytes]], object]]


def atomic_write(path: str | os.PathLike, content: Content) -> Path:
    """Write ``content`` to ``path`` atomically and return the path.

    ``content`` is ``bytes``, a ``str`` (written as UTF-8), or a callable that writes to the
    binary file object it is given (e.g. ``lambda f: torch.save(state, f)``). Missing parent
    directories are created. On any error the temporary file is removed and ``path`` is left as
    it was. The new file's mode is ``0o666 & ~umask``.
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"cannot write {path}: it is a directory")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    # os.open with 0o666: the kernel applies the umask, as for open(path, "w")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            if callable(content):
                content(f)
            else:
                f.write(content.encode("utf-8") if isinstance(content, str) else content)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_json(path: str | os.PathLike, payload) -> Path:
    """Write ``payload`` as indented JSON with :func:`atomic_write`."""
    return atomic_write(path, json.dumps(payload, indent=2) + "\n")


def check_writable(path: str | os.PathLike, what: str, directory: bool = False) -> Path:
    """Fail early, before any work, when ``path`` could not be written later.

    ``directory=True``: ``path`` is an output directory (it may exist, as a directory);
    otherwise ``path`` is a file (it may exist, as a file). Every existing ancestor must be a
    writable directory. Nothing is created. Raises :class:`ValueError` naming ``what`` and ``path``.
    """
    path = Path(path)
    if path.exists():
        if directory and not path.is_dir():
            raise ValueError(f"{what} {path} exists and is not a directory")
        if not directory and path.is_dir():
            raise ValueError(f"{what} {path} is a directory, not a file")
        target = path if directory else path.parent
        if not os.access(target, os.W_OK | os.X_OK):
            raise ValueError(f"{what} {path}: {target} is not writable")
        return path
    parent = path.parent
    while not parent.exists():
        if parent == parent.parent:
            break
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{what} {path} cannot be created: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{what} {path} cannot be created: {parent} is not writable")
    return path
