"""flash-linear-attention's gated RMSNorm (``fla.modules.fused_norm_gate.rms_norm_gated``) on
:func:`linattn.ops.norm.rms_norm_gated`; see :mod:`linattn.fla`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from linattn.ops._common import accumulation_dtype, check_eps, check_float_tensor
from linattn.ops._fla import _flag, _kwargs
from linattn.ops.norm import op as norm_op

__all__ = ["rms_norm_gated"]


def _same(t: object, name: str, x: Tensor) -> Tensor:
    check_float_tensor(t, name, dense=False)
    if t.shape != x.shape:
        raise ValueError(f"{name}: expected x's shape {tuple(x.shape)}, got {tuple(t.shape)}")
    return t


def rms_norm_gated(x, g, weight, bias, activation="swish", residual=None, prenorm=False,
                   residual_in_fp32=False, eps=1e-6, **kwargs):
    """fla's ``rms_norm_gated``: ``y = (rmsnorm(x + residual)·weight + bias)·act(g)`` over the
    last dimension, act "swish" / "silu" (the same) or "sigmoid"; x, g (..., D), weight and
    bias (D,) or None, residual (..., D) or None (added in float32 first). Returns y in x's
    dtype, or with ``prenorm`` (y, the residual stream: x + residual in residual's dtype, or
    x in float32 with ``residual_in_fp32``, else x itself), as fla.

    Without bias the work is :func:`linattn.rms_norm_gated` (the compiled kernel where it runs);
    a bias takes the torch form."""
    _kwargs("rms_norm_gated", kwargs)
    check_float_tensor(x, "x", dense=False)
    _same(g, "g", x)
    prenorm = _flag("prenorm", prenorm)
    residual_in_fp32 = _flag("residual_in_fp32", residual_in_fp32)
    eps = check_eps(eps)
    sigmoid = norm_op.check_norm_activation(activation)
    D = x.shape[-1] if x.dim() else 0
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and (not isinstance(t, Tensor) or tuple(t.shape) != (D,)):
            what = type(t).__name__ if not isinstance(t, Tensor) else tuple(t.shape)
            raise ValueError(f"{name}: expected a tensor of shape (D,) = ({D},) or None, "
                             f"got {what}")
    acc = accumulation_dtype(x.dtype)
    if residual is not None:
        _same(residual, "residual", x)
        xs = x.to(acc) + residual.to(acc)
        residual_out = xs.to(residual.dtype)
    else:
        xs = x
        residual_out = x.to(torch.float32) if residual_in_fp32 and x.dtype != torch.float32 \
            else x
    if bias is None:
        y = norm_op.rms_norm_gated(xs, g, weight, eps=eps, activation=activation)
    else:
        y = _with_bias(xs, g, weight, bias, eps, sigmoid)
    y = y.to(x.dtype)
    return (y, residual_out) if prenorm else y


def _with_bias(x: Tensor, g: Tensor, weight: Tensor | None, bias: Tensor, eps: float,
               sigmoid: bool) -> Tensor:
    acc = accumulation_dtype(x.dtype)
    z = x.to(acc)
    y = z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.to(acc)
    y = y + bias.to(acc)
    ga = g.to(acc)
    return y * (torch.sigmoid(ga) if sigmoid else F.silu(ga))
