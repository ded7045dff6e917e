"""The batched image pipeline: exact crops and flips, fused normalisation, seeding, uint8 loaders."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from pyrobnn.data import images
from pyrobnn.data.augment import CIFAR10_MEAN, CIFAR10_STD, NORMALIZATION, ImageAugment, select_pixels
from tests.support import ROOT

SHARED = Path(os.environ.get("PYROBNN_DATA") or ROOT.parent / "shared" / "data")


def _distinct_images(n: int, c: int = 3, h: int = 6, w: int = 5, seed: int = 0) -> torch.Tensor:
    """uint8 images whose pixels are all different and non-zero in every channel (so a crop offset, a flip
    and the zero padding are identifiable from the output)."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randperm(255, generator=g)[: c * h * w].add(1).view(1, c, h, w)
    shift = torch.randint(0, 2, (n, 1, 1, 1), generator=g)  # two families, so images differ
    return torch.where(shift.bool(), 256 - base, base).to(torch.uint8).expand(n, c, h, w).clone()


def _candidates(x: torch.Tensor, p: int) -> torch.Tensor:
    """Every crop (offsets a, b in 0..2p) of the zero-padded image, unflipped and flipped, by plain slicing:
    shape (2p+1, 2p+1, 2, C, H, W)."""
    c, h, w = x.shape
    padded = torch.zeros(c, h + 2 * p, w + 2 * p, dtype=x.dtype)
    padded[:, p:p + h, p:p + w] = x
    crops = torch.stack([torch.stack([padded[:, a:a + h, b:b + w] for b in range(2 * p + 1)])
                         for a in range(2 * p + 1)])
    return torch.stack([crops, crops.flip(-1)], 2)


def test_each_output_is_exactly_one_padded_crop_possibly_flipped_with_uniform_offsets():
    n, p = 600, 2
    x = _distinct_images(n)
    aug = ImageAugment((0.0,) * 3, (1.0,) * 3, crop_padding=p, flip=True)
    out = aug.crop_and_flip(x, torch.Generator().manual_seed(3))
    assert out.dtype == torch.uint8 and out.shape == x.shape
    seen = torch.zeros(2 * p + 1, 2 * p + 1, 2, dtype=torch.long)
    for i in range(n):
        match = (_candidates(x[i], p) == out[i]).flatten(3).all(-1)
        assert match.sum() == 1, f"image {i} matches {int(match.sum())} crops"
        seen += match.long()
    # offsets uniform on {0..2p}^2 and flips Bernoulli(1/2): every cell is hit, counts within 5 s.e.
    cells = seen.sum(2).flatten().double()
    expected = n / cells.numel()
    assert (cells - expected).abs().max() < 5 * math.sqrt(expected)
    flips = seen[..., 1].sum().item()
    assert abs(flips - n / 2) < 5 * math.sqrt(n / 4)


def test_flip_reverses_columns_and_zero_padding_crop_is_identity():
    x = _distinct_images(64)
    aug = ImageAugment((0.0,) * 3, (1.0,) * 3, crop_padding=0, flip=True)
    out = aug.crop_and_flip(x, torch.Generator().manual_seed(0))
    flipped = (out == x.flip(-1)).flatten(1).all(1)
    kept = (out == x).flatten(1).all(1)
    assert bool((flipped ^ kept).all()) and 0 < int(flipped.sum()) < 64
    assert torch.equal(ImageAugment((0.0,) * 3, (1.0,) * 3, crop_padding=0, flip=False).crop_and_flip(x), x)


def test_select_pixels_is_per_image_fancy_indexing():
    g = torch.Generator().manual_seed(1)
    x = torch.rand(4, 2, 7, 9, generator=g)
    rows = torch.randint(0, 7, (4, 3), generator=g)
    cols = torch.randint(0, 9, (4, 5), generator=g)
    expected = torch.stack([x[n][:, rows[n]][:, :, cols[n]] for n in range(4)])
    assert torch.equal(select_pixels(x, rows, cols), expected)


def test_uint8_in_normalised_float_out_and_eval_is_only_normalisation():
    x = _distinct_images(8)
    aug = ImageAugment(CIFAR10_MEAN, CIFAR10_STD)
    mean = torch.tensor(CIFAR10_MEAN, dtype=torch.float64).view(3, 1, 1)
    std = torch.tensor(CIFAR10_STD, dtype=torch.float64).view(3, 1, 1)
    expected = (x.double() / 255 - mean) / std
    state = torch.get_rng_state()
    for out in (aug(x, train=False), aug.normalize(x), aug.normalize(x.float() / 255)):
        assert out.dtype == torch.float32 and out.shape == x.shape
        torch.testing.assert_close(out.double(), expected, rtol=0, atol=1e-5)
    assert torch.equal(torch.get_rng_state(), state)  # evaluation draws nothing
    torch.manual_seed(0)
    train = aug(x)
    assert train.dtype == torch.float32
    # training output = normalisation of the crop/flip drawn from the same RNG state
    torch.manual_seed(0)
    torch.testing.assert_close(train, aug.normalize(aug.crop_and_flip(x)), rtol=0, atol=0)
    # the zero padding is black: -mean/std after normalisation
    black = -(mean / std).float()
    assert bool((train == black).all(1).any()) and not bool((aug.normalize(x) == black).all(1).any())


def test_deterministic_per_seed_and_generator():
    x = _distinct_images(32)
    aug = ImageAugment(CIFAR10_MEAN, CIFAR10_STD)
    torch.manual_seed(5)
    a = aug(x)
    torch.manual_seed(5)
    assert torch.equal(a, aug(x))
    torch.manual_seed(6)
    assert not torch.equal(a, aug(x))
    g1, g2 = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    assert torch.equal(aug(x, generator=g1), aug(x, generator=g2))


def test_channels_last_keeps_values():
    x = _distinct_images(4)
    plain = ImageAugment.for_dataset("cifar10")
    fast = ImageAugment.for_dataset("cifar10", channels_last=True)
    out = fast.normalize(x)
    assert out.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(out, plain.normalize(x))
    torch.manual_seed(1)
    a = fast(x)
    torch.manual_seed(1)
    assert torch.equal(a, plain(x)) and a.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_same_code_on_cuda():
    x = _distinct_images(16)
    aug = ImageAugment(CIFAR10_MEAN, CIFAR10_STD)
    out = aug(x.cuda())
    assert out.device.type == "cuda" and out.dtype == torch.float32
    torch.testing.assert_close(aug.normalize(x.cuda()).cpu(), aug.normalize(x))
    g = torch.Generator().manual_seed(2)
    cpu = aug(x, generator=g)
    g = torch.Generator().manual_seed(2)
    torch.testing.assert_close(aug(x.cuda(), generator=g).cpu(), cpu)  # CPU generator: same draws


@pytest.mark.parametrize("call, error, match", [
    (lambda: ImageAugment((0.5,), (0.5, 0.5)), ValueError, "one entry per channel"),
    (lambda: ImageAugment((0.5,), (0.0,)), ValueError, r"std\[0\] must be a finite number > 0"),
    (lambda: ImageAugment((0.5,), (0.5,), crop_padding=-1), ValueError, "crop_padding"),
    (lambda: ImageAugment("rgb", (0.5,)), ValueError, "mean must be a non-empty sequence"),
    (lambda: ImageAugment((0.5,), (0.5,), flip=1), TypeError, "flip"),
    (lambda: ImageAugment.for_dataset("imagenet"), ValueError, "no channel statistics"),
    (lambda: ImageAugment.for_dataset("cifar10")(torch.zeros(2, 1, 4, 4, dtype=torch.uint8)), ValueError,
     "1 channels but mean/std have 3"),
    (lambda: ImageAugment.for_dataset("cifar10")(torch.zeros(3, 4, 4, dtype=torch.uint8)), ValueError,
     r"\(N, C, H, W\)"),
    (lambda: ImageAugment.for_dataset("cifar10")(torch.zeros(1, 3, 4, 4, dtype=torch.int32)), ValueError, "uint8"),
    (lambda: ImageAugment.for_dataset("cifar10")(np.zeros((1, 3, 4, 4))), TypeError, "torch.Tensor"),
])
def test_bad_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_normalization_table_matches_the_loaders_names():
    from pyrobnn.data import DATASETS

    assert set(NORMALIZATION) <= set(DATASETS)
    for mean, std in NORMALIZATION.values():
        assert len(mean) == len(std) and all(0 < m < 1 for m in mean) and all(0 < s < 1 for s in std)


# ----------------------------------------------------------------------------- uint8 from the loaders


def test_folder_loader_gives_uint8_without_conversion(tmp_path):
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for cls in ("a", "b"):
            (tmp_path / split / cls).mkdir(parents=True)
            for i in range(3):
                Image.fromarray(rng.integers(0, 256, (5, 4, 3), dtype=np.uint8)).save(
                    tmp_path / split / cls / f"{i}.png")
    raw = images.load_folder(tmp_path, dtype=torch.uint8)
    scaled = images.load_folder(tmp_path)
    assert raw.x_train.dtype == torch.uint8 and raw.x_test.dtype == torch.uint8
    assert raw.x_train.shape == (6, 3, 5, 4) and raw.input_shape == (3, 5, 4)
    assert torch.equal(raw.x_train.float() / 255, scaled.x_train) and scaled.x_train.dtype == torch.float32
    half = images.load_folder(tmp_path, dtype=torch.float64, val_size=2)
    assert half.x_val.dtype == torch.float64 and torch.equal(half.x_train.float(), images.load_folder(
        tmp_path, val_size=2).x_train)
    with pytest.raises(ValueError, match="dtype must be torch.uint8"):
        images.load_folder(tmp_path, dtype=torch.int64)


@pytest.mark.skipif(not (SHARED / "MNIST" / "raw").is_dir(), reason="shared MNIST not found (set PYROBNN_DATA)")
def test_mnist_uint8_equals_the_float_images_times_255():
    raw = images.load_mnist(SHARED, download=False, train_size=200, test_size=100, dtype=torch.uint8)
    scaled = images.load_mnist(SHARED, download=False, train_size=200, test_size=100)
    assert raw.x_train.dtype == torch.uint8 and raw.x_train.shape == (200, 1, 28, 28)
    assert torch.equal(raw.x_train.float() / 255, scaled.x_train) and torch.equal(raw.y_train, scaled.y_train)
    with pytest.raises(ValueError, match="dtype must be"):
        images.load_mnist(SHARED, download=False, dtype="uint8")


def test_denormalize_inverts_normalize():
    torch.manual_seed(0)
    images = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8)
    aug = ImageAugment.for_dataset("cifar10")
    assert torch.allclose(aug.denormalize(aug.normalize(images)), images.float() / 255, atol=1e-6)
