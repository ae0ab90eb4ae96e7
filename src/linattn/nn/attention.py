"""Multi-head linear attention as an ``nn.Module``, with optional learned relative positions."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from linattn.feature_maps import FeatureMap, get_feature_map
from linattn.ops.linear import linear_attention
from linattn.ops.relative import relative_linear_attention

__all__ = ["MultiheadLinearAttention"]


class MultiheadLinearAttention(nn.Module):
    r"""Multi-head linear attention: ``(B, T, E) -> (B, T, E)``.

    Projections ``E → H·d`` for queries, keys and values, linear attention per head, and an
    output projection ``H·d → E``. With ``max_len`` set, each head also learns ``2·max_len − 1``
    relative vectors ``r_m`` (lags m = −(max_len−1) … max_len−1) that enter as a second kernel,
    ``sim(i, j) = φ(q_i)·φ(k_j) + φ(q_i)·φ(r_{j−i})`` (see :mod:`linattn.ops.relative`); a
    sequence of length T ≤ max_len uses the central 2T − 1 of them.

    Parameters without biases: ``4·E·H·d + (2·max_len − 1)·H·d``.

    The relative vectors are initialised N(0, τ²) with τ the standard deviation of a key
    coordinate at initialisation for unit-variance inputs (τ² = mean over rows of ‖W_k row‖²),
    so neither the content nor the position term dominates the scores at the start.

    Args:
        embed_dim: E. num_heads: H. head_dim: d (default E // H).
        feature_map: name or :class:`~linattn.feature_maps.FeatureMap` instance (a module, so
            random maps are saved with the model).
        is_causal: attend to j ≤ i only.
        max_len: longest sequence; set it to learn relative positions.
        bias: biases in the four projections.
        dropout: dropout on the output projection (there is no attention matrix to drop from).
        sequence_parallel_group: a ``torch.distributed`` group across which the sequence is
            split (each rank holds a contiguous slice, in rank order); attention then runs
            through :func:`linattn.distributed.sequence_parallel_linear_attention`. Not with
            ``max_len``: lag terms would need the other ranks' values.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        head_dim: int | None = None,
        *,
        feature_map: str | FeatureMap = "elu",
        is_causal: bool = False,
        max_len: int | None = None,
        bias: bool = False,
        dropout: float = 0.0,
        sequence_parallel_group=None,
    ) -> None:
        super().__init__()
        if sequence_parallel_group is not None and max_len is not None:
            raise ValueError(
                "sequence_parallel_group: relative positions (max_len) need the whole sequence "
                "on one rank"
            )
        self.sequence_parallel_group = sequence_parallel_group
        if head_dim is None:
            if embed_dim % num_heads:
                raise ValueError(
                    f"num_heads: embed_dim {embed_dim} is not divisible by {num_heads}; "
                    "pass head_dim"
                )
            head_dim = embed_dim // num_heads
        if max_len is not None and max_len < 1:
            raise ValueError(f"max_len: expected a positive integer, got {max_len!r}")
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, head_dim
        self.is_causal = is_causal
        self.max_len = max_len
        inner = num_heads * head_dim
        self.q_proj = nn.Linear(embed_dim, inner, bias=bias)
        self.k_proj = nn.Linear(embed_dim, inner, bias=bias)
        self.v_proj = nn.Linear(embed_dim, inner, bias=bias)
        self.out_proj = nn.Linear(inner, embed_dim, bias=bias)
        self.feature_map = get_feature_map(feature_map)
        self.dropout = nn.Dropout(dropout)
        if max_len is not None:
            self.rel = nn.Parameter(torch.empty(num_heads, 2 * max_len - 1, head_dim))
            self.reset_relative()
        else:
            self.register_parameter("rel", None)

    def key_std(self) -> float:
        """Std of one key coordinate for unit-variance inputs: sqrt(mean_h ‖W_k[h]‖²)."""
        return math.sqrt(self.k_proj.weight.detach().pow(2).sum(1).mean().item())

    def reset_relative(self) -> None:
        """Draw the relative vectors from N(0, τ²), τ = :meth:`key_std` (τ² = σ²)."""
        if self.rel is not None:
            with torch.no_grad():
                self.rel.normal_(0.0, self.key_std())

    def relative_vectors(self, T: int) -> Tensor:
        """The central 2T − 1 relative vectors: (H, 2T − 1, d)."""
        assert self.max_len is not None and self.rel is not None
        if T > self.max_len:
            raise ValueError(f"x: sequence length {T} exceeds max_len={self.max_len}")
        return self.rel[:, self.max_len - T : self.max_len + T - 1]

    def _heads(self, x: Tensor) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        """x: (B, T, E); key_padding_mask: bool (B, T), True = padding. Returns (B, T, E)."""
        if x.dim() != 3 or x.shape[-1] != self.embed_dim:
            raise ValueError(f"x: expected shape (B, T, {self.embed_dim}), got {tuple(x.shape)}")
        B, T, _ = x.shape
        q, k, v = (
            self._heads(self.q_proj(x)),
            self._heads(self.k_proj(x)),
            self._heads(self.v_proj(x)),
        )
        kwargs = dict(
            feature_map=self.feature_map,
            is_causal=self.is_causal,
            key_padding_mask=key_padding_mask,
        )
        if self.rel is not None:
            o = relative_linear_attention(q, k, v, self.relative_vectors(T), **kwargs)
        elif self.sequence_parallel_group is not None:
            from linattn.distributed import sequence_parallel_linear_attention

            o = sequence_parallel_linear_attention(
                q, k, v, group=self.sequence_parallel_group, **kwargs
            )
        else:
            o = linear_attention(q, k, v, **kwargs)
        o = o.transpose(1, 2).reshape(B, T, self.num_heads * self.head_dim)
        return self.dropout(self.out_proj(o))

    def extra_repr(self) -> str:
        return (
            f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, head_dim={self.head_dim}, "
            f"is_causal={self.is_causal}, max_len={self.max_len}"
        )
