"""VGG-16 with BatchNorm (Simonyan & Zisserman 2015; Ioffe & Szegedy 2015) for 32x32 CIFAR images (paper 004)."""

from __future__ import annotations

from collections import OrderedDict

from torch import nn
from torchvision.models.vgg import cfgs, make_layers

from pyrobnn.checks import in_range
from pyrobnn.networks.building import he_init_, scaled

__all__ = ["VGG16"]


class VGG16(nn.Sequential):
    """Thirteen 3x3 convolutions (64, 64, M, 128, 128, M, 256 x3, M, 512 x3, M, 512 x3, M; configuration D),
    each followed by BatchNorm and ReLU, built by torchvision's ``make_layers``; five 2x2 max-pools take 32x32
    to 1x1, so the classifier is FC 512 -> 512 -> classes instead of ImageNet's 7x7x512 -> 4096 -> 4096 (the
    15M-parameter "VGG16-small" of paper 004's Table 1).

    :param num_classes: number of outputs.
    :param width: multiplier of every layer's width (1: 64 ... 512).
    :param dropout: dropout rate before each hidden FC layer (Simonyan & Zisserman's places; 0 disables).
    :param in_channels: 3 for CIFAR-10.
    """

    def __init__(self, num_classes: int = 10, width: float = 1.0, dropout: float = 0.0, in_channels: int = 3):
        dropout = in_range("dropout", dropout, 0, 1, "[)")
        config = [v if v == "M" else scaled(v, width) for v in cfgs["D"]]
        features = make_layers(config, batch_norm=True)
        if in_channels != 3:
            features[0] = nn.Conv2d(in_channels, config[0], 3, padding=1)
        hidden = scaled(512, width)
        classifier = []
        for i, fan_in in enumerate((config[-2], hidden), start=1):
            if dropout:
                classifier.append((f"dropout{i}", nn.Dropout(dropout)))
            classifier += [(f"fc{i}", nn.Linear(fan_in, hidden)), (f"relu{i}", nn.ReLU(inplace=True))]
        classifier.append(("fc3", nn.Linear(hidden, num_classes)))
        super().__init__(OrderedDict(features=features, flatten=nn.Flatten(),
                                     classifier=nn.Sequential(OrderedDict(classifier))))
        he_init_(self)
