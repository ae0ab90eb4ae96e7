r"""Quadratic references: build the explicit T×T similarity matrix.

These are the ground truth that every fast path is tested against. They cost O(T²) time and
memory by design: never call them on a fast path.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from linattn.feature_maps import FeatureMap
from linattn.ops._common import (
    accumulation_dtype,
    causal_mask,
    check_eps,
    check_gamma,
    check_qkv,
    features,
    key_mask_for,
    normalise,
    resolve,
    zero_padded,
)
from linattn.ops.cosformer import CosFormerFeatures

__all__ = [
    "linear_attention",
    "relative_linear_attention",
    "cosformer_attention",
    "decay_linear_attention",
]


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


def cosformer_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    is_causal: bool = False,
    key_padding_mask: Tensor | None = None,
    eps: float | None = None,
) -> Tensor:
    r"""sim(i, j) = relu(q_i)·relu(k_j)·cos(π/2 · (i − j)/T), built as an explicit T×T matrix.

    q, k: (..., T, D), v: (..., T, Dv) -> (..., T, Dv). ``eps`` None: the op's default,
    :attr:`linattn.ops.cosformer.CosFormerFeatures.eps`."""
    check_qkv(q, k, v, same_length=True)
    eps = check_eps(CosFormerFeatures.eps if eps is None else eps)
    acc = accumulation_dtype(q.dtype)
    keep = key_mask_for(key_padding_mask, k)
    fk = zero_padded(torch.relu(k.to(acc)), keep)
    T = q.shape[-2]
    pos = torch.arange(T, device=q.device, dtype=acc)
    cos = torch.cos(math.pi / 2 * (pos[:, None] - pos[None, :]) / T)
    sim = (torch.relu(q.to(acc)) @ fk.transpose(-1, -2)) * cos
    return _attend(sim, zero_padded(v.to(acc), keep), eps, is_causal).to(q.dtype)


def decay_linear_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    gamma: float | Tensor,
    *,
    feature_map: str | FeatureMap = "elu",
    eps: float | None = None,
) -> Tensor:
    r"""Causal decayed linear attention with explicit weights ``W[i, j] = γ^{i−j} φ(q_i)·φ(k_j)``
    for j ≤ i (0 above the diagonal): the ground truth of :mod:`linattn.ops.decay`.

    q, k: (..., T, D); v: (..., T, Dv); gamma in [0, 1] broadcastable to ``...``.
    Returns (..., T, Dv)."""
    check_qkv(q, k, v, same_length=True)
    fmap, eps = resolve(feature_map, eps)
    fq, fk = features(fmap, q, k)
    T = q.shape[-2]
    g = check_gamma(gamma, tuple(q.shape[:-2]), fq)[..., None, None]
    idx = torch.arange(T, device=q.device)
    lag = (idx[:, None] - idx[None, :]).to(fq.dtype)
    W = (fq @ fk.transpose(-1, -2)) * torch.where(lag >= 0, g.pow(lag.clamp(min=0)), 0.0)
    return normalise(W @ v.to(fq.dtype), W.sum(-1), eps).to(q.dtype)
