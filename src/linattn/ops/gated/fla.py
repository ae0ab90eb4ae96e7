"""flash-linear-attention's gated linear attention names (simple GLA, GLA, retention) on
:func:`linattn.gated_linear_attention`; see :mod:`linattn.fla`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.ops._common import accumulation_dtype
from linattn.ops._fla import (
    _finish,
    _flag,
    _flip_time,
    _gate,
    _hf,
    _kwargs,
    _one_token_each,
    _qkv,
    _reversed_cu,
    _scale,
    _scan,
    _sequences,
    _state_v_first,
    _varlen,
)
from linattn.ops.gated import op as gated_op
from linattn.ops.gated.chunk import segsum
from linattn.ops.gated.op import gated_linear_attention, gated_linear_attention_step

__all__ = [
    "chunk_simple_gla",
    "fused_recurrent_simple_gla",
    "fused_chunk_simple_gla",
    "parallel_simple_gla",
    "chunk_gla",
    "fused_recurrent_gla",
    "fused_chunk_gla",
    "chunk_retention",
    "fused_recurrent_retention",
    "fused_chunk_retention",
    "parallel_retention",
]


# ----------------------------------------------------------------------------- gated linear attn


def _gla(q: Tensor, k: Tensor, v: Tensor, *, g: Tensor | None = None,
         gk: Tensor | None = None, gv: Tensor | None = None, scale: float,
         initial_state: Tensor | None, output_final_state: bool, reverse: bool = False,
         state_v_first: bool = False, cu: Tensor | None = None, chunk_size: int | None = None,
         ) -> tuple[Tensor, Tensor | None]:
    """Checked fla-layout inputs -> gated_linear_attention (or its step function, for gv)."""
    if reverse:
        q, k, v, g, gk, gv = _flip_time([q, k, v, g, gk, gv])
        if cu is not None:
            cu = _reversed_cu(cu)
            initial_state = None if initial_state is None else initial_state.flip(0)
    if _one_token_each(q.shape[1], cu):
        # decoding: every sequence one token, the step on (N, H, ·) views (the chunked form
        # costs several times the step here); reversing one token changes nothing
        n, H, K, V = q.shape[0] * q.shape[1], q.shape[2], q.shape[3], v.shape[3]
        S0 = initial_state if initial_state is not None else \
            torch.zeros(n, H, K, V, dtype=accumulation_dtype(q.dtype), device=q.device)
        o_t, S = gated_linear_attention_step(
            *(x.reshape(n, H, x.shape[-1]) for x in (q, k, v)), S0, scale=scale,
            g_t=None if g is None else g.reshape(n, H),
            **{f"{name}_t": x.reshape(n, H, x.shape[-1])
               for name, x in (("gk", gk), ("gv", gv)) if x is not None})
        return _finish(o_t.view(v.shape).transpose(1, 2), S, output_final_state, state_v_first)
    if gv is None:
        o, S = gated_linear_attention(
            _hf(q), _hf(k), _hf(v), g=_hf(g), gk=_hf(gk), scale=scale,
            initial_state=initial_state, return_state=True, chunk_size=chunk_size, cu_seqlens=cu)
    else:
        def step(q_t, k_t, v_t, S, **gates):
            return gated_linear_attention_step(q_t, k_t, v_t, S, scale=scale, **gates)

        o, S = _scan(step, _hf(q), _hf(k), _hf(v),
                     {"g_t": _hf(g), "gk_t": _hf(gk), "gv_t": _hf(gv)}, initial_state, cu)
    if reverse:
        o = o.flip(2)
        if cu is not None:
            S = S.flip(0)
    return _finish(o, S, output_final_state, state_v_first)


def _decode(q: object, k: object, v: object, g: object, gk: object, scale: object,
            initial_state: object, output_final_state: object, reverse: object
            ) -> tuple[Tensor, Tensor | None] | None:
    """The front door's decoding step: fla-layout q, k (B, 1, H, K), v (B, 1, H, V), g (B, 1, H)
    or None, gk (B, 1, H, K) or None, initial_state (B, H, K, V) straight to the compiled step
    (:func:`linattn.ops.gated.op._plain_step`, no view made: (B, 1, H, ·) and (B, H, ·) are the
    same memory), or None for anything else, which then takes the general path (with its
    checks and their errors). One token reversed is the token."""
    if not (type(q) is Tensor and q.ndim == 4 and type(v) is Tensor and v.ndim == 4
            and type(initial_state) is Tensor and q.shape[1] == 1
            and (output_final_state is True or output_final_state is False)
            and (reverse is True or reverse is False)):
        return None
    B, _, H, K = q.shape
    out = gated_op._plain_step(q, k, v, initial_state, g, gk, scale, (B, H, K, v.shape[-1]))
    if out is None:
        return None
    o, S = out
    return o, (S if output_final_state else None)


def _simple_gla(q, k, v, g, g_gamma, scale, initial_state, output_final_state,
                reverse=False, state_v_first=False, cu_seqlens=None, chunk_size=None):
    B, T, H, _, K = _qkv(q, k, v)
    g = _gate("g", g, (B, T, H))
    if g_gamma is not None:
        g_gamma = _gate("g_gamma", g_gamma, (H,))
        const = g_gamma.to(accumulation_dtype(q.dtype)).expand(B, T, H)
        g = const if g is None else g.to(const.dtype) + const
    cu, S0 = _sequences(cu_seqlens, q, initial_state, H, K, v.shape[-1], state_v_first)
    return _gla(q, k, v, g=g, scale=_scale(scale, K), initial_state=S0,
                output_final_state=_flag("output_final_state", output_final_state),
                reverse=_flag("reverse", reverse), state_v_first=state_v_first, cu=cu,
                chunk_size=chunk_size)


def chunk_simple_gla(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor | None = None,
    g_gamma: Tensor | None = None,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    cu_seqlens_cpu: torch.LongTensor | None = None,
    **kwargs,
) -> tuple[Tensor, Tensor | None]:
    """Scalar-gated ("simple") GLA: ``S_t = exp(g_t)·S_{t−1} + k_t v_tᵀ``,
    ``o_t = S_tᵀ(scale·q_t)``.

    fla's ``fla.ops.simple_gla.chunk_simple_gla``; runs
    :func:`linattn.ops.gated.gated_linear_attention` with ``g``.

    Args:
        q, k: (B, T, H, K). v: (B, T, H, V).
        g: (B, T, H) log decays ≤ 0, or None.
        g_gamma: (H,) a constant log decay per head, or None (both given: they add).
        scale: default ``K**-0.5``.
        initial_state: (N, H, K, V) ((N, H, V, K) if ``state_v_first``), N = B or the number of
            sequences in ``cu_seqlens``; None is zeros.
        output_final_state: return the state after the last token (else None).
        state_v_first: states in (…, V, K) layout.
        cu_seqlens: (N + 1,) cumulative lengths of N sequences packed along T (B = 1).
        cu_seqlens_cpu: ignored (a GPU synchronisation hint in fla).
        **kwargs: ``chunk_size`` (speed only).

    Returns:
        o (B, T, H, V) in q's dtype; final state (N, H, K, V) in float32 (float64 for float64
        inputs) or None.
    """
    kw = _kwargs("chunk_simple_gla", kwargs, ("chunk_size", "transpose_state_layout"))
    svf = _state_v_first(state_v_first, kw)
    return _simple_gla(q, k, v, g, g_gamma, scale, initial_state,
                       output_final_state, False, svf, cu_seqlens, kw.get("chunk_size"))


def fused_recurrent_simple_gla(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor | None = None,
    g_gamma: Tensor | None = None,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    reverse: bool = False,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    **kwargs,
) -> tuple[Tensor, Tensor | None]:
    """:func:`chunk_simple_gla` with fla's recurrent signature: same shapes and maths, plus
    ``reverse`` (the scan runs from the last token to the first of each sequence: the forward
    recurrence on time-flipped inputs; the final state is the one after token 0).
    ``**kwargs``: ``transpose_state_layout`` (fla's old name of ``state_v_first``).
    Runs :func:`linattn.ops.gated.gated_linear_attention`."""
    if g_gamma is None and cu_seqlens is None and state_v_first is False and not kwargs:
        fast = _decode(q, k, v, g, None, scale, initial_state, output_final_state, reverse)
        if fast is not None:
            return fast
    kw = _kwargs("fused_recurrent_simple_gla", kwargs, ("transpose_state_layout",))
    svf = _state_v_first(state_v_first, kw)
    return _simple_gla(q, k, v, g, g_gamma, scale, initial_state,
                       output_final_state, reverse, svf, cu_seqlens)


def fused_chunk_simple_gla(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor | None = None,
    g_gamma: Tensor | None = None,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    **kwargs,
) -> tuple[Tensor, Tensor | None]:
    """:func:`chunk_simple_gla` with fla's fused-chunk signature (no state_v_first; ``**kwargs``
    takes no name here: it is there so that ``head_first`` is the ValueError it is
    everywhere)."""
    _kwargs("fused_chunk_simple_gla", kwargs)
    return _simple_gla(q, k, v, g, g_gamma, scale, initial_state,
                       output_final_state, False, False, cu_seqlens)


def _decay_attention(q: Tensor, k: Tensor, g: Tensor | None, scale: float) -> Tensor:
    """fla's materialised attention (B, H, T, T): ``scale·q_i·k_j·exp(Σ_{j<t≤i} g_t)``, j ≤ i."""
    acc = accumulation_dtype(q.dtype)
    qh, kh = _hf(q).to(acc), _hf(k).to(acc)
    A = (qh * scale) @ kh.transpose(-1, -2)
    if g is None:
        return A.tril().to(q.dtype)
    return (A * segsum(_hf(g).to(acc)).exp()).to(q.dtype)  # segsum: −∞ above the diagonal


def parallel_simple_gla(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor | None = None,
    scale: float | None = None,
    output_attentions: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    cu_seqlens_cpu: torch.LongTensor | None = None,
    **kwargs,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``parallel_simple_gla``: :func:`chunk_simple_gla` from a zero state, returning
    ``(o, attn)``: attn (B, H, T, T) = ``scale·q_i·k_j·exp(g_{j+1} + … + g_i)`` for j ≤ i (0
    above), in q's dtype, if ``output_attentions`` (not with ``cu_seqlens``, as fla) else None.
    ``**kwargs``: none taken (``head_first`` is a ValueError, other names a TypeError)."""
    _kwargs("parallel_simple_gla", kwargs)
    B, T, H, _, K = _qkv(q, k, v)
    s = _scale(scale, K)
    g = _gate("g", g, (B, T, H))
    cu = _varlen(cu_seqlens, q)
    output_attentions = _flag("output_attentions", output_attentions)
    if output_attentions and cu is not None:
        raise ValueError("output_attentions: not supported with cu_seqlens (as in fla)")
    o, _ = _gla(q, k, v, g=g, scale=s, initial_state=None,
                output_final_state=False, cu=cu)
    return o, (_decay_attention(q, k, g, s) if output_attentions else None)


def chunk_gla(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    cu_seqlens_cpu: torch.LongTensor | None = None,
    **kwargs,
) -> tuple[Tensor, Tensor | None]:
    """Gated linear attention (GLA) with per-key gates:
    ``S_t = diag(exp(g_t))·S_{t−1} + k_t v_tᵀ``, ``o_t = S_tᵀ(scale·q_t)``.

    fla's ``fla.ops.gla.chunk_gla``. NB: here ``g`` is the PER-KEY gate (B, T, H, K), as in
    fla; runs :func:`linattn.ops.gated.gated_linear_attention` with ``gk=g``.

    Args:
        q, k: (B, T, H, K); v: (B, T, H, V); g: (B, T, H, K) log decays ≤ 0.
        scale, initial_state (N, H, K, V), output_final_state, state_v_first, cu_seqlens
            (N + 1,), cu_seqlens_cpu (ignored): as :func:`chunk_simple_gla`.
        **kwargs: ``transpose_state_layout`` (fla's old name of ``state_v_first``).

    Returns:
        o (B, T, H, V) in q's dtype; final state (N, H, K, V) or None.
    """
    kw = _kwargs("chunk_gla", kwargs, ("transpose_state_layout",))
    svf = _state_v_first(state_v_first, kw)
    B, T, H, _, K = _qkv(q, k, v)
    g = _gate("g", g, (B, T, H, K))
    if g is None:
        raise ValueError("g: chunk_gla needs the per-key gates (B, T, H, K)")
    cu, S0 = _sequences(cu_seqlens, q, initial_state, H, K, v.shape[-1], svf)
    return _gla(q, k, v, gk=g, scale=_scale(scale, K), initial_state=S0,
                output_final_state=_flag("output_final_state", output_final_state),
                state_v_first=svf, cu=cu)


def fused_recurrent_gla(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    gk: Tensor | None = None,
    gv: Tensor | None = None,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    reverse: bool = False,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    **kwargs,
) -> tuple[Tensor, Tensor | None]:
    """GLA with key and value gates:
    ``S_t = diag(exp(gk_t))·S_{t−1}·diag(exp(gv_t)) + k_t v_tᵀ``, ``o_t = S_tᵀ(scale·q_t)``.

    fla's ``fla.ops.gla.fused_recurrent_gla``. gk: (B, T, H, K), gv: (B, T, H, V), log decays ≤ 0
    or None; ``reverse`` as :func:`fused_recurrent_simple_gla`; the rest as :func:`chunk_gla`.
    Without ``gv`` runs :func:`linattn.ops.gated.gated_linear_attention` (chunked); with ``gv``
    :func:`linattn.ops.gated.gated_linear_attention_step` token by token (slower).
    ``**kwargs``: ``transpose_state_layout`` (fla's old name of ``state_v_first``)."""
    if gv is None and cu_seqlens is None and state_v_first is False and not kwargs:
        fast = _decode(q, k, v, None, gk, scale, initial_state, output_final_state, reverse)
        if fast is not None:
            return fast
    kw = _kwargs("fused_recurrent_gla", kwargs, ("transpose_state_layout",))
    svf = _state_v_first(state_v_first, kw)
    B, T, H, _, K = _qkv(q, k, v)
    V = v.shape[-1]
    gk = _gate("gk", gk, (B, T, H, K))
    gv = _gate("gv", gv, (B, T, H, V))
    cu, S0 = _sequences(cu_seqlens, q, initial_state, H, K, V, svf)
    return _gla(q, k, v, gk=gk, gv=gv, scale=_scale(scale, K),
                initial_state=S0,
                output_final_state=_flag("output_final_state", output_final_state),
                reverse=_flag("reverse", reverse), state_v_first=svf, cu=cu)


def fused_chunk_gla(**kwargs) -> tuple[Tensor, Tensor | None]:
    """Deprecated in fla (it raises there too): use :func:`chunk_gla`."""
    _kwargs("fused_chunk_gla", kwargs, tuple(kwargs))  # head_first: the ValueError first
    raise NotImplementedError("fused_chunk_gla is deprecated (in fla too); use chunk_gla")


# ----------------------------------------------------------------------------- retention


def _retention_gamma(H: int, like: Tensor) -> Tensor:
    """RetNet's per-head log decays ``log(1 − 2^(−5−h))``, h = 0 … H−1 (fla's g_gamma)."""
    h = torch.arange(H, dtype=accumulation_dtype(like.dtype), device=like.device)
    return torch.log1p(-torch.exp2(-5.0 - h))


def _retention(q, k, v, scale, initial_state, output_final_state, reverse, state_v_first,
               cu_seqlens, chunk_size=None):
    """:func:`_simple_gla` with RetNet's decays, for the three retention functions that take a
    state; q, k, v are checked first, so that q's head count is there to read."""
    _qkv(q, k, v)
    return _simple_gla(q, k, v, None, _retention_gamma(q.shape[2], q), scale, initial_state,
                       output_final_state, reverse, state_v_first, cu_seqlens, chunk_size)


def chunk_retention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    **kwargs,
) -> tuple[Tensor, Tensor | None]:
    """RetNet retention: :func:`chunk_simple_gla` with the fixed per-head log decay
    ``g_gamma[h] = log(1 − 2^(−5−h))`` (fla's ``fla.ops.retention.chunk_retention``).
    q, k (B, T, H, K), v (B, T, H, V), initial_state (N, H, K, V); returns (o, final state or
    None). ``**kwargs``: ``chunk_size`` (speed only)."""
    kw = _kwargs("chunk_retention", kwargs, ("chunk_size",))
    return _retention(q, k, v, scale, initial_state, output_final_state, False, False,
                      cu_seqlens, kw.get("chunk_size"))


def fused_recurrent_retention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    reverse: bool = False,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    **kwargs,
) -> tuple[Tensor, Tensor | None]:
    """:func:`chunk_retention` with fla's recurrent signature (``reverse``, ``state_v_first``;
    ``**kwargs``: ``transpose_state_layout``)."""
    kw = _kwargs("fused_recurrent_retention", kwargs, ("transpose_state_layout",))
    svf = _state_v_first(state_v_first, kw)
    return _retention(q, k, v, scale, initial_state, output_final_state, reverse, svf,
                      cu_seqlens)


def fused_chunk_retention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    **kwargs,
) -> tuple[Tensor, Tensor | None]:
    """:func:`chunk_retention` with fla's fused-chunk signature (``**kwargs``: none taken)."""
    _kwargs("fused_chunk_retention", kwargs)
    return _retention(q, k, v, scale, initial_state, output_final_state, False, False,
                      cu_seqlens)


def parallel_retention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float | None = None,
    output_attentions: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    **kwargs,
) -> tuple[Tensor, Tensor | None]:
    """:func:`parallel_simple_gla` with RetNet's decays (see :func:`chunk_retention`):
    returns (o (B, T, H, V), attn (B, H, T, T) or None). ``**kwargs``: none taken."""
    _kwargs("parallel_retention", kwargs)
    B, T, H, _, _ = _qkv(q, k, v)
    g = _retention_gamma(H, q).expand(B, T, H)
    return parallel_simple_gla(q, k, v, g, scale, output_attentions, cu_seqlens)


