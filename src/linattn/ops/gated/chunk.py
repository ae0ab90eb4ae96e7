"""The torch side of gated linear attention: the chunked form (:func:`chunked_form`,
:func:`portable_prefill`), the decay of a state by one token's gates (:func:`decayed`), and the
argument checks that the op, its compiled glue (:mod:`linattn.ops.gated.native`) and the delta
rule share. The maths is in :mod:`linattn.ops.gated.op`'s docstring and docs/theory.md §10.
Neither the op nor its compiled glue is imported here: both import this module."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from linattn.ops._common import (
    accumulation_dtype,
    check_float_tensor,
    check_range,
    check_scale,
    to_chunks,
)
from linattn.ops.varlen import packed, unpacked

__all__ = ["segsum", "checked_tensor", "check_gate", "initial_state_for", "resolve_scale",
           "decayed", "portable_prefill", "chunked_form"]


def segsum(x: Tensor) -> Tensor:
    """Segment sums of the last dimension: (..., C) -> (..., C, C) with
    ``[i, j] = Σ_{j<t≤i} x_t`` for j ≤ i (0 on the diagonal) and −∞ above it.

    A masked cumulative sum, not ``cumsum(x)[i] − cumsum(x)[j]``: no cancellation of large
    sums, and x_t = −∞ gives −∞ (exp → 0) where the difference would give nan."""
    C = x.shape[-1]
    idx = torch.arange(C, device=x.device)
    strictly_below = idx[:, None] > idx[None, :]  # [t, j]: t > j
    terms = torch.where(strictly_below, x.unsqueeze(-1), x.new_zeros(()))  # [t, j] = x_t, t > j
    sums = terms.cumsum(-2)  # [i, j] = Σ_{t≤i, t>j} x_t
    return sums.masked_fill(~(idx[:, None] >= idx[None, :]), float("-inf"))


def checked_tensor(x: object, name: str, shape: tuple[int, ...], like: Tensor) -> Tensor:
    """``x`` unchanged if it is a floating-point tensor of exactly ``shape`` on ``like``'s
    device; else TypeError/ValueError naming ``name`` (gates, states and β share this)."""
    check_float_tensor(x, name, dense=False)
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(x.shape)}")
    if x.device != like.device:
        raise ValueError(f"{name}: expected device {like.device}, got {x.device}")
    return x


def check_gate(
    gate: Tensor | None, name: str, shape: tuple[int, ...], like: Tensor
) -> Tensor | None:
    """A log-gate of exactly ``shape`` in the accumulation dtype, or None; TypeError/ValueError
    naming ``name`` for a non-float tensor, a wrong shape, another device, nan or values > 0
    (a positive log-gate grows the state without bound and breaks the ≤ 0 exponents)."""
    if gate is None:
        return None
    checked_tensor(gate, name, shape, like)
    check_range(gate, -math.inf, 0.0,  # (nan fails too)
                f"{name}: expected log-gates <= 0 (the state decays by exp(gate))",
                 lambda: f", got values in [{gate.min().item():g}, {gate.max().item():g}]")
    return gate.to(accumulation_dtype(like.dtype))


def initial_state_for(state: Tensor | None, name: str, shape: tuple[int, ...],
                      like: Tensor) -> Tensor:
    """``state`` (or zeros) of ``shape`` in the accumulation dtype; errors name ``name``."""
    acc = accumulation_dtype(like.dtype)
    if state is None:
        return torch.zeros(shape, dtype=acc, device=like.device)
    checked_tensor(state, name, shape, like)
    return state.to(acc)


def resolve_scale(scale: float | None, K: int, dtype: torch.dtype | None = None) -> float:
    """``scale`` or the default ``K**-0.5``; TypeError unless a real number (NumPy numbers
    taken, bools refused), ValueError unless finite and, with the inputs' ``dtype``, a
    magnitude the computation carries (:func:`linattn.ops._common.check_scale`)."""
    return check_scale(scale, K, dtype=dtype)


def decayed(S: Tensor, g_t: object, gk_t: object, gv_t: object, like: Tensor) -> Tensor:
    """``exp(g)·diag(exp(gk))·S·diag(exp(gv))`` for one step's state S (..., K, V) and gates
    g (...), gk (..., K), gv (..., V), checked against the step's ``like`` (..., K) input;
    None gates are 1."""
    *batch, K, V = S.shape
    g_t = check_gate(g_t, "g_t", tuple(batch), like)
    gk_t = check_gate(gk_t, "gk_t", (*batch, K), like)
    gv_t = check_gate(gv_t, "gv_t", (*batch, V), like)
    if g_t is not None:
        S = S * g_t.exp()[..., None, None]
    if gk_t is not None:
        S = S * gk_t.exp().unsqueeze(-1)
    if gv_t is not None:
        S = S * gv_t.exp().unsqueeze(-2)
    return S


def portable_prefill(q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, gk: Tensor | None,
                     s: float, S0: Tensor, cu: Tensor | None, C: int) -> tuple[Tensor, Tensor]:
    """The chunked torch form on checked arguments, packed sequences included: (o in q's
    dtype, the final state in S0's dtype). Differentiable."""
    if cu is not None:
        xs, keep = packed([q, k, v, g, gk], cu)
        o, S = chunked_form(*xs, s, S0, C)
        return unpacked(o, cu, keep).to(q.dtype), S
    o, S = chunked_form(q, k, v, g, gk, s, S0, C)
    return o.to(q.dtype), S


def chunked_form(q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, gk: Tensor | None,
                 s: float, S: Tensor, C: int) -> tuple[Tensor, Tensor]:
    """The chunked form on checked inputs: returns o (..., T, V) and the final state, both in
    S's dtype (the accumulation dtype).

    ``g`` of shape (..., 1) is one gate for every token (a fixed decay): the chunk's decay
    matrix is then built once and shared by all chunks, and a last partial chunk runs as a
    second call rather than as zero padding (a padded row would still decay the state)."""
    acc = S.dtype
    *batch, T, K = q.shape
    if T == 0:  # the state as it was, in a new tensor (never the caller's initial state)
        return q.to(acc) @ S, S.clone()
    C = max(1, min(C, T))
    constant = g is not None and g.shape[-1] == 1
    if constant and T % C:
        split = T - T % C
        first = [x[..., :split, :] for x in (q, k, v)]
        rest = [x[..., split:, :] for x in (q, k, v)]
        o1, S = chunked_form(*first, g, None, s, S, C)
        o2, S = chunked_form(*rest, g, None, s, S, T - split)
        return torch.cat([o1, o2], dim=-2), S
    if gk is not None and g is not None:  # one per-key gate: e^g·diag(e^gk) = diag(e^(g+gk))
        gk, g = gk + g.unsqueeze(-1), None
    # zero padding to whole chunks: k = v = 0 and gate 0 leave the state as it was
    qc, kc, vc = (to_chunks(x.to(acc), C) for x in (q if s == 1.0 else q * s, k, v))
    n = qc.shape[-3]  # qc, kc, vc: (..., n, C, ·)
    if gk is None:
        if g is None:
            gc = torch.zeros(*batch, 1, C, dtype=acc, device=q.device)
        elif constant:  # (..., 1, C): one chunk's gates, broadcast over the n chunks
            gc = g.unsqueeze(-1).expand(*batch, 1, C)
        else:
            gc = to_chunks(g.unsqueeze(-1), C).squeeze(-1)  # (..., n, C)
        seg = segsum(gc)  # (..., n or 1, C, C)
        into = gc.cumsum(-1).exp()  # exp(b_i): the carried state -> row i
        outof = seg[..., -1, :].exp()  # exp(Σ_{j<t<C} g_t): key j -> the state after the chunk
        through = into[..., -1].expand(*batch, n)  # exp(b_{C−1}): the whole chunk
        intra = (qc @ kc.transpose(-1, -2)) * seg.exp()  # causal: exp(−∞) = 0 above
        out = intra @ vc
        own = (kc * outof.unsqueeze(-1)).transpose(-1, -2) @ vc  # (..., n, K, V)
        q_in = qc * into.unsqueeze(-1)
        inter = []
        for c in range(n):
            inter.append(q_in[..., c, :, :] @ S)
            S = through[..., c, None, None] * S + own[..., c, :, :]
        # every size explicit: an empty batch (B or H = 0) cannot infer a -1
        return (out + torch.stack(inter, dim=-3)).reshape(*batch, n * C, v.shape[-1]
                                                          )[..., :T, :], S
    gkc = to_chunks(gk, C)  # (..., n, C, K)
    outs = []
    for c in range(n):
        qi, ki, vi, gi = qc[..., c, :, :], kc[..., c, :, :], vc[..., c, :, :], gkc[..., c, :, :]
        seg = segsum(gi.transpose(-1, -2))  # (..., K, C, C)
        into = gi.cumsum(-2).exp()  # (..., C, K)
        outof = seg[..., -1, :].exp().transpose(-1, -2)  # (..., C, K)
        weights = torch.einsum("...ik,...jk,...kij->...ij", qi, ki, seg.exp())
        outs.append(weights @ vi + (qi * into) @ S)
        S = into[..., -1, :].unsqueeze(-1) * S + (ki * outof).transpose(-1, -2) @ vi
    return torch.cat(outs, dim=-2)[..., :T, :], S
