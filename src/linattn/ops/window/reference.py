r"""The quadratic reference of :func:`linattn.window_linear_attention`.

A reference as :mod:`linattn.ops.reference` describes them (standalone, O(T²) by design); the
window check, this op's alone, is stated here.
"""

from __future__ import annotations

import math
import numbers

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

__all__ = ['window_linear_attention']


@inference_tensors_as_constants
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
    overflows only when |D_F + ε| is below the dtype's smallest normal number. A row with no
    key (and ε = 0) is 0. Arguments and shapes as
    :func:`linattn.ops.window.op.window_linear_attention` (without its state and chunk
    arguments)."""
    check_qkv(q, k, v, same_length=True)
    if isinstance(window, bool) or not isinstance(window, numbers.Integral) or window < 1:
        raise ValueError(f"window: expected a positive integer, got {window!r}")
    w = min(int(window), max(q.shape[-2], 1))  # lags stay below T: a longer window is the same
    fmap = get_feature_map(feature_map)
    eps = map_eps(eps, fmap)
    if key_padding_mask is not None:
        check_padding_mask(key_padding_mask, k, "key_padding_mask", "k")
    out_dtype = q.dtype
    T = q.shape[-2]
    if T == 0:  # on the graph of q, k and v, as the op's empty output
        return (q[..., :0, :1] * k[..., :0, :1] * v[..., :0, :]).to(out_dtype)
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    q, k, v = q.to(acc), k.to(acc), v.to(acc)
    zero = q.new_zeros(())

    # kept[..., j]: key j takes part, (Tk,) or (B, 1, …, 1, Tk)
    kept = kept_keys(key_padding_mask, k)
    # padded keys and values (which may hold nan or inf) are 0: they reach nothing
    k = torch.where(kept[..., :, None], k, zero)
    v = torch.where(kept[..., :, None], v, zero)

    i = torch.arange(T, device=q.device)[:, None]
    j = torch.arange(T, device=q.device)[None, :]
    lag = i - j
    near = (lag >= 0) & (lag < w) if is_causal else lag.abs() < w  # (T, T): the window
    far = lag >= w if is_causal else lag.abs() >= w  # the linear part
    near = near & kept[..., None, :]  # (..., T, T)
    far = far & kept[..., None, :]

    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (..., T, T)
    kern = torch.where(far, fmap.forward_queries(q) @ fmap.forward_keys(k).transpose(-1, -2),
                       zero)
    # the shift m_i (a constant of the row: it cancels from the quotient, so no gradient)
    far_den = (kern.sum(-1, keepdim=True) + eps).detach().abs()  # |D_F + ε|: (..., T, 1)
    near_max = torch.where(near, s, -math.inf).amax(-1, keepdim=True).detach()
    m = torch.maximum(near_max, torch.where(far_den > 0, far_den.log(), -math.inf))
    m = torch.where(m == -math.inf, 0.0, m)  # a row with no key at all: its output is 0
    # exp(−m) ≤ 1/|D_F + ε| where D_F + ε ≠ 0; elsewhere ε = 0 and no far key: no scale needed
    shift = torch.where(far_den > 0, torch.exp(-m), 0.0)
    W = torch.where(near, torch.exp(torch.where(near, s, 0.0) - m), kern * shift)

    num = W @ v  # (..., T, Dv)
    den = W.sum(-1) + eps * shift[..., 0]  # (..., T)
    den = torch.where(den == 0, torch.ones_like(den), den)  # nothing to attend to: 0, not 0/0
    return (num / den[..., None]).to(out_dtype)
