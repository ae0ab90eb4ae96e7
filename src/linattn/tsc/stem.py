"""``StemNet``: learned convolutions over the raw series, then linear attention over their
pooled tokens (round 9 of docs/experiments.md).

The random-kernel tokens of :class:`~linattn.tsc.conv_tokens.ConvTokens` are fixed before any
label is seen; on long or finely shaped series (EthanolLevel's spectra, ChlorineConcentration)
the networks that learn their kernels (InceptionTime, ResNet) score far higher. This net learns
its own: each series is z-normalised, its first difference joins it as a second channel, both
are average-pooled so that at most ``max_length`` samples remain (a 1,751-sample spectrum
becomes 438), and three convolution blocks (kernel 9 at dilations 1, 2 and 4, batch norm, ReLU;
``channels``, ``channels`` and ``d_model`` channels) describe every position. Max pooling cuts
that into ``tokens`` tokens, and ``num_layers`` linear-attention encoder blocks with learned
relative positions relate them before the mean over tokens, a LayerNorm and the linear head.
``num_layers=0`` removes the mixer (the ablation).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["StemNet"]


def _conv_block(c_in: int, c_out: int, dilation: int) -> torch.nn.Sequential:
    """Kernel 9 at ``dilation``, same length; batch norm; ReLU."""
    return torch.nn.Sequential(torch.nn.Conv1d(c_in, c_out, 9, padding=4 * dilation,
                                               dilation=dilation),
                               torch.nn.BatchNorm1d(c_out), torch.nn.ReLU())


class StemNet(torch.nn.Module):
    """A classifier of raw series: (B, length) -> (B, n_classes) logits (module docstring).

    ``length``: the series' samples (fixed at construction, like the token count of
    :class:`~linattn.tsc.conv_tokens.TokenNet`); ``max_length``: the most samples the
    convolutions see (average pooling by ``ceil(length / max_length)``); ``tokens``: how many
    the attention relates (at most the pooled length)."""

    def __init__(self, length: int, n_classes: int, channels: int = 32, d_model: int = 64,
                 tokens: int = 32, num_layers: int = 2, num_heads: int = 4,
                 dropout: float = 0.1, max_length: int = 512) -> None:
        super().__init__()
        from linattn.nn import EncoderBlock

        self.stride = max(1, math.ceil(length / max_length))
        self.pooled_length = math.ceil(length / self.stride)  # avg_pool1d's ceil_mode
        self.tokens = min(tokens, self.pooled_length)
        self.convs = torch.nn.Sequential(_conv_block(2, channels, 1),
                                         _conv_block(channels, channels, 2),
                                         _conv_block(channels, d_model, 4))
        self.blocks = torch.nn.ModuleList(
            EncoderBlock(d_model, num_heads, 2 * d_model, head_dim=d_model // num_heads,
                         max_len=self.tokens, dropout=dropout) for _ in range(num_layers))
        self.norm = torch.nn.LayerNorm(d_model)
        self.head = torch.nn.Linear(d_model, n_classes)

    def forward(self, x: Tensor) -> Tensor:
        # per series, so that level and scale differences between recordings do not decide
        z = (x - x.mean(1, keepdim=True)) / (x.std(1, keepdim=True) + 1e-6)
        z = torch.stack([z, torch.diff(z, dim=1, prepend=z[:, :1])], 1)  # (B, 2, L)
        if self.stride > 1:
            z = F.avg_pool1d(z, self.stride, self.stride, ceil_mode=True)
        h = F.adaptive_max_pool1d(self.convs(z), self.tokens).transpose(1, 2)  # (B, S, d)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h.mean(1)))
