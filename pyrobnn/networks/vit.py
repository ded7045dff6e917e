"""A small vision transformer (Dosovitskiy et al. 2021) for 28x28 or 32x32 images (the VDP++ ViT on MNIST)."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["ViT"]


class EncoderBlock(nn.Module):
    """Pre-norm transformer block: ``x + MHA(LN(x))``, then ``x + MLP(LN(x))`` (GELU)."""

    def __init__(self, dim: int, heads: int, mlp_dim: int, dropout: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attention = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_dim), nn.GELU(), nn.Dropout(dropout), nn.Linear(mlp_dim, dim))

    def forward(self, x):
        y = self.norm1(x)
        x = x + self.attention(y, y, y, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """Patch embedding (a ``patch_size`` strided convolution) plus a learned positional embedding,
    ``depth`` encoder blocks, a final LayerNorm, mean pooling over the tokens and a linear head.

    Built only from layers the VDP++ handler covers (conv, LayerNorm, multi-head self-attention, GELU,
    residual additions, mean), so it trains by sampling or by moment propagation unchanged.
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 10, image_size: int = 28, patch_size: int = 7,
                 dim: int = 64, depth: int = 2, heads: int = 4, mlp_dim: int = 128, dropout: float = 0.0):
        super().__init__()
        if image_size % patch_size:
            raise ValueError(f"patch_size ({patch_size}) must divide image_size ({image_size})")
        if dim % heads:
            raise ValueError(f"heads ({heads}) must divide dim ({dim})")
        self.patch_embedding = nn.Conv2d(in_channels, dim, patch_size, stride=patch_size)
        self.position_embedding = nn.Parameter(0.02 * torch.randn(1, (image_size // patch_size) ** 2, dim))
        self.blocks = nn.Sequential(*(EncoderBlock(dim, heads, mlp_dim, dropout) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        tokens = self.patch_embedding(x).flatten(2).transpose(1, 2) + self.position_embedding
        return self.head(self.norm(self.blocks(tokens)).mean(1))
