"""The (gated) delta rule in torch operations: the chunked WY form, the step, the L2 norm.

The portable backend of :mod:`linattn.ops.delta.op` (every device and dtype, differentiable) and
what the compiled ops fall back to where their kernels cannot be had (an exported program run on
a machine without a C compiler). The maths is in :mod:`linattn.ops.delta`'s op docstring; the
per-key (KDA) chunked form and the token loop of per-value gates are in
:mod:`linattn.ops.delta.kda`.

Grouped value attention (GVA: q, k with H heads, v and everything per value head with
HV = G·H): these forms repeat q and k to HV heads first (:func:`grouped`), value head j reading
q/k head j // G; autograd sums the group's gradients back. (The compiled kernels index the
shared rows in place instead.)
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.ops._common import to_chunks
from linattn.ops.delta.kda import per_key_chunked_form, recurrent_form
from linattn.ops.gated.chunk import decayed, segsum
from linattn.ops.varlen import packed, unpacked

__all__ = ["L2_EPS", "l2_normalised", "chunked_form", "torch_prefill", "torch_step", "grouped"]

#: Added to Σx² before the square root in :func:`l2_normalised` (as flash-linear-attention).
L2_EPS = 1e-6


def l2_normalised(x: Tensor) -> Tensor:
    """x / sqrt(Σx² + 1e-6) along the last dimension."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2_EPS)


def grouped(q: Tensor, k: Tensor, v: Tensor, dim: int) -> tuple[Tensor, Tensor]:
    """q and k with as many heads (dimension ``dim``: -3 for a prefill, -2 for a step) as v:
    each q/k head repeated G = HV / H times in place, so that value head j reads q/k head
    j // G (fla's and transformers' convention); q and k as they are when the heads agree
    (the caller checked that HV is a multiple of H)."""
    if q.dim() < -dim or v.dim() != q.dim() or q.shape[dim] == v.shape[dim]:
        return q, k
    G = v.shape[dim] // q.shape[dim]
    return q.repeat_interleave(G, dim=dim), k.repeat_interleave(G, dim=dim)


def _differentiated(*xs: Tensor | None) -> bool:
    """Whether autograd records this call (a tensor wants a gradient, grad mode is on)."""
    return torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in xs)


def torch_prefill(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None, s: float,
                  S0: Tensor, cu: Tensor | None, qk_l2norm: bool, C: int,
                  gk: Tensor | None = None, gv: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The torch forms on checked arguments (beta, the gates, S0 in the accumulation dtype;
    ``cu`` the checked cumulative lengths of a packed batch, or None): the scalar-gate chunked
    form, the per-key one for ``gk`` (:mod:`linattn.ops.delta.kda`), the token loop for ``gv``.
    q, k may have fewer heads than v (GVA: :func:`grouped`). Returns (o in q's dtype, S)."""
    acc, out_dtype = beta.dtype, q.dtype
    q, k = grouped(q, k, v, -3)
    q, k, v = q.to(acc), k.to(acc), v.to(acc)
    if qk_l2norm:
        q, k = l2_normalised(q), l2_normalised(k)
    xs, keep = ([q, k, v, beta, g, gk, gv], None) if cu is None else \
        packed([q, k, v, beta, g, gk, gv], cu)
    q, k, v, beta, g, gk, gv = xs
    if gv is not None or (gk is not None and not _differentiated(q, k, v, beta, g, gk, S0)):
        # per-value gates: token by token (kda.py says why); per-key gates without gradients
        # too: the token loop's forward took 0.6-0.8x the chunked form's at T = 1,024-4,096,
        # whose strength is the backward (3.5-13.7x faster; docs/bench-recurrences.md)
        o, S = recurrent_form(q * s, k, v, beta, g, gk, gv, S0)
    elif gk is not None:  # one per-key gate: e^g·diag(e^gk) = diag(e^(g+gk))
        o, S = per_key_chunked_form(q * s, k, v, beta, gk if g is None else gk + g.unsqueeze(-1),
                                    S0, C)
    else:
        o, S = chunked_form(q * s, k, v, beta, g, S0, C)
    if cu is not None:
        o = unpacked(o, cu, keep)
    return o.to(out_dtype), S


def chunked_form(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None, S: Tensor,
             C: int) -> tuple[Tensor, Tensor]:
    """The chunked form on checked inputs in the accumulation dtype (q already scaled)."""
    *batch, T, K = q.shape
    V = v.shape[-1]
    if T == 0:  # the state as it was, in a new tensor (never the caller's initial state)
        return q @ S, S.clone()
    C = max(1, min(C, T))
    # zero padding to whole chunks: k = v = 0, β = 0 and gate 0 leave the state as it was
    qc, kc, vc = (to_chunks(x, C) for x in (q, k, v))  # (..., n, C, ·)
    n = qc.shape[-3]
    bc = to_chunks(beta.unsqueeze(-1), C)  # (..., n, C, 1)
    gc = q.new_zeros(*batch, n, C) if g is None else to_chunks(g.unsqueeze(-1), C).squeeze(-1)
    seg = segsum(gc)
    decay = seg.exp()  # Γ: (..., n, C, C), 0 above the diagonal
    into = gc.cumsum(-1).exp().unsqueeze(-1)  # γ_i: (..., n, C, 1)
    outof = seg[..., -1, :].exp().unsqueeze(-1)  # Γ[C−1, j]
    idx = torch.arange(C, device=q.device)
    below = idx[:, None] > idx[None, :]
    A = torch.where(below, (kc @ kc.transpose(-1, -2)) * decay * bc, q.new_zeros(()))
    rhs = torch.cat([bc * vc, (bc * into) * kc], dim=-1)  # (..., n, C, V + K)
    X = torch.linalg.solve_triangular(A, rhs, upper=False, unitriangular=True)
    U_free, W = X[..., :V], X[..., V:]  # U = U_free − W S_0
    P = (qc @ kc.transpose(-1, -2)) * decay  # causal: Γ is 0 above the diagonal
    q_in, k_out, through = qc * into, kc * outof, into[..., -1, :]  # through: (..., n, 1)
    outs = []
    # unbind, not x[..., c, :, :]: the backward of n slices would fill n full-size zero tensors
    for U_c, W_c, q_c, P_c, through_c, k_c in zip(
            *(x.unbind(-3) for x in (U_free, W, q_in, P, through.unsqueeze(-1),
                                      k_out.transpose(-1, -2))), strict=True):
        U = U_c - W_c @ S
        outs.append(q_c @ S + P_c @ U)
        S = through_c * S + k_c @ U
    return torch.cat(outs, dim=-2)[..., :T, :], S


def torch_step(q_t, k_t, v_t, beta_t, S, g_t, gk_t, gv_t, scale: float, qk_l2norm: bool):
    """The step in torch operations, on checked arguments (beta_t, S in the accumulation
    dtype; the gates are checked here). q_t, k_t may have fewer heads than v_t (GVA:
    :func:`grouped`)."""
    acc = beta_t.dtype
    q_t, k_t = grouped(q_t, k_t, v_t, -2)
    S = decayed(S, g_t, gk_t, gv_t, q_t)
    q, k = q_t.to(acc), k_t.to(acc)
    if qk_l2norm:
        q, k = l2_normalised(q), l2_normalised(k)
    u = beta_t.unsqueeze(-1) * (v_t.to(acc) - (k.unsqueeze(-2) @ S).squeeze(-2))
    S = S + k.unsqueeze(-1) * u.unsqueeze(-2)
    o = ((q * scale).unsqueeze(-2) @ S).squeeze(-2)
    return o.to(q_t.dtype), S
