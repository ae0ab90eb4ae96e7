r"""The quadratic reference of :func:`linattn.linear_attention`: the explicit T×T similarity matrix.

The ground truth of the tests: O(T²) time and memory, or a Python loop over T, by design;
never call it on a fast path.
"""

from __future__ import annotations

from torch import Tensor

from linattn.feature_maps import FeatureMap
from linattn.ops._common import (
    causal_mask,
    check_qkv,
    features,
    key_mask_for,
    normalise,
    resolve,
    zero_padded,
)

__all__ = ['linear_attention']


def _attend(sim: Tensor, v: Tensor, eps: float, is_causal: bool) -> Tensor:
    """o_i = Σ_j sim_ij v_j / Σ_j sim_ij (j ≤ i if causal). sim: (..., Tq, Tk), v: (..., Tk, Dv)."""
    if is_causal:
        T = sim.shape[-1]
        sim = sim * causal_mask(T, sim.device)
    return normalise(sim @ v, sim.sum(-1), eps)


def linear_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    feature_map: str | FeatureMap = "elu",
    is_causal: bool = False,
    key_padding_mask: Tensor | None = None,
    eps: float | None = None,
) -> Tensor:
    r"""o_i = Σ_j φ(q_i)·φ(k_j) v_j / Σ_j φ(q_i)·φ(k_j), with the T×T matrix built explicitly.

    q: (..., Tq, D), k: (..., Tk, D), v: (..., Tk, Dv) -> (..., Tq, Dv). Masked keys (True in
    ``key_padding_mask``, (B, Tk)) and, when causal, keys j > i get similarity 0."""
    check_qkv(q, k, v, same_length=is_causal)
    fmap, eps = resolve(feature_map, eps)
    keep = key_mask_for(key_padding_mask, k)
    fq, fk = features(fmap, q, k, keep)
    sim = fq @ fk.transpose(-1, -2)
    return _attend(sim, zero_padded(v.to(fq.dtype), keep), eps, is_causal).to(q.dtype)
