"""Tests for pyrobnn.data: real MNIST / Fashion-MNIST from the shared data, synthetic sets,
ImageFolder trees and the CIFAR-10 tarball path (on a tiny synthetic archive)."""

from __future__ import annotations

import math
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from pyrobnn import data as D
from pyrobnn.data import DATASETS, cache_dir, cubic, data_root, images, load_dataset, sinusoid, sources, two_moons
from pyrobnn.data.splits import holdout
from tests.support import ROOT

SHARED = Path(os.environ.get("PYROBNN_DATA") or ROOT.parent / "shared" / "data")
needs_mnist = pytest.mark.skipif(
    not (SHARED / "MNIST" / "raw").is_dir(),
    reason=f"shared MNIST not found at {SHARED / 'MNIST' / 'raw'} (set PYROBNN_DATA to a data root)",
)
needs_fashion = pytest.mark.skipif(
    not (SHARED / "FashionMNIST" / "raw").is_dir(),
    reason=f"shared Fashion-MNIST not found at {SHARED / 'FashionMNIST' / 'raw'} (set PYROBNN_DATA)",
)


@pytest.fixture(scope="module")
def mnist_full():
    return load_dataset("mnist", SHARED, download=False)


# ----------------------------------------------------------------------------- MNIST


@needs_mnist
def test_mnist_full_counts_and_known_labels(mnist_full):
    d = mnist_full
    assert d.x_train.shape == (60000, 1, 28, 28) and d.x_test.shape == (10000, 1, 28, 28)
    assert d.y_train.shape == (60000,) and d.y_test.shape == (10000,)
    assert d.x_val is None and d.y_val is None
    assert d.y_train[0].item() == 5 and d.y_test[0].item() == 7
    # label histograms published for the official files
    assert d.y_train.bincount().tolist() == [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
    assert d.y_test.bincount().tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    assert (d.x_test.double() * 255).round().sum().item() == 264_923_200
    assert d.input_shape == (1, 28, 28) and d.num_outputs == 10
    assert d.task == "classification" and d.name == "mnist"


@needs_mnist
def test_mnist_subsets_shapes_dtypes_ranges(mnist_full):
    d = load_dataset("mnist", SHARED, train_size=1000, test_size=500, val_size=100, download=False)
    assert d.x_train.shape == (900, 1, 28, 28) and d.y_train.shape == (900,)
    assert d.x_val.shape == (100, 1, 28, 28) and d.y_val.shape == (100,)
    assert d.x_test.shape == (500, 1, 28, 28) and d.y_test.shape == (500,)
    for x in (d.x_train, d.x_val, d.x_test):
        assert x.dtype == torch.float32
        assert x.min().item() == 0.0 and x.max().item() == 1.0
    for y in (d.y_train, d.y_val, d.y_test):
        assert y.dtype == torch.int64
        assert y.min().item() >= 0 and y.max().item() <= 9
    assert len(d.y_train.unique()) == 10
    # subsets are genuine rows of the full set, train and val disjoint
    full_x = mnist_full.x_train.flatten(1)
    rows = lambda x: {hash(r.numpy().tobytes()) for r in x.flatten(1)}  # noqa: E731
    assert rows(d.x_val).isdisjoint(rows(d.x_train))
    assert rows(d.x_train) <= rows(full_x)


def test_read_idx_uncompressed_and_corrupt(tmp_path):
    arr = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    header = bytes([0, 0, 0x08, 3]) + np.array([2, 3, 4], ">u4").tobytes()
    (tmp_path / "a").write_bytes(header + arr.tobytes())
    out = D.read_idx(tmp_path / "a")
    assert out.shape == (2, 3, 4) and (out == arr).all()
    (tmp_path / "b").write_bytes(header + arr.tobytes()[:-1])
    with pytest.raises(ValueError, match="truncated"):
        D.read_idx(tmp_path / "b")


@needs_fashion
def test_fashion_mnist_loads_10_classes():
    d = load_dataset("fashion-mnist", SHARED, train_size=2000, test_size=300, download=False)
    assert d.x_train.shape == (2000, 1, 28, 28) and d.x_test.shape == (300, 1, 28, 28)
    assert d.num_outputs == 10 and d.name == "fashion-mnist"
    assert sorted(d.y_train.unique().tolist()) == list(range(10))
    assert len(d.classes) == 10


# ----------------------------------------------------------------------------- data root


def test_data_root_precedence(monkeypatch, tmp_path):
    monkeypatch.delenv("PYROBNN_DATA", raising=False)
    assert data_root() == Path("~/.cache/pyrobnn/data").expanduser()
    monkeypatch.setenv("PYROBNN_DATA", str(tmp_path / "env"))
    assert data_root() == tmp_path / "env"
    assert data_root(tmp_path / "arg") == tmp_path / "arg"
    assert data_root(str(tmp_path / "arg")) == tmp_path / "arg"


def test_cache_dir_env(monkeypatch, tmp_path):
    monkeypatch.delenv("PYROBNN_CACHE", raising=False)
    assert cache_dir() == Path("~/.cache/pyrobnn").expanduser()
    monkeypatch.setenv("PYROBNN_CACHE", str(tmp_path))
    assert cache_dir() == tmp_path


@needs_mnist
def test_load_dataset_uses_root_precedence(monkeypatch, tmp_path):
    bogus = tmp_path / "bogus"
    monkeypatch.setenv("PYROBNN_DATA", str(bogus))
    # argument beats the environment variable
    assert load_dataset("mnist", SHARED, train_size=10, test_size=10, download=False).x_train.shape[0] == 10
    # the environment variable is used when no argument is given ...
    with pytest.raises(FileNotFoundError) as e:
        load_dataset("mnist", download=False)
    assert str(bogus / "MNIST" / "raw") in str(e.value) and "PYROBNN_DATA" in str(e.value)
    monkeypatch.setenv("PYROBNN_DATA", str(SHARED))
    assert load_dataset("mnist", train_size=10, test_size=10, download=False).x_test.shape[0] == 10


def test_missing_root_error_message_and_no_side_effects(tmp_path, monkeypatch):
    monkeypatch.delenv("PYROBNN_DATA", raising=False)
    root = tmp_path / "empty"
    root.mkdir()
    for name, sub in (("mnist", root / "MNIST" / "raw"), ("fashion-mnist", root / "FashionMNIST" / "raw"),
                      ("cifar10", root)):
        with pytest.raises(FileNotFoundError) as e:
            load_dataset(name, root, download=False)
        msg = str(e.value)
        assert str(sub) in msg and name in msg
        assert "--data-root" in msg and "PYROBNN_DATA" in msg and "root argument" in msg
    assert list(root.iterdir()) == []
    # the default root is named as such
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with pytest.raises(FileNotFoundError, match="default"):
        load_dataset("mnist", download=False)
    assert not (tmp_path / "home").exists()


def test_failed_download_cleans_up(tmp_path, monkeypatch):
    import torchvision.datasets as tvd

    def offline(root, train=True, download=False):
        (Path(root) / "MNIST" / "raw").mkdir(parents=True, exist_ok=True)
        raise RuntimeError("Error downloading: no network")

    monkeypatch.setattr(tvd, "MNIST", offline)
    root = tmp_path / "new" / "root"
    with pytest.raises(FileNotFoundError, match="Downloading them failed.*no network"):
        load_dataset("mnist", root, download=True)
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- subsets / errors


@needs_mnist
def test_subset_determinism():
    kw = dict(train_size=50, test_size=20, val_size=10, download=False)
    a = load_dataset("mnist", SHARED, seed=1, **kw)
    b = load_dataset("mnist", SHARED, seed=1, **kw)
    c = load_dataset("mnist", SHARED, seed=2, **kw)
    for f in ("x_train", "y_train", "x_val", "y_val", "x_test", "y_test"):
        assert torch.equal(getattr(a, f), getattr(b, f))
    assert not torch.equal(a.x_train, c.x_train)
    assert not torch.equal(a.x_test, c.x_test)


def test_make_splits_deterministic_and_disjoint():
    x = torch.arange(100)[:, None]
    y = torch.arange(100)
    kw = dict(name="t", task="regression", num_outputs=1, train_size=30, test_size=10, val_size=5)
    a = D.make_splits(x, y, x + 1000, y + 1000, seed=3, **kw)
    b = D.make_splits(x, y, x + 1000, y + 1000, seed=3, **kw)
    c = D.make_splits(x, y, x + 1000, y + 1000, seed=4, **kw)
    assert torch.equal(a.y_train, b.y_train) and torch.equal(a.y_val, b.y_val) and torch.equal(a.y_test, b.y_test)
    assert not torch.equal(a.y_train, c.y_train)
    assert len(a.y_train) == 25 and len(a.y_val) == 5 and len(a.y_test) == 10
    assert set(a.y_train.tolist()).isdisjoint(a.y_val.tolist())
    assert (a.y_train.diff() > 0).all()  # original order kept


@pytest.mark.parametrize(
    "kwargs, arg",
    [
        (dict(train_size=0), "train_size"),
        (dict(train_size=101), "train_size"),
        (dict(train_size=-5), "train_size"),
        (dict(train_size=2.5), "train_size"),
        (dict(test_size=0), "test_size"),
        (dict(test_size=1000), "test_size"),
        (dict(val_size=100), "val_size"),
        (dict(train_size=10, val_size=10), "val_size"),
        (dict(val_size=-1), "val_size"),
    ],
)
def test_bad_sizes(kwargs, arg):
    x = torch.zeros(100, 2)
    y = torch.zeros(100, dtype=torch.long)
    with pytest.raises(ValueError, match=arg) as e:
        D.make_splits(x, y, x, y, name="t", task="classification", num_outputs=2, **kwargs)
    assert "[" in str(e.value)  # names the valid range


@needs_mnist
def test_bad_sizes_via_load_dataset():
    with pytest.raises(ValueError, match=r"train_size.*\[1, 60000\]"):
        load_dataset("mnist", SHARED, train_size=60001, download=False)
    with pytest.raises(ValueError, match=r"val_size.*\[0, 9\]"):
        load_dataset("mnist", SHARED, train_size=10, val_size=10, download=False)


def test_registry_names_and_aliases():
    assert list(DATASETS) == ["mnist", "fashion-mnist", "cifar10", "two-moons", "cubic", "sinusoid", "imdb",
                              "rotten-tomatoes", "uci-boston", "uci-concrete", "uci-energy", "uci-kin8nm",
                              "uci-naval", "uci-power", "uci-protein", "uci-wine", "uci-yacht"]
    assert all(callable(load) for load in DATASETS.values())
    for alias in ("moons", "Two_Moons", " twomoons "):
        assert load_dataset(alias).name == "two-moons"
    # a registry entry is what load_dataset calls, with the same arguments
    a = load_dataset("cubic", train_size=12, test_size=7, val_size=2, seed=5)
    b = DATASETS["cubic"](None, True, train_size=12, test_size=7, val_size=2, seed=5)
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_val, b.y_val) and len(a.x_test) == 7


def test_download_goes_through_sources(tmp_path, monkeypatch):
    """Both torchvision-backed loaders ask sources.try_download (the one place to stub out the network)."""
    calls = []

    def offline(fetch, dirs):
        calls.append(dirs[0])
        return ConnectionError("offline (test)")

    monkeypatch.setattr(sources, "try_download", offline)
    for name in ("mnist", "fashion-mnist", "cifar10"):
        with pytest.raises(FileNotFoundError, match="offline"):
            load_dataset(name, tmp_path / "r", download=True)
    assert calls == [tmp_path / "r"] * 3 and not (tmp_path / "r").exists()


def test_unknown_dataset():
    with pytest.raises(ValueError) as e:
        load_dataset("imagenet")
    msg = str(e.value)
    assert "dataset" in msg and "imagenet" in msg
    assert all(n in msg for n in DATASETS) and "folder:" in msg


# ----------------------------------------------------------------------------- folders / CIFAR tarball


def _write_tree(top: Path, classes, n_per_class: dict[str, int], size=(8, 8), mode="RGB", fmt="PNG"):
    rng = np.random.default_rng(0)
    for split, n in n_per_class.items():
        for cls in classes:
            d = top / split / cls
            d.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                shape = (size[1], size[0], 3) if mode == "RGB" else (size[1], size[0])
                arr = rng.integers(0, 256, shape, dtype=np.uint8)
                ext = {"JPEG": "jpg"}.get(fmt, fmt.lower())
                Image.fromarray(arr, mode).save(d / f"{i:04d}.{ext}", fmt)


def _folder_rows(n: int) -> np.ndarray:
    """The files of a folder in their order on disk (class by class), in the order the loader returns them."""
    return np.random.default_rng(images.FOLDER_ORDER_SEED).permutation(n)


def test_folder_dataset(tmp_path):
    _write_tree(tmp_path / "ds", ["dog", "cat"], {"train": 3, "test": 3})
    d = load_dataset(f"folder:{tmp_path / 'ds'}")
    assert d.x_train.shape == (6, 3, 8, 8) and d.x_test.shape == (6, 3, 8, 8)
    assert d.x_train.dtype == torch.float32 and 0 <= d.x_train.min() and d.x_train.max() <= 1
    assert d.classes == ("cat", "dog") and d.num_outputs == 2 and d.input_shape == (3, 8, 8)
    order = _folder_rows(6)
    assert d.y_train.tolist() == np.array([0, 0, 0, 1, 1, 1])[order].tolist() and d.y_train.dtype == torch.int64
    # pixels are exact (PNG is lossless) and in CHW order; dog/0001.png is the 5th file on disk
    png = np.array(Image.open(tmp_path / "ds" / "train" / "dog" / "0001.png"))
    row = int(np.flatnonzero(order == 4)[0])
    assert torch.equal((d.x_train[row] * 255).round().to(torch.uint8), torch.from_numpy(png).permute(2, 0, 1))
    s = load_dataset(f"folder:{tmp_path / 'ds'}", train_size=4, val_size=1, seed=0)
    assert len(s.x_train) == 3 and len(s.x_val) == 1


def test_folder_grayscale(tmp_path):
    _write_tree(tmp_path / "g", ["a", "b"], {"train": 2, "test": 1}, size=(5, 4), mode="L")
    d = load_dataset(f"folder:{tmp_path / 'g'}")
    assert d.x_train.shape == (4, 1, 4, 5) and d.x_test.shape == (2, 1, 4, 5)


def test_folder_mismatched_sizes(tmp_path):
    _write_tree(tmp_path / "ds", ["a", "b"], {"train": 3, "test": 3})
    bad = tmp_path / "ds" / "test" / "b" / "0002.png"
    Image.new("RGB", (9, 8)).save(bad)
    with pytest.raises(ValueError, match="0002.png.*9x8"):
        load_dataset(f"folder:{tmp_path / 'ds'}")


def test_folder_bad_layout(tmp_path):
    (tmp_path / "ds" / "train" / "a").mkdir(parents=True)
    with pytest.raises(ValueError, match="train/ and test/"):
        load_dataset(f"folder:{tmp_path / 'ds'}")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_dataset(f"folder:{tmp_path / 'nope'}")


def _make_cifar_tarball(root: Path, tmp: Path) -> Path:
    tree = tmp / "tree"
    _write_tree(tree, D.CIFAR10_CLASSES, {"train": 2, "test": 1}, size=(32, 32), fmt="JPEG")
    root.mkdir(parents=True, exist_ok=True)
    archive = root / "cifar10-jpeg.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for split in ("train", "test"):
            tar.add(tree / split, arcname=split)
    return archive


def test_cifar10_tarball_extracts_once_and_caches(tmp_path, monkeypatch):
    root, cache = tmp_path / "root", tmp_path / "cache"
    _make_cifar_tarball(root, tmp_path)
    monkeypatch.setenv("PYROBNN_CACHE", str(cache))
    root.chmod(0o555)  # the data root is read-only, like the shared one
    try:
        d = load_dataset("cifar10", root, download=False)
    finally:
        root.chmod(0o755)
    assert sorted(p.name for p in root.iterdir()) == ["cifar10-jpeg.tar.gz"]
    assert d.x_train.shape == (20, 3, 32, 32) and d.x_test.shape == (10, 3, 32, 32)
    assert d.x_train.dtype == torch.float32 and 0 <= d.x_train.min() and d.x_train.max() <= 1
    assert sorted(d.y_train.tolist()) == [c for c in range(10) for _ in range(2)]
    # not grouped by class: the first half of the rows holds most classes (a held-out tail, a check on the first
    # rows see them all), in the same order on every load
    assert len(set(d.y_train[:10].tolist())) >= 5 and len(set(d.y_test[:5].tolist())) >= 4
    assert d.classes == D.CIFAR10_CLASSES and d.num_outputs == 10 and d.input_shape == (3, 32, 32)
    # JPEG decoding matches PIL's
    jpg = np.array(Image.open(cache / "cifar10-jpeg" / "train" / "bird" / "0001.jpg").convert("RGB"))
    row = int(np.flatnonzero(_folder_rows(20) == 5)[0])  # bird/0001.jpg: the 6th file on disk
    assert torch.equal((d.x_train[row] * 255).round().to(torch.uint8), torch.from_numpy(jpg).permute(2, 0, 1))
    npz = cache / images.CIFAR10_CACHE
    assert npz.is_file() and (cache / "cifar10-jpeg" / "train").is_dir()
    assert not [p for p in cache.iterdir() if p.name.startswith(".")]  # no temp leftovers
    mask = os.umask(0)
    os.umask(mask)
    assert npz.stat().st_mode & 0o777 == 0o666 & ~mask  # not left private by mkstemp
    assert (cache / "cifar10-jpeg").stat().st_mode & 0o777 == 0o777 & ~mask

    # second call: served from the decoded cache, no extraction and no decoding
    def boom(*a, **k):
        raise AssertionError("cache not used")

    monkeypatch.setattr(tarfile, "open", boom)
    monkeypatch.setattr(images, "decode_image_folder", boom)
    mtime = npz.stat().st_mtime_ns
    d2 = load_dataset("cifar10", root, download=False, train_size=5, seed=1)
    assert npz.stat().st_mtime_ns == mtime
    assert len(d2.x_train) == 5
    full = load_dataset("cifar10", root, download=False)
    assert torch.equal(full.x_train, d.x_train) and torch.equal(full.y_test, d.y_test)


def test_cifar10_decodes_from_existing_extraction(tmp_path, monkeypatch):
    root, cache = tmp_path / "root", tmp_path / "cache"
    _make_cifar_tarball(root, tmp_path)
    monkeypatch.setenv("PYROBNN_CACHE", str(cache))
    load_dataset("cifar10", root, download=False)
    (cache / images.CIFAR10_CACHE).unlink()
    monkeypatch.setattr(tarfile, "open", lambda *a, **k: (_ for _ in ()).throw(AssertionError("re-extracted")))
    d = load_dataset("cifar10", root, download=False)  # decodes again from the extracted tree
    assert d.x_train.shape == (20, 3, 32, 32) and (cache / images.CIFAR10_CACHE).is_file()


# ----------------------------------------------------------------------------- synthetic


def test_two_moons():
    d = two_moons()
    assert d.x_train.shape == (50, 2) and d.x_test.shape == (950, 2)
    assert d.x_train.dtype == torch.float32 and d.y_train.dtype == torch.int64
    assert d.num_outputs == 2 and d.task == "classification" and d.input_shape == (2,)
    y = torch.cat([d.y_train, d.y_test])
    assert y.bincount().tolist() == [500, 500]
    assert 0 < d.y_train.sum() < 50  # both classes in the training set
    assert torch.equal(two_moons(seed=3).x_train, two_moons(seed=3).x_train)
    assert not torch.equal(two_moons(seed=3).x_train, two_moons(seed=4).x_train)
    # the upper moon (0) lies mostly above the lower one (1)
    x = torch.cat([d.x_train, d.x_test])
    assert x[y == 0, 1].mean() > x[y == 1, 1].mean() + 0.5
    assert load_dataset("two-moons").x_train.shape == (50, 2)


def test_sinusoid():
    d = sinusoid()
    assert d.x_train.shape == (40, 1) and d.y_train.shape == (40, 1)
    assert d.x_test.shape == (460, 1) and d.y_test.shape == (460, 1)
    assert d.task == "regression" and d.num_outputs == 1 and d.x_train.dtype == torch.float32
    x = torch.cat([d.x_train, d.x_test]).double()
    y = torch.cat([d.y_train, d.y_test]).double()
    assert x.min() >= 0 and x.max() <= 0.5
    clean = x + 0.3 * torch.sin(2 * math.pi * x) + 0.3 * torch.sin(4 * math.pi * x)
    resid = y - clean
    assert resid.abs().max() < 0.5 and 0.02 < resid.std() < 0.12
    assert torch.equal(sinusoid(seed=5).y_train, sinusoid(seed=5).y_train)
    assert not torch.equal(sinusoid(seed=5).y_train, sinusoid(seed=6).y_train)
    v = load_dataset("sinusoid", val_size=10)
    assert len(v.x_train) == 30 and len(v.x_val) == 10 and len(v.x_test) == 460


def test_cubic():
    d = cubic()
    assert d.x_train.shape == (30, 1) and d.y_train.shape == (30, 1) and d.x_test.shape == (1000, 1)
    assert d.x_train.abs().max() <= 4 and d.x_test.min() == -6 and d.x_test.max() == 6
    resid = torch.cat([d.y_train - d.x_train**3, d.y_test - d.x_test**3])
    assert 2.5 < resid.std() < 3.5
    assert torch.equal(cubic(seed=1).y_train, cubic(seed=1).y_train)
    assert not torch.equal(cubic(seed=1).y_train, cubic(seed=2).y_train)
    assert load_dataset("cubic", train_size=20, test_size=100).x_test.shape == (100, 1)


def test_cifar10_torchvision_batches_preferred(tmp_path, monkeypatch):
    import pickle

    import torchvision.datasets as tvd

    # the real batches carry md5 sums; accept these tiny synthetic ones
    monkeypatch.setattr(tvd.CIFAR10, "_check_integrity", lambda self: True)
    monkeypatch.setattr(tvd.cifar, "check_integrity", lambda *a, **k: True)
    root = tmp_path / "root"
    batches = root / "cifar-10-batches-py"
    batches.mkdir(parents=True)
    rng = np.random.default_rng(0)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for name in names:
        entry = {"data": rng.integers(0, 256, (4, 3072), dtype=np.uint8), "labels": [0, 3, 9, 1]}
        (batches / name).write_bytes(pickle.dumps(entry))
    (batches / "batches.meta").write_bytes(pickle.dumps({"label_names": list(D.CIFAR10_CLASSES)}))
    _make_cifar_tarball(root, tmp_path)  # present too, but the lossless batches win
    monkeypatch.setenv("PYROBNN_CACHE", str(tmp_path / "cache"))
    d = load_dataset("cifar10", root, download=False)
    assert d.x_train.shape == (20, 3, 32, 32) and d.x_test.shape == (4, 3, 32, 32)
    assert d.y_test.tolist() == [0, 3, 9, 1] and d.y_test.dtype == torch.int64
    first = pickle.loads((batches / "data_batch_1").read_bytes())["data"][0].reshape(3, 32, 32)
    assert torch.equal((d.x_train[0] * 255).round().to(torch.uint8), torch.from_numpy(first))
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("name", [pytest.param("mnist", marks=needs_mnist),
                                  pytest.param("fashion-mnist", marks=needs_fashion), "two-moons"])
def test_the_held_out_rows_of_a_grid_hold_every_class_in_proportion(name):
    """``--grid`` scores its points on the last 20 % of the training rows (``splits.holdout``): a loader that keeps
    its source's class order (IMDB's CSV, an image folder) would hold out one class only."""
    for train_size in (None, 3000):
        d = load_dataset(name, SHARED, train_size=train_size, download=False)
        _, y_fit, _, y_held = holdout(d.x_train, d.y_train)
        classes = d.y_train.unique()
        fit_share = torch.stack([(y_fit == c).float().mean() for c in classes])
        held_share = torch.stack([(y_held == c).float().mean() for c in classes])
        assert (held_share > 0.5 * fit_share).all() and (held_share < 2 * fit_share).all(), (name, held_share)
