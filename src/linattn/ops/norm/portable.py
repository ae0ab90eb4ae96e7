"""The torch form of the gated RMSNorm: every device, every floating dtype, differentiable (the
``portable`` backend, and what the compiled op computes where no C compiler is available)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from linattn.ops._common import accumulation_dtype

__all__ = ["torch_norm"]


def torch_norm(x: Tensor, gate: Tensor | None, weight: Tensor | None, eps: float,
               sigmoid: bool, group_size: int, norm_before_gate: bool) -> Tensor:
    """x, gate (..., D), weight (D,) or None, groups of ``group_size`` channels (dividing D);
    in float32 (float64 for float64 x), one rounding to x's dtype."""
    acc = accumulation_dtype(x.dtype)
    z = x.to(acc)
    act = None
    if gate is not None:
        g = gate.to(acc)
        act = torch.sigmoid(g) if sigmoid else F.silu(g)
        if not norm_before_gate:
            z = z * act
    D = x.shape[-1]
    if group_size == D:
        y = z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + eps)
    else:
        zg = z.unflatten(-1, (D // group_size, group_size))
        y = (zg * torch.rsqrt(zg.pow(2).mean(-1, keepdim=True) + eps)).flatten(-2)
    if weight is not None:
        y = y * weight.to(acc)
    if act is not None and norm_before_gate:
        y = y * act
    return y.to(x.dtype)
