r"""The sequential float64 reference of :func:`linattn.gated_linear_attention`.

The ground truth of the tests: O(T²) time and memory, or a Python loop over T, by design;
never call it on a fast path.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ['gated_linear_attention']


def _recurrence(q: Tensor, k: Tensor, v: Tensor, beta: Tensor | None, g: Tensor | None,
                gk: Tensor | None, gv: Tensor | None, scale: float | None,
                initial_state: Tensor | None, qk_l2norm: bool) -> tuple[Tensor, Tensor]:
    """The gated (β None) or delta-rule recurrence in float64, one token at a time."""
    f64 = torch.float64
    q, k, v = q.to(f64), k.to(f64), v.to(f64)
    if qk_l2norm:
        q = q / (q * q).sum(-1, keepdim=True).add(1e-6).sqrt()
        k = k / (k * k).sum(-1, keepdim=True).add(1e-6).sqrt()
    *batch, T, K = q.shape
    s = K ** -0.5 if scale is None else scale
    S = q.new_zeros(*batch, K, v.shape[-1]) if initial_state is None else initial_state.to(f64)
    outs = []
    for t in range(T):
        if g is not None:
            S = S * g[..., t].to(f64).exp()[..., None, None]
        if gk is not None:
            S = S * gk[..., t, :].to(f64).exp()[..., :, None]
        if gv is not None:
            S = S * gv[..., t, :].to(f64).exp()[..., None, :]
        k_t, v_t = k[..., t, :], v[..., t, :]
        if beta is not None:  # write β(v − Sᵀk): the state's prediction for k_t is replaced
            v_t = beta[..., t, None].to(f64) * (v_t - torch.einsum("...k,...kv->...v", k_t, S))
        S = S + k_t[..., :, None] * v_t[..., None, :]
        outs.append(torch.einsum("...k,...kv->...v", s * q[..., t, :], S))
    o = torch.stack(outs, dim=-2) if outs else q.new_zeros(*batch, 0, v.shape[-1])
    return o, S


def gated_linear_attention(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor | None = None, gk: Tensor | None = None,
    gv: Tensor | None = None, *, scale: float | None = None,
    initial_state: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """``S_t = e^{g_t}·diag(e^{gk_t})·S_{t−1}·diag(e^{gv_t}) + k_t v_tᵀ``, ``o_t = S_tᵀ(s·q_t)``,
    walked token by token in float64 (:mod:`linattn.ops.gated` for the fast form).

    q, k: (..., T, K); v: (..., T, V); g (..., T), gk (..., T, K), gv (..., T, V) log-gates or
    None; scale default ``K**-0.5``; initial_state (..., K, V) or None. Returns (o (..., T, V),
    final state (..., K, V)), both float64."""
    return _recurrence(q, k, v, None, g, gk, gv, scale, initial_state, False)
