r"""The quadratic reference of :func:`linattn.cosformer_attention`.

The ground truth of the tests: O(T²) time and memory, or a Python loop over T, by design;
never call it on a fast path.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from linattn.ops._common import (
    accumulation_dtype,
    causal_mask,
    check_eps,
    check_qkv,
    key_mask_for,
    normalise,
    zero_padded,
)
from linattn.ops.cosformer.op import CosFormerFeatures

__all__ = ['cosformer_attention']


def _attend(sim: Tensor, v: Tensor, eps: float, is_causal: bool) -> Tensor:
    """o_i = Σ_j sim_ij v_j / Σ_j sim_ij (j ≤ i if causal). sim: (..., Tq, Tk), v: (..., Tk, Dv)."""
    if is_causal:
        T = sim.shape[-1]
        sim = sim * causal_mask(T, sim.device)
    return normalise(sim @ v, sim.sum(-1), eps)


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
