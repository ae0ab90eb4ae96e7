r"""The sequential float64 reference of :func:`linattn.delta_rule`.

The ground truth of the tests: a Python loop over the T tokens by design; never call it on a
fast path. Standalone: torch only, nothing shared with the op it checks (nor with the gated
reference, which has its own loop). The L2-norm epsilon, a constant that must agree with the
op's (``linattn.ops.delta.op.L2_EPS``), is restated here; tests/ops/test_reference.py holds
them equal. Grouped value attention (q, k with H heads, v with HV = G·H) repeats q and k to
HV heads first, value head j reading q/k head j // G.
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.ops._reference_checks import inference_tensors_as_constants

__all__ = ['delta_rule']

#: ``qk_l2norm`` divides q and k by sqrt(Σx² + L2_EPS) (the published models' epsilon).
L2_EPS = 1e-6


@inference_tensors_as_constants
def delta_rule(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None = None,
    gk: Tensor | None = None, gv: Tensor | None = None, *, scale: float | None = None,
    initial_state: Tensor | None = None, qk_l2norm: bool = False,
) -> tuple[Tensor, Tensor]:
    r"""The (gated) delta rule ``S' = e^{g}·diag(e^{gk})·S·diag(e^{gv})``,
    ``S_t = S' + k_t β_t (v_t − S'ᵀk_t)ᵀ``, ``o_t = S_tᵀ(s·q_t)``, token by token in float64
    (:mod:`linattn.ops.delta` for the fast form).

    Arguments and shapes as :func:`linattn.ops.delta.op.delta_rule` (without ``return_state``,
    ``chunk_size`` and ``cu_seqlens``); ``qk_l2norm`` divides q and k by sqrt(Σx² + 1e-6) first.
    Returns (o, final state), both float64."""
    f64 = torch.float64
    if q.dim() >= 3 and v.dim() == q.dim() and v.shape[-3] != q.shape[-3]:
        H, HV = q.shape[-3], v.shape[-3]
        if H == 0 or HV % H:
            raise ValueError(f"v: expected a multiple of q's {H} heads, got {HV}")
        q, k = q.repeat_interleave(HV // H, dim=-3), k.repeat_interleave(HV // H, dim=-3)
    q, k, v, beta = q.to(f64), k.to(f64), v.to(f64), beta.to(f64)
    if qk_l2norm:
        q = q / ((q * q).sum(-1, keepdim=True) + L2_EPS).sqrt()
        k = k / ((k * k).sum(-1, keepdim=True) + L2_EPS).sqrt()
    *batch, T, K = q.shape
    V = v.shape[-1]
    s = K ** -0.5 if scale is None else scale
    S = q.new_zeros(*batch, K, V) if initial_state is None else initial_state.to(f64)
    outs = []
    for t in range(T):
        if g is not None:  # S' = e^{g_t} S
            S = S * g[..., t].to(f64).exp()[..., None, None]
        if gk is not None:  # diag(e^{gk_t}) S': row κ scaled by e^{gk_t[κ]}
            S = S * gk[..., t, :].to(f64).exp()[..., :, None]
        if gv is not None:  # S' diag(e^{gv_t}): column ν scaled by e^{gv_t[ν]}
            S = S * gv[..., t, :].to(f64).exp()[..., None, :]
        k_t, v_t = k[..., t, :], v[..., t, :]
        predicted = (k_t[..., :, None] * S).sum(-2)  # S'ᵀk_t: what the state recalls for k_t
        write = beta[..., t, None] * (v_t - predicted)  # β_t (v_t − S'ᵀk_t)
        S = S + k_t[..., :, None] * write[..., None, :]
        outs.append((s * q[..., t, :, None] * S).sum(-2))  # S_tᵀ(s·q_t): (..., V)
    o = torch.stack(outs, dim=-2) if outs else q.new_zeros(*batch, 0, V)
    return o, S
