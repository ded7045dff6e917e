"""AlexNet (Krizhevsky, Sutskever & Hinton 2012) for 32x32 CIFAR-10 images, as paper 000 uses it."""

from __future__ import annotations

from collections import OrderedDict

from torch import nn

from pyrobnn.checks import in_range
from pyrobnn.networks.building import scaled

__all__ = ["AlexNet"]


class AlexNet(nn.Sequential):
    """Five convolutions (96 11x11 stride 4, 256 5x5, 384, 384, 256 3x3, ReLU), three max-pools, then
    FC 4096 -> 4096 -> classes (paper 000, sec. 3.3.2; its MC-dropout runs use rate 0.5).

    Adapted to 32x32 inputs by the spatial plan of ``BBBAlexNet`` in Shridhar, Laumann & Liwicki (2019, "A
    Comprehensive guide to Bayesian Convolutional Neural Network with Variational Inference"), the Bayesian CNN
    code that from-scratch Bayesian layers like paper 000's follow: the 11x11 stride-4 stem keeps its kernel and
    stride with padding 5 (32 -> 8), and the ImageNet net's 3x3 stride-2 overlapping max-pools (which would
    shrink 8x8 to nothing) become 2x2 stride-2 pools after conv 1, conv 2 and conv 5 (8 -> 4 -> 2 -> 1), so the
    classifier reads 256 features. The channel counts and the two FC 4096 layers are paper 000's.

    :param in_channels: 3 for CIFAR-10.
    :param num_classes: number of outputs.
    :param width: multiplier of every layer's width (1: the paper's 96 ... 4096).
    :param dropout: dropout rate before each hidden FC layer (Krizhevsky et al.'s places; 0 disables).
    """

    def __init__(self, in_channels: int = 3, num_classes: int = 10, width: float = 1.0, dropout: float = 0.0):
        dropout = in_range("dropout", dropout, 0, 1, "[)")
        c1, c2, c3, c4, c5 = (scaled(c, width) for c in (96, 256, 384, 384, 256))
        hidden = scaled(4096, width)
        layers = [
            ("conv1", nn.Conv2d(in_channels, c1, 11, stride=4, padding=5)), ("relu1", nn.ReLU()),
            ("pool1", nn.MaxPool2d(2)),
            ("conv2", nn.Conv2d(c1, c2, 5, padding=2)), ("relu2", nn.ReLU()), ("pool2", nn.MaxPool2d(2)),
            ("conv3", nn.Conv2d(c2, c3, 3, padding=1)), ("relu3", nn.ReLU()),
            ("conv4", nn.Conv2d(c3, c4, 3, padding=1)), ("relu4", nn.ReLU()),
            ("conv5", nn.Conv2d(c4, c5, 3, padding=1)), ("relu5", nn.ReLU()), ("pool5", nn.MaxPool2d(2)),
            ("flatten", nn.Flatten()),
        ]
        for i, (fan_in, fan_out) in enumerate(((c5, hidden), (hidden, hidden)), start=1):
            if dropout:
                layers.append((f"dropout{i}", nn.Dropout(dropout)))
            layers += [(f"fc{i}", nn.Linear(fan_in, fan_out)), (f"relu_fc{i}", nn.ReLU())]
        layers.append(("fc3", nn.Linear(hidden, num_classes)))
        super().__init__(OrderedDict(layers))
