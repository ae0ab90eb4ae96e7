r"""The quadratic reference of :func:`linattn.decay_linear_attention`.

The ground truth of the tests: O(T²) time and memory, or a Python loop over T, by design;
never call it on a fast path.
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.feature_maps import FeatureMap
from linattn.ops._common import (
    check_gamma,
    check_qkv,
    features,
    normalise,
    resolve,
)

__all__ = ['decay_linear_attention']


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
