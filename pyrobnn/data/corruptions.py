r"""Image corruptions for covariate-shift benchmarks, generated in code from clean images.

:func:`corrupt` ``(x, name, severity, seed)`` turns clean images ``x`` ``(N, C, H, W)`` in [0, 1] (C = 1 or 3)
into corrupted ones of the same shape, clamped to [0, 1], at a severity 1..5; its randomness comes from
its own ``torch.Generator`` seeded with ``seed`` (on the CPU, then moved to ``x``'s device), so the
result depends only on ``(x, name, severity, seed)`` and never touches the global RNG.
:data:`CORRUPTIONS` maps each name to its :class:`Corruption` (the function and its parameter at each
severity).

CIFAR-10-C (Hendrycks & Dietterich 2019, "Benchmarking neural network robustness to common corruptions
and perturbations"): each family below uses the published CIFAR-10-C parameter at severities 1..5, from
the authors' ``make_cifar_c.py`` (sizes in pixels for 32x32 images; other sizes scale with min(H, W)).
14 of the 15 benchmark types (:data:`CIFAR10_C`):

* ``gaussian_noise``: x + N(0, s^2), s = 0.04, 0.06, 0.08, 0.09, 0.10.
* ``shot_noise``: Poisson(c x) / c, c = 500, 250, 100, 75, 50.
* ``impulse_noise``: salt-and-pepper at rate 0.01, 0.02, 0.03, 0.05, 0.07 (scikit-image's ``s&p``).
* ``defocus_blur``: disk of radius r anti-aliased by a 3x3 Gaussian of s.d. a, (r, a) = (0.3, 0.4),
  (0.4, 0.5), (0.5, 0.6), (1, 0.2), (1.5, 0.1); mirrored border (OpenCV's default).
* ``glass_blur``: Gaussian blur s.d. s, then ``k`` sweeps copying each pixel from a random neighbour at
  offset in {-d, ..., d - 1}^2 (the published code's tuple "swap" of numpy views copies one way), blur again;
  (s, d, k) = (0.05, 1, 1), (0.25, 1, 1), (0.4, 1, 1), (0.25, 1, 2), (0.4, 1, 2).
* ``motion_blur``: ImageMagick's ``MotionBlurImage`` kernel (one-sided Gaussian weights of s.d. s over
  2 ceil(r) + 1 pixels along a line at a uniform random angle in [-45, 45] degrees, edge pixels
  repeated), (r, s) = (6, 1), (6, 1.5), (6, 2), (8, 2), (9, 2.5).
* ``zoom_blur``: mean of the image and its centre zooms by 1, 1.01, ..., z - 0.01 (bilinear),
  z = 1.06, 1.11, 1.16, 1.21, 1.26.
* ``snow``: a thresholded, zoomed Gaussian snow layer streaked by the motion-blur kernel (angle in
  [-135, -45] degrees) added twice (once rotated by 180 degrees) to the image brightened towards its
  grey level; the published 7-tuples (:data:`CORRUPTIONS` ``["snow"].levels``).
* ``fog``: x + t F (F a diamond-square plasma fractal in [0, 1] with decay d), rescaled by
  max(x) / (max(x) + t); (t, d) = (0.2, 3), (0.5, 3), (0.75, 2.5), (1, 2), (1.5, 1.75).
* ``brightness``: HSV value + b, b = 0.05, 0.1, 0.15, 0.2, 0.3.
* ``contrast``: (x - m) c + m with m the per-channel image mean, c = 0.75, 0.5, 0.4, 0.3, 0.15.
* ``elastic_transform``: a random affine map (corner jitter a) then a displacement field, uniform
  noise smoothed by a Gaussian of s.d. s and scaled by alpha; (alpha, s, a) / 32 = (0, 0, 0.08),
  (0.05, 0.2, 0.07), (0.08, 0.06, 0.06), (0.1, 0.04, 0.05), (0.1, 0.03, 0.03).
* ``pixelate``: box downsampling to int(c H) x int(c W) and box upsampling back (Pillow's BOX
  filter), c = 0.95, 0.9, 0.85, 0.75, 0.65.
* ``jpeg_compression``: Pillow JPEG at quality 80, 65, 58, 50, 40.

Missing: ``frost``, which blends crops of six frost photographs shipped with the benchmark code; they
are not part of torch, torchvision, Pillow or numpy, and a synthetic texture would be a different
corruption.

The four extra CIFAR-10-C types: ``speckle_noise`` (x + x N(0, s^2), s = 0.06, 0.1, 0.12, 0.16, 0.2),
``gaussian_blur`` (s.d. 0.4, 0.6, 0.7, 0.8, 1), ``saturate`` (HSV saturation S c + o, (c, o) =
(0.3, 0), (0.1, 0), (1.5, 0), (2, 0.1), (2.5, 0.2); RGB only) and ``spatter``. ``spatter`` is exact for
its mud severities 4-5 and *spatter-like* for the water severities 1-3: the drops are the published
thresholded liquid layer tinted pale turquoise, without the OpenCV edge-distance shading
(Canny, distance transform, histogram equalisation) of the original.

Paper 004 (Trinh et al. 2022, "Tackling covariate shift with node-based Bayesian neural networks",
Sec. 3.5; :data:`PAPER_004`): ``gaussian_blend`` :math:`\hat x = (1 - \gamma) x + \gamma \epsilon`,
:math:`\epsilon \sim \mathcal N(0, I)` (:func:`gaussian_blend`), and ``salt_and_pepper``, each element
set to 0 or 1 (equally likely) with probability p (:func:`salt_and_pepper`). The paper sweeps
:math:`\gamma` and p without listing levels; ours are gamma = 0.1, 0.2, 0.4, 0.6, 0.8 and
p = 0.05, 0.1, 0.2, 0.4, 0.6 (``impulse_noise`` is the same operation at CIFAR-10-C's rates).

Severities follow the published parameters, which are not monotone in every family, so the distance
to the clean image (PSNR) does not grow with severity in four of them: ``saturate`` desaturates at
severities 1-2 and oversaturates at 3-5; ``elastic_transform`` trades affine jitter for displacement;
``glass_blur`` blurs its pixel jitter more at severities 2-3 than at 1; ``spatter`` switches from water
(1-3) to mud (4-5).
"""

from __future__ import annotations

import io
import math
import numbers
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from pyrobnn.checks import choice, in_range, nonnegative_int
from pyrobnn.data.augment import select_pixels

__all__ = [
    "CIFAR10_C", "CIFAR10_C_EXTRA", "CORRUPTIONS", "PAPER_004", "SEVERITIES", "Corruption", "check_images", "corrupt",
    "gaussian_blend", "psnr", "salt_and_pepper",
]

SEVERITIES = (1, 2, 3, 4, 5)

CIFAR10_C = ("gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur", "motion_blur",
             "zoom_blur", "snow", "fog", "brightness", "contrast", "elastic_transform", "pixelate",
             "jpeg_compression")
"""The 15 CIFAR-10-C benchmark corruptions but ``frost``, in the benchmark's order."""
CIFAR10_C_EXTRA = ("speckle_noise", "gaussian_blur", "spatter", "saturate")
"""CIFAR-10-C's four held-out (validation) corruptions."""
PAPER_004 = ("gaussian_blend", "salt_and_pepper")
"""The two corruptions of paper 004 (Trinh et al. 2022)."""

_GREY = (0.299, 0.587, 0.114)  # ITU-R BT.601 luma weights (OpenCV's RGB2GRAY)


@dataclass(frozen=True)
class Corruption:
    """One corruption family: ``apply(x, level, generator)`` and its parameter ``levels[s - 1]`` at severity s."""

    name: str
    apply: Callable[[torch.Tensor, object, torch.Generator | None], torch.Tensor]
    levels: tuple
    rgb_only: bool = False

    def check(self, x: torch.Tensor, severity: int) -> None:
        """Raise the error :meth:`__call__` would raise for these images and severity, without corrupting."""
        check_images(x)
        if (isinstance(severity, bool) or not isinstance(severity, numbers.Integral)
                or not 1 <= severity <= len(self.levels)):
            raise ValueError(f"severity must be an integer in 1..{len(self.levels)}, got {severity!r}")
        if self.rgb_only and x.shape[1] != 3:
            raise ValueError(f"corruption {self.name!r} needs RGB images (C = 3), got {x.shape[1]} channel(s)")

    def __call__(self, x: torch.Tensor, severity: int, generator: torch.Generator | None = None) -> torch.Tensor:
        self.check(x, severity)
        return self.apply(x, self.levels[int(severity) - 1], generator).clamp_(0, 1)


CORRUPTIONS: dict[str, Corruption] = {}
"""Corruption name -> :class:`Corruption`: :data:`CIFAR10_C`, :data:`CIFAR10_C_EXTRA`, :data:`PAPER_004`."""


def register(name: str, levels, rgb_only: bool = False):
    """Decorator: ``apply(x, level, generator)`` becomes :data:`CORRUPTIONS` ``[name]`` with ``levels``
    (its parameter at severities 1..5); returns ``apply`` unchanged."""

    def decorate(apply):
        CORRUPTIONS[name] = Corruption(name, apply, tuple(levels), rgb_only)
        return apply

    return decorate


def corrupt(x: torch.Tensor, name: str, severity: int, seed: int = 0) -> torch.Tensor:
    """Corruption ``name`` (a key of :data:`CORRUPTIONS`) of images ``x`` (N, C, H, W) in [0, 1] at
    ``severity`` 1..5: same shape, dtype and device, clamped to [0, 1], a function of ``seed``."""
    choice("corruption name", name, CORRUPTIONS)
    seed = nonnegative_int("seed", seed)
    return CORRUPTIONS[name](x, severity, torch.Generator().manual_seed(seed))


def check_images(x) -> None:
    """Raise unless ``x`` is a non-empty floating-point batch of images (N, C, H, W), C = 1 or 3, in [0, 1]."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor of images (N, C, H, W) in [0, 1], got {type(x).__name__}")
    if not x.dtype.is_floating_point:
        raise TypeError(f"x must be floating point in [0, 1], got dtype {x.dtype} (for uint8 use x.float() / 255)")
    if x.dim() != 4 or x.shape[1] not in (1, 3) or x.numel() == 0:
        raise ValueError(f"x must be a non-empty batch of images (N, C, H, W) with C = 1 or 3, "
                         f"got shape {tuple(x.shape)}")
    if bool((x.min() < 0) | (x.max() > 1)):
        raise ValueError("x must hold clean images in [0, 1]: corrupt before normalising "
                         "(normalise afterwards, e.g. with ImageAugment.normalize)")


def psnr(x: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    r"""Peak signal-to-noise ratio per image, :math:`10 \log_{10}(1 / \mathrm{MSE})` dB for images in [0, 1]
    (infinite for identical images)."""
    mse = (x - reference).pow(2).flatten(1).mean(1)
    return -10 * torch.log10(mse)


# ----------------------------------------------------------------------------- random draws


def _uniform(shape, generator, like: torch.Tensor, low: float = 0.0, high: float = 1.0) -> torch.Tensor:
    """U[low, high) draws in ``like``'s dtype on the generator's device (CPU by default), moved to ``like``'s device."""
    device = generator.device if generator is not None else torch.device("cpu")
    u = torch.rand(shape, generator=generator, device=device, dtype=like.dtype)
    return (low + (high - low) * u).to(like.device)


def _normal(shape, generator, like: torch.Tensor, loc: float = 0.0, scale: float = 1.0) -> torch.Tensor:
    device = generator.device if generator is not None else torch.device("cpu")
    z = torch.randn(shape, generator=generator, device=device, dtype=like.dtype)
    return (loc + scale * z).to(like.device)


# ----------------------------------------------------------------------------- filters


def _border_index(n: int, radius: int, mode: str, device) -> torch.Tensor:
    """Source index of each position ``-radius .. n + radius - 1`` of a padded axis of length ``n``:
    ``"nearest"`` (edge repeated), ``"reflect"`` (``d c b a | a b c d``, SciPy/scikit-image) or
    ``"mirror"`` (``d c b | a b c d``, OpenCV's BORDER_REFLECT_101); any radius."""
    index = torch.arange(-radius, n + radius, device=device)
    if mode == "nearest" or n == 1:
        return index.clamp(0, n - 1)
    period = 2 * n if mode == "reflect" else 2 * n - 2
    index = index.remainder(period)
    return torch.where(index >= n, period - 1 - index if mode == "reflect" else period - index, index)


def _correlate(x: torch.Tensor, kernel: torch.Tensor, mode: str) -> torch.Tensor:
    """Each channel of ``x`` (..., H, W) correlated with the small odd-sized 2-d ``kernel`` (a sum of shifted
    copies of the padded image, one per non-zero weight), border by ``mode``."""
    h, w = x.shape[-2:]
    rh, rw = kernel.shape[0] // 2, kernel.shape[1] // 2
    padded = (x.index_select(-2, _border_index(h, rh, mode, x.device))
              .index_select(-1, _border_index(w, rw, mode, x.device)))
    out = torch.zeros_like(x)
    for (a, b), weight in np.ndenumerate(kernel.double().cpu().numpy()):
        if weight:
            out.add_(padded[..., a:a + h, b:b + w], alpha=float(weight))
    return out


def _filter_matrix(n: int, kernel: torch.Tensor, mode: str, like: torch.Tensor) -> torch.Tensor:
    """The (n, n) matrix of correlating a length-n axis with the odd-sized 1-d ``kernel``, border by ``mode``
    folded in: ``M[i, j]`` sums the weights that output ``i`` takes from input ``j``."""
    radius = kernel.shape[0] // 2
    sources = _border_index(n, radius, mode, "cpu").unfold(0, 2 * radius + 1, 1)  # (n, 2 radius + 1)
    matrix = torch.zeros(n, n, dtype=torch.float64).scatter_add_(1, sources, kernel.double().expand(n, -1))
    return matrix.to(like.device, like.dtype)


def _gaussian_kernel(sigma: float, truncate: float) -> torch.Tensor:
    """SciPy's 1-d Gaussian: weights exp(-k^2 / (2 sigma^2)) for |k| <= int(truncate sigma + 0.5), summing to 1."""
    radius = int(truncate * sigma + 0.5)
    k = torch.arange(-radius, radius + 1, dtype=torch.float64)
    weights = torch.exp(-0.5 * (k / sigma) ** 2)
    return weights / weights.sum()


def _gaussian_filter(x: torch.Tensor, sigma: float, mode: str = "nearest", truncate: float = 4.0) -> torch.Tensor:
    """scikit-image's ``filters.gaussian`` per channel (default border ``"nearest"``): separable, so
    ``M_H x M_W^T`` with :func:`_filter_matrix` along each axis."""
    if sigma <= 0:
        return x
    kernel = _gaussian_kernel(sigma, truncate)
    h, w = x.shape[-2:]
    return _filter_matrix(h, kernel, mode, x) @ x @ _filter_matrix(w, kernel, mode, x).T


def _motion_blur(x: torch.Tensor, radius: float, sigma: float, angle: torch.Tensor) -> torch.Tensor:
    """ImageMagick's ``MotionBlurImage``: ``out(p) = sum_i k_i x(p + round(i (cos a, sin a)))``, i = 0 .. 2 ceil(r),
    ``k_i`` proportional to exp(-i^2 / (2 sigma^2)), edge pixels repeated; ``angle`` (N,) in degrees."""
    n, _, h, w = x.shape
    steps = torch.arange(2 * math.ceil(radius) + 1, dtype=torch.float64)
    weights = torch.exp(-steps ** 2 / (2 * sigma ** 2))
    weights = (weights / weights.sum()).tolist()
    radians = torch.deg2rad(angle.double().cpu())[:, None]
    dcol = torch.ceil(steps * torch.cos(radians) - 0.5).long().to(x.device)  # (N, width)
    drow = torch.ceil(steps * torch.sin(radians) - 0.5).long().to(x.device)
    rows, cols = torch.arange(h, device=x.device), torch.arange(w, device=x.device)
    out = torch.zeros_like(x)
    for i, weight in enumerate(weights):
        shifted = select_pixels(x, (rows + drow[:, i:i + 1]).clamp(0, h - 1), (cols + dcol[:, i:i + 1]).clamp(0, w - 1))
        out.add_(shifted, alpha=weight)
    return out


def _clipped_zoom(x: torch.Tensor, factor: float) -> torch.Tensor:
    """The centre ``ceil(H / factor)`` crop zoomed by ``factor`` (SciPy ``zoom``, order 1: bilinear with
    aligned corners, output ``round(size * factor)``) and trimmed back to H x W, as in CIFAR-10-C."""
    h, w = x.shape[-2:]
    ch, cw = math.ceil(h / factor), math.ceil(w / factor)
    top, left = (h - ch) // 2, (w - cw) // 2
    zh, zw = round(ch * factor), round(cw * factor)
    zoomed = F.interpolate(x[..., top:top + ch, left:left + cw], size=(zh, zw), mode="bilinear", align_corners=True)
    top, left = (zh - h) // 2, (zw - w) // 2
    return zoomed[..., top:top + h, left:left + w]


def _box_resize_matrix(size_in: int, size_out: int) -> torch.Tensor:
    """(size_out, size_in) weights of Pillow's BOX resampling along one axis: output pixel ``o`` averages
    the inputs whose centres fall in ``[o, o + 1) * size_in / size_out``."""
    scale = size_in / size_out
    support = 0.5 * max(scale, 1.0)
    matrix = torch.zeros(size_out, size_in, dtype=torch.float64)
    for o in range(size_out):
        centre = (o + 0.5) * scale
        low, high = max(int(centre - support + 0.5), 0), min(int(centre + support + 0.5), size_in)
        for i in range(low, high):
            if -0.5 <= (i - centre + 0.5) / max(scale, 1.0) < 0.5:
                matrix[o, i] = 1.0
    return matrix / matrix.sum(1, keepdim=True)


def _grey(x: torch.Tensor) -> torch.Tensor:
    """Luma (N, 1, H, W) of RGB images (the image itself if grey)."""
    if x.shape[1] == 1:
        return x
    return torch.einsum("nchw,c->nhw", x, x.new_tensor(_GREY)).unsqueeze(1)


def _colour(rgb, x: torch.Tensor) -> torch.Tensor:
    """An RGB colour in [0, 255] as a (C, 1, 1) tensor for ``x`` (its luma for grey images)."""
    colour = x.new_tensor(rgb) / 255
    if x.shape[1] == 1:
        colour = (colour * x.new_tensor(_GREY)).sum(0, keepdim=True)
    return colour.view(-1, 1, 1)


def _rgb_to_hsv(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """scikit-image's ``rgb2hsv`` of (N, 3, H, W): hue, saturation, value, each (N, H, W) in [0, 1]
    (hue and saturation 0 for greys)."""
    r, g, b = x.unbind(1)
    value = x.amax(1)
    delta = value - x.amin(1)
    grey = delta == 0
    safe = torch.where(grey, torch.ones_like(delta), delta)
    hue = torch.where(b == value, 4 + (r - g) / safe, torch.where(g == value, 2 + (b - r) / safe, (g - b) / safe))
    hue = torch.where(grey, torch.zeros_like(hue), (hue / 6).remainder(1))
    saturation = torch.where(grey, torch.zeros_like(delta), delta / torch.where(grey, torch.ones_like(value), value))
    return hue, saturation, value


_HSV_SECTORS = torch.tensor([[0, 1, 2], [3, 0, 2], [2, 0, 1], [2, 3, 0], [1, 2, 0], [0, 2, 3]])
"""Per hue sector (0..5), which of (v, t, p, q) are the R, G, B of the colour (scikit-image's ``hsv2rgb``)."""


def _hsv_to_rgb(hue: torch.Tensor, saturation: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    sector = torch.floor(hue * 6)
    f = hue * 6 - sector
    candidates = torch.stack([value, value * (1 - (1 - f) * saturation), value * (1 - saturation),
                              value * (1 - f * saturation)])  # v, t, p, q
    index = _HSV_SECTORS.to(hue.device)[sector.long().remainder(6)].movedim(-1, 0)  # (3, N, H, W)
    return candidates.gather(0, index).movedim(0, 1)


def _pillow_per_image(x: torch.Tensor, process: Callable) -> torch.Tensor:
    """Apply ``process(PIL image) -> PIL image`` to each image of ``x`` as 8-bit (rounded), back to [0, 1]."""
    from PIL import Image

    images = (x.detach() * 255).round().to(torch.uint8).cpu().numpy()
    grey = images.shape[1] == 1
    out = np.empty_like(images)
    for i, image in enumerate(images):
        pil = Image.fromarray(image[0] if grey else image.transpose(1, 2, 0))  # mode L or RGB
        result = np.asarray(process(pil).convert(pil.mode))
        out[i] = result[None] if grey else result.transpose(2, 0, 1)
    return torch.from_numpy(out).to(x.device, x.dtype) / 255


# ----------------------------------------------------------------------------- paper 004


def gaussian_blend(x: torch.Tensor, gamma: float, generator: torch.Generator | None = None) -> torch.Tensor:
    r""":math:`\hat x = (1 - \gamma) x + \gamma \epsilon`, :math:`\epsilon \sim \mathcal N(0, I)` one standard normal
    per element (``torch.randn(x.shape, generator=generator, dtype=x.dtype)``), clamped to [0, 1] (Trinh et al. 2022,
    eq. 28)."""
    check_images(x)
    gamma = in_range("gamma (noise fraction)", gamma, 0, 1)
    return ((1 - gamma) * x + gamma * _normal(x.shape, generator, x)).clamp_(0, 1)


def salt_and_pepper(x: torch.Tensor, p: float, generator: torch.Generator | None = None) -> torch.Tensor:
    r"""Each element independently set, with probability ``p``, to 1 or 0 with probability 1/2 each
    (Trinh et al. 2022, Sec. 3.5; scikit-image's ``s&p``): with
    ``u = torch.rand((2, *x.shape), generator=generator, dtype=x.dtype)``,
    :math:`\hat x = \mathbb 1[u_1 < 1/2]` where :math:`u_0 < p`, else ``x``."""
    check_images(x)
    p = in_range("p (replacement rate)", p, 0, 1)
    u = _uniform((2, *x.shape), generator, x)
    return torch.where(u[0] < p, (u[1] < 0.5).to(x.dtype), x)


register("gaussian_blend", (0.1, 0.2, 0.4, 0.6, 0.8))(gaussian_blend)
register("salt_and_pepper", (0.05, 0.1, 0.2, 0.4, 0.6))(salt_and_pepper)
register("impulse_noise", (0.01, 0.02, 0.03, 0.05, 0.07))(salt_and_pepper)


# ----------------------------------------------------------------------------- CIFAR-10-C: noise


@register("gaussian_noise", (0.04, 0.06, 0.08, 0.09, 0.10))
def _gaussian_noise(x, std, generator):
    return x + _normal(x.shape, generator, x, scale=std)


@register("shot_noise", (500, 250, 100, 75, 50))
def _shot_noise(x, photons, generator):
    device = generator.device if generator is not None else torch.device("cpu")
    counts = torch.poisson(x.detach().to(device) * photons, generator=generator)
    return (counts / photons).to(x.device, x.dtype)


@register("speckle_noise", (0.06, 0.1, 0.12, 0.16, 0.2))
def _speckle_noise(x, std, generator):
    return x + x * _normal(x.shape, generator, x, scale=std)


# ----------------------------------------------------------------------------- CIFAR-10-C: blur


@register("gaussian_blur", (0.4, 0.6, 0.7, 0.8, 1.0))
def _gaussian_blur(x, sigma, generator):
    return _gaussian_filter(x, sigma)


@register("defocus_blur", ((0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1, 0.2), (1.5, 0.1)))
def _defocus_blur(x, level, generator):
    radius, alias_sigma = level
    half = max(8, math.ceil(radius))
    grid = torch.arange(-half, half + 1, dtype=torch.float64)
    disk = ((grid[:, None] ** 2 + grid[None, :] ** 2) <= radius ** 2).double()
    disk = _gaussian_3x3(disk / disk.sum(), alias_sigma, large=radius > 8)
    rows, cols = disk.abs().sum(1).nonzero(), disk.abs().sum(0).nonzero()  # trim to the support, kept centred
    r = int(max(half - rows.min(), rows.max() - half, half - cols.min(), cols.max() - half))
    return _correlate(x, disk[half - r:half + r + 1, half - r:half + r + 1], "mirror")


def _gaussian_3x3(image: torch.Tensor, sigma: float, large: bool) -> torch.Tensor:
    """OpenCV ``GaussianBlur`` of a 2-d array with a 3x3 (5x5 if ``large``) kernel of s.d. ``sigma``."""
    radius = 2 if large else 1
    k = torch.arange(-radius, radius + 1, dtype=torch.float64)
    kernel = torch.exp(-k ** 2 / (2 * sigma ** 2))
    kernel = kernel / kernel.sum()
    return _correlate(image[None, None], kernel[:, None] * kernel[None, :], "mirror")[0, 0]


@register("glass_blur", ((0.05, 1, 1), (0.25, 1, 1), (0.4, 1, 1), (0.25, 1, 2), (0.4, 1, 2)))
def _glass_blur(x, level, generator):
    # The published sweep visits rows H-1..2 and columns W-1..2 from the bottom right and sets each pixel
    # to the pixel at offset (dy, dx) in {-1, 0}^2 (max_delta = 1 at every severity): a source is never
    # a pixel the sweep has already visited, so one sweep is one gather of the image before it.
    sigma, delta, sweeps = level
    n, c, h, w = x.shape
    image = torch.floor(_gaussian_filter(x, sigma).clamp(0, 1) * 255) / 255  # the published uint8 round trip
    rows = torch.arange(h - delta, delta, -1, device=x.device)[:, None]
    cols = torch.arange(w - delta, delta, -1, device=x.device)[None, :]
    device = generator.device if generator is not None else torch.device("cpu")
    shifts = torch.randint(-delta, delta, (sweeps, 2, n, *rows.shape[:1], *cols.shape[1:]), generator=generator,
                           device=device).to(x.device)
    targets = (rows * w + cols).flatten()
    for drow, dcol in shifts:
        sources = ((rows + drow) * w + cols + dcol).flatten(1)  # (n, visited pixels)
        moved = image.flatten(2).gather(2, sources[:, None].expand(n, c, -1))
        image = image.flatten(2).index_copy(2, targets, moved).view(n, c, h, w)
    return _gaussian_filter(image, sigma)


@register("motion_blur", ((6, 1), (6, 1.5), (6, 2), (8, 2), (9, 2.5)))
def _motion_blur_corruption(x, level, generator):
    radius, sigma = level
    return _motion_blur(x, radius, sigma, _uniform((x.shape[0],), generator, x, -45, 45))


@register("zoom_blur", (1.06, 1.11, 1.16, 1.21, 1.26))
def _zoom_blur(x, max_zoom, generator):
    factors = np.arange(1, max_zoom, 0.01)  # as published: 6, 11, 16, 21, 26 zooms
    out = x.clone()
    for factor in factors:
        out += _clipped_zoom(x, float(factor))
    return out / (len(factors) + 1)


# ----------------------------------------------------------------------------- CIFAR-10-C: weather


@register("snow", ((0.1, 0.2, 1, 0.6, 8, 3, 0.95), (0.1, 0.2, 1, 0.5, 10, 4, 0.9),
                   (0.15, 0.3, 1.75, 0.55, 10, 4, 0.9), (0.25, 0.3, 2.25, 0.6, 12, 6, 0.85),
                   (0.3, 0.3, 1.25, 0.65, 14, 12, 0.8)))
def _snow(x, level, generator):
    loc, scale, zoom, threshold, radius, sigma, keep = level
    n, _, h, w = x.shape
    layer = _clipped_zoom(_normal((n, 1, h, w), generator, x, loc, scale), zoom)
    layer = torch.where(layer < threshold, torch.zeros_like(layer), layer)
    layer = torch.floor(layer.clamp(0, 1) * 255) / 255  # 8-bit, as the published code's PNG round trip
    layer = _motion_blur(layer, radius, sigma, _uniform((n,), generator, x, -135, -45))
    x = keep * x + (1 - keep) * torch.maximum(x, _grey(x) * 1.5 + 0.5)
    return x + layer + layer.flip(-2, -1)


def _plasma_fractal(n: int, size: int, decay: float, generator, like: torch.Tensor) -> torch.Tensor:
    """``n`` diamond-square height maps (size x size, size a power of 2) in [0, 1], as CIFAR-10-C's
    ``plasma_fractal``: midpoints are the mean of their 4 neighbours plus U(-w, w) w, w = 100 / decay^level."""
    maps = torch.zeros(n, size, size, dtype=torch.float64)
    step, wibble = size, 100.0

    def wibbled_mean(total):
        return total / 4 + wibble * _uniform(total.shape, generator, maps, -wibble, wibble)

    while step >= 2:
        half = step // 2
        corners = maps[:, 0::step, 0::step]
        squares = corners + corners.roll(-1, 1)
        maps[:, half::step, half::step] = wibbled_mean(squares + squares.roll(-1, 2))
        centres, corners = maps[:, half::step, half::step], maps[:, 0::step, 0::step]
        maps[:, 0::step, half::step] = wibbled_mean(centres + centres.roll(1, 1) + corners + corners.roll(-1, 2))
        maps[:, half::step, 0::step] = wibbled_mean(centres + centres.roll(1, 2) + corners + corners.roll(-1, 1))
        step //= 2
        wibble /= decay
    maps -= maps.amin((1, 2), keepdim=True)
    return (maps / maps.amax((1, 2), keepdim=True)).to(like.device, like.dtype)


@register("fog", ((0.2, 3), (0.5, 3), (0.75, 2.5), (1, 2), (1.5, 1.75)))
def _fog(x, level, generator):
    thickness, decay = level
    n, _, h, w = x.shape
    size = 1 << (max(h, w) - 1).bit_length()
    fractal = _plasma_fractal(n, size, decay, generator, x)[:, None, :h, :w]
    peak = x.amax((1, 2, 3), keepdim=True)
    return (x + thickness * fractal) * peak / (peak + thickness)


@register("spatter", ((0.62, 0.1, 0.7, 0.7, 0.5, 0), (0.65, 0.1, 0.8, 0.7, 0.5, 0), (0.65, 0.3, 1, 0.69, 0.5, 0),
                      (0.65, 0.1, 0.7, 0.69, 0.6, 1), (0.65, 0.1, 0.5, 0.68, 0.6, 1)))
def _spatter(x, level, generator):
    loc, scale, sigma, threshold, strength, mud = level
    n, _, h, w = x.shape
    liquid = _gaussian_filter(_normal((n, 1, h, w), generator, x, loc, scale), sigma)
    liquid = torch.where(liquid < threshold, torch.zeros_like(liquid), liquid)
    if not mud:  # water: the liquid layer, tinted pale turquoise (without the published edge shading)
        drops = liquid / liquid.amax((2, 3), keepdim=True).clamp_min(1e-12) * strength
        return x + drops * _colour((175, 238, 238), x)
    mask = _gaussian_filter((liquid > threshold).to(x.dtype), strength)
    mask = torch.where(mask < 0.8, torch.zeros_like(mask), mask)
    return x * (1 - mask) + _colour((63, 42, 20), x) * mask


# ----------------------------------------------------------------------------- CIFAR-10-C: digital


@register("brightness", (0.05, 0.1, 0.15, 0.2, 0.3))
def _brightness(x, shift, generator):
    if x.shape[1] == 1:  # grey: HSV value is the intensity
        return x + shift
    hue, saturation, value = _rgb_to_hsv(x)
    return _hsv_to_rgb(hue, saturation, (value + shift).clamp(0, 1))


@register("saturate", ((0.3, 0), (0.1, 0), (1.5, 0), (2, 0.1), (2.5, 0.2)), rgb_only=True)
def _saturate(x, level, generator):
    factor, offset = level
    hue, saturation, value = _rgb_to_hsv(x)
    return _hsv_to_rgb(hue, (saturation * factor + offset).clamp(0, 1), value)


@register("contrast", (0.75, 0.5, 0.4, 0.3, 0.15))
def _contrast(x, factor, generator):
    mean = x.mean((2, 3), keepdim=True)
    return (x - mean) * factor + mean


@register("pixelate", (0.95, 0.9, 0.85, 0.75, 0.65))
def _pixelate(x, fraction, generator):
    def down_and_up(size):  # (size, size): box-resize to int(size * fraction) pixels and back
        small = int(size * fraction)
        return (_box_resize_matrix(small, size) @ _box_resize_matrix(size, small)).to(x.device, x.dtype)

    return down_and_up(x.shape[-2]) @ x @ down_and_up(x.shape[-1]).T


@register("jpeg_compression", (80, 65, 58, 50, 40))
def _jpeg_compression(x, quality, generator):
    from PIL import Image

    def compress(image):
        buffer = io.BytesIO()
        image.save(buffer, "JPEG", quality=quality)
        buffer.seek(0)
        return Image.open(buffer)

    return _pillow_per_image(x, compress)


@register("elastic_transform", ((0, 0, 0.08), (0.05, 0.2, 0.07), (0.08, 0.06, 0.06), (0.1, 0.04, 0.05),
                                (0.1, 0.03, 0.03)))
def _elastic_transform(x, level, generator):
    n, _, h, w = x.shape
    size = min(h, w)
    alpha, sigma, jitter = (fraction * size for fraction in level)
    # random affine map fixed by three points (OpenCV getAffineTransform + warpAffine, mirrored border)
    centre_x, centre_y, square = w // 2, h // 2, size // 3
    source = torch.tensor([[centre_x + square, centre_y + square], [centre_x + square, centre_y - square],
                           [centre_x - square, centre_y - square]], dtype=torch.float64)
    target = source + _uniform((n, 3, 2), generator, source, -jitter, jitter)
    affine = torch.linalg.solve(torch.cat([source, torch.ones(3, 1, dtype=torch.float64)], 1), target)  # (n, 3, 2)
    linear, offset = affine[:, :2].transpose(1, 2), affine[:, 2]  # target = linear @ source + offset
    cols, rows = torch.meshgrid(torch.arange(w, dtype=torch.float64), torch.arange(h, dtype=torch.float64),
                                indexing="xy")
    pixels = torch.stack([cols, rows], -1).view(1, -1, 2) - offset[:, None]  # (n, h w, 2) as (x, y)
    where = torch.linalg.solve(linear[:, None], pixels[..., None]).squeeze(-1).view(n, h, w, 2)
    x = _sample(x, where, align_corners=True)
    if alpha == 0:
        return x
    # displacement field: uniform noise smoothed by a Gaussian (scikit-image, reflect, truncate 3), bilinear
    # resampling with a reflected border (SciPy map_coordinates, order 1)
    noise = _uniform((n, 2, h, w), generator, x, -1, 1)
    shift = _gaussian_filter(noise, sigma, mode="reflect", truncate=3.0).double().cpu() * alpha
    where = torch.stack([cols + shift[:, 0], rows + shift[:, 1]], -1)
    return _sample(x, where, align_corners=False)


def _sample(x: torch.Tensor, where: torch.Tensor, align_corners: bool) -> torch.Tensor:
    """Bilinear samples of ``x`` at pixel coordinates ``where`` (N, H, W, 2) as (column, row), reflected
    border: about the edge pixels' centres (``align_corners``, OpenCV's mirror) or their outer edges (SciPy)."""
    h, w = x.shape[-2:]
    size = where.new_tensor([w, h])
    grid = 2 * where / (size - 1) - 1 if align_corners else (2 * where + 1) / size - 1
    return F.grid_sample(x, grid.to(x.device, x.dtype), mode="bilinear", padding_mode="reflection",
                         align_corners=align_corners)
