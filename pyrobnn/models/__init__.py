"""Network architectures and a registry that builds them (or any torchvision model) by name."""

from __future__ import annotations

import math
from typing import Sequence

from torch import nn

from .lenet import LeNet5
from .mlp import MLP
from .vit import ViT

__all__ = ["MLP", "LeNet5", "ViT", "MODELS", "build_model"]

MODELS = ("mlp", "lenet300-100", "lenet5", "vit")
"""Built-in names; ``tv:<name>`` (e.g. ``tv:resnet18``) builds any torchvision classification model."""


class _GreyToRGB(nn.Module):
    """Repeat a single channel three times so grey images fit ImageNet-style models."""

    def forward(self, x):
        return x.expand(-1, 3, *x.shape[2:]) if x.shape[1] == 1 else x


def build_model(
    name: str,
    input_shape: Sequence[int],
    num_outputs: int,
    *,
    hidden: Sequence[int] = (400,),
    dropout: float = 0.0,
) -> nn.Module:
    """Build a network by name for inputs of ``input_shape`` (per example) and ``num_outputs`` outputs.

    ``mlp`` uses ``hidden``; ``lenet300-100`` is ``MLP(784, (300, 100), 10)``; ``lenet5`` needs
    ``(C, 28|32, 28|32)`` images; ``vit`` is the small :class:`ViT` (7x7 patches of 28x28, 8x8 of 32x32
    images, ``dropout`` in its blocks); ``tv:<name>`` is ``torchvision.models.get_model(name,
    num_classes=num_outputs)`` (random init; grey inputs are repeated to 3 channels).
    """
    key = name.lower()
    size = math.prod(input_shape)
    if key == "mlp":
        return MLP(size, hidden, num_outputs, dropout=dropout)
    if key in ("lenet300-100", "lenet-300-100"):
        return MLP(size, (300, 100), num_outputs, dropout=dropout)
    if key in ("lenet5", "lenet-5", "lenet"):
        if len(input_shape) != 3:
            raise ValueError(f"lenet5 needs image inputs (C, H, W), got input shape {tuple(input_shape)}")
        return LeNet5(input_shape[0], num_outputs, image_size=input_shape[-1])
    if key == "vit":
        if len(input_shape) != 3 or input_shape[-1] not in (28, 32):
            raise ValueError(f"vit needs (C, 28|32, 28|32) images, got input shape {tuple(input_shape)}")
        return ViT(input_shape[0], num_outputs, image_size=input_shape[-1], patch_size=input_shape[-1] // 4,
                   dropout=dropout)
    if key.startswith("tv:"):
        import torchvision

        tv_name = name[3:]
        available = torchvision.models.list_models(module=torchvision.models)
        if tv_name not in available:
            raise ValueError(f"model: unknown torchvision model {tv_name!r}; choose one of {available}")
        net = torchvision.models.get_model(tv_name, weights=None, num_classes=num_outputs)
        return nn.Sequential(_GreyToRGB(), net) if input_shape[0] == 1 else net
    raise ValueError(f"model: unknown model {name!r}; choose one of {list(MODELS)} or 'tv:<torchvision name>'")
