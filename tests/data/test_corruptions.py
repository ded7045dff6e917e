"""Corruptions (CIFAR-10-C families, paper 004's blend and salt-and-pepper) and the covariate-shift evaluation."""

from __future__ import annotations

import colorsys
import io
import math
import os
import tarfile
from pathlib import Path

import numpy as np
import pyro
import pytest
import torch
from PIL import Image
from torch import nn

from pyrobnn import BayesianNetwork, NormalGuide
from pyrobnn.analysis.metrics import classification_metrics
from pyrobnn.analysis.shift import METRICS, evaluate_corruptions, plot_metric_vs_severity
from pyrobnn.data.augment import ImageAugment
from pyrobnn.data.corruptions import (
    CIFAR10_C,
    CIFAR10_C_EXTRA,
    CORRUPTIONS,
    PAPER_004,
    corrupt,
    gaussian_blend,
    psnr,
    salt_and_pepper,
)
from pyrobnn.infer.predict import predict
from pyrobnn.infer.svi import svi_step
from tests.support import ROOT

SHARED = Path(os.environ.get("PYROBNN_DATA") or ROOT.parent / "shared" / "data")
NOT_MONOTONE = {"saturate", "spatter", "glass_blur", "elastic_transform"}  # published parameters (module docstring)
RANDOM = {"gaussian_noise", "shot_noise", "impulse_noise", "speckle_noise", "glass_blur", "motion_blur", "snow", "fog",
          "spatter", "elastic_transform", "gaussian_blend", "salt_and_pepper"}


def _natural_images(n: int = 8, size: int = 32, seed: int = 0) -> torch.Tensor:
    """Natural-ish images: smooth colour fields plus a few flat rectangles (edges) and some fine texture (without
    it, pixelating at severity 4 happens to lose less than at 3 on so smooth an image), in [0, 1]."""
    g = torch.Generator().manual_seed(seed)
    field = torch.rand(n, 3, size // 4, size // 4, generator=g)
    x = torch.nn.functional.interpolate(field, size=(size, size), mode="bicubic", align_corners=False)
    for i in range(n):
        for _ in range(3):
            top, left = torch.randint(0, size - 8, (2,), generator=g).tolist()
            x[i, :, top:top + 8, left:left + 10] = torch.rand(3, 1, 1, generator=g)
    texture = torch.nn.functional.interpolate(torch.rand(n, 3, size // 2, size // 2, generator=g), size=(size, size),
                                              mode="bilinear", align_corners=False)
    x = x + 0.2 * (texture - 0.5) + 0.2 * (torch.rand(n, 3, size, size, generator=g) - 0.5)
    return x.clamp(0.02, 0.98)


@pytest.fixture(scope="module")
def clean() -> torch.Tensor:
    """Eight CIFAR-10 test images (two from each of four classes) from $PYROBNN_DATA's JPEG tarball, else
    synthetic natural-ish images."""
    archive = SHARED / "cifar10-jpeg.tar.gz"
    if not archive.is_file():
        return _natural_images()
    found: dict[str, list[np.ndarray]] = {}
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar:
            parts = member.name.split("/")
            if member.isfile() and len(parts) >= 3 and parts[-3] == "test" and len(found.get(parts[-2], [])) < 2:
                with Image.open(io.BytesIO(tar.extractfile(member).read())) as im:
                    found.setdefault(parts[-2], []).append(np.asarray(im.convert("RGB")))
                if sum(map(len, found.values())) == 8:
                    break
    images = np.stack([im for ims in found.values() for im in ims]).transpose(0, 3, 1, 2)
    return torch.from_numpy(images).float() / 255


def test_registry_holds_the_documented_sets():
    assert len(CIFAR10_C) == 14 and "frost" not in CORRUPTIONS
    assert set(CORRUPTIONS) == set(CIFAR10_C) | set(CIFAR10_C_EXTRA) | set(PAPER_004)
    assert all(len(c.levels) == 5 for c in CORRUPTIONS.values())


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_every_corruption_is_deterministic_keeps_shape_and_range_and_leaves_the_global_rng(name, clean):
    x = clean[:4]
    state = torch.get_rng_state()
    outputs = [corrupt(x, name, severity, seed=7) for severity in (1, 3, 5)]
    assert torch.equal(torch.get_rng_state(), state)
    for severity, y in zip((1, 3, 5), outputs):
        assert y.shape == x.shape and y.dtype == x.dtype
        assert float(y.min()) >= 0 and float(y.max()) <= 1
        assert not torch.equal(y, x), (name, severity)
        assert torch.equal(y, corrupt(x, name, severity, seed=7))
    other = corrupt(x, name, 3, seed=8)
    assert torch.equal(other, outputs[1]) != (name in RANDOM)


@pytest.mark.parametrize("name", sorted(set(CORRUPTIONS) - NOT_MONOTONE))
def test_psnr_to_the_clean_image_falls_with_severity(name, clean):
    values = [float(psnr(corrupt(clean, name, s, seed=0), clean).mean()) for s in range(1, 6)]
    assert all(b <= a + 0.05 for a, b in zip(values, values[1:])), (name, values)  # motion blur 3, 4 tie
    assert values[-1] < values[0] - 1.0, (name, values)


# ----------------------------------------------------------------------------- formulas


def test_gaussian_blend_is_paper_004s_formula_with_standard_normal_noise(clean):
    for gamma in (0.0, 0.3, 1.0):
        eps = torch.randn(clean.shape, generator=torch.Generator().manual_seed(4))
        expected = ((1 - gamma) * clean + gamma * eps).clamp(0, 1)
        assert torch.equal(gaussian_blend(clean, gamma, torch.Generator().manual_seed(4)), expected)
    level = CORRUPTIONS["gaussian_blend"].levels[2]
    torch.testing.assert_close(corrupt(clean, "gaussian_blend", 3, seed=4),
                               gaussian_blend(clean, level, torch.Generator().manual_seed(4)))


def test_salt_and_pepper_sets_a_fraction_p_to_zero_or_one(clean):
    p = 0.2
    u = torch.rand((2, *clean.shape), generator=torch.Generator().manual_seed(1))
    expected = torch.where(u[0] < p, (u[1] < 0.5).float(), clean)
    out = salt_and_pepper(clean, p, torch.Generator().manual_seed(1))
    assert torch.equal(out, expected)
    x = torch.full((64, 3, 16, 16), 0.5)
    out = salt_and_pepper(x, p, torch.Generator().manual_seed(2))
    n = x.numel()
    replaced = out != 0.5
    assert set(out.unique().tolist()) == {0.0, 0.5, 1.0}
    assert abs(replaced.float().mean() - p) < 5 * math.sqrt(p * (1 - p) / n)
    salt = (out == 1).sum() / replaced.sum()
    assert abs(salt - 0.5) < 5 * math.sqrt(0.25 / replaced.sum())
    # impulse noise is the same operation at CIFAR-10-C's rates
    assert torch.equal(corrupt(clean, "impulse_noise", 4, seed=3), salt_and_pepper(clean, 0.05,
                                                                                   torch.Generator().manual_seed(3)))


def test_additive_noises_have_the_published_standard_deviation():
    x = torch.full((32, 3, 32, 32), 0.5)
    n = x.numel()
    for name, severity, std in (("gaussian_noise", 3, 0.08), ("speckle_noise", 5, 0.2 * 0.5)):
        noise = corrupt(x, name, severity, seed=0) - x  # no clamping at 0.5 +- 5 s.d.
        assert abs(noise.mean()) < 5 * std / math.sqrt(n)
        assert abs(noise.std() / std - 1) < 5 * math.sqrt(0.5 / n)
    # shot noise: Poisson(c x) / c has mean x and variance x / c
    photons = CORRUPTIONS["shot_noise"].levels[4]
    out = corrupt(x, "shot_noise", 5, seed=0)
    assert abs(out.mean() - 0.5) < 5 * math.sqrt(0.5 / photons / n)
    assert abs(out.var() / (0.5 / photons) - 1) < 0.05


def test_contrast_and_fog_formulas(clean):
    for severity, factor in enumerate(CORRUPTIONS["contrast"].levels, 1):
        mean = clean.mean((2, 3), keepdim=True)
        torch.testing.assert_close(corrupt(clean, "contrast", severity), (clean - mean) * factor + mean)
    # fog: y = (x + t F) max(x) / (max(x) + t), F a height map in [0, 1] shared by the channels
    thickness = CORRUPTIONS["fog"].levels[0][0]
    peak = clean.amax((1, 2, 3), keepdim=True)
    fractal = (corrupt(clean, "fog", 1, seed=2) * (peak + thickness) / peak - clean) / thickness
    torch.testing.assert_close(fractal, fractal[:, :1].expand_as(fractal), rtol=0, atol=1e-5)
    torch.testing.assert_close(fractal.amin((1, 2, 3)), torch.zeros(len(clean)), rtol=0, atol=1e-5)
    torch.testing.assert_close(fractal.amax((1, 2, 3)), torch.ones(len(clean)), rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", ["brightness", "saturate"])
def test_hsv_corruptions_match_colorsys(name):
    x = torch.rand(2, 3, 6, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    x[0, :, 0, 0] = 0.0  # black
    x[0, :, 0, 1] = 0.4  # grey: hue 0, saturation 0
    x[0, :2, 0, 2] = 0.7  # tie between red and green
    for severity in (1, 4):
        level = CORRUPTIONS[name].levels[severity - 1]
        out = corrupt(x, name, severity)
        for n, i, j in np.ndindex(2, 6, 6):
            h, s, v = colorsys.rgb_to_hsv(*x[n, :, i, j].tolist())
            if name == "brightness":
                v = min(max(v + level, 0), 1)
            else:
                s = min(max(s * level[0] + level[1], 0), 1)
            expected = torch.tensor(colorsys.hsv_to_rgb(h, s, v), dtype=torch.float64)
            torch.testing.assert_close(out[n, :, i, j], expected, rtol=0, atol=1e-9)


def test_pixelate_is_pillows_box_resize_down_and_up(clean):
    for severity, fraction in enumerate(CORRUPTIONS["pixelate"].levels, 1):
        out = corrupt(clean[:2], "pixelate", severity)
        small = int(32 * fraction)
        for n, c in np.ndindex(2, 3):
            im = Image.fromarray(clean[n, c].numpy(), mode="F")
            expected = np.asarray(im.resize((small, small), Image.BOX).resize((32, 32), Image.BOX))
            torch.testing.assert_close(out[n, c], torch.from_numpy(expected.copy()), rtol=0, atol=1e-5)


def test_jpeg_is_eight_bit_and_worse_at_lower_quality(clean):
    out = corrupt(clean, "jpeg_compression", 5)
    assert torch.equal((out * 255).round() / 255, out)
    assert psnr(out, clean).mean() < psnr(corrupt(clean, "jpeg_compression", 1), clean).mean()


def test_blurs_keep_a_constant_image_and_motion_blur_has_the_imagemagick_kernel():
    flat = torch.full((3, 3, 24, 24), 102 / 255)
    for name in ("gaussian_blur", "defocus_blur", "motion_blur", "zoom_blur", "pixelate", "elastic_transform",
                 "glass_blur", "contrast"):
        for severity in (1, 5):
            torch.testing.assert_close(corrupt(flat, name, severity, seed=1), flat, rtol=0, atol=1e-5)
    # an impulse: the weights sum to 1, and the centre keeps k_0 = 1 / sum_i exp(-i^2 / (2 sigma^2))
    radius, sigma = CORRUPTIONS["motion_blur"].levels[2]
    impulse = torch.zeros(4, 1, 41, 41)
    impulse[:, :, 20, 20] = 1
    out = corrupt(impulse, "motion_blur", 3, seed=5)
    steps = torch.arange(2 * radius + 1, dtype=torch.float64)
    k0 = float(1 / torch.exp(-steps ** 2 / (2 * sigma ** 2)).sum())
    torch.testing.assert_close(out.sum((1, 2, 3)), torch.ones(4), rtol=0, atol=1e-5)
    torch.testing.assert_close(out[:, 0, 20, 20], torch.full((4,), k0), rtol=0, atol=1e-6)


def test_blurs_match_scipy(clean):
    ndimage = pytest.importorskip("scipy.ndimage")
    x = clean[:2].double()
    # gaussian_blur: scikit-image's gaussian = scipy's gaussian_filter, mode "nearest", truncate 4
    for severity, sigma in enumerate(CORRUPTIONS["gaussian_blur"].levels, 1):
        expected = ndimage.gaussian_filter(x.numpy(), sigma=(0, 0, sigma, sigma), mode="nearest", truncate=4.0)
        torch.testing.assert_close(corrupt(x, "gaussian_blur", severity), torch.from_numpy(expected))
    # defocus: the published disk, anti-aliased by a 3x3 Gaussian, correlated with a mirrored border
    for severity, (radius, alias) in enumerate(CORRUPTIONS["defocus_blur"].levels, 1):
        grid = np.arange(-8, 9)
        disk = ((grid[:, None] ** 2 + grid[None, :] ** 2) <= radius ** 2).astype(np.float64)
        k = np.exp(-np.arange(-1, 2) ** 2 / (2 * alias ** 2))
        kernel = ndimage.correlate(disk / disk.sum(), np.outer(k, k) / k.sum() ** 2, mode="mirror")
        expected = ndimage.correlate(x.numpy(), kernel[None, None], mode="mirror")
        torch.testing.assert_close(corrupt(x, "defocus_blur", severity), torch.from_numpy(expected))
    # zoom blur: the published clipped_zoom with scipy's order-1 zoom
    for severity, max_zoom in enumerate(CORRUPTIONS["zoom_blur"].levels, 1):
        image = x[0].permute(1, 2, 0).numpy()
        out = image.copy()
        for factor in np.arange(1, max_zoom, 0.01):
            ch = int(np.ceil(32 / factor))
            top = (32 - ch) // 2
            zoomed = ndimage.zoom(image[top:top + ch, top:top + ch], (factor, factor, 1), order=1)
            trim = (zoomed.shape[0] - 32) // 2
            out += zoomed[trim:trim + 32, trim:trim + 32]
        expected = torch.from_numpy(out / (len(np.arange(1, max_zoom, 0.01)) + 1)).permute(2, 0, 1)
        torch.testing.assert_close(corrupt(x[:1], "zoom_blur", severity)[0], expected)


def test_glass_blur_is_the_published_pixel_sweep(clean):
    ndimage = pytest.importorskip("scipy.ndimage")
    sigma, delta, sweeps = CORRUPTIONS["glass_blur"].levels[3]
    x = clean[:2].double()
    shifts = torch.randint(-delta, delta, (sweeps, 2, 2, 30, 30), generator=torch.Generator().manual_seed(5))
    expected = []
    for n in range(2):
        blur = dict(sigma=(sigma, sigma, 0), mode="nearest", truncate=4.0)
        image = np.uint8(ndimage.gaussian_filter(x[n].permute(1, 2, 0).numpy(), **blur) * 255)
        for sweep in range(sweeps):
            for a, h in enumerate(range(32 - delta, delta, -1)):
                for b, w in enumerate(range(32 - delta, delta, -1)):
                    dy, dx = int(shifts[sweep, 0, n, a, b]), int(shifts[sweep, 1, n, a, b])
                    # the published "swap" of two numpy views (it copies one way)
                    image[h, w], image[h + dy, w + dx] = image[h + dy, w + dx], image[h, w]
        expected.append(torch.from_numpy(ndimage.gaussian_filter(image / 255, **blur)).permute(2, 0, 1))
    out = corrupt(x, "glass_blur", 4, seed=5)
    difference = (out - torch.stack(expected)).abs()
    # equal but where float rounding puts a blurred value on the other side of an 8-bit level
    assert float(difference.max()) <= 1 / 255 + 1e-9 and float(difference.mean()) < 1e-3


@pytest.mark.parametrize("mode, align_corners", [("reflect", False), ("mirror", True)])
def test_elastic_resampling_matches_scipy_map_coordinates(mode, align_corners):
    ndimage = pytest.importorskip("scipy.ndimage")
    from pyrobnn.data.corruptions import _sample

    g = torch.Generator().manual_seed(0)
    x = torch.rand(2, 3, 12, 10, generator=g, dtype=torch.float64)
    cols, rows = torch.meshgrid(torch.arange(10.0), torch.arange(12.0), indexing="xy")
    shift = 8 * torch.rand(2, 2, 12, 10, generator=g, dtype=torch.float64) - 4  # reaches past the border
    where_x, where_y = cols + shift[:, 0], rows + shift[:, 1]
    out = _sample(x, torch.stack([where_x, where_y], -1), align_corners)
    expected = [[ndimage.map_coordinates(x[n, c].numpy(), [where_y[n].numpy(), where_x[n].numpy()], order=1, mode=mode)
                 for c in range(3)] for n in range(2)]
    torch.testing.assert_close(out, torch.from_numpy(np.array(expected)))


def test_grey_images(clean):
    grey = clean[:2].mean(1, keepdim=True)
    for name in sorted(set(CORRUPTIONS) - {"saturate"}):
        out = corrupt(grey, name, 3)
        assert out.shape == grey.shape and float(out.min()) >= 0 and float(out.max()) <= 1
    with pytest.raises(ValueError, match="'saturate' needs RGB images"):
        corrupt(grey, "saturate", 1)


@pytest.mark.parametrize("call, error, match", [
    (lambda x: corrupt(x, "frost", 1), ValueError, "corruption name must be one of"),
    (lambda x: corrupt(x, "fog", 0), ValueError, r"severity must be an integer in 1\.\.5, got 0"),
    (lambda x: corrupt(x, "fog", 6), ValueError, "severity must be an integer in 1..5"),
    (lambda x: corrupt(x, "fog", 2.0), ValueError, "severity must be an integer"),
    (lambda x: corrupt(x, "fog", True), ValueError, "severity must be an integer"),
    (lambda x: corrupt(x, "fog", 1, seed=-1), ValueError, "seed must be an integer >= 0"),
    (lambda x: corrupt((x * 255).to(torch.uint8), "fog", 1), TypeError, r"x.float\(\) / 255"),
    (lambda x: corrupt(x[0], "fog", 1), ValueError, r"\(N, C, H, W\)"),
    (lambda x: corrupt(x[:, :2], "fog", 1), ValueError, "C = 1 or 3"),
    (lambda x: corrupt(ImageAugment.for_dataset("cifar10").normalize(x), "fog", 1), ValueError, r"in \[0, 1\]"),
    (lambda x: gaussian_blend(x, 1.5), ValueError, "gamma"),
    (lambda x: salt_and_pepper(x, -0.1), ValueError, "p "),
])
def test_bad_inputs(call, error, match, clean):
    with pytest.raises(error, match=match):
        call(clean[:2])


# ----------------------------------------------------------------------------- evaluate_corruptions


@pytest.fixture(scope="module")
def tiny_classifier():
    """A Bayesian MLP on 3x8x8 images of 3 classes (mean colour), trained for 30 steps."""
    g = torch.Generator().manual_seed(0)
    y = torch.arange(90) % 3
    x = (0.3 * torch.rand(90, 3, 8, 8, generator=g) + 0.35).clamp(0, 1)
    x[torch.arange(90), y] += 0.3
    pyro.clear_param_store()
    torch.manual_seed(0)
    model = BayesianNetwork(nn.Sequential(nn.Flatten(), nn.Linear(192, 16), nn.ReLU(), nn.Linear(16, 3)),
                            num_data=90)
    guide = NormalGuide(model, init_rho=-5.0)
    aug = ImageAugment((0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
    guide(aug.normalize(x[:2]))  # create the parameters
    optim = torch.optim.Adam(guide.parameters(), lr=1e-2)
    for _ in range(30):
        svi_step(model, guide, optim, aug(x), y)
    return model, guide, x, y, aug


def test_evaluate_corruptions_reports_every_record_and_their_means(tiny_classifier, tmp_path):
    model, guide, x, y, aug = tiny_classifier
    names, severities = ("gaussian_blend", "contrast"), (1, 5)
    pyro.set_rng_seed(11)
    result = evaluate_corruptions(model, guide, x, y, corruptions=names, severities=severities, num_samples=4,
                                  transform=aug.normalize, seed=3)
    assert set(result) == {"clean", "corruptions", "severities", "mean"}
    assert set(result["corruptions"]) == set(names)
    # the same predictions, made independently in the same order from the same RNG state
    pyro.set_rng_seed(11)
    inputs = [x] + [corrupt(x, name, s, seed=3) for name in names for s in severities]
    records = []
    for images in inputs:
        pred = predict(model, guide, aug.normalize(images), num_samples=4)
        records.append({**classification_metrics(pred["probs"], y),
                        **{k: float(pred[k].mean()) for k in ("total", "aleatoric", "epistemic")}})
    assert result["clean"] == pytest.approx(records[0], abs=1e-6)
    flat = [result["corruptions"][name][s] for name in names for s in severities]
    for got, expected in zip(flat, records[1:]):
        assert set(got) == set(METRICS) and got == pytest.approx(expected, abs=1e-6)
        assert got["epistemic"] >= 0 and got["total"] == pytest.approx(got["aleatoric"] + got["epistemic"], abs=1e-5)
    for key in METRICS:
        assert result["mean"][key] == pytest.approx(sum(r[key] for r in flat) / 4)
        assert result["severities"][5][key] == pytest.approx((flat[1][key] + flat[3][key]) / 2)
    # strong corruption hurts: the blend at gamma = 0.8 is less accurate and less certain than clean images
    blend = result["corruptions"]["gaussian_blend"][5]
    assert blend["accuracy"] < result["clean"]["accuracy"] and blend["nll"] > result["clean"]["nll"]
    assert blend["total"] > result["clean"]["total"]
    path = plot_metric_vs_severity({"bbb": result, "again": result}, tmp_path / "plots" / "acc.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot_metric_vs_severity(result, tmp_path / "ece.png", metric="ece").is_file()


def test_evaluate_corruptions_refuses_bad_arguments_before_predicting(tiny_classifier):
    model, guide, x, y, _ = tiny_classifier
    with pytest.raises(ValueError, match="corruption name must be one of"):
        evaluate_corruptions(model, guide, x, y, corruptions=("fog", "frost"))
    with pytest.raises(ValueError, match="severity must be an integer in 1..5"):
        evaluate_corruptions(model, guide, x, y, corruptions="fog", severities=(3, 7))
    with pytest.raises(ValueError, match="must not be empty"):
        evaluate_corruptions(model, guide, x, y, corruptions=())
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        evaluate_corruptions(model, guide, x * 2 - 1, y, corruptions="fog")
    with pytest.raises(ValueError, match="one label per example"):
        evaluate_corruptions(model, guide, x, y[:5], corruptions="fog")
    with pytest.raises(ValueError, match="metric must be one of"):
        plot_metric_vs_severity({}, "unused.png", metric="error")
