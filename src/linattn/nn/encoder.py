"""Pre-norm encoder blocks built on :class:`MultiheadLinearAttention`."""

from __future__ import annotations

from torch import Tensor, nn

from linattn.nn.attention import FeatureMapSpec, MultiheadLinearAttention

__all__ = ["PreNormBlock", "EncoderBlock", "LinearTransformerEncoder"]


class PreNormBlock(nn.Module):
    """The pre-norm layout shared by the blocks: ``norm1``, the given attention ``attn``,
    ``norm2`` and the MLP ``Linear(E, mlp_dim) → GELU → Dropout → Linear(mlp_dim, E) → Dropout``
    (mlp_dim defaults to 4E; 0 for no MLP at all, e.g. Zoology's recall models, whose only
    mixing is attention). Each subclass builds its own attention and defines ``forward``
    (``x + attn(norm1(x))`` then :meth:`mlp_residual`); this class has none.

    The submodules are registered in this order (norm1, attn, norm2, mlp) so that parameter
    order, which saved optimizer states follow, is that of the blocks before this class."""

    def __init__(self, d_model: int, attn: nn.Module, mlp_dim: int | None = None,
                 dropout: float = 0.0) -> None:
        super().__init__()
        mlp_dim = 4 * d_model if mlp_dim is None else mlp_dim
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = attn
        self.norm2: nn.Module | None = None
        self.mlp: nn.Module | None = None
        if mlp_dim:
            self.norm2 = nn.LayerNorm(d_model)
            self.mlp = nn.Sequential(
                nn.Linear(d_model, mlp_dim),
                nn.GELU(),
                nn.Dropout(dropout),
                nn.Linear(mlp_dim, d_model),
                nn.Dropout(dropout),
            )

    def mlp_residual(self, x: Tensor) -> Tensor:
        """``x + MLP(LN(x))`` (x itself without an MLP): (B, T, E) -> (B, T, E)."""
        if self.mlp is None:
            return x
        return x + self.mlp(self.norm2(x))


class EncoderBlock(PreNormBlock):
    """Pre-norm transformer block: ``x + Attn(LN(x))``, then ``x + MLP(LN(x))``.

    x: (B, T, E) -> (B, T, E). Attention arguments are those of
    :class:`MultiheadLinearAttention` (``attention="flow"`` selects Flowformer's flow
    attention); with ``sequence_parallel_group`` x is this rank's slice
    of the sequence (LayerNorm and MLP act per token, so they need nothing from other ranks).
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        mlp_dim: int | None = None,
        *,
        head_dim: int | None = None,
        feature_map: FeatureMapSpec = "elu",
        is_causal: bool = False,
        max_len: int | None = None,
        dropout: float = 0.0,
        bias: bool = False,
        sequence_parallel_group=None,
        attention: str = "linear",
    ) -> None:
        attn = MultiheadLinearAttention(
            d_model,
            num_heads,
            head_dim,
            feature_map=feature_map,
            is_causal=is_causal,
            max_len=max_len,
            bias=bias,
            dropout=dropout,
            sequence_parallel_group=sequence_parallel_group,
            attention=attention,
        )
        super().__init__(d_model, attn, mlp_dim, dropout)

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        """x: (B, T, E); key_padding_mask: bool (B, T), True = padding. Returns (B, T, E)."""
        return self.mlp_residual(x + self.attn(self.norm1(x), key_padding_mask=key_padding_mask))


class LinearTransformerEncoder(nn.Module):
    """A stack of :class:`EncoderBlock` s, then a final LayerNorm (pre-norm stacks need one).
    x: (B, T, E) -> (B, T, E).

    Each layer owns its relative vectors and its feature map: a ``feature_map`` instance in
    ``block_kwargs`` is a template that every layer copies (see
    :func:`~linattn.nn.attention.own_feature_map`), so a learnable map is not tied across layers
    and a random map gets one draw per layer."""

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
