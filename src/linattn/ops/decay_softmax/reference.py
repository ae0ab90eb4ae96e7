r"""The float64 reference of :func:`linattn.decay_softmax_attention`.

The ground truth of the tests: O(T²) time and memory, or a Python loop over T, by design;
never call it on a fast path.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from linattn.ops.decay_softmax.op import check_decay_softmax_inputs

__all__ = ['decay_softmax_attention']


def decay_softmax_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    gamma: float | Tensor,
    *,
    scale: float | None = None,
) -> Tensor:
    r"""Causal softmax attention with the explicit biased scores
    ``scale·q_i·k_j + (i − j)·log γ`` (j ≤ i, −∞ above), queries at the last T of S positions:
    the ground truth of :mod:`linattn.ops.decay_softmax`, in float64.

    q: (..., T, D); k: (..., S, D); v: (..., S, Dv); gamma in (0, 1] broadcastable to ``...``.
    Returns (..., T, Dv) in q's dtype."""
    logg, scale = check_decay_softmax_inputs(q, k, v, gamma, scale)
    T, S = q.shape[-2], k.shape[-2]
    f64 = torch.float64
    i = torch.arange(S - T, S, device=q.device, dtype=f64)[:, None]
    j = torch.arange(S, device=q.device, dtype=f64)[None, :]
    bias = (i - j) * logg.to(f64)[..., None, None]
    scores = scale * (q.to(f64) @ k.to(f64).transpose(-1, -2)) + bias
    scores = scores.masked_fill(j > i, -math.inf)
    return (scores.softmax(-1) @ v.to(f64)).to(q.dtype)
