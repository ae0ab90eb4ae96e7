r"""The float64 reference of :func:`linattn.rms_norm_gated`.

The ground truth of the tests: the definition written out per group of channels, in float64;
never call it on a fast path. Standalone: torch only, nothing shared with the op it checks
(SiLU and the sigmoid are written out, not torch's).
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.ops._reference_checks import inference_tensors_as_constants

__all__ = ["rms_norm_gated"]


@inference_tensors_as_constants
def rms_norm_gated(
    x: Tensor, gate: Tensor | None, weight: Tensor | None = None, *, eps: float = 1e-6,
    activation: str = "silu", group_size: int | None = None, norm_before_gate: bool = True,
) -> Tensor:
    """``rmsnorm(x)·weight·act(gate)`` (``norm_before_gate``) or ``rmsnorm(x·act(gate))·weight``,
    ``rmsnorm(z) = z / sqrt(mean(z²) + eps)`` over each group of ``group_size`` channels (None:
    the whole last dimension), act ``a·σ(a)`` ("silu", "swish") or ``σ(a)`` ("sigmoid"),
    ``σ(a) = 1 / (1 + e^{−a})``; gate None: no gating. Arguments and shapes as
    :func:`linattn.ops.norm.op.rms_norm_gated`; returns float64."""
    f64 = torch.float64
    x = x.to(f64)
    D = x.shape[-1]
    G = D if group_size is None else group_size
    act = None
    if gate is not None:
        a = gate.to(f64)
        sigma = 1 / (1 + torch.exp(-a))
        act = sigma if activation == "sigmoid" else a * sigma
    z = x if act is None or norm_before_gate else x * act
    y = torch.empty_like(z)
    for g0 in range(0, D, G):
        part = z[..., g0:g0 + G]
        mean_square = (part * part).sum(-1, keepdim=True) / G
        den = torch.sqrt(mean_square + eps)
        # an all-zero group with eps = 0 normalises to zeros (defined; 0/0 otherwise)
        y[..., g0:g0 + G] = torch.where(den == 0, 0.0, part / den)
    if weight is not None:
        y = y * weight.to(f64)
    if act is not None and norm_before_gate:
        y = y * act
    return y
