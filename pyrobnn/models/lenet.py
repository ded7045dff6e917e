"""LeNet-5 (LeCun et al. 1998) as used for MNIST and CIFAR-10 (papers 000, 002)."""

from __future__ import annotations

from torch import nn

__all__ = ["LeNet5"]


class LeNet5(nn.Sequential):
    """conv(6, 5x5) -> act -> pool -> conv(16, 5x5) -> act -> pool -> FC 120 -> 84 -> classes.

    :param in_channels: 1 for MNIST, 3 for CIFAR-10.
    :param num_classes: number of outputs.
    :param image_size: input side (28 or 32); the first conv pads 28x28 inputs to keep the 5x5x16 map.
    :param activation: ``"relu"`` (default) or ``"sigmoid"`` (the original of LeCun et al. 1998).
    :param pool: ``"max"`` (default) or ``"avg"``.
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 10, image_size: int = 28,
                 activation: str = "relu", pool: str = "max"):
        acts = {"relu": nn.ReLU, "sigmoid": nn.Sigmoid, "tanh": nn.Tanh}
        pools = {"max": nn.MaxPool2d, "avg": nn.AvgPool2d}
        if activation not in acts:
            raise ValueError(f"activation must be one of {sorted(acts)}, got {activation!r}")
        if pool not in pools:
            raise ValueError(f"pool must be one of {sorted(pools)}, got {pool!r}")
        if image_size not in (28, 32):
            raise ValueError(f"image_size must be 28 or 32, got {image_size!r}")
        act, pool_cls = acts[activation], pools[pool]
        super().__init__(
            nn.Conv2d(in_channels, 6, 5, padding=2 if image_size == 28 else 0), act(), pool_cls(2),
            nn.Conv2d(6, 16, 5), act(), pool_cls(2),
            nn.Flatten(),
            nn.Linear(16 * 5 * 5, 120), act(),
            nn.Linear(120, 84), act(),
            nn.Linear(84, num_classes),
        )
