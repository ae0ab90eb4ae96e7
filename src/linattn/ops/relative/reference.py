r"""The quadratic reference of :func:`linattn.relative_linear_attention`.

The ground truth of the tests: O(T²) time and memory, or a Python loop over T, by design;
never call it on a fast path.
"""

from __future__ import annotations

import torch
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

__all__ = ['relative_linear_attention']


def _attend(sim: Tensor, v: Tensor, eps: float, is_causal: bool) -> Tensor:
    """o_i = Σ_j sim_ij v_j / Σ_j sim_ij (j ≤ i if causal). sim: (..., Tq, Tk), v: (..., Tk, Dv)."""
    if is_causal:
        T = sim.shape[-1]
        sim = sim * causal_mask(T, sim.device)
    return normalise(sim @ v, sim.sum(-1), eps)


def relative_linear_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    r: Tensor,
    *,
    feature_map: str | FeatureMap = "elu",
    is_causal: bool = False,
    key_padding_mask: Tensor | None = None,
    eps: float | None = None,
) -> Tensor:
    r"""sim(i, j) = φ(q_i)·φ(k_j) + φ(q_i)·φ(r_{j−i}), built as an explicit T×T matrix.

    q, k: (B, H, T, D), v: (B, H, T, Dv), r: (H, 2T−1, D) with r[:, m + T − 1] the vector of lag
    m = j − i. Returns (B, H, T, Dv)."""
    check_qkv(q, k, v, same_length=True)
    fmap, eps = resolve(feature_map, eps)
    keep = key_mask_for(key_padding_mask, k)
    fq, fk = features(fmap, q, k, keep)
    fr = fmap.forward_keys(r.to(fq.dtype))  # (H, 2T-1, L)
    T = q.shape[-2]
    pos = torch.arange(T, device=q.device)
    lag = pos[None, :] - pos[:, None] + T - 1  # lag[i, j] = j - i, shifted to index r
    fr_ij = fr[:, lag]  # (H, T, T, L)
    sim = fq @ fk.transpose(-1, -2) + torch.einsum("...il,...ijl->...ij", fq, fr_ij)
    if keep is not None:
        sim = sim * keep.squeeze(-1).unsqueeze(-2)
    return _attend(sim, zero_padded(v.to(fq.dtype), keep), eps, is_causal).to(q.dtype)
