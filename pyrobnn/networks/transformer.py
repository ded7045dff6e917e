r"""A one-block Transformer-encoder text classifier (the VariationalMLP.jl thesis, sec. 3.2, after Sinai 2022).

Token ids ``(B, L)`` (int64, padding id 0 at the end) go through an embedding plus the sinusoidal
positional encoding of Vaswani et al. (2017), :math:`PE_{p,2i} = \sin(p/10000^{2i/d})`,
:math:`PE_{p,2i+1} = \cos(p/10000^{2i/d})`, one ``nn.TransformerEncoderLayer`` (post-norm:
:math:`h = \mathrm{LN}(x + \mathrm{MHA}(x))`, :math:`y = \mathrm{LN}(h + W_2\,\mathrm{ReLU}(W_1 h + b_1) + b_2)`),
masked mean pooling over the real tokens, :math:`\bar y = \sum_t m_t y_t / \sum_t m_t`, and a linear head.

The padding mask :math:`m_t = [\mathrm{id}_t \ne 0]` is recomputed from the ids inside ``forward``, so the
network takes one tensor and ``BayesianNetwork.forward(x, y)`` is unchanged. The thesis makes only the
feed-forward sublayer (:data:`FFN_SITES`: ``encoder.linear1``, ``encoder.linear2``) variational.

The block is PyTorch's ``nn.TransformerEncoderLayer`` (its parameters, names and initialisation), but ``forward``
applies its submodules itself, the layer's post-norm equations above, instead of calling the layer. Calling it
works with pyrobnn: its fused inference kernel (``torch._transformer_encoder_layer_fwd``, which skips ``F.linear``)
is only taken in eval mode without gradients when no parameter has a ``__torch_function__``, so the estimator
handlers' :class:`~pyrobnn.handlers.gaussian_weight.GaussianWeight` s always select the modular path, and otherwise it
runs on a plain weight sample, as the modular path would (both checked in ``tests/data/test_text.py``). But on CPU that
kernel, and ``nn.MultiheadAttention``'s with a boolean padding mask, are 2-4x slower than the modular path
(one thread, 500 reviews of 256 tokens: 0.77 s against 0.19 s), and prediction runs many passes. The padding
mask is therefore given to the attention as an additive float mask (0, or :math:`-\infty` at padding), which
also keeps ``nn.MultiheadAttention`` on its modular path.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from pyrobnn.checks import in_range, positive_int

__all__ = ["TransformerClassifier", "FFN_SITES", "BLOCK_SITES", "sinusoidal_encoding"]

FFN_SITES = ("encoder.linear1.*", "encoder.linear2.*")
"""``include=`` selectors of the feed-forward sublayer, the only Bayesian part in the thesis."""

BLOCK_SITES = ("encoder.self_attn.*", *FFN_SITES)
"""``include=`` selectors of every linear map of the encoder block (attention projections and FFN)."""


def sinusoidal_encoding(length: int, dim: int) -> torch.Tensor:
    r"""The ``(length, dim)`` positional encoding of Vaswani et al. (2017): :math:`\sin(p\,\omega_i)` in the even
    and :math:`\cos(p\,\omega_i)` in the odd columns, :math:`\omega_i = 10000^{-2i/d}`."""
    position = torch.arange(length, dtype=torch.float32).unsqueeze(1)
    frequency = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    encoding = torch.zeros(length, dim)
    encoding[:, 0::2] = torch.sin(position * frequency)
    encoding[:, 1::2] = torch.cos(position * frequency)[:, : dim // 2]
    return encoding


class TransformerClassifier(nn.Module):
    """Embedding + positional encoding, one encoder block, masked mean pooling, linear head (module docstring).

    :param vocab_size: number of token ids (the tokenizer's, special tokens included).
    :param num_classes: outputs of the head.
    :param max_length: longest sequence (rows of the positional encoding).
    :param dim: embedding width (32 in the thesis); ``heads`` must divide it.
    :param ffn_dim: hidden width of the feed-forward sublayer.
    :param dropout: dropout rate inside the block (attention weights, FFN, residual branches).
    """

    def __init__(self, vocab_size: int, num_classes: int = 2, max_length: int = 256, dim: int = 32, heads: int = 2,
                 ffn_dim: int = 64, dropout: float = 0.1, pad_id: int = 0):
        super().__init__()
        vocab_size = positive_int("vocab_size", vocab_size)
        max_length = positive_int("max_length", max_length)
        dim, heads = positive_int("dim", dim), positive_int("heads", heads)
        if dim % heads:
            raise ValueError(f"heads ({heads}) must divide dim ({dim})")
        if not 0 <= pad_id < vocab_size:
            raise ValueError(f"pad_id must be a token id in [0, {vocab_size}), got {pad_id!r}")
        self.pad_id = pad_id
        self.embedding = nn.Embedding(vocab_size, dim, padding_idx=pad_id)
        self.register_buffer("positions", sinusoidal_encoding(max_length, dim), persistent=False)
        self.encoder = nn.TransformerEncoderLayer(dim, heads, positive_int("ffn_dim", ffn_dim),
                                                  in_range("dropout", dropout, 0, 1, "[)"), batch_first=True)
        self.head = nn.Linear(dim, positive_int("num_classes", num_classes))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.dtype != torch.long or ids.dim() != 2:
            raise ValueError(f"ids must be int64 token ids of shape (batch, length), got {ids.dtype} "
                             f"{tuple(ids.shape)}")
        if ids.shape[1] > self.positions.shape[0]:
            raise ValueError(f"ids have {ids.shape[1]} tokens but max_length is {self.positions.shape[0]}: "
                             "truncate them or build the model with a larger max_length")
        padding = ids == self.pad_id
        if padding.all(1).any():
            raise ValueError("a sequence of ids is all padding: every text needs at least one token")
        x = self.embedding(ids) + self.positions[: ids.shape[1]]
        block = self.encoder
        key_bias = torch.zeros(padding.shape, dtype=x.dtype, device=x.device).masked_fill(padding, -math.inf)
        attended = block.self_attn(x, x, x, key_padding_mask=key_bias, need_weights=False)[0]
        x = block.norm1(x + block.dropout1(attended))
        x = block.norm2(x + block.dropout2(block.linear2(block.dropout(block.activation(block.linear1(x))))))
        weights = (~padding).to(x.dtype)
        weights = weights / weights.sum(1, keepdim=True)
        return self.head((x * weights.unsqueeze(-1)).sum(1))
