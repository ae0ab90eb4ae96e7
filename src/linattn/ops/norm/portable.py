"""The torch form of the gated RMSNorm: every device, every floating dtype, differentiable (the
``portable`` backend, and what the compiled op computes where no C compiler is available)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from linattn.ops._common import accumulation_dtype
from linattn.ops._library import tracing

__all__ = ["torch_norm", "RESCALE_ABOVE", "RESCALE_BELOW"]

#: A group's mean square outside [RESCALE_BELOW, RESCALE_ABOVE] in float32 may have lost its
#: squares to overflow or underflow (or is 0): it is computed again in float64 (the compiled
#: kernel does the same per group). Rows of ordinary values never get there.
RESCALE_ABOVE = 2.0 ** 120
RESCALE_BELOW = 2.0 ** -100


def _wide(x: Tensor, gate: Tensor | None, weight: Tensor | None, eps: float, sigmoid: bool,
          group_size: int, norm_before_gate: bool) -> Tensor:
    """:func:`torch_norm` in float64, rounded once to x's dtype."""
    f64 = torch.float64
    return torch_norm(x.to(f64), None if gate is None else gate.to(f64),
                      None if weight is None else weight.to(f64), eps, sigmoid, group_size,
                      norm_before_gate).to(x.dtype)


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
    zg = z if group_size == D else z.unflatten(-1, (D // group_size, group_size))
    ms = zg.pow(2).mean(-1, keepdim=True)
    if acc != torch.float64 and not tracing(ms) and not ms.is_meta and bool(
            ((ms > RESCALE_ABOVE) | (ms < RESCALE_BELOW)).any()):
        # squares that overflow (|x| ~ 1e19) or underflow (eps 0, |x| ~ 1e-30), or an all-zero
        # group: those groups in float64, where the squares of float32 values are exact
        return _wide(x, gate, weight, eps, sigmoid, group_size, norm_before_gate)
    r = torch.rsqrt(ms + eps)
    if eps == 0:  # an all-zero group normalises to zeros (defined), not 0·inf
        r = torch.where(ms == 0, 0.0, r)
    y = zg * r
    if group_size != D:
        y = y.flatten(-2)
    if weight is not None:
        y = y * weight.to(acc)
    if act is not None and norm_before_gate:
        y = y * act
    return y.to(x.dtype)
