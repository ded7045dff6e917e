"""Multi-layer perceptrons: 784-h-10 (Blundell et al. 2015) and
LeNet-300-100 (LeCun et al. 1998; Molchanov et al. 2017)."""

from __future__ import annotations

from typing import Sequence

from torch import nn

__all__ = ["MLP"]


class MLP(nn.Sequential):
    """``Flatten -> [Linear -> ReLU (-> Dropout)] * len(hidden) -> Linear``.

    :param in_features: input size after flattening (784 for 28x28 images).
    :param hidden: hidden widths, e.g. ``(400,)`` or ``(300, 100)`` (LeNet-300-100).
    :param out_features: number of outputs (classes).
    :param dropout: dropout rate after each hidden layer (0 disables; Blundell et al.'s dropout baseline uses 0.5).
    """

    def __init__(self, in_features: int, hidden: Sequence[int], out_features: int, dropout: float = 0.0):
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must lie in [0, 1), got {dropout!r}")
        if any(int(h) <= 0 for h in hidden):
            raise ValueError(f"hidden widths must be positive, got {list(hidden)}")
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_features
        for h in hidden:
            layers += [nn.Linear(width, int(h)), nn.ReLU()]
            if dropout:
                layers.append(nn.Dropout(dropout))
            width = int(h)
        layers.append(nn.Linear(width, out_features))
        super().__init__(*layers)
