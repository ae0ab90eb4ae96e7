r"""flash-linear-attention's front door: fla's function names, signatures and layout, on CPU.

Code written against `fla <https://github.com/fla-org/flash-linear-attention>`_ (``fla-core``
0.6.0) runs on any device torch runs on by changing one import: change
``from fla.ops.gated_delta_rule import chunk_gated_delta_rule`` to
``from linattn.fla import chunk_gated_delta_rule``. Every function takes fla's arguments in fla's
order with fla's names and defaults, tensors in fla's layout

* q, k: (B, T, H, K); v: (B, T, H, V); scalar gates and beta: (B, T, H); per-key gates
  (B, T, H, K); per-value gates (B, T, H, V),

and returns fla's pair ``(o, final_state)``: o (B, T, H, V) in q's dtype, final_state
(N, H, K, V) (N = B, or the number of packed sequences with ``cu_seqlens``) or ``None`` when
``output_final_state=False``. Gates are natural-log decays (the state is multiplied by
``exp(g)``); ``scale=None`` is ``K**-0.5``; no feature map and no normaliser (except
``*_linear_attn(normalize=True)``): ``o_t = S_tᵀ (scale·q_t)``.

The work is done by the head-first ops (B, H, T, ·) of :mod:`linattn.ops.gated`
(:func:`~linattn.ops.gated.gated_linear_attention`, chunked) and :mod:`linattn.ops.delta`
(:func:`~linattn.ops.delta.delta_rule`, chunked); this module only transposes, validates and
maps arguments. fla's ``chunk_*``, ``fused_chunk_*``, ``fused_recurrent_*`` and ``parallel_*``
variants of one op compute the same function (they differ in GPU kernels), and so do the ones
here.

================================== =================================================================
fla function                       here
================================== =================================================================
chunk_simple_gla                   yes (g and/or g_gamma) -> gated_linear_attention(g=...)
fused_recurrent_simple_gla         yes, also ``reverse``
fused_chunk_simple_gla             yes
parallel_simple_gla                yes, ``output_attentions`` without ``cu_seqlens`` (as fla)
chunk_gla                          yes (fla's ``g`` is the per-key gate: gk= here)
fused_recurrent_gla                yes, ``reverse``; ``gv`` runs the step function token by token
fused_chunk_gla                    raises NotImplementedError, as fla (deprecated there)
chunk_retention & co. (4)          yes: g_gamma[h] = log(1 − 2^(−5−h)); ``reverse`` where fla has it
chunk_linear_attn                  yes, ``normalize`` (default True, as fla), (kv, z) state tuples
fused_chunk_linear_attn            yes (normalize default True)
fused_recurrent_linear_attn        yes, ``reverse`` (normalize default False, as fla)
chunk_delta_rule                   yes -> delta_rule; any float dtype (fla: not float32)
fused_recurrent_delta_rule         yes; per-value beta (B, T, H, V) runs token by token
fused_chunk_delta_rule             raises NotImplementedError, as fla (deprecated there)
parallel_delta_rule                o only; ``output_attentions=True`` raises NotImplementedError
chunk_gated_delta_rule / chunk_gdn yes -> delta_rule(g=...); GVA (HV > H); use_gate_in_kernel,
                                   A_log, dt_bias, beta sigmoid, allow_neg_eigval, state_v_first
fused_recurrent_gated_delta_rule   yes, same; ``gk``/``gv``/per-value beta run token by token
 / fused_recurrent_gdn
================================== =================================================================

Not supported: ``cp_context`` (context parallelism: NotImplementedError), ``head_first`` (removed
in fla too: ValueError), keyword arguments fla silently ignores (TypeError here), gates > 0
(ValueError: a log-decay must be ≤ 0; fla does not check). ``chunk_size=`` (where fla takes it)
is forwarded as linattn's chunk size, which changes speed only; ``cu_seqlens_cpu`` and
``chunk_indices`` are accepted and unused (they are GPU synchronisation hints).

Dtypes: any floating dtype, q, k and v alike (fla's Triton kernels want half precision in some
functions). States are accumulated and returned in float32, or float64 for float64 inputs (fla:
float32 always); ``initial_state`` may have any floating dtype (``chunk_gla`` in fla wants
float32). ``use_qk_l2norm_in_kernel`` is linattn's ``qk_l2norm``, with fla's formula
``x / sqrt(Σx² + 1e-6)``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from linattn.ops._common import accumulation_dtype
from linattn.ops.gated.op import gated_linear_attention, gated_linear_attention_step, segsum
from linattn.ops.varlen import check_cu_seqlens

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
    "chunk_linear_attn",
    "fused_recurrent_linear_attn",
    "fused_chunk_linear_attn",
    "chunk_delta_rule",
    "fused_recurrent_delta_rule",
    "fused_chunk_delta_rule",
    "parallel_delta_rule",
    "chunk_gated_delta_rule",
    "fused_recurrent_gated_delta_rule",
    "chunk_gdn",
    "fused_recurrent_gdn",
]

#: fla's ``normalize=True`` denominator guard: o / (⟨scale·q_t, Σ_{s≤t} k_s⟩ + eps).
NORMALIZE_EPS = 1e-10


# ----------------------------------------------------------------------------- validation


def _tensor(name: str, x: object, ndim: int) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor, got {x.dtype}")
    if x.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(x.shape)}")
    return x


def _qkv(q: object, k: object, v: object, *, gva: bool = False) -> tuple[int, int, int, int, int]:
    """Check fla's q, k (B, T, H, K) and v (B, T, HV, V); HV == H unless ``gva`` (HV % H == 0).
    Returns B, T, H, HV, K."""
    q = _tensor("q", q, 4)
    k = _tensor("k", k, 4)
    v = _tensor("v", v, 4)
    B, T, H, K = q.shape
    if tuple(k.shape) != tuple(q.shape):
        raise ValueError(f"k: expected q's shape (B, T, H, K) = {tuple(q.shape)}, "
                         f"got {tuple(k.shape)}")
    if tuple(v.shape[:2]) != (B, T):
        raise ValueError(f"v: expected shape (B, T, H, V) with (B, T) = {(B, T)}, "
                         f"got {tuple(v.shape)}")
    HV = v.shape[2]
    if gva:
        if H == 0 or HV % H != 0:
            raise ValueError(f"v: its {HV} heads must be a multiple of q's {H} heads")
    elif HV != H:
        raise ValueError(f"v: expected {H} heads (B, T, H, V), got shape {tuple(v.shape)}")
    if K == 0:
        raise ValueError(f"q: expected a head dimension K >= 1, got shape {tuple(q.shape)}")
    return B, T, H, HV, K


def _gate(name: str, g: object, shape: tuple[int, ...]) -> Tensor | None:
    """A log-decay gate of exactly ``shape`` (or None): finite or −∞, ≤ 0."""
    if g is None:
        return None
    g = _tensor(name, g, len(shape))
    if tuple(g.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(g.shape)}")
    if g.numel() and (g.isnan().any() or (g > 0).any()):
        raise ValueError(f"{name}: expected log decays <= 0 (the state is multiplied by "
                         f"exp({name})), got values in [{g.min().item():g}, {g.max().item():g}]")
    return g


def _beta(beta: object, B: int, T: int, H: int, V: int, *, per_value: bool) -> Tensor:
    """beta (B, T, H), or also (B, T, H, V) if ``per_value``."""
    if not isinstance(beta, Tensor) or not beta.is_floating_point():
        raise TypeError(f"beta: expected a floating-point tensor, got "
                        f"{beta.dtype if isinstance(beta, Tensor) else type(beta).__name__}")
    ok = [(B, T, H)] + ([(B, T, H, V)] if per_value else [])
    if tuple(beta.shape) not in ok:
        want = " or ".join(str(s) for s in ok)
        raise ValueError(f"beta: expected shape {want}, got {tuple(beta.shape)}")
    if beta.numel() and beta.isnan().any():
        raise ValueError("beta: contains nan")
    return beta


def _scale(scale: object, K: int, *, positive: bool = False) -> float:
    if scale is None:
        return K ** -0.5
    if isinstance(scale, Tensor) and scale.numel() == 1:
        scale = scale.item()
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"scale: expected a finite real number or None, got {scale!r}")
    if positive and scale <= 0:
        raise ValueError(f"scale: expected a positive number, got {scale!r}")
    return float(scale)


def _varlen(cu_seqlens: object, q: Tensor) -> Tensor | None:
    """cu_seqlens checked against fla-layout q (B must be 1), as an int64 tensor, or None."""
    if cu_seqlens is None:
        return None
    if isinstance(cu_seqlens, Tensor) and q.shape[0] != 1:
        raise ValueError(f"cu_seqlens: packed sequences need batch size B = 1, got q of shape "
                         f"{tuple(q.shape)}; flatten them to (1, sum of lengths, H, K)")
    return check_cu_seqlens(cu_seqlens, q.transpose(1, 2))


def _state(name: str, x: object, N: int, H: int, K: int, V: int,
           state_v_first: bool) -> Tensor | None:
    """An initial state (N, H, K, V) ((N, H, V, K) if ``state_v_first``) -> (N, H, K, V)."""
    if x is None:
        return None
    x = _tensor(name, x, 4)
    want = (N, H, V, K) if state_v_first else (N, H, K, V)
    if tuple(x.shape) != want:
        what = "(N, H, V, K)" if state_v_first else "(N, H, K, V)"
        raise ValueError(f"{name}: expected shape {what} = {want}, got {tuple(x.shape)}")
    return x.transpose(-1, -2) if state_v_first else x


def _flag(name: str, x: object) -> bool:
    if not isinstance(x, (bool, int)) or isinstance(x, int) and x not in (0, 1):
        raise ValueError(f"{name}: expected a bool, got {x!r}")
    return bool(x)


def _kwargs(fn: str, kwargs: dict, allowed: tuple[str, ...] = ()) -> dict:
    """fla's extra keyword arguments: ``head_first`` (removed in fla: ValueError),
    ``transpose_state_layout`` (fla's deprecated name of state_v_first), those in ``allowed``;
    anything else is a TypeError (fla ignores unknown names silently)."""
    if "head_first" in kwargs:
        raise ValueError("head_first: removed (in fla too); inputs are (B, T, H, ...)")
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise TypeError(f"{fn}() got unexpected keyword argument(s) {', '.join(unknown)}")
    return kwargs


def _state_v_first(state_v_first: object, kwargs: dict) -> bool:
    if "transpose_state_layout" in kwargs:
        if state_v_first:
            raise ValueError("transpose_state_layout: cannot be passed with state_v_first "
                             "(its new name)")
        warnings.warn("transpose_state_layout is deprecated (in fla too); use state_v_first",
                      DeprecationWarning, stacklevel=3)
        state_v_first = kwargs.pop("transpose_state_layout")
    return _flag("state_v_first", state_v_first)


def _no_cp(cp_context: object) -> None:
    if cp_context is not None:
        raise NotImplementedError("cp_context: context parallelism is not supported by linattn.fla")


# ----------------------------------------------------------------------------- layout helpers


def _hf(x: Tensor | None) -> Tensor | None:
    """fla layout (B, T, H, ...) -> head-first (B, H, T, ...)."""
    return None if x is None else x.transpose(1, 2)


def _flip_time(xs: list[Tensor | None]) -> list[Tensor | None]:
    return [None if x is None else x.flip(1) for x in xs]


def _reversed_cu(cu: Tensor) -> Tensor:
    """Offsets of the packed batch flipped in time: sequence order and each sequence reversed."""
    return (cu[-1] - cu).flip(0)


def _finish(o: Tensor, S: Tensor, output_final_state: bool, state_v_first: bool,
            ) -> tuple[Tensor, Tensor | None]:
    """Head-first o -> fla layout; the state in fla's layout or None."""
    o = o.transpose(1, 2)
    if not output_final_state:
        return o, None
    return o, (S.transpose(-1, -2).contiguous() if state_v_first else S)


def _scan(step: Callable, q: Tensor, k: Tensor, v: Tensor, per_token: dict[str, Tensor | None],
          S0: Tensor | None, cu: Tensor | None) -> tuple[Tensor, Tensor]:
    """The recurrence token by token: ``step(q_t, k_t, v_t, S, **x_t) -> (o_t, S)`` over head-first
    q, k (B, H, T, K), v (B, H, T, V) and ``per_token`` tensors (B, H, T, ...). With ``cu`` (B = 1)
    each sequence n starts from S0[n] (or zeros). Returns o (B, H, T, V) and the final states."""
    B, H, T, K = q.shape
    V = v.shape[-1]
    acc = accumulation_dtype(q.dtype)
    extras = {name: x for name, x in per_token.items() if x is not None}
    spans = [(0, T)] if cu is None else list(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True))
    outs, states = [], []
    for n, (a, b) in enumerate(spans):
        if S0 is None:
            S = torch.zeros(q.shape[0] if cu is None else 1, H, K, V, dtype=acc, device=q.device)
        else:
            S = (S0 if cu is None else S0[n:n + 1]).to(acc)
        for t in range(a, b):
            o_t, S = step(q[:, :, t], k[:, :, t], v[:, :, t], S,
                          **{name: x[:, :, t] for name, x in extras.items()})
            outs.append(o_t)
        states.append(S)
    o = torch.stack(outs, dim=2) if outs else v.new_zeros(B, H, 0, V).to(q.dtype)
    return o, torch.cat(states, dim=0)


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


def _simple_gla(q, k, v, g, g_gamma, scale, initial_state, output_final_state,
                reverse=False, state_v_first=False, cu_seqlens=None, chunk_size=None):
    B, T, H, _, K = _qkv(q, k, v)
    g = _gate("g", g, (B, T, H))
    if g_gamma is not None:
        g_gamma = _gate("g_gamma", g_gamma, (H,))
        const = g_gamma.to(accumulation_dtype(q.dtype)).expand(B, T, H)
        g = const if g is None else g.to(const.dtype) + const
    cu = _varlen(cu_seqlens, q)
    N = B if cu is None else len(cu) - 1
    S0 = _state("initial_state", initial_state, N, H, K, v.shape[-1], state_v_first)
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
) -> tuple[Tensor, Tensor | None]:
    """:func:`chunk_simple_gla` with fla's fused-chunk signature (no state_v_first)."""
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
) -> tuple[Tensor, Tensor | None]:
    """fla's ``parallel_simple_gla``: :func:`chunk_simple_gla` from a zero state, returning
    ``(o, attn)``: attn (B, H, T, T) = ``scale·q_i·k_j·exp(g_{j+1} + … + g_i)`` for j ≤ i (0
    above), in q's dtype, if ``output_attentions`` (not with ``cu_seqlens``, as fla) else None."""
    B, T, H, _, K = _qkv(q, k, v)
    s = _scale(scale, K)
    g = _gate("g", g, (B, T, H))
    cu = _varlen(cu_seqlens, q)
    if _flag("output_attentions", output_attentions) and cu is not None:
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
) -> tuple[Tensor, Tensor | None]:
    """Gated linear attention (GLA) with per-key gates:
    ``S_t = diag(exp(g_t))·S_{t−1} + k_t v_tᵀ``, ``o_t = S_tᵀ(scale·q_t)``.

    fla's ``fla.ops.gla.chunk_gla``. NB: here ``g`` is the PER-KEY gate (B, T, H, K), as in
    fla; runs :func:`linattn.ops.gated.gated_linear_attention` with ``gk=g``.

    Args:
        q, k: (B, T, H, K); v: (B, T, H, V); g: (B, T, H, K) log decays ≤ 0.
        scale, initial_state (N, H, K, V), output_final_state, state_v_first, cu_seqlens
            (N + 1,), cu_seqlens_cpu (ignored): as :func:`chunk_simple_gla`.

    Returns:
        o (B, T, H, V) in q's dtype; final state (N, H, K, V) or None.
    """
    B, T, H, _, K = _qkv(q, k, v)
    g = _gate("g", g, (B, T, H, K))
    if g is None:
        raise ValueError("g: chunk_gla needs the per-key gates (B, T, H, K)")
    svf = _flag("state_v_first", state_v_first)
    cu = _varlen(cu_seqlens, q)
    N = B if cu is None else len(cu) - 1
    S0 = _state("initial_state", initial_state, N, H, K, v.shape[-1], svf)
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
    kw = _kwargs("fused_recurrent_gla", kwargs, ("transpose_state_layout",))
    svf = _state_v_first(state_v_first, kw)
    B, T, H, _, K = _qkv(q, k, v)
    V = v.shape[-1]
    gk = _gate("gk", gk, (B, T, H, K))
    gv = _gate("gv", gv, (B, T, H, V))
    cu = _varlen(cu_seqlens, q)
    N = B if cu is None else len(cu) - 1
    S0 = _state("initial_state", initial_state, N, H, K, V, svf)
    return _gla(q, k, v, gk=gk, gv=gv, scale=_scale(scale, K),
                initial_state=S0,
                output_final_state=_flag("output_final_state", output_final_state),
                reverse=_flag("reverse", reverse), state_v_first=svf, cu=cu)


def fused_chunk_gla(**kwargs) -> tuple[Tensor, Tensor | None]:
    """Deprecated in fla (it raises there too): use :func:`chunk_gla`."""
    raise NotImplementedError("fused_chunk_gla is deprecated (in fla too); use chunk_gla")


# ----------------------------------------------------------------------------- retention


def _retention_gamma(H: int, like: Tensor) -> Tensor:
    """RetNet's per-head log decays ``log(1 − 2^(−5−h))``, h = 0 … H−1 (fla's g_gamma)."""
    h = torch.arange(H, dtype=accumulation_dtype(like.dtype), device=like.device)
    return torch.log1p(-torch.exp2(-5.0 - h))


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
    _qkv(q, k, v)
    return _simple_gla(q, k, v, None, _retention_gamma(q.shape[2], q), scale,
                       initial_state, output_final_state, False, False, cu_seqlens,
                       kw.get("chunk_size"))


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
    _qkv(q, k, v)
    return _simple_gla(q, k, v, None,
                       _retention_gamma(q.shape[2], q), scale, initial_state, output_final_state,
                       reverse, svf, cu_seqlens)


def fused_chunk_retention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """:func:`chunk_retention` with fla's fused-chunk signature."""
    _qkv(q, k, v)
    return _simple_gla(q, k, v, None, _retention_gamma(q.shape[2], q),
                       scale, initial_state, output_final_state, False, False, cu_seqlens)


def parallel_retention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float | None = None,
    output_attentions: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """:func:`parallel_simple_gla` with RetNet's decays (see :func:`chunk_retention`):
    returns (o (B, T, H, V), attn (B, H, T, T) or None)."""
    B, T, H, _, _ = _qkv(q, k, v)
    g = _retention_gamma(H, q).expand(B, T, H)
    return parallel_simple_gla(q, k, v, g, scale, output_attentions, cu_seqlens)


# ----------------------------------------------------------------------------- linear attention


def _linear_attn(q, k, v, scale, initial_state, output_final_state, reverse, normalize,
                 cu_seqlens):
    B, T, H, _, K = _qkv(q, k, v)
    V = v.shape[-1]
    normalize = _flag("normalize", normalize)
    output_final_state = _flag("output_final_state", output_final_state)
    reverse = _flag("reverse", reverse)
    s = _scale(scale, K)
    cu = _varlen(cu_seqlens, q)
    N = B if cu is None else len(cu) - 1
    z0 = None
    if isinstance(initial_state, tuple):
        if not normalize:
            raise ValueError("initial_state: a (kv_state, z_state) tuple needs normalize=True")
        if len(initial_state) != 2:
            raise ValueError(f"initial_state: expected a (kv_state, z_state) pair, got "
                             f"{len(initial_state)} items")
        initial_state, z0 = initial_state
        if z0 is not None:
            z0 = _tensor("initial_state", z0, 4)
            if tuple(z0.shape) != (N, 1, H, K):
                raise ValueError(f"initial_state: expected z_state of shape (N, 1, H, K) = "
                                 f"{(N, 1, H, K)}, got {tuple(z0.shape)}")
    S0 = _state("initial_state", initial_state, N, H, K, V, False)
    o, S = _gla(q, k, v, scale=s, initial_state=S0, output_final_state=True, reverse=reverse,
                cu=cu)
    if not normalize:
        return o, (S if output_final_state else None)
    o, z = _normalized(o, q, k, s, z0, reverse, cu)
    return o, ((S, z) if output_final_state else None)


def _normalized(o: Tensor, q: Tensor, k: Tensor, scale: float, z0: Tensor | None, reverse: bool,
                cu: Tensor | None) -> tuple[Tensor, Tensor]:
    """fla's ``normalize=True``: o_t / (⟨scale·q_t, z0 + Σ_{s≤t} k_s⟩ + 1e-10) (s ≥ t if
    ``reverse``), and the key sum after the last token (first if reverse): (B|N, 1, H, K)."""
    acc = accumulation_dtype(q.dtype)
    B, T, H, K = q.shape
    spans = [(0, T)] if cu is None else list(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True))
    kk = k.to(acc)
    cums, zs = [], []
    for n, (a, b) in enumerate(spans):
        part = kk[:, a:b]
        c = part.flip(1).cumsum(1).flip(1) if reverse else part.cumsum(1)
        if z0 is not None:
            c = c + (z0 if cu is None else z0[n:n + 1]).to(acc)
        cums.append(c)
        if b > a:
            zs.append(c[:, :1] if reverse else c[:, -1:])
        else:
            zs.append(torch.zeros(c.shape[0], 1, H, K, dtype=acc, device=q.device)
                      if z0 is None else (z0 if cu is None else z0[n:n + 1]).to(acc))
    k_cum = torch.cat(cums, dim=1)
    den = (q.to(acc) * scale * k_cum).sum(-1, keepdim=True) + NORMALIZE_EPS
    return (o.to(acc) / den).to(o.dtype), torch.cat(zs, dim=0).to(k.dtype)


def chunk_linear_attn(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float | None = None,
    initial_state: Tensor | tuple | None = None,
    output_final_state: bool = False,
    normalize: bool = True,
    cu_seqlens: torch.LongTensor | None = None,
) -> tuple[Tensor, Tensor | tuple | None]:
    """Plain causal linear attention (fla's ``fla.ops.linear_attn.chunk_linear_attn``):
    ``S_t = S_{t−1} + k_t v_tᵀ``, ``o_t = S_tᵀ(scale·q_t)`` — no feature map (apply yours to q
    and k first) — divided, if ``normalize`` (default True here, as fla), by
    ``⟨scale·q_t, z0 + Σ_{s≤t} k_s⟩ + 1e-10``. Runs
    :func:`linattn.ops.gated.gated_linear_attention` with no gate (not
    :func:`linattn.linear_attention`, which applies a feature map and another normaliser).

    Args:
        q, k: (B, T, H, K); v: (B, T, H, V); scale: default ``K**-0.5``.
        initial_state: (N, H, K, V), or with ``normalize`` a tuple (kv (N, H, K, V) or None,
            z (N, 1, H, K) or None), the running key sum of the denominator.
        output_final_state: return the final state: (N, H, K, V), or with ``normalize`` the tuple
            (kv (N, H, K, V), z (N, 1, H, K) in k's dtype); else None.
        cu_seqlens: (N + 1,) packed sequences (B = 1).

    Returns:
        o (B, T, H, V) in q's dtype, and the final state or None.
    """
    return _linear_attn(q, k, v, scale, initial_state, output_final_state,
                        False, normalize, cu_seqlens)


def fused_chunk_linear_attn(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float | None = None,
    initial_state: Tensor | tuple | None = None,
    output_final_state: bool = False,
    normalize: bool = True,
    cu_seqlens: torch.LongTensor | None = None,
) -> tuple[Tensor, Tensor | tuple | None]:
    """:func:`chunk_linear_attn` under fla's fused-chunk name (normalize default True)."""
    return _linear_attn(q, k, v, scale, initial_state,
                        output_final_state, False, normalize, cu_seqlens)


def fused_recurrent_linear_attn(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float | None = None,
    initial_state: Tensor | tuple | None = None,
    output_final_state: bool = False,
    reverse: bool = False,
    normalize: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
) -> tuple[Tensor, Tensor | tuple | None]:
    """:func:`chunk_linear_attn` with fla's recurrent signature: ``reverse`` (scan from the last
    token; the key sum runs backwards too) and ``normalize`` defaulting to **False** (as fla)."""
    return _linear_attn(q, k, v, scale, initial_state,
                        output_final_state, reverse, normalize, cu_seqlens)


# ----------------------------------------------------------------------------- delta rule


def _delta_ops():
    from linattn.ops import delta

    return delta


def _delta(q, k, v, beta, *, g=None, gk=None, gv=None, scale, initial_state,
           output_final_state, use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False,
           allow_neg_eigval=False, use_gate_in_kernel=False, A_log=None, dt_bias=None,
           state_v_first=False, cu_seqlens=None, chunk_size=None, gva=False, per_value_beta=False,
           positive_scale=False):
    """Checked fla-layout delta rule -> linattn.ops.delta (chunked, or step by step for gk, gv
    or per-value beta)."""
    B, T, H, HV, K = _qkv(q, k, v, gva=gva)
    V = v.shape[-1]
    s = _scale(scale, K, positive=positive_scale)
    output_final_state = _flag("output_final_state", output_final_state)
    l2 = _flag("use_qk_l2norm_in_kernel", use_qk_l2norm_in_kernel)
    sig = _flag("use_beta_sigmoid_in_kernel", use_beta_sigmoid_in_kernel)
    neg = _flag("allow_neg_eigval", allow_neg_eigval)
    if neg and not sig:
        raise ValueError("allow_neg_eigval: needs use_beta_sigmoid_in_kernel=True (as in fla)")
    if _flag("use_gate_in_kernel", use_gate_in_kernel):
        if A_log is None:
            raise ValueError("A_log: must be given when use_gate_in_kernel=True")
        if g is None:
            raise ValueError("g: the raw gate input must be given when use_gate_in_kernel=True")
        A_log = _tensor("A_log", A_log, 1)
        if tuple(A_log.shape) != (HV,):
            raise ValueError(f"A_log: expected shape (HV,) = {(HV,)}, got {tuple(A_log.shape)}")
        raw = _tensor("g", g, 3)
        if tuple(raw.shape) != (B, T, HV):
            raise ValueError(f"g: expected shape (B, T, HV) = {(B, T, HV)}, got {tuple(raw.shape)}")
        acc = accumulation_dtype(q.dtype)
        raw = raw.to(acc)
        if dt_bias is not None:
            dt_bias = _tensor("dt_bias", dt_bias, 1)
            if tuple(dt_bias.shape) != (HV,):
                raise ValueError(f"dt_bias: expected shape (HV,) = {(HV,)}, got "
                                 f"{tuple(dt_bias.shape)}")
            raw = raw + dt_bias.to(acc)
        g = -A_log.to(acc).exp() * F.softplus(raw)
    g = _gate("g", g, (B, T, HV))
    gk = _gate("gk", gk, (B, T, HV, K))
    gv = _gate("gv", gv, (B, T, HV, V))
    if beta is None:
        beta = q.new_ones(B, T, HV)
    beta = _beta(beta, B, T, HV, V, per_value=per_value_beta)
    if sig:
        beta = torch.sigmoid(beta) * (2 if neg else 1)
    cu = _varlen(cu_seqlens, q)
    N = B if cu is None else len(cu) - 1
    S0 = _state("initial_state", initial_state, N, HV, K, V, state_v_first)
    if HV != H:  # grouped value attention: value head j reads q/k head j // (HV // H)
        q, k = (x.repeat_interleave(HV // H, dim=2) for x in (q, k))
    delta = _delta_ops()
    if gk is None and gv is None and beta.dim() == 3:
        o, S = delta.delta_rule(_hf(q), _hf(k), _hf(v), _hf(beta), _hf(g), scale=s,
                                initial_state=S0, return_state=True, chunk_size=chunk_size,
                                cu_seqlens=cu, qk_l2norm=l2)
    else:
        step = _per_value_beta_step(delta.delta_rule_step, s, l2) if beta.dim() == 4 else \
            (lambda q_t, k_t, v_t, S, beta_t, **gates:
             delta.delta_rule_step(q_t, k_t, v_t, beta_t, S, scale=s, qk_l2norm=l2, **gates))
        o, S = _scan(step, _hf(q), _hf(k), _hf(v),
                     {"beta_t": _hf(beta), "g_t": _hf(g), "gk_t": _hf(gk), "gv_t": _hf(gv)},
                     S0, cu)
    return _finish(o, S, output_final_state, state_v_first)


def _per_value_beta_step(delta_rule_step: Callable, scale: float, l2: bool) -> Callable:
    """The delta step with a per-value beta_t (..., V): each value column j of the state is a
    delta rule of its own with the scalar beta_t[j], so run the V columns as a batch dimension
    (state (..., K, V) -> (..., V, K, 1))."""

    def step(q_t, k_t, v_t, S, beta_t, g_t=None, gk_t=None, gv_t=None):
        V, K = v_t.shape[-1], q_t.shape[-1]
        wide = (*q_t.shape[:-1], V, K)
        cols = S.movedim(-1, -2).unsqueeze(-1)  # (..., V, K, 1)
        o, cols = delta_rule_step(
            q_t.unsqueeze(-2).expand(wide), k_t.unsqueeze(-2).expand(wide), v_t.unsqueeze(-1),
            beta_t, cols, scale=scale, qk_l2norm=l2,
            g_t=None if g_t is None else g_t.unsqueeze(-1).expand(beta_t.shape),
            gk_t=None if gk_t is None else gk_t.unsqueeze(-2).expand(wide),
            gv_t=None if gv_t is None else gv_t.unsqueeze(-1))
        return o.squeeze(-1), cols.squeeze(-1).movedim(-1, -2)

    return step


def chunk_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    cu_seqlens_cpu: torch.LongTensor | None = None,
    **kwargs,
) -> tuple[Tensor, Tensor | None]:
    """The delta rule (DeltaNet): ``S_t = S_{t−1} + β_t k_t (v_t − S_{t−1}ᵀ k_t)ᵀ``,
    ``o_t = S_tᵀ(scale·q_t)``.

    fla's ``fla.ops.delta_rule.chunk_delta_rule``; runs :func:`linattn.ops.delta.delta_rule`.

    Args:
        q, k: (B, T, H, K); v: (B, T, H, V); beta: (B, T, H).
        scale: default ``K**-0.5``.
        initial_state: (N, H, K, V) or None (zeros); N = B or the number of sequences.
        output_final_state: return the final state (else None).
        use_qk_l2norm_in_kernel: L2-normalise q and k first (x / sqrt(Σx² + 1e-6)).
        cu_seqlens: (N + 1,) packed sequences (B = 1); cu_seqlens_cpu: ignored.
        **kwargs: ``chunk_size`` (speed only).

    Returns:
        o (B, T, H, V) in q's dtype; final state (N, H, K, V) or None.
    """
    kw = _kwargs("chunk_delta_rule", kwargs, ("chunk_size",))
    return _delta(q, k, v, beta, scale=scale, initial_state=initial_state,
                  output_final_state=output_final_state,
                  use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens,
                  chunk_size=kw.get("chunk_size"))


def fused_recurrent_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor | None = None,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """:func:`chunk_delta_rule` with fla's recurrent signature: beta None means ones, and beta may
    also be per value (B, T, H, V) (then the value columns run token by token through
    :func:`linattn.ops.delta.delta_rule_step`); ``scale`` must be positive (as fla)."""
    return _delta(q, k, v, beta, scale=scale,
                  initial_state=initial_state, output_final_state=output_final_state,
                  use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens,
                  per_value_beta=True, positive_scale=True)


def fused_chunk_delta_rule(**kwargs) -> tuple[Tensor, Tensor | None]:
    """Deprecated in fla (it raises there too): use :func:`chunk_delta_rule`."""
    raise NotImplementedError("fused_chunk_delta_rule is deprecated (in fla too); "
                              "use chunk_delta_rule")


def parallel_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    scale: float | None = None,
    output_attentions: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """:func:`chunk_delta_rule` from a zero state under fla's parallel name: returns (o, None).
    ``output_attentions=True`` (fla's materialised (B, H, T, T) matrix) is not supported."""
    if _flag("output_attentions", output_attentions):
        raise NotImplementedError("output_attentions: parallel_delta_rule's attention matrix is "
                                  "not supported by linattn.fla")
    return _delta(q, k, v, beta, scale=scale, initial_state=None,
                  output_final_state=False)


def chunk_gated_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    cu_seqlens_cpu: torch.LongTensor | None = None,
    chunk_indices: torch.LongTensor | None = None,
    cp_context: object | None = None,
    **kwargs,
) -> tuple[Tensor, Tensor | None]:
    """The gated delta rule (Gated DeltaNet):
    ``S_t = exp(g_t) S_{t−1} + β_t k_t (v_t − exp(g_t) S_{t−1}ᵀ k_t)ᵀ``, ``o_t = S_tᵀ(scale·q_t)``.

    fla's ``fla.ops.gated_delta_rule.chunk_gated_delta_rule``; runs
    :func:`linattn.ops.delta.delta_rule` with ``g``.

    Args:
        q, k: (B, T, H, K); v: (B, T, HV, V), HV a multiple of H (grouped value attention: value
            head j uses q/k head j // (HV // H)).
        g: (B, T, HV) log decays ≤ 0; with ``use_gate_in_kernel=True`` (a keyword here, as in
            fla) the raw input, and the decay is ``−exp(A_log)·softplus(g + dt_bias)``.
        beta: (B, T, HV); with ``use_beta_sigmoid_in_kernel`` logits (β = sigmoid(beta), times 2
            if ``allow_neg_eigval``).
        scale: default ``K**-0.5``. initial_state: (N, HV, K, V) ((N, HV, V, K) with
            ``state_v_first``) or None. output_final_state: return the final state.
        use_qk_l2norm_in_kernel: L2-normalise q and k first (x / sqrt(Σx² + 1e-6)).
        cu_seqlens: (N + 1,) packed sequences (B = 1); cu_seqlens_cpu, chunk_indices: ignored.
        cp_context: must be None (context parallelism is not supported).
        **kwargs: ``chunk_size`` (speed only), ``use_gate_in_kernel``, ``A_log`` (HV,),
            ``dt_bias`` (HV,), ``transpose_state_layout``.

    Returns:
        o (B, T, HV, V) in q's dtype; final state (N, HV, K, V) or None.
    """
    kw = _kwargs("chunk_gated_delta_rule", kwargs,
                 ("chunk_size", "use_gate_in_kernel", "A_log", "dt_bias", "transpose_state_layout"))
    svf = _state_v_first(state_v_first, kw)
    _no_cp(cp_context)
    if g is None and not kw.get("use_gate_in_kernel", False):
        raise ValueError("g: chunk_gated_delta_rule needs the gates (B, T, HV)")
    return _delta(q, k, v, beta, g=g, scale=scale,
                  initial_state=initial_state, output_final_state=output_final_state,
                  use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                  use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                  allow_neg_eigval=allow_neg_eigval,
                  use_gate_in_kernel=kw.get("use_gate_in_kernel", False), A_log=kw.get("A_log"),
                  dt_bias=kw.get("dt_bias"), state_v_first=svf, cu_seqlens=cu_seqlens,
                  chunk_size=kw.get("chunk_size"), gva=True)


def fused_recurrent_gated_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor | None = None,
    gk: Tensor | None = None,
    gv: Tensor | None = None,
    beta: Tensor | None = None,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    A_log: Tensor | None = None,
    dt_bias: Tensor | None = None,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    **kwargs,
) -> tuple[Tensor, Tensor | None]:
    """The gated delta rule with fla's recurrent signature — NB the order ``g, gk, gv, beta``:
    ``S ← exp(g_t)·diag(exp(gk_t))·S·diag(exp(gv_t))``, then ``S ← S + β_t k_t (v_t − Sᵀk_t)ᵀ``,
    ``o_t = Sᵀ(scale·q_t)``.

    fla's ``fla.ops.gated_delta_rule.fused_recurrent_gated_delta_rule``. g (B, T, HV),
    gk (B, T, HV, K), gv (B, T, HV, V): log decays ≤ 0 or None; beta (B, T, HV) or per value
    (B, T, HV, V), None means ones; the other arguments as :func:`chunk_gated_delta_rule`
    (``use_gate_in_kernel``, ``A_log``, ``dt_bias`` are named parameters here, as in fla).
    Runs :func:`linattn.ops.delta.delta_rule` (chunked) for scalar g and beta; with gk, gv or a
    per-value beta :func:`linattn.ops.delta.delta_rule_step` token by token (slower).
    ``**kwargs``: ``transpose_state_layout``. Returns (o (B, T, HV, V), final state or None)."""
    kw = _kwargs("fused_recurrent_gated_delta_rule", kwargs, ("transpose_state_layout",))
    svf = _state_v_first(state_v_first, kw)
    return _delta(q, k, v, beta, g=g, gk=gk, gv=gv,
                  scale=scale, initial_state=initial_state,
                  output_final_state=output_final_state,
                  use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                  use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                  allow_neg_eigval=allow_neg_eigval, use_gate_in_kernel=use_gate_in_kernel,
                  A_log=A_log, dt_bias=dt_bias, state_v_first=svf, cu_seqlens=cu_seqlens,
                  gva=True, per_value_beta=True)


#: fla's short names.
chunk_gdn = chunk_gated_delta_rule
fused_recurrent_gdn = fused_recurrent_gated_delta_rule
