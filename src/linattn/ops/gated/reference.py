r"""The sequential float64 reference of :func:`linattn.gated_linear_attention`.

The ground truth of the tests: a Python loop over the T tokens by design; never call it on a
fast path. Standalone: torch only, nothing shared with the op it checks (nor with the
delta-rule reference, which has its own loop).
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.ops._reference_checks import inference_tensors_as_constants

__all__ = ['gated_linear_attention']


@inference_tensors_as_constants
def gated_linear_attention(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor | None = None, gk: Tensor | None = None,
    gv: Tensor | None = None, *, scale: float | None = None,
    initial_state: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    r"""``S_t = e^{g_t}·diag(e^{gk_t})·S_{t−1}·diag(e^{gv_t}) + k_t v_tᵀ``, ``o_t = S_tᵀ(s·q_t)``,
    walked token by token in float64 (:mod:`linattn.ops.gated` for the fast form).

    Arguments and shapes as :func:`linattn.ops.gated.op.gated_linear_attention` (without
    ``return_state``, ``chunk_size`` and ``cu_seqlens``). Returns (o, final state), both float64."""
    f64 = torch.float64
    q, k, v = q.to(f64), k.to(f64), v.to(f64)
    *batch, T, K = q.shape
    V = v.shape[-1]
    s = K ** -0.5 if scale is None else scale
    S = q.new_zeros(*batch, K, V) if initial_state is None else initial_state.to(f64)
    outs = []
    for t in range(T):
        if g is not None:  # S ← e^{g_t} S
            S = S * g[..., t].to(f64).exp()[..., None, None]
        if gk is not None:  # S ← diag(e^{gk_t}) S: row κ scaled by e^{gk_t[κ]}
            S = S * gk[..., t, :].to(f64).exp()[..., :, None]
        if gv is not None:  # S ← S diag(e^{gv_t}): column ν scaled by e^{gv_t[ν]}
            S = S * gv[..., t, :].to(f64).exp()[..., None, :]
        S = S + k[..., t, :, None] * v[..., t, None, :]  # + k_t v_tᵀ
        outs.append((s * q[..., t, :, None] * S).sum(-2))  # S_tᵀ(s·q_t): (..., V)
    o = torch.stack(outs, dim=-2) if outs else q.new_zeros(*batch, 0, V)
    return o, S
