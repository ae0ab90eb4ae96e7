"""Pre-norm encoder blocks built on :class:`MultiheadLinearAttention`."""

from __future__ import annotations

from torch import Tensor, nn

from linattn.feature_maps import FeatureMap
from linattn.nn.attention import MultiheadLinearAttention

__all__ = ["EncoderBlock", "LinearTransformerEncoder"]


class EncoderBlock(nn.Module):
    """Pre-norm transformer block: ``x + Attn(LN(x))``, then ``x + MLP(LN(x))``.

    The MLP is ``Linear(E, mlp_dim) → GELU → Dropout → Linear(mlp_dim, E) → Dropout``.
    x: (B, T, E) -> (B, T, E). Attention arguments are those of
    :class:`MultiheadLinearAttention`; with ``sequence_parallel_group`` x is this rank's slice
    of the sequence (LayerNorm and MLP act per token, so they need nothing from other ranks).
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        mlp_dim: int | None = None,
        *,
        head_dim: int | None = None,
        feature_map: str | FeatureMap = "elu",
        is_causal: bool = False,
        max_len: int | None = None,
        dropout: float = 0.0,
        bias: bool = False,
        sequence_parallel_group=None,
    ) -> None:
        super().__init__()
        mlp_dim = 4 * d_model if mlp_dim is None else mlp_dim
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = MultiheadLinearAttention(
            d_model,
            num_heads,
            head_dim,
            feature_map=feature_map,
            is_causal=is_causal,
            max_len=max_len,
            bias=bias,
            dropout=dropout,
            sequence_parallel_group=sequence_parallel_group,
        )
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, mlp_dim),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(mlp_dim, d_model),
            nn.Dropout(dropout),
        )

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        x = x + self.attn(self.norm1(x), key_padding_mask=key_padding_mask)
        return x + self.mlp(self.norm2(x))


class LinearTransformerEncoder(nn.Module):
    """A stack of :class:`EncoderBlock` s, each with its own relative vectors, then a final
    LayerNorm (pre-norm stacks need one). x: (B, T, E) -> (B, T, E)."""

    def __init__(self, num_layers: int, d_model: int, num_heads: int, **block_kwargs) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            EncoderBlock(d_model, num_heads, **block_kwargs) for _ in range(num_layers)
        )
        self.norm = nn.LayerNorm(d_model)

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        for layer in self.layers:
            x = layer(x, key_padding_mask=key_padding_mask)
        return self.norm(x)
