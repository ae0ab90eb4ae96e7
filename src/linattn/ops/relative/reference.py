r"""The quadratic reference of :func:`linattn.relative_linear_attention`; standalone and O(T²)
by design, as :mod:`linattn.ops.reference` describes them.
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.feature_maps import FeatureMap, get_feature_map
from linattn.ops._reference_checks import (
    check_padding_mask,
    check_qkv,
    inference_tensors_as_constants,
    kept_keys,
    map_eps,
)

__all__ = ['relative_linear_attention']


@inference_tensors_as_constants
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
    r"""sim(i, j) = φ(q_i)·φ(k_j) + φ(q_i)·φ(r_{j−i}), built as an explicit T×T matrix;
    o_i = Σ_j sim(i, j) v_j / (Σ_j sim(i, j) + ε) over the unpadded keys (j ≤ i when causal).

    Arguments and shapes as :func:`linattn.ops.relative.op.relative_linear_attention` (without
    ``method`` and ``chunk_size``); a row whose normaliser is exactly 0 is 0."""
    check_qkv(q, k, v, same_length=True)
    fmap = get_feature_map(feature_map)
    eps = map_eps(eps, fmap)
    if key_padding_mask is not None:
        check_padding_mask(key_padding_mask, k, "key_padding_mask", "k")
    out_dtype = q.dtype
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    q, k, v, r = q.to(acc), k.to(acc), v.to(acc), r.to(acc)
    T = q.shape[-2]
    zero = q.new_zeros(())

    # kept[..., j]: key j takes part, (Tk,) or (B, 1, …, 1, Tk)
    kept = kept_keys(key_padding_mask, k)
    # padded keys and values (which may hold nan or inf) are 0 before φ: they reach nothing
    k = torch.where(kept[..., :, None], k, zero)
    v = torch.where(kept[..., :, None], v, zero)

    fq = fmap.forward_queries(q)  # (B, H, T, L)
    fk = fmap.forward_keys(k)  # (B, H, T, L)
    fr = fmap.forward_keys(r)  # (H, 2T−1, L)
    i = torch.arange(T, device=q.device)[:, None]
    j = torch.arange(T, device=q.device)[None, :]
    fr_ij = fr[:, j - i + T - 1]  # (H, T, T, L): fr_ij[h, i, j] = φ(r_{j−i})
    sim = fq @ fk.transpose(-1, -2) + torch.einsum("...il,...ijl->...ij", fq, fr_ij)
    allowed = kept[..., None, :]  # (..., 1, T)
    if is_causal:
        allowed = allowed & (j <= i)
    sim = torch.where(allowed, sim, zero)

    num = sim @ v  # (B, H, T, Dv)
    den = sim.sum(-1) + eps  # (B, H, T)
    den = torch.where(den == 0, torch.ones_like(den), den)  # nothing to attend to: 0, not 0/0
    return (num / den[..., None]).to(out_dtype)
