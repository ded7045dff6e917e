"""What the convolutional architectures share: channel counts scaled by a width multiplier, and He initialisation."""

from __future__ import annotations

from torch import nn

from pyrobnn.checks import positive

__all__ = ["scaled", "he_init_"]


def scaled(channels: int, width: float) -> int:
    """``channels * width`` rounded, at least 1: the layer widths of a network ``width`` times as wide
    (``width`` < 1 gives the tiny networks of the tests, > 1 the wide ones of paper 004's LeNet x4 ... x64)."""
    return max(1, round(channels * positive("width", width)))


def he_init_(net: nn.Module) -> nn.Module:
    r"""He et al. (2015) initialisation of every convolution, :math:`w \sim \mathcal N(0, 2 / (k^2 C_{out}))`
    (``kaiming_normal_``, fan-out, ReLU gain, as torchvision's ResNet and VGG), biases zero. The guide's means
    start from these weights. Returns ``net``."""
    for module in net.modules():
        if isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            if module.bias is not None:
                nn.init.zeros_(module.bias)
    return net
