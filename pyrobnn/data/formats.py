"""File formats the loaders read: IDX arrays and tar archives (extracted atomically)."""

from __future__ import annotations

import gzip
import os
import shutil
import tarfile
import uuid
from pathlib import Path

import numpy as np

_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (LeCun et al., 1998; ``.gz`` or uncompressed) into a native-endian numpy array."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_DTYPES:
        raise ValueError(f"{path} is not an IDX file (bad magic number {data[:4]!r})")
    ndim = data[3]
    dims = tuple(int(d) for d in np.frombuffer(data, ">u4", count=ndim, offset=4))
    dtype = np.dtype(_IDX_DTYPES[data[2]])
    offset = 4 + 4 * ndim
    count = int(np.prod(dims)) if dims else 1
    if len(data) - offset != count * dtype.itemsize:
        raise ValueError(f"{path}: header says shape {dims} but the file holds "
                         f"{len(data) - offset} data bytes (truncated or corrupt?)")
    arr = np.frombuffer(data, dtype, count=count, offset=offset).reshape(dims)
    return arr.astype(dtype.newbyteorder("="), copy=True)


def extract_archive(archive: Path, target: Path, stamp: str = "") -> None:
    """Extract ``archive`` into ``target`` atomically (temp dir + rename); no-op if done.

    ``stamp`` is written to ``target/.stamp`` (before the rename), identifying the archive.
    """
    if target.is_dir():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.mkdir(mode=0o777)  # the kernel applies the umask (mkdtemp would make it private, 0700)
    try:
        with tarfile.open(archive, "r:*") as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(tmp, filter="data")
            else:  # pragma: no cover - Python < 3.11.4
                tar.extractall(tmp)
        (tmp / ".stamp").write_text(stamp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():  # lost a race to another process: fine, else re-raise
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
