"""Wide residual networks WRN-d-k (Zagoruyko & Komodakis 2016) for 32x32 CIFAR images (paper 004's WRN-28-10)."""

from __future__ import annotations

from collections import OrderedDict

import torch.nn.functional as F
from torch import nn

from pyrobnn.checks import in_range, positive
from pyrobnn.networks.building import he_init_, scaled

__all__ = ["WideBasicBlock", "WideResNet"]


class WideBasicBlock(nn.Module):
    """Pre-activation block (He et al. 2016b): ``BN -> ReLU -> conv3x3 (stride) -> BN -> ReLU -> dropout ->
    conv3x3``, plus the input, or a 1x1 convolution of the activated input when the shape changes."""

    def __init__(self, in_planes: int, planes: int, stride: int = 1, dropout: float = 0.0):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_planes)
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.dropout = nn.Dropout(dropout) if dropout else nn.Identity()
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        projected = stride != 1 or in_planes != planes
        self.shortcut = nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False) if projected else None

    def forward(self, x):
        activated = F.relu(self.bn1(x))
        out = self.conv2(self.dropout(F.relu(self.bn2(self.conv1(activated)))))
        return out + (x if self.shortcut is None else self.shortcut(activated))


class WideResNet(nn.Sequential):
    """WRN-``depth``-``widen``: a 3x3 convolution of 16 channels, three stages of ``(depth - 4) / 6`` wide blocks
    of 16k, 32k, 64k channels (strides 1, 2, 2: 32 -> 8), BN, ReLU, global average pooling, a linear classifier.
    WRN-28-10 has 36.5M parameters.

    :param depth: ``6n + 4`` (28: four blocks per stage).
    :param widen: the widening factor k (10 for WRN-28-10; any positive number, rounded per layer).
    :param num_classes: number of outputs.
    :param dropout: dropout rate between the two convolutions of every block (Zagoruyko & Komodakis use 0.3).
    :param in_channels: 3 for CIFAR-10.
    """

    def __init__(self, depth: int = 28, widen: float = 10, num_classes: int = 10, dropout: float = 0.0,
                 in_channels: int = 3):
        if not isinstance(depth, int) or depth < 10 or (depth - 4) % 6:
            raise ValueError(f"depth must be 6n + 4 with n >= 1 (10, 16, 22, 28, ...), got {depth!r}")
        widen = positive("widen", widen)
        dropout = in_range("dropout", dropout, 0, 1, "[)")
        blocks = (depth - 4) // 6
        modules = [("conv1", nn.Conv2d(in_channels, 16, 3, padding=1, bias=False))]
        in_planes = 16
        for i, planes in enumerate(scaled(16 * 2**i, widen) for i in range(3)):
            stage = [WideBasicBlock(in_planes if j == 0 else planes, planes, 2 if i and not j else 1, dropout)
                     for j in range(blocks)]
            modules.append((f"layer{i + 1}", nn.Sequential(*stage)))
            in_planes = planes
        modules += [("bn", nn.BatchNorm2d(in_planes)), ("relu", nn.ReLU()), ("avgpool", nn.AdaptiveAvgPool2d(1)),
                    ("flatten", nn.Flatten()), ("fc", nn.Linear(in_planes, num_classes))]
        super().__init__(OrderedDict(modules))
        he_init_(self)
