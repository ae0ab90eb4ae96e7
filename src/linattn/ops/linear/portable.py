"""Linear attention in whole-tensor, differentiable torch operations: the portable form.

It runs on every device and dtype, with every feature map, and differentiates twice; the CPU
fast paths (:mod:`~linattn.ops.linear.fused`, :mod:`~linattn.ops.linear.native`) compute the
same function and fall back to it for ``create_graph=True``.
"""

from __future__ import annotations

from torch import Tensor

from linattn.feature_maps import FeatureMap
from linattn.ops._common import causal_chunked, features, split_normalised, values_with_ones

__all__ = ["portable_forward"]


def portable_forward(
    fmap: FeatureMap, q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, eps: float,
    chunk: int, is_causal: bool, S0: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Linear attention in whole-tensor, differentiable torch operations (the portable form).

    q (..., Tq, D), k (..., Tk, D), v (..., Tk, Dv), keep from :func:`key_mask_for`, S0
    (..., ℓ, Dv + 1) or None. Returns the output (..., Tq, Dv) in q's dtype and the state
    Σ φ(k)ᵀ[v, 1] (..., ℓ, Dv + 1) in the accumulation dtype. The fast paths' backward
    differentiates this with the graph kept when asked for ``create_graph=True``."""
    fq, fk = features(fmap, q, k, keep)
    v1 = values_with_ones(v, fq.dtype, keep)
    S0 = None if S0 is None else S0.to(fq.dtype)
    if is_causal:
        o1, total = causal_chunked(fq, fk, v1, chunk, S0)
    else:
        total = fk.transpose(-1, -2) @ v1
        total = total if S0 is None else total + S0
        o1 = fq @ total
    return split_normalised(o1, eps).to(q.dtype), total
