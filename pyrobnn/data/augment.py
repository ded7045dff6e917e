r"""Image augmentation as a few batched tensor ops on the batch's device: random crop with zero padding,
horizontal flip and per-channel normalisation of a whole uint8 batch.

The training set stays a uint8 tensor ``(N, C, H, W)`` on the device (a quarter of the float32 size;
``load_cifar10(dtype=torch.uint8)``); each training batch ``u`` is turned into the network's input by
the standard CIFAR-10 augmentation (He et al. 2016, "Deep residual learning for image recognition",
Sec. 4.2: pad 4 pixels with zeros, random 32x32 crop, random horizontal flip) with the normalisation
fused in:

.. math::
    \tilde x_{n,c,i,j} = \frac{\bar u_{n,c,\,i + a_n,\; b_n + (W - 1 - j \text{ if } f_n \text{ else } j)} / 255
    - m_c}{s_c}, \qquad a_n, b_n \sim \mathcal U\{0, \dots, 2p\}, \quad f_n \sim \mathrm{Bernoulli}(1/2),

where :math:`\bar u` is ``u`` padded with ``p`` zeros on every side (black, as torchvision's
``RandomCrop(padding=p)`` pads before ``Normalize``) and :math:`m, s` are the channel means and standard
deviations. Crop and flip are one gather of the padded batch; there is no per-image Python loop and
no DataLoader worker. The offsets and flips are drawn from torch's default generator on the batch's
device (seeded by ``torch.manual_seed`` / ``pyro.set_rng_seed``) or from ``generator``.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from pyrobnn.checks import finite, nonnegative_int, positive

__all__ = ["CIFAR10_MEAN", "CIFAR10_STD", "NORMALIZATION", "ImageAugment", "select_pixels"]

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
"""Per-channel (R, G, B) mean of the 50000 CIFAR-10 training images in [0, 1]."""
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
"""Per-channel standard deviation over all pixels of the CIFAR-10 training images (not the often copied
(0.2023, 0.1994, 0.2010), which is close to the mean of the per-image standard deviations)."""

NORMALIZATION: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "cifar10": (CIFAR10_MEAN, CIFAR10_STD),
    "mnist": ((0.1307,), (0.3081,)),
    "fashion-mnist": ((0.2860,), (0.3530,)),
}
"""Dataset name (as in :data:`pyrobnn.data.DATASETS`) -> (channel means, channel standard deviations)
of its training images in [0, 1]."""


class ImageAugment:
    """Callable batch transform: uint8 (or [0, 1] float) images ``(N, C, H, W)`` on any device -> normalised
    float32 images on that device, randomly cropped and flipped when ``train`` (see the module docstring).

    :param mean: channel means ``m_c`` of the images in [0, 1] (one per channel).
    :param std: channel standard deviations ``s_c`` (> 0), as many as ``mean``.
    :param crop_padding: ``p``, zeros added on each side before the random crop (0: no crop).
    :param flip: flip each image left-right with probability 1/2.
    :param channels_last: return the batch in ``torch.channels_last`` memory format (faster convolutions
        on GPUs with tensor cores).

    ``aug(x)`` augments (for ``fit(..., transform=aug)``); ``aug(x, train=False)`` or
    ``aug.normalize(x)`` only normalises (test data). uint8 inputs are divided by 255, float inputs are
    taken to be in [0, 1] already.
    """

    def __init__(self, mean: Sequence[float], std: Sequence[float], crop_padding: int = 4, flip: bool = True,
                 channels_last: bool = False):
        self.mean = tuple(finite(f"mean[{c}]", m) for c, m in enumerate(_sequence("mean", mean)))
        self.std = tuple(positive(f"std[{c}]", s) for c, s in enumerate(_sequence("std", std)))
        if len(self.std) != len(self.mean):
            raise ValueError(f"std must have one entry per channel like mean ({len(self.mean)}), got {len(self.std)}")
        self.crop_padding = nonnegative_int("crop_padding", crop_padding)
        if not isinstance(flip, bool) or not isinstance(channels_last, bool):
            raise TypeError("flip and channels_last must be True or False")
        self.flip = flip
        self.channels_last = channels_last
        self._affine: dict[tuple[torch.device, bool], tuple[torch.Tensor, torch.Tensor]] = {}

    @classmethod
    def for_dataset(cls, name: str, **options) -> "ImageAugment":
        """The transform with the channel statistics of dataset ``name`` (a key of :data:`NORMALIZATION`);
        ``options`` as for the constructor. Flips suit natural images (CIFAR-10), not digits."""
        if name not in NORMALIZATION:
            raise ValueError(f"no channel statistics for dataset {name!r}; known: {list(NORMALIZATION)} "
                             "(or pass mean= and std= to ImageAugment)")
        mean, std = NORMALIZATION[name]
        return cls(mean, std, **options)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(mean={self.mean}, std={self.std}, crop_padding={self.crop_padding}, "
                f"flip={self.flip}, channels_last={self.channels_last})")

    def __call__(self, x: torch.Tensor, train: bool = True, generator: torch.Generator | None = None) -> torch.Tensor:
        self._check(x)
        if train and (self.crop_padding or self.flip):
            x = self.crop_and_flip(x, generator)
        return self._normalize(x)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """Only the normalisation :math:`(u / 255 - m_c) / s_c` (uint8) or :math:`(x - m_c) / s_c` (float)."""
        return self(x, train=False)

    def denormalize(self, x: torch.Tensor) -> torch.Tensor:
        """The inverse of :meth:`normalize` for float images: :math:`x s_c + m_c`, clamped to [0, 1]."""
        self._check(x)
        scale, shift = self._scale_and_shift(x.device, False)
        return ((x - shift) / scale).clamp_(0.0, 1.0)

    def crop_and_flip(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """The random crop (``crop_padding`` zeros each side) and flip of each image, dtype and device kept."""
        self._check(x)
        n, _, h, w = x.shape
        p = self.crop_padding
        device = generator.device if generator is not None else x.device
        offsets = torch.randint(0, 2 * p + 1, (2, n), generator=generator, device=device).to(x.device)
        rows = offsets[0, :, None] + torch.arange(h, device=x.device)  # (n, h) rows of the padded image
        cols = torch.arange(w, device=x.device).expand(n, w)
        if self.flip:
            flipped = torch.randint(0, 2, (n, 1), generator=generator, device=device).to(x.device).bool()
            cols = torch.where(flipped, w - 1 - cols, cols)
        return select_pixels(F.pad(x, (p, p, p, p)) if p else x, rows, cols + offsets[1, :, None])

    def _normalize(self, x: torch.Tensor) -> torch.Tensor:
        scale, shift = self._scale_and_shift(x.device, x.dtype == torch.uint8)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return x.to(torch.float32, copy=True).mul_(scale).add_(shift)

    def _scale_and_shift(self, device: torch.device, from_bytes: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """``1 / s_c`` (``1 / (255 s_c)`` for uint8) and ``-m_c / s_c`` as (C, 1, 1) tensors, built once per device."""
        key = (device, from_bytes)
        if key not in self._affine:
            std = torch.tensor(self.std, dtype=torch.float64)
            mean = torch.tensor(self.mean, dtype=torch.float64)
            scale = 1.0 / (std * 255.0) if from_bytes else 1.0 / std
            self._affine[key] = tuple(t.view(-1, 1, 1).to(device=device, dtype=torch.float32)
                                      for t in (scale, -mean / std))
        return self._affine[key]

    def _check(self, x) -> None:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a torch.Tensor of images (N, C, H, W), got {type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(f"x must be a batch of images (N, C, H, W), got shape {tuple(x.shape)}")
        if x.shape[1] != len(self.mean):
            raise ValueError(f"x has {x.shape[1]} channels but mean/std have {len(self.mean)} "
                             f"(images must be (N, C, H, W), channels first)")
        if x.dtype != torch.uint8 and not x.dtype.is_floating_point:
            raise ValueError(f"x must be uint8 (0..255) or floating point (in [0, 1]), got dtype {x.dtype}")


def select_pixels(x: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """``out[n, c, i, j] = x[n, c, rows[n, i], cols[n, j]]``: rows ``(N, H')`` and columns ``(N, W')`` chosen
    per image (crops, flips, shifts), all channels, in one gather."""
    n, c, h, w = x.shape
    index = (rows[:, :, None] * w + cols[:, None, :]).view(n, 1, -1).expand(n, c, -1)
    return x.flatten(2).gather(2, index).view(n, c, rows.shape[1], cols.shape[1])


def _sequence(name: str, value) -> tuple:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) == 0:
        raise ValueError(f"{name} must be a non-empty sequence of numbers, one per channel, got {value!r}")
    return tuple(value)
