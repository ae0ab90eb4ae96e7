r"""The quadratic reference of :func:`linattn.cosformer_attention`.

The ground truth of the tests: O(T²) time and memory by design; never call it on a fast path.
Standalone: it shares no code with the op it checks (only the argument checks of
:mod:`linattn.ops._reference_checks`, which no op uses). The op computes the cosine weight as a
product of 2d position features; here it is the T×T matrix itself.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from linattn.ops._reference_checks import (
    check_eps,
    check_padding_mask,
    check_qkv,
    inference_tensors_as_constants,
    kept_keys,
)

__all__ = ['cosformer_attention']

#: The default ``eps`` of cosFormer attention (relu features can give a zero normaliser); must
#: equal the op's, ``linattn.ops.cosformer.CosFormerFeatures.eps`` (tests/ops/test_reference.py).
DEFAULT_EPS = 1e-6


@inference_tensors_as_constants
def cosformer_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    is_causal: bool = False,
    key_padding_mask: Tensor | None = None,
    eps: float | None = None,
) -> Tensor:
    r"""sim(i, j) = relu(q_i)·relu(k_j)·cos(π/2 · (i − j)/T), built as an explicit T×T matrix;
    o_i = Σ_j sim(i, j) v_j / (Σ_j sim(i, j) + ε) over the unpadded keys (j ≤ i when causal).

    Arguments and shapes as :func:`linattn.ops.cosformer.op.cosformer_attention`; ``eps`` None is
    :data:`DEFAULT_EPS`, the op's default; a row whose normaliser is exactly 0 is 0."""
    check_qkv(q, k, v, same_length=True)
    eps = check_eps(DEFAULT_EPS if eps is None else eps)
    if key_padding_mask is not None:
        check_padding_mask(key_padding_mask, k, "key_padding_mask", "k")
    out_dtype = q.dtype
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    q, k, v = q.to(acc), k.to(acc), v.to(acc)
    T = q.shape[-2]
    zero = q.new_zeros(())

    # kept[..., j]: key j takes part, (Tk,) or (B, 1, …, 1, Tk)
    kept = kept_keys(key_padding_mask, k)
    # padded keys and values (which may hold nan or inf) are 0: they reach nothing
    k = torch.where(kept[..., :, None], k, zero)
    v = torch.where(kept[..., :, None], v, zero)

    i = torch.arange(T, device=q.device, dtype=acc)[:, None]
    j = torch.arange(T, device=q.device, dtype=acc)[None, :]
    cos = torch.cos(math.pi / 2 * (i - j) / T)  # (T, T), in (0, 1] since |i − j| < T
    sim = (torch.relu(q) @ torch.relu(k).transpose(-1, -2)) * cos  # (..., T, T)
    allowed = kept[..., None, :]  # (..., 1, T)
    if is_causal:
        allowed = allowed & (j <= i)
    sim = torch.where(allowed, sim, zero)

    num = sim @ v  # (..., T, Dv)
    den = sim.sum(-1) + eps  # (..., T)
    den = torch.where(den == 0, torch.ones_like(den), den)  # nothing to attend to: 0, not 0/0
    return (num / den[..., None]).to(out_dtype)
