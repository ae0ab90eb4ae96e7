r"""The quadratic reference of :func:`linattn.window_linear_attention`.

The ground truth of the tests: O(T²) time and memory, or a Python loop over T, by design;
never call it on a fast path.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from linattn.feature_maps import FeatureMap
from linattn.ops._common import (
    check_qkv,
    features,
    key_mask_for,
    normalise,
    resolve,
    zero_padded,
)
from linattn.ops.window.op import check_window

__all__ = ['window_linear_attention']


def window_linear_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    window: int,
    feature_map: str | FeatureMap = "elu",
    is_causal: bool = True,
    key_padding_mask: Tensor | None = None,
    eps: float | None = None,
) -> Tensor:
    r"""Sliding-window softmax + linear attention with the explicit T×T weights: the ground
    truth of :mod:`linattn.ops.window`.

    ``W[i, j] = exp(s_ij − m_i)`` inside the window (causal: ``0 ≤ i − j < w``; non-causal:
    ``|i − j| < w``), ``φ(q_i)·φ(k_j)·exp(−m_i)`` outside it (causal: j ≤ i − w only), 0 for
    padded keys; ``s_ij = q_i·k_j/√D``; ``o_i = Σ_j W[i, j] v_j / (Σ_j W[i, j] + ε·exp(−m_i))``,
    exactly the unscaled quotient. ``m_i = max(max of s_ij in the window, log|D_F + ε|)`` with
    D_F the row's linear normaliser, as in the op: every weight is at most 1, and exp(−m_i)
    overflows only when |D_F + ε| is below the dtype's smallest normal number.
    q, k: (..., T, D); v: (..., T, Dv). Returns (..., T, Dv)."""
    check_qkv(q, k, v, same_length=True)
    w = check_window(window)
    fmap, eps = resolve(feature_map, eps)
    keep = key_mask_for(key_padding_mask, k)
    fq, fk = features(fmap, q, k, keep)
    acc = fq.dtype
    T = q.shape[-2]
    if T == 0:
        return q.new_zeros(*q.shape[:-2], 0, v.shape[-1])
    s = q.to(acc) @ zero_padded(k.to(acc), keep).transpose(-1, -2) / math.sqrt(q.shape[-1])
    idx = torch.arange(T, device=q.device)
    lag = idx[:, None] - idx[None, :]  # i − j
    near = (lag >= 0) & (lag < w) if is_causal else lag.abs() < w
    far = lag >= w if is_causal else lag.abs() >= w
    if keep is not None:
        kept = keep.squeeze(-1).unsqueeze(-2)  # (B, 1, ..., 1, T)
        near, far = near & kept, far & kept
    kern = torch.where(far, fq @ fk.transpose(-1, -2), 0.0)
    far_den = (kern.sum(-1, keepdim=True) + eps).detach().abs()
    m = torch.maximum(torch.where(near, s, float("-inf")).amax(-1, keepdim=True).detach(),
                      torch.where(far_den > 0, far_den.log(), float("-inf")))
    m = torch.where(m == float("-inf"), 0.0, m)  # a row with no key: zeros
    # exp(−m) ≤ 1/|D_F + ε| where D_F + ε ≠ 0; elsewhere ε = 0 and no far key: no scale needed
    scale = torch.where(far_den > 0, torch.exp(-m), 0.0)
    W = torch.where(near, torch.exp(torch.where(near, s, 0.0) - m), kern * scale)
    den = W.sum(-1) + eps * scale[..., 0]
    return normalise(W @ zero_padded(v.to(acc), keep), den, 0.0).to(q.dtype)
