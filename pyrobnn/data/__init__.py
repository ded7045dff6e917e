"""Datasets as in-memory tensors.

Every loader returns a :class:`DataSplits` holding whole tensors (no
``DataLoader``): on CPU, slicing a tensor per mini-batch is the fastest way to
feed a training loop. Images are float32 in ``[0, 1]`` with shape
``(N, C, H, W)``; class labels are int64; regression inputs and targets are
float32 of shape ``(N, D)``.

Where the data live
-------------------
Benchmark files are looked up under a *data root*, chosen in this order:

1. the explicit ``root`` argument (the CLI's ``--data-root DIR``);
2. the environment variable ``PYROBNN_DATA``;
3. the default ``~/.cache/pyrobnn/data``.

Files in the data root are only ever read, never written next to (it may be
a shared, read-only directory). Anything derived from them -- an extracted
archive, a decoded-array cache -- goes to :func:`cache_dir` (``PYROBNN_CACHE``,
else ``~/.cache/pyrobnn``). Layout expected under the data root:

* ``MNIST/raw/`` and ``FashionMNIST/raw/``: the official IDX files
  (``train-images-idx3-ubyte.gz`` ...), gzipped or not (torchvision's layout);
* ``cifar-10-batches-py/`` (torchvision's CIFAR-10) or ``cifar10-jpeg.tar.gz``
  (an ImageFolder tree ``train/<class>/*.jpg``, ``test/<class>/*.jpg``).

When files are missing and ``download=True``, torchvision is asked to
download them into the data root (only sensible when that root is your own
directory); offline this fails fast and a :class:`FileNotFoundError` explains
where the files were looked for and how to point at them.

``"folder:<path>"`` loads any ImageFolder tree with ``train/`` and ``test/``.
"""

from __future__ import annotations

import gzip
import os
import shutil
import socket
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

__all__ = [
    "DATASETS",
    "DataSplits",
    "cache_dir",
    "cubic",
    "data_root",
    "load_dataset",
    "sinusoid",
    "two_moons",
]

DATASETS = ("mnist", "fashion-mnist", "cifar10", "two-moons", "cubic", "sinusoid")
"""Dataset names accepted by :func:`load_dataset`, plus ``"folder:<path>"``."""

DATA_ENV = "PYROBNN_DATA"
CACHE_ENV = "PYROBNN_CACHE"
DEFAULT_DATA_ROOT = "~/.cache/pyrobnn/data"
DEFAULT_CACHE_DIR = "~/.cache/pyrobnn"

CIFAR10_CLASSES = (
    "airplane", "automobile", "bird", "cat", "deer",
    "dog", "frog", "horse", "ship", "truck",
)
FASHION_MNIST_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)
CIFAR10_ARCHIVE = "cifar10-jpeg.tar.gz"

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")

DOWNLOAD_TIMEOUT_S = 10.0
"""Socket timeout while torchvision downloads (so offline attempts fail fast)."""


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


# --------------------------------------------------------------------------- paths


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
    """Directory for derived files (extracted archives, decoded arrays): ``$PYROBNN_CACHE`` else ``~/.cache/pyrobnn``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env if env else DEFAULT_CACHE_DIR).expanduser()


def _not_found(dataset: str, looked_in: Path, wanted: str, root: str | os.PathLike | None,
               download: bool, download_error: BaseException | None = None) -> FileNotFoundError:
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


def _try_download(fetch: Callable[[], object], dirs: list[Path]) -> BaseException | None:
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


# --------------------------------------------------------------------------- IDX (MNIST)

_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (``.gz`` or uncompressed) into a native-endian numpy array."""
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


_IDX_FILES = {
    "train_x": "train-images-idx3-ubyte",
    "train_y": "train-labels-idx1-ubyte",
    "test_x": "t10k-images-idx3-ubyte",
    "test_y": "t10k-labels-idx1-ubyte",
}


def _find_idx_files(raw: Path) -> dict[str, Path] | None:
    found = {}
    for key, stem in _IDX_FILES.items():
        for cand in (raw / (stem + ".gz"), raw / stem):
            if cand.is_file():
                found[key] = cand
                break
        else:
            return None
    return found


def _load_mnist_like(name: str, folder: str, root: str | os.PathLike | None, download: bool):
    base = data_root(root)
    raw = base / folder / "raw"
    files = _find_idx_files(raw)
    err = None
    if files is None and download:
        import torchvision.datasets as tvd

        cls = tvd.MNIST if folder == "MNIST" else tvd.FashionMNIST
        err = _try_download(lambda: cls(str(base), train=True, download=True),
                            [base, base / folder, raw])
        files = _find_idx_files(raw)
    if files is None:
        wanted = ", ".join(f"{s}[.gz]" for s in _IDX_FILES.values())
        raise _not_found(name, raw, wanted, root, download, err)
    arrays = {k: read_idx(p) for k, p in files.items()}
    return arrays["train_x"][:, None], arrays["train_y"], arrays["test_x"][:, None], arrays["test_y"]


# --------------------------------------------------------------------------- image folders


def _gray(mode: str) -> bool:
    return mode in ("1", "L", "LA", "I", "I;16", "F")


def decode_image_folder(split_dir: str | os.PathLike, classes: tuple[str, ...] | None = None,
                        size: tuple[int, int] | None = None, mode: str | None = None
                        ) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """Decode ``split_dir/<class>/<image>`` into ``(uint8 images (N, C, H, W), int64 labels, classes)``.

    Classes are the sub-directories in alphabetical order (or ``classes``, to
    reuse the training split's label mapping). All images must have the same
    size (``size`` = (width, height) if given, else the first image's); the
    colour mode is taken from the first image (grayscale -> 1 channel, else RGB)
    unless ``mode`` ("L" or "RGB") is given.
    """
    from PIL import Image

    split_dir = Path(split_dir)
    found = tuple(sorted(d.name for d in split_dir.iterdir() if d.is_dir()))
    if classes is None:
        classes = found
    else:
        extra = sorted(set(found) - set(classes))
        if extra:
            raise ValueError(f"{split_dir} has class folders {extra} that the training split lacks "
                             f"(training classes: {list(classes)})")
    files: list[tuple[Path, int]] = []
    for label, cls in enumerate(classes):
        cdir = split_dir / cls
        if cdir.is_dir():
            files += [(p, label) for p in sorted(cdir.iterdir())
                      if p.is_file() and p.suffix.lower() in IMG_EXTENSIONS]
    if not files:
        raise ValueError(f"no images ({', '.join(IMG_EXTENSIONS)}) found in {split_dir}/<class>/")
    first = files[0][0]
    out: np.ndarray | None = None
    labels = np.empty(len(files), dtype=np.int64)
    for i, (path, label) in enumerate(files):
        with Image.open(path) as im:
            if mode is None:
                mode = "L" if _gray(im.mode) else "RGB"
            if size is None:
                size = im.size
            if im.size != size:
                raise ValueError(
                    f"image {path} is {im.size[0]}x{im.size[1]} but {first} (the first image) is "
                    f"{size[0]}x{size[1]}; all images must have the same size (resize them first)")
            arr = np.asarray(im.convert(mode) if im.mode != mode else im, dtype=np.uint8)
        if out is None:
            out = np.empty((len(files), 1 if mode == "L" else 3, size[1], size[0]), dtype=np.uint8)
        out[i] = arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)
        labels[i] = label
    assert out is not None
    return out, labels, classes


def _layout_root(path: Path) -> Path | None:
    """``path`` if it holds ``train/`` and ``test/``, or its single sub-directory that does."""
    if (path / "train").is_dir() and (path / "test").is_dir():
        return path
    subs = [d for d in path.iterdir() if d.is_dir()] if path.is_dir() else []
    if len(subs) == 1 and (subs[0] / "train").is_dir() and (subs[0] / "test").is_dir():
        return subs[0]
    return None


def _load_folder(path: str | os.PathLike):
    path = Path(path).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(f"folder dataset {path} does not exist (expected an ImageFolder "
                                f"tree {path}/train/<class>/<image> and {path}/test/<class>/<image>)")
    top = _layout_root(path)
    if top is None:
        raise ValueError(f"folder dataset {path} must contain train/ and test/ sub-directories, "
                         f"laid out as train/<class>/<image> and test/<class>/<image> "
                         f"(found: {sorted(p.name for p in path.iterdir())})")
    x_tr, y_tr, classes = decode_image_folder(top / "train")
    mode = "L" if x_tr.shape[1] == 1 else "RGB"
    size = (x_tr.shape[3], x_tr.shape[2])
    x_te, y_te, _ = decode_image_folder(top / "test", classes, size=size, mode=mode)
    return x_tr, y_tr, x_te, y_te, classes


# --------------------------------------------------------------------------- CIFAR-10


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _extract_archive(archive: Path, target: Path, stamp: str = "") -> None:
    """Extract ``archive`` into ``target`` atomically (temp dir + rename); no-op if done.

    ``stamp`` is written to ``target/.stamp`` (before the rename), identifying the archive.
    """
    if target.is_dir():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it private (0700)
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


def _save_npz_atomic(path: Path, **arrays: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it private (0600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _load_cifar10_archive(archive: Path):
    """Decode the ImageFolder tarball once, caching uint8 arrays in :func:`cache_dir`."""
    cache = cache_dir()
    npz = cache / "cifar10-jpeg.npz"
    key = np.array(archive.stat().st_size, dtype=np.int64)  # identifies the archive version
    if npz.is_file():
        with np.load(npz) as z:
            if "archive_size" in z.files and int(z["archive_size"]) == int(key):
                return (z["x_train"], z["y_train"], z["x_test"], z["y_test"],
                        tuple(str(c) for c in z["classes"]))
    extracted = cache / "cifar10-jpeg"
    stamp = extracted / ".stamp"
    if extracted.is_dir() and (not stamp.is_file() or stamp.read_text() != str(int(key))):
        shutil.rmtree(extracted)  # incomplete, or extracted from another archive version
    _extract_archive(archive, extracted, stamp=str(int(key)))
    top = _layout_root(extracted)
    if top is None:
        raise ValueError(f"{archive} does not hold an ImageFolder tree train/<class>/*, test/<class>/*")
    x_tr, y_tr, classes = decode_image_folder(top / "train", mode="RGB")
    if len(classes) != 10:
        raise ValueError(f"{archive} has {len(classes)} classes {list(classes)}; CIFAR-10 needs 10")
    x_te, y_te, _ = decode_image_folder(top / "test", classes, size=(x_tr.shape[3], x_tr.shape[2]),
                                        mode="RGB")
    _save_npz_atomic(npz, x_train=x_tr, y_train=y_tr, x_test=x_te, y_test=y_te,
                     classes=np.array(classes), archive_size=key)
    return x_tr, y_tr, x_te, y_te, classes


def _load_cifar10(root: str | os.PathLike | None, download: bool):
    import torchvision.datasets as tvd

    base = data_root(root)

    def from_batches():
        tr = tvd.CIFAR10(str(base), train=True, download=False)
        te = tvd.CIFAR10(str(base), train=False, download=False)
        return (tr.data.transpose(0, 3, 1, 2), np.asarray(tr.targets, dtype=np.int64),
                te.data.transpose(0, 3, 1, 2), np.asarray(te.targets, dtype=np.int64),
                tuple(tr.classes))

    if (base / "cifar-10-batches-py").is_dir():
        return from_batches()
    if (base / CIFAR10_ARCHIVE).is_file():
        return _load_cifar10_archive(base / CIFAR10_ARCHIVE)
    err = None
    if download:
        err = _try_download(lambda: tvd.CIFAR10(str(base), train=True, download=True), [base])
        if err is None:
            return from_batches()
    raise _not_found("cifar10", base, f"cifar-10-batches-py/ or {CIFAR10_ARCHIVE}",
                     root, download, err)


# --------------------------------------------------------------------------- subsets / splits


def _check_size(arg: str, value: int | None, low: int, high: int | None) -> None:
    ok = (isinstance(value, (int, np.integer)) and not isinstance(value, bool)
          and value >= low and (high is None or value <= high))
    if not ok:
        rng = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{arg} must be an integer in {rng}, got {value!r}")


def _subset_index(n: int, size: int | None, seed: int, stream: int, arg: str) -> torch.Tensor | None:
    """Sorted random subset of ``range(n)`` of ``size`` (None -> all, returns None)."""
    if size is None:
        return None
    _check_size(arg, size, 1, n)
    g = torch.Generator().manual_seed(2 * seed + stream)
    return torch.randperm(n, generator=g)[:size].sort().values


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
    _check_size("val_size", val_size, 0, len(x_train) - 1)
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


def _uint8_to_float(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float32).div_(255.0)


# --------------------------------------------------------------------------- synthetic


def _split_generated(x: torch.Tensor, y: torch.Tensor, n_train: int, name: str, task: str,
                     num_outputs: int, g: torch.Generator, shuffle: bool) -> DataSplits:
    if shuffle:
        perm = torch.randperm(len(x), generator=g)
        x, y = x[perm], y[perm]
    return DataSplits(x[:n_train], y[:n_train], None, None, x[n_train:], y[n_train:],
                      input_shape=tuple(x.shape[1:]), num_outputs=num_outputs, task=task, name=name)


def two_moons(n: int = 1000, n_train: int = 50, noise: float = 0.1, seed: int = 0) -> DataSplits:
    """Two interleaving half-circles (as sklearn's ``make_moons``), randomly split into train/test.

    Inputs (N, 2) float32, labels (N,) int64 (0 = upper moon, 1 = lower moon).
    """
    _check_size("n", n, 2, None)
    _check_size("n_train", n_train, 1, n - 1)
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
    """Toy regression y = x^3 + N(0, 3^2): train x ~ U[-4, 4]; test on a grid over [-6, 6] (extrapolation)."""
    _check_size("n_train", n_train, 1, None)
    _check_size("n_test", n_test, 1, None)
    g = torch.Generator().manual_seed(seed)
    x_tr = torch.empty(n_train, 1, dtype=torch.float64).uniform_(-4.0, 4.0, generator=g)
    x_te = torch.linspace(-6.0, 6.0, n_test, dtype=torch.float64)[:, None]
    x = torch.cat([x_tr, x_te])
    y = x**3 + 3.0 * torch.randn(x.shape, generator=g, dtype=torch.float64)
    return _split_generated(x.float(), y.float(), n_train, "cubic", "regression", 1, g, shuffle=False)


def sinusoid(n: int = 500, n_train: int = 40, seed: int = 0) -> DataSplits:
    """Blundell et al. (2015) curve: y = x + 0.3 sin(2π(x+ε)) + 0.3 sin(4π(x+ε)) + ε, ε ~ N(0, 0.02²), x ~ U[0, 0.5]."""
    _check_size("n", n, 2, None)
    _check_size("n_train", n_train, 1, n - 1)
    g = torch.Generator().manual_seed(seed)
    x = torch.empty(n, 1, dtype=torch.float64).uniform_(0.0, 0.5, generator=g)
    eps = 0.02 * torch.randn(x.shape, generator=g, dtype=torch.float64)
    y = x + 0.3 * torch.sin(2 * torch.pi * (x + eps)) + 0.3 * torch.sin(4 * torch.pi * (x + eps)) + eps
    return _split_generated(x.float(), y.float(), n_train, "sinusoid", "regression", 1, g, shuffle=False)


# --------------------------------------------------------------------------- entry point


def load_dataset(name: str, root: str | os.PathLike | None = None, *, train_size: int | None = None,
                 test_size: int | None = None, val_size: int = 0, seed: int = 0,
                 download: bool = True) -> DataSplits:
    """Load a dataset by name (see :data:`DATASETS`, or ``"folder:<path>"``) as in-memory tensors.

    ``train_size`` / ``test_size`` pick a seeded random subset (order kept);
    ``val_size`` examples are then split off the training set. For the
    synthetic datasets ``train_size`` / ``test_size`` set how many points are
    generated (defaults: the paper settings).
    """
    if not isinstance(name, str):
        raise ValueError(f"dataset must be a string, one of {list(DATASETS)} or 'folder:<path>'; got {name!r}")
    if name.startswith("folder:"):
        path = name[len("folder:"):]
        if not path:
            raise ValueError("dataset 'folder:' needs a path, e.g. 'folder:/data/my-images'")
        x_tr, y_tr, x_te, y_te, classes = _load_folder(path)
        return make_splits(x_tr, y_tr, x_te, y_te, name=name, task="classification",
                           num_outputs=len(classes), classes=classes, train_size=train_size,
                           test_size=test_size, val_size=val_size, seed=seed,
                           to_tensor=_uint8_to_float)
    key = name.strip().lower().replace("_", "-")
    key = {"fashionmnist": "fashion-mnist", "cifar-10": "cifar10", "twomoons": "two-moons",
           "moons": "two-moons"}.get(key, key)
    if key not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}: dataset must be one of "
                         f"{list(DATASETS)} or 'folder:<path>'")

    if key in ("two-moons", "cubic", "sinusoid"):
        if train_size is not None:
            _check_size("train_size", train_size, 1, None)
        if test_size is not None:
            _check_size("test_size", test_size, 1, None)
        if key == "two-moons":
            n_tr = 50 if train_size is None else train_size
            d = two_moons(n_tr + (950 if test_size is None else test_size), n_tr, seed=seed)
        elif key == "cubic":
            d = cubic(30 if train_size is None else train_size,
                      1000 if test_size is None else test_size, seed=seed)
        else:
            n_tr = 40 if train_size is None else train_size
            d = sinusoid(n_tr + (460 if test_size is None else test_size), n_tr, seed=seed)
        return make_splits(d.x_train, d.y_train, d.x_test, d.y_test, name=key, task=d.task,
                           num_outputs=d.num_outputs, val_size=val_size, seed=seed)

    if key in ("mnist", "fashion-mnist"):
        x_tr, y_tr, x_te, y_te = _load_mnist_like(
            key, "MNIST" if key == "mnist" else "FashionMNIST", root, download)
        classes = FASHION_MNIST_CLASSES if key == "fashion-mnist" else tuple(str(i) for i in range(10))
    else:  # cifar10
        x_tr, y_tr, x_te, y_te, classes = _load_cifar10(root, download)
    return make_splits(x_tr, y_tr.astype(np.int64), x_te, y_te.astype(np.int64), name=key,
                       task="classification", num_outputs=10, classes=classes,
                       train_size=train_size, test_size=test_size, val_size=val_size, seed=seed,
                       to_tensor=_uint8_to_float)
