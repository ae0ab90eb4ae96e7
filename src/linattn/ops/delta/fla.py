"""flash-linear-attention's delta-rule names (DeltaNet, Gated DeltaNet) on
:func:`linattn.delta_rule`; see :mod:`linattn.fla`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from linattn.ops._common import accumulation_dtype, all_finite, is_bool, nonfinite
from linattn.ops._fla import (
    _beta,
    _finish,
    _flag,
    _gate,
    _hf,
    _kwargs,
    _no_cp,
    _one_token_each,
    _qkv,
    _scale,
    _scan,
    _sequences,
    _state_v_first,
    _tensor,
)
from linattn.ops.delta import op as delta

__all__ = [
    "chunk_delta_rule",
    "fused_recurrent_delta_rule",
    "fused_chunk_delta_rule",
    "parallel_delta_rule",
    "chunk_gated_delta_rule",
    "fused_recurrent_gated_delta_rule",
    "chunk_gdn",
    "fused_recurrent_gdn",
    "chunk_kda",
    "fused_recurrent_kda",
]


# ----------------------------------------------------------------------------- delta rule


def _delta(q, k, v, beta, *, g=None, gk=None, gv=None, scale, initial_state,
           output_final_state, use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False,
           allow_neg_eigval=False, use_gate_in_kernel=False, A_log=None, dt_bias=None,
           state_v_first=False, cu_seqlens=None, chunk_size=None, gva=False, per_value_beta=False,
           positive_scale=False, lower_bound=None):
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
        if g is None and gk is None:
            raise ValueError("g: the raw gate input must be given when use_gate_in_kernel=True")
        if gk is not None:  # KDA: the per-key gate is the raw input
            gk = _gate_in_kernel("g", gk, A_log, dt_bias, lower_bound, (B, T, HV, K), q.dtype)
        else:
            g = _gate_in_kernel("g", g, A_log, dt_bias, lower_bound, (B, T, HV), q.dtype)
    g = _gate("g", g, (B, T, HV))
    gk = _gate("gk", gk, (B, T, HV, K))
    gv = _gate("gv", gv, (B, T, HV, V))
    if beta is None:
        beta = q.new_ones(B, T, HV)
    beta = _beta(beta, B, T, HV, V, per_value=per_value_beta, logits=sig)
    if sig:
        beta = torch.sigmoid(beta) * (2 if neg else 1)
    cu, S0 = _sequences(cu_seqlens, q, initial_state, HV, K, V, state_v_first)
    # grouped value attention (HV = G·H): the op reads q/k head j // G for value head j itself,
    # without copies, so q and k keep their H heads
    if gv is None and beta.dim() == 3 and _one_token_each(T, cu):
        # decoding: every sequence one token, the step on (N, H or HV, ·) views (the chunked
        # form would cost several times the step here); states (N, HV, K, V) as the step's
        n = q.shape[0] if cu is None else T
        if S0 is None:
            S0 = torch.zeros(n, HV, K, V, dtype=accumulation_dtype(q.dtype), device=q.device)
        o_t, S = delta.delta_rule_step(
            q.reshape(n, H, K), k.reshape(n, H, K), v.reshape(n, HV, V), beta.reshape(n, HV), S0,
            g_t=None if g is None else g.reshape(n, HV),
            gk_t=None if gk is None else gk.reshape(n, HV, K), scale=s, qk_l2norm=l2)
        o = o_t.view(B, T, HV, V)
        return o, (None if not output_final_state else
                   S.transpose(-1, -2).contiguous() if state_v_first else S)
    if beta.dim() == 3:  # per-key gates in chunks too; per-value gates there token by token
        o, S = delta.delta_rule(_hf(q), _hf(k), _hf(v), _hf(beta), _hf(g), gk=_hf(gk),
                                gv=_hf(gv), scale=s, initial_state=S0, return_state=True,
                                chunk_size=chunk_size, cu_seqlens=cu, qk_l2norm=l2)
    else:
        if HV != H:  # the per-value step expands q/k itself: give it one row per value head
            q, k = (x.repeat_interleave(HV // H, dim=2) for x in (q, k))
        step = _per_value_beta_step(delta.delta_rule_step, s, l2) if beta.dim() == 4 else \
            (lambda q_t, k_t, v_t, S, beta_t, **gates:
             delta.delta_rule_step(q_t, k_t, v_t, beta_t, S, scale=s, qk_l2norm=l2, **gates))
        o, S = _scan(step, _hf(q), _hf(k), _hf(v),
                     {"beta_t": _hf(beta), "g_t": _hf(g), "gk_t": _hf(gk), "gv_t": _hf(gv)},
                     S0, cu)
    return _finish(o, S, output_final_state, state_v_first)


def _gate_in_kernel(name: str, raw: object, A_log: object, dt_bias: object,
                    lower_bound: object, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
    """fla's ``use_gate_in_kernel=True``: the log decay from the raw gate input ``raw`` of
    ``shape`` ((B, T, HV) for Gated DeltaNet, (B, T, HV, K) for KDA), in the accumulation dtype:
    ``−exp(A_log)·softplus(raw + dt_bias)``, or with ``lower_bound`` (KDA's bounded gate)
    ``lower_bound·sigmoid(exp(A_log)·(raw + dt_bias))`` (A_log may then be None: factor 1).
    A_log (HV,); dt_bias (HV,) per head, or for KDA (HV·K,) or (HV, K)."""
    HV = shape[2]
    per_key = len(shape) == 4
    if A_log is None and lower_bound is None:
        raise ValueError("A_log: must be given when use_gate_in_kernel=True")
    raw = _tensor(name, raw, len(shape))
    if tuple(raw.shape) != shape:
        what = "(B, T, HV, K)" if per_key else "(B, T, HV)"
        raise ValueError(f"{name}: expected shape {what} = {shape}, got {tuple(raw.shape)}")
    acc = accumulation_dtype(dtype)
    raw = raw.to(acc)
    if dt_bias is not None:
        dt_bias = _finite_tensor("dt_bias", dt_bias, raw)
        if tuple(dt_bias.shape) == shape[2:]:
            pass
        elif per_key and tuple(dt_bias.shape) == (HV * shape[3],):
            dt_bias = dt_bias.view(shape[2:])
        else:
            want = f"(HV·K,) = {(HV * shape[3],)}" if per_key else f"(HV,) = {(HV,)}"
            raise ValueError(f"dt_bias: expected shape {want}, got {tuple(dt_bias.shape)}")
        raw = raw + dt_bias.to(acc)
    a = None
    if A_log is not None:
        A_log = _finite_tensor("A_log", A_log, raw)
        if tuple(A_log.shape) != (HV,):
            raise ValueError(f"A_log: expected shape (HV,) = {(HV,)}, got {tuple(A_log.shape)}")
        a = A_log.to(acc).exp()
        a = a.view(HV, 1) if per_key else a
    if lower_bound is None:
        return -a * F.softplus(raw)
    if is_bool(lower_bound) or not isinstance(lower_bound, numbers.Real) or not (
            -math.inf < float(lower_bound) < 0):
        raise ValueError(f"lower_bound: expected a finite negative number, got {lower_bound!r}")
    return float(lower_bound) * torch.sigmoid(raw if a is None else a * raw)


def _finite_tensor(name: str, x: object, like: Tensor) -> Tensor:
    """A floating-point parameter tensor (A_log, dt_bias) whose values are all finite: a nan
    there would otherwise surface as a nan gate, blamed on ``g``. Meta (no values to check)
    exactly when ``like`` (the raw gate) is."""
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor, got "
                        f"{x.dtype if isinstance(x, Tensor) else type(x).__name__}")
    if x.is_meta != like.is_meta:
        raise ValueError(f"{name}: expected a tensor on {like.device} (the inputs' device), "
                         f"got {x.device}: a meta tensor has no values to read")
    if not x.is_meta and not all_finite(x):
        raise ValueError(f"{name}: expected finite values, got {nonfinite(x)}")
    return x


def _decode(q: object, k: object, v: object, g: object, beta: object, scale: object,
            initial_state: object, output_final_state: object, l2norm: object,
            positive_scale: bool, gk: object = None) -> tuple[Tensor, Tensor | None] | None:
    """The front door's decoding step: fla-layout q, k (B, 1, H, K), v (B, 1, HV, V), g, beta
    (B, 1, HV) (g may be None), KDA's gk (B, 1, HV, K) or None, initial_state (B, HV, K, V)
    straight to the compiled step
    (:func:`linattn.ops.delta.op._plain_step`, no view made: (B, 1, H, ·) and (B, H, ·) are
    the same memory), or None for anything else, which then takes the general path (with its
    checks and their errors). A token costs the step's checks, not the chunked form's setup."""
    if not (type(q) is Tensor and q.ndim == 4 and type(initial_state) is Tensor
            and type(v) is Tensor and v.ndim == 4):
        return None
    B, T, H, K = q.shape
    if T != 1:
        return None
    if beta is None or not (output_final_state is True or output_final_state is False):
        return None  # (beta None means ones: the general path; fla's DeltaNet passes beta)
    if scale is None:
        s = K ** -0.5
    elif type(scale) is float and scale - scale == 0 and (scale > 0 or not positive_scale):
        s = scale
    else:
        return None  # any other scale: checked (and its error raised) by the general path
    out = delta._plain_step(q, k, v, beta, initial_state, g, s, l2norm, False,
                            (B, v.shape[2], K, v.shape[-1]), gk)
    if out is None:
        return None
    o, S = out
    return o, (S if output_final_state else None)


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
    **kwargs,
) -> tuple[Tensor, Tensor | None]:
    """:func:`chunk_delta_rule` with fla's recurrent signature: beta None means ones, and beta may
    also be per value (B, T, H, V) (then the value columns run token by token through
    :func:`linattn.ops.delta.delta_rule_step`); ``scale`` must be positive (as fla).
    ``**kwargs``: none taken (``head_first`` is a ValueError, other names a TypeError)."""
    if kwargs:
        _kwargs("fused_recurrent_delta_rule", kwargs)
    fast = _decode(q, k, v, None, beta, scale, initial_state, output_final_state,
                   use_qk_l2norm_in_kernel, True) if cu_seqlens is None else None
    if fast is not None:
        return fast
    return _delta(q, k, v, beta, scale=scale,
                  initial_state=initial_state, output_final_state=output_final_state,
                  use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens,
                  per_value_beta=True, positive_scale=True)


def fused_chunk_delta_rule(**kwargs) -> tuple[Tensor, Tensor | None]:
    """Deprecated in fla (it raises there too): use :func:`chunk_delta_rule`."""
    _kwargs("fused_chunk_delta_rule", kwargs, tuple(kwargs))  # head_first: the ValueError first
    raise NotImplementedError("fused_chunk_delta_rule is deprecated (in fla too); "
                              "use chunk_delta_rule")


def parallel_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    scale: float | None = None,
    output_attentions: bool = False,
    **kwargs,
) -> tuple[Tensor, Tensor | None]:
    """:func:`chunk_delta_rule` from a zero state under fla's parallel name: returns (o, None).
    ``output_attentions=True`` (fla's materialised (B, H, T, T) matrix) is not supported.
    ``**kwargs``: none taken (``head_first`` is a ValueError, other names a TypeError)."""
    _kwargs("parallel_delta_rule", kwargs)
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
    Runs :func:`linattn.ops.delta.delta_rule` for a beta per head (chunked for g and gk; gv
    there token by token); a per-value beta :func:`linattn.ops.delta.delta_rule_step` token by
    token (slower).
    ``**kwargs``: ``transpose_state_layout``. Returns (o (B, T, HV, V), final state or None)."""
    kw = _kwargs("fused_recurrent_gated_delta_rule", kwargs, ("transpose_state_layout",)) \
        if kwargs else kwargs
    svf = _state_v_first(state_v_first, kw)
    if (gk is None and gv is None and cu_seqlens is None and svf is False
            and use_gate_in_kernel is False and use_beta_sigmoid_in_kernel is False
            and allow_neg_eigval is False):
        fast = _decode(q, k, v, g, beta, scale, initial_state, output_final_state,
                       use_qk_l2norm_in_kernel, False)
        if fast is not None:
            return fast
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


# ----------------------------------------------------------------------------- KDA


def _kda_options(return_intermediate_states: object, safe_gate: object,
                 use_gate_in_kernel: object, lower_bound: object, cp_context: object) -> None:
    """What fla's KDA takes that changes nothing here, checked as fla checks it."""
    _no_cp(cp_context)
    if _flag("return_intermediate_states", return_intermediate_states):
        raise NotImplementedError("return_intermediate_states: the per-chunk states (vLLM's "
                                  "inference hint) are not returned by linattn.fla")
    if (_flag("safe_gate", safe_gate) and _flag("use_gate_in_kernel", use_gate_in_kernel)
            and lower_bound is None):
        raise ValueError("lower_bound: must be given when safe_gate=True and "
                         "use_gate_in_kernel=True (as in fla)")


def chunk_kda(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    safe_gate: bool = False,
    lower_bound: float | None = None,
    disable_recompute: bool = False,
    return_intermediate_states: bool = False,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    cu_seqlens_cpu: torch.LongTensor | None = None,
    cp_context: object | None = None,
    use_graph: bool = False,
    max_num_seqs: int | None = None,
    **kwargs,
) -> tuple[Tensor, Tensor | None]:
    """Kimi Delta Attention: the gated delta rule with a gate per key dimension,
    ``S_t = diag(exp(g_t)) S_{t−1} + β_t k_t (v_t − (diag(exp(g_t)) S_{t−1})ᵀ k_t)ᵀ``,
    ``o_t = S_tᵀ(scale·q_t)``.

    fla's ``fla.ops.kda.chunk_kda``; runs :func:`linattn.ops.delta.delta_rule` with ``gk``.

    Args:
        q, k: (B, T, H, K); v: (B, T, HV, V), HV a multiple of H (grouped value attention).
        g: (B, T, HV, K) log decays ≤ 0; with ``use_gate_in_kernel=True`` the raw input, and the
            decay is ``−exp(A_log)·softplus(g + dt_bias)``, or with ``lower_bound``
            ``lower_bound·sigmoid(exp(A_log)·(g + dt_bias))`` (A_log may then be None).
        beta: (B, T, HV); logits with ``use_beta_sigmoid_in_kernel`` (times 2 with
            ``allow_neg_eigval``).
        scale: default ``K**-0.5``. initial_state: (N, HV, K, V) ((N, HV, V, K) with
            ``state_v_first``) or None. output_final_state: return the final state.
        use_qk_l2norm_in_kernel: L2-normalise q and k first (x / sqrt(Σx² + 1e-6)).
        safe_gate: needs ``lower_bound`` with ``use_gate_in_kernel`` (as fla); else a speed
            hint. disable_recompute, use_graph, max_num_seqs, cu_seqlens_cpu: GPU hints, unused.
        return_intermediate_states: True raises NotImplementedError.
        cp_context: must be None (context parallelism is not supported).
        **kwargs: ``A_log`` (HV,), ``dt_bias`` (HV·K,) or (HV, K), ``chunk_size`` (speed only),
            ``transpose_state_layout``; other names are ignored.

    Returns:
        o (B, T, HV, V) in q's dtype; final state (N, HV, K, V) or None.
    """
    kw = _kwargs("chunk_kda", kwargs, ("A_log", "dt_bias", "chunk_size"))
    svf = _state_v_first(state_v_first, kw)
    _kda_options(return_intermediate_states, safe_gate, use_gate_in_kernel, lower_bound,
                 cp_context)
    if g is None:
        raise ValueError("g: chunk_kda needs the gates (B, T, HV, K)")
    return _delta(q, k, v, beta, gk=g, scale=scale, initial_state=initial_state,
                  output_final_state=output_final_state,
                  use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                  use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                  allow_neg_eigval=allow_neg_eigval, use_gate_in_kernel=use_gate_in_kernel,
                  A_log=kw.get("A_log"), dt_bias=kw.get("dt_bias"), lower_bound=lower_bound,
                  state_v_first=svf, cu_seqlens=cu_seqlens, chunk_size=kw.get("chunk_size"),
                  gva=True)


def fused_recurrent_kda(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    A_log: Tensor | None = None,
    dt_bias: Tensor | None = None,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    lower_bound: float | None = None,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    **kwargs,
) -> tuple[Tensor, Tensor | None]:
    """:func:`chunk_kda` with fla's recurrent signature (``A_log``, ``dt_bias`` named here, as
    in fla): g (B, T, HV, K); beta (B, T, HV) or per value (B, T, HV, V) (token by token), None
    means ones. A decoding step (T = 1) runs :func:`linattn.ops.delta.delta_rule_step`.
    ``**kwargs``: ``transpose_state_layout``; fla's serving arguments (``ssm_state_indices``,
    ``num_accepted_tokens``, ``inplace_final_state``, ``out``) are ignored. Returns
    (o (B, T, HV, V), final state or None)."""
    kw = _kwargs("fused_recurrent_kda", kwargs)
    svf = _state_v_first(state_v_first, kw)
    if g is None:
        raise ValueError("g: fused_recurrent_kda needs the gates (B, T, HV, K)")
    if (cu_seqlens is None and svf is False and use_gate_in_kernel is False
            and use_beta_sigmoid_in_kernel is False and allow_neg_eigval is False):
        fast = _decode(q, k, v, None, beta, scale, initial_state, output_final_state,
                       use_qk_l2norm_in_kernel, False, gk=g)
        if fast is not None:
            return fast
    return _delta(q, k, v, beta, gk=g, scale=scale, initial_state=initial_state,
                  output_final_state=output_final_state,
                  use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                  use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                  allow_neg_eigval=allow_neg_eigval, use_gate_in_kernel=use_gate_in_kernel,
                  A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound, state_v_first=svf,
                  cu_seqlens=cu_seqlens, gva=True, per_value_beta=True)
