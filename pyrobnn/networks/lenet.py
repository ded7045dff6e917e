"""LeNet-5 (LeCun et al. 1998) as used for MNIST and CIFAR-10 (papers 000, 002)."""

from __future__ import annotations

from torch import nn

from pyrobnn.networks.building import scaled

__all__ = ["LeNet5"]


class LeNet5(nn.Sequential):
    """conv(6, 5x5) -> act -> pool -> conv(16, 5x5) -> act -> pool -> FC 120 -> 84 -> classes.

    :param in_channels: 1 for MNIST, 3 for CIFAR-10.
    :param num_classes: number of outputs.
    :param image_size: input side (28 or 32); the first conv pads 28x28 inputs to keep the 5x5x16 map.
    :param activation: ``"relu"`` (default) or ``"sigmoid"`` (the original of LeCun et al. 1998).
    :param pool: ``"max"`` (default) or ``"avg"``.
    :param width: multiplier of every hidden layer's width (paper 004 trains LeNet x1, x4, x16, x64).

    Paper 000's CIFAR-10 LeNet is ``LeNet5(3, 10, 32, activation="sigmoid", pool="avg")`` (``lenet5-cifar``).
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 10, image_size: int = 28,
                 activation: str = "relu", pool: str = "max", width: float = 1.0):
        acts = {"relu": nn.ReLU, "sigmoid": nn.Sigmoid, "tanh": nn.Tanh}
        pools = {"max": nn.MaxPool2d, "avg": nn.AvgPool2d}
        if activation not in acts:
            raise ValueError(f"activation must be one of {sorted(acts)}, got {activation!r}")
        if pool not in pools:
            raise ValueError(f"pool must be one of {sorted(pools)}, got {pool!r}")
        if image_size not in (28, 32):
            raise ValueError(f"image_size must be 28 or 32, got {image_size!r}")
        act, pool_cls = acts[activation], pools[pool]
        c1, c2, h1, h2 = (scaled(n, width) for n in (6, 16, 120, 84))
        super().__init__(
            nn.Conv2d(in_channels, c1, 5, padding=2 if image_size == 28 else 0), act(), pool_cls(2),
            nn.Conv2d(c1, c2, 5), act(), pool_cls(2),
            nn.Flatten(),
            nn.Linear(c2 * 5 * 5, h1), act(),
            nn.Linear(h1, h2), act(),
            nn.Linear(h2, num_classes),
        )
