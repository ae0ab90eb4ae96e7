r"""The quadratic reference of :func:`linattn.decay_linear_attention`; standalone and O(T²) by
design, as :mod:`linattn.ops.reference` describes them.
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.feature_maps import FeatureMap, get_feature_map
from linattn.ops._reference_checks import (
    check_gamma,
    check_qkv,
    inference_tensors_as_constants,
    map_eps,
)

__all__ = ['decay_linear_attention']


@inference_tensors_as_constants
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
    for j ≤ i (0 above the diagonal), ``o_i = Σ_j W[i, j] v_j / (Σ_j W[i, j] + ε)``: the ground
    truth of :mod:`linattn.ops.decay`.

    Arguments and shapes as :func:`linattn.ops.decay.op.decay_linear_attention` (without its
    state and chunk arguments); γ⁰ = 1, also for γ = 0; a row whose normaliser is exactly 0 is 0."""
    check_qkv(q, k, v, same_length=True)
    fmap = get_feature_map(feature_map)
    eps = map_eps(eps, fmap)
    out_dtype = q.dtype
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    q, k, v = q.to(acc), k.to(acc), v.to(acc)
    T = q.shape[-2]
    g = check_gamma(gamma, tuple(q.shape[:-2]), acc, q.device)[..., None, None]  # (..., 1, 1)

    i = torch.arange(T, device=q.device)[:, None]
    j = torch.arange(T, device=q.device)[None, :]
    lag = (i - j).to(acc)  # (T, T): i − j
    decay = torch.where(j <= i, g.pow(lag.clamp(min=0)), 0.0)  # (..., T, T): γ^{i−j}, j ≤ i
    W = (fmap.forward_queries(q) @ fmap.forward_keys(k).transpose(-1, -2)) * decay

    num = W @ v  # (..., T, Dv)
    den = W.sum(-1) + eps  # (..., T)
    den = torch.where(den == 0, torch.ones_like(den), den)  # nothing to attend to: 0, not 0/0
    return (num / den[..., None]).to(out_dtype)
