"""ResNet-18 and ResNet-50 (He et al. 2016) with the CIFAR stem, built from torchvision's residual blocks."""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

from torch import nn
from torchvision.models.resnet import BasicBlock, Bottleneck

from pyrobnn.networks.building import he_init_, scaled

__all__ = ["ResNet", "resnet18", "resnet50"]


def _stage(block: type, in_planes: int, planes: int, blocks: int, stride: int) -> nn.Sequential:
    """``blocks`` residual blocks of ``planes`` (times the block's expansion) outputs; the first one strides and,
    when the shape changes, projects its shortcut with a 1x1 convolution and BatchNorm (He et al.'s option B)."""
    out_planes = planes * block.expansion
    downsample = None
    if stride != 1 or in_planes != out_planes:
        downsample = nn.Sequential(nn.Conv2d(in_planes, out_planes, 1, stride=stride, bias=False),
                                   nn.BatchNorm2d(out_planes))
    return nn.Sequential(block(in_planes, planes, stride, downsample),
                         *(block(out_planes, planes) for _ in range(blocks - 1)))


class ResNet(nn.Sequential):
    """ResNet for 32x32 images (He et al. 2016, sec. 4.2): the ImageNet stem (7x7 stride-2 convolution and
    max-pool, which would shrink a 32x32 image to 8x8 at once) becomes one 3x3 stride-1 convolution with no
    pooling, followed by four stages of 64, 128, 256, 512 planes (strides 1, 2, 2, 2: 32 -> 4), global average
    pooling and a linear classifier. Modules are named as torchvision's (``conv1``, ``layer1`` ... ``fc``), and
    the blocks are torchvision's ``BasicBlock`` (ResNet-18) and ``Bottleneck`` (ResNet-50).

    :param block: ``torchvision.models.resnet.BasicBlock`` or ``Bottleneck``.
    :param layers: blocks per stage, e.g. ``(2, 2, 2, 2)``.
    :param num_classes: number of outputs.
    :param width: multiplier of the planes of every stage (1: 64 ... 512).
    :param in_channels: 3 for CIFAR-10.
    """

    def __init__(self, block: type, layers: Sequence[int], num_classes: int = 10, width: float = 1.0,
                 in_channels: int = 3):
        if block not in (BasicBlock, Bottleneck):
            raise TypeError(f"block must be torchvision's BasicBlock or Bottleneck, got {block!r}")
        if len(layers) != 4 or any(int(n) < 1 for n in layers):
            raise ValueError(f"layers must give four positive block counts, got {list(layers)}")
        planes = [scaled(64 * 2**i, width) for i in range(4)]
        modules = [("conv1", nn.Conv2d(in_channels, planes[0], 3, padding=1, bias=False)),
                   ("bn1", nn.BatchNorm2d(planes[0])), ("relu", nn.ReLU(inplace=True))]
        in_planes = planes[0]
        for i, (width_i, blocks) in enumerate(zip(planes, layers)):
            modules.append((f"layer{i + 1}", _stage(block, in_planes, width_i, int(blocks), 1 if i == 0 else 2)))
            in_planes = width_i * block.expansion
        modules += [("avgpool", nn.AdaptiveAvgPool2d(1)), ("flatten", nn.Flatten()),
                    ("fc", nn.Linear(in_planes, num_classes))]
        super().__init__(OrderedDict(modules))
        he_init_(self)


def resnet18(num_classes: int = 10, width: float = 1.0, in_channels: int = 3) -> ResNet:
    """ResNet-18: basic blocks (two 3x3 convolutions), two per stage; 11.2M parameters at width 1."""
    return ResNet(BasicBlock, (2, 2, 2, 2), num_classes, width, in_channels)


def resnet50(num_classes: int = 10, width: float = 1.0, in_channels: int = 3) -> ResNet:
    """ResNet-50: bottleneck blocks (1x1, 3x3, 1x1, expansion 4), 3, 4, 6, 3 per stage; 23.5M parameters at width 1."""
    return ResNet(Bottleneck, (3, 4, 6, 3), num_classes, width, in_channels)
