r"""The float64 reference of :func:`linattn.decay_softmax_attention`.

The ground truth of the tests: O(T²) time and memory by design; never call it on a fast path.
Standalone: it shares no code with the op it checks (only the argument checks of
:mod:`linattn.ops._reference_checks`, which no op uses; the checks only this op has, keys
enough for the queries, γ > 0 and the scale, are stated here).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from linattn.ops._reference_checks import (
    check_gamma,
    check_qkv,
    check_scale,
    inference_tensors_as_constants,
    shown,
)

__all__ = ['decay_softmax_attention']


@inference_tensors_as_constants
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

    Arguments and shapes as :func:`linattn.ops.decay_softmax.op.decay_softmax_attention`
    (without ``block_size``); γ is taken in q's dtype, as the op takes it, its log in float64."""
    check_qkv(q, k, v, same_length=False)
    T, S = q.shape[-2], k.shape[-2]
    if S < T:
        raise ValueError(f"k: expected at least as many keys as queries (the queries are the "
                         f"last T of S positions), got {S} keys for {T} queries")
    g = check_gamma(gamma, tuple(q.shape[:-2]), q.dtype, q.device)
    if (g == 0).any():
        raise ValueError("gamma: expected decays in (0, 1] (log γ must be finite), got "
                         f"{shown(gamma)}")
    scale = check_scale(scale, q.shape[-1] ** -0.5, positive=True)

    f64 = torch.float64
    i = torch.arange(S - T, S, device=q.device, dtype=f64)[:, None]  # query positions
    j = torch.arange(S, device=q.device, dtype=f64)[None, :]  # key positions
    bias = (i - j) * g.to(f64).log()[..., None, None]  # (..., T, S)
    scores = float(scale) * (q.to(f64) @ k.to(f64).transpose(-1, -2)) + bias
    scores = scores.masked_fill(j > i, -math.inf)  # every row keeps j = i: never all −∞
    return (scores.softmax(-1) @ v.to(f64)).to(q.dtype)
