r"""The sequential float64 reference of :func:`linattn.delta_rule`.

The ground truth of the tests: O(T²) time and memory, or a Python loop over T, by design;
never call it on a fast path.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ['delta_rule']


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


def delta_rule(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None = None,
    gk: Tensor | None = None, gv: Tensor | None = None, *, scale: float | None = None,
    initial_state: Tensor | None = None, qk_l2norm: bool = False,
) -> tuple[Tensor, Tensor]:
    """The (gated) delta rule ``S' = e^{g}·diag(e^{gk})·S·diag(e^{gv})``,
    ``S_t = S' + k_t β_t (v_t − S'ᵀk_t)ᵀ``, ``o_t = S_tᵀ(s·q_t)``, token by token in float64
    (:mod:`linattn.ops.delta` for the fast form).

    q, k: (..., T, K); v: (..., T, V); beta, g: (..., T); gk (..., T, K), gv (..., T, V) or
    None. Returns (o (..., T, V), final state (..., K, V)), both float64."""
    return _recurrence(q, k, v, beta, g, gk, gv, scale, initial_state, qk_l2norm)
