"""Image classification sets: MNIST, Fashion-MNIST, CIFAR-10 and any ImageFolder tree.

Images come back float32 in ``[0, 1]`` with shape ``(N, C, H, W)`` (converted
after subsetting), labels int64; ``dtype=torch.uint8`` keeps the stored bytes 0..255
instead, with no float copy (for :class:`~pyrobnn.data.augment.ImageAugment`, which
converts and normalises each batch on the device). Layout expected under the data root
(:func:`~pyrobnn.data.sources.data_root`):

* ``MNIST/raw/`` and ``FashionMNIST/raw/``: the official IDX files
  (``train-images-idx3-ubyte.gz`` ...), gzipped or not (torchvision's layout);
* ``cifar-10-batches-py/`` (torchvision's CIFAR-10) or ``cifar10-jpeg.tar.gz``
  (an ImageFolder tree ``train/<class>/*.jpg``, ``test/<class>/*.jpg``), which
  is extracted and decoded once into :func:`~pyrobnn.data.sources.cache_dir`.

Missing files are downloaded by torchvision when ``download=True``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import torch

from pyrobnn.data import sources
from pyrobnn.data.formats import extract_archive, read_idx
from pyrobnn.data.splits import DataSplits, check_training_classes, make_splits, split_rows
from pyrobnn.files import atomic_write

MNIST_CLASSES = tuple(str(i) for i in range(10))
"""MNIST's class names, by label: the digits."""
FASHION_MNIST_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)
"""Fashion-MNIST's class names, by label."""
FOLDER_ORDER_SEED = 0
"""Seed of the fixed permutation of an image folder's files (:func:`decode_image_folder`)."""

CIFAR10_CACHE = "cifar10-jpeg-shuffled.npz"
"""The decoded JPEG archive under :func:`~pyrobnn.data.sources.cache_dir` (its rows in the order above; an older
``cifar10-jpeg.npz`` held them grouped by class and is not read)."""

CIFAR10_CLASSES = (
    "airplane", "automobile", "bird", "cat", "deer",
    "dog", "frog", "horse", "ship", "truck",
)
"""CIFAR-10's class names, by label."""
CIFAR10_ARCHIVE = "cifar10-jpeg.tar.gz"

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def _image_converter(dtype: torch.dtype):
    """uint8 images -> ``dtype``: ``None`` (kept as stored) for ``torch.uint8``, else scaled to [0, 1]."""
    if dtype == torch.uint8:
        return None
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype must be torch.uint8 (raw bytes 0..255) or a floating-point torch.dtype "
                         f"(images in [0, 1]), got {dtype!r}")
    return lambda x: x.to(dtype).div_(255.0)


def _classification_splits(name: str, x_tr, y_tr, x_te, y_te, classes: tuple[str, ...],
                           dtype: torch.dtype = torch.float32, **split) -> DataSplits:
    """uint8 images and integer labels as :class:`DataSplits` (``split``: sizes and seed of :func:`make_splits`),
    images converted to ``dtype`` (see :func:`_image_converter`)."""
    return make_splits(x_tr, np.asarray(y_tr, dtype=np.int64), x_te, np.asarray(y_te, dtype=np.int64),
                       name=name, task="classification", num_outputs=len(classes), classes=classes,
                       to_tensor=_image_converter(dtype), **split)


# --------------------------------------------------------------------------- MNIST, Fashion-MNIST

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


def _load_mnist_like(name: str, folder: str, classes: tuple[str, ...],
                     root: str | os.PathLike | None, download: bool, **split) -> DataSplits:
    _image_converter(split.get("dtype", torch.float32))  # a bad dtype fails before any file is read
    base = sources.data_root(root)
    raw = base / folder / "raw"
    files = _find_idx_files(raw)
    err = None
    if files is None and download:
        import torchvision.datasets as tvd

        cls = tvd.MNIST if folder == "MNIST" else tvd.FashionMNIST
        err = sources.try_download(lambda: cls(str(base), train=True, download=True),
                                   [base, base / folder, raw])
        files = _find_idx_files(raw)
    if files is None:
        wanted = ", ".join(f"{s}[.gz]" for s in _IDX_FILES.values())
        raise sources.not_found(name, raw, wanted, root, download, err)
    arrays = {k: read_idx(p) for k, p in files.items()}
    return _classification_splits(name, arrays["train_x"][:, None], arrays["train_y"],
                                  arrays["test_x"][:, None], arrays["test_y"], classes, **split)


def load_mnist(root: str | os.PathLike | None = None, download: bool = True, **split) -> DataSplits:
    """MNIST handwritten digits (LeCun et al., 1998): 60000 train / 10000 test, 1x28x28.

    ``split``: ``train_size``, ``test_size``, ``val_size``, ``seed`` (:func:`make_splits`) and ``dtype``
    (``torch.float32`` in [0, 1] by default, ``torch.uint8`` for the raw bytes)."""
    return _load_mnist_like("mnist", "MNIST", MNIST_CLASSES, root, download, **split)


def load_fashion_mnist(root: str | os.PathLike | None = None, download: bool = True, **split) -> DataSplits:
    """Fashion-MNIST clothing images (Xiao et al., 2017): 60000 train / 10000 test, 1x28x28
    (``split`` as for :func:`load_mnist`, ``dtype`` included)."""
    return _load_mnist_like("fashion-mnist", "FashionMNIST", FASHION_MNIST_CLASSES, root, download, **split)


# --------------------------------------------------------------------------- image folders


def _gray(mode: str) -> bool:
    return mode in ("1", "L", "LA", "I", "I;16", "F")


def decode_image_folder(split_dir: str | os.PathLike, classes: tuple[str, ...] | None = None,
                        size: tuple[int, int] | None = None, mode: str | None = None
                        ) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """Decode ``split_dir/<class>/<image>`` into ``(uint8 images (N, C, H, W), int64 labels, classes)``, the
    images in a fixed random order (:data:`FOLDER_ORDER_SEED`), not grouped by class.

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
    # the rows in a fixed random order, as in CIFAR-10's own batches: the first rows of a split (a held-out tail,
    # a check on the first 1,000 examples) hold every class, not the first class folders
    files = [files[i] for i in np.random.default_rng(FOLDER_ORDER_SEED).permutation(len(files))]
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


def folder_layout(path: str | os.PathLike, *, split: int | None = None, folds: int | None = None,
                  test_fraction: float | None = None, split_seed: int | None = None) -> Path | None:
    """Where the ``train/`` and ``test/`` trees of the image folder ``path`` are (``path`` or its one
    sub-directory), or None for a tree of class folders alone, which takes the split arguments; anything else, or
    split arguments for a folder with its own split, is an error naming the folder. Decodes nothing."""
    path = Path(path).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(f"folder dataset {path} does not exist (expected an ImageFolder tree "
                                f"{path}/train/<class>/<image> and {path}/test/<class>/<image>, or class folders "
                                f"{path}/<class>/<image>)")
    top = _layout_root(path)
    if top is not None:
        given = [f"{key}={value}" for key, value in (("split", split), ("folds", folds),
                                                      ("test_fraction", test_fraction), ("split_seed", split_seed))
                 if value is not None]
        if given:
            raise ValueError(f"folder dataset {path} has its own train/ and test/ split, so {', '.join(given)} "
                             "(--split, --data.folds, --data.test-fraction, --data.seed) do not apply; to split its "
                             "images yourself, put them all in class folders <class>/<image>")
        return top
    found = sorted(p.name for p in path.iterdir())
    if "train" in found or "test" in found or not any((path / name).is_dir() for name in found):
        raise ValueError(f"folder dataset {path} must contain train/ and test/ sub-directories laid out as "
                         f"train/<class>/<image> and test/<class>/<image>, or class folders <class>/<image> "
                         f"(found: {found})")
    return None


def load_folder(path: str | os.PathLike, *, split: int | None = None, folds: int | None = None,
                test_fraction: float | None = None, split_seed: int | None = None, **sizes) -> DataSplits:
    """Any ImageFolder tree ``path/train/<class>/<image>``, ``path/test/<class>/<image>`` (or one sub-directory
    holding them), or a tree of class folders alone, ``path/<class>/<image>``, whose images are split into training
    and test rows as a table's (:func:`~pyrobnn.data.splits.split_rows`: ``split`` of ``folds``, else
    ``test_fraction``, drawn with ``split_seed``; :func:`folder_layout`); the dataset is named ``folder:<path>``
    (``sizes`` as for :func:`load_mnist`, ``dtype`` included)."""
    name = f"folder:{path}"
    _image_converter(sizes.get("dtype", torch.float32))
    top = folder_layout(path, split=split, folds=folds, test_fraction=test_fraction, split_seed=split_seed)
    if top is not None:
        x_tr, y_tr, classes = decode_image_folder(top / "train")
        mode = "L" if x_tr.shape[1] == 1 else "RGB"
        size = (x_tr.shape[3], x_tr.shape[2])
        x_te, y_te, _ = decode_image_folder(top / "test", classes, size=size, mode=mode)
        return _classification_splits(name, x_tr, y_tr, x_te, y_te, classes, **sizes)
    path = Path(path).expanduser()
    x, y, classes = decode_image_folder(path)
    train, test = split_rows(len(y), split=split, folds=folds, test_fraction=test_fraction, seed=split_seed)
    check_training_classes(y, train, classes, f"folder dataset {path}", "its class folders", split=split, folds=folds,
                           test_fraction=test_fraction, seed=split_seed)
    return _classification_splits(name, x[train], y[train], x[test], y[test], classes, **sizes)


# --------------------------------------------------------------------------- CIFAR-10


def _load_cifar10_archive(archive: Path):
    """Decode the ImageFolder tarball once, caching uint8 arrays in :func:`cache_dir`."""
    cache = sources.cache_dir()
    npz = cache / CIFAR10_CACHE
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
    extract_archive(archive, extracted, stamp=str(int(key)))
    top = _layout_root(extracted)
    if top is None:
        raise ValueError(f"{archive} does not hold an ImageFolder tree train/<class>/*, test/<class>/*")
    x_tr, y_tr, classes = decode_image_folder(top / "train", mode="RGB")
    if len(classes) != 10:
        raise ValueError(f"{archive} has {len(classes)} classes {list(classes)}; CIFAR-10 needs 10")
    x_te, y_te, _ = decode_image_folder(top / "test", classes, size=(x_tr.shape[3], x_tr.shape[2]),
                                        mode="RGB")
    atomic_write(npz, lambda f: np.savez(f, x_train=x_tr, y_train=y_tr, x_test=x_te, y_test=y_te,
                                         classes=np.array(classes), archive_size=key))
    return x_tr, y_tr, x_te, y_te, classes


def _load_cifar10_arrays(root: str | os.PathLike | None, download: bool):
    import torchvision.datasets as tvd

    base = sources.data_root(root)

    def from_batches():
        tr = tvd.CIFAR10(str(base), train=True, download=False)
        te = tvd.CIFAR10(str(base), train=False, download=False)
        return (tr.data.transpose(0, 3, 1, 2), tr.targets, te.data.transpose(0, 3, 1, 2), te.targets,
                tuple(tr.classes))

    if (base / "cifar-10-batches-py").is_dir():
        return from_batches()
    if (base / CIFAR10_ARCHIVE).is_file():
        return _load_cifar10_archive(base / CIFAR10_ARCHIVE)
    err = None
    if download:
        err = sources.try_download(lambda: tvd.CIFAR10(str(base), train=True, download=True), [base])
        if err is None:
            return from_batches()
    raise sources.not_found("cifar10", base, f"cifar-10-batches-py/ or {CIFAR10_ARCHIVE}",
                            root, download, err)


def load_cifar10(root: str | os.PathLike | None = None, download: bool = True, **split) -> DataSplits:
    """CIFAR-10 (Krizhevsky, 2009): 50000 train / 10000 test colour images, 3x32x32, 10 classes.

    torchvision's lossless ``cifar-10-batches-py/`` is preferred over the JPEG tarball.
    ``split`` as for :func:`load_mnist`: ``dtype=torch.uint8`` gives the bytes without a float copy.
    """
    _image_converter(split.get("dtype", torch.float32))
    x_tr, y_tr, x_te, y_te, classes = _load_cifar10_arrays(root, download)
    return _classification_splits("cifar10", x_tr, y_tr, x_te, y_te, classes, **split)
