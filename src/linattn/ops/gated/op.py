r"""Gated linear attention: a state that decays per token (RetNet, GLA, Mamba-2-style gates).

The recurrence, for one batch slice (usually one head), with log-gates ``g_t ≤ 0`` (a scalar
per token) and ``gk_t ∈ (−∞, 0]^K`` (one per key dimension, GLA):

.. math::
    S_t = e^{g_t}\,\mathrm{diag}(e^{gk_t})\,S_{t-1} + k_t v_t^\top, \qquad
    o_t = S_t^\top (s\,q_t),

S: (K, V), s the scale (default ``K**-0.5``). This is the convention of flash-linear-attention
(no feature map, no normaliser): q and k are used as given, the caller applies any map. RetNet's
fixed decay is the constant ``g_t = log γ``; :mod:`linattn.ops.decay` (φ features, normalised)
is that case run through this module's chunked form with the values extended by a column of
ones.

Four forms, held together by tests (``tests/ops/gated/``):

* :func:`gated_linear_attention` — the chunked parallel form (chunk size C). With
  ``b_i = Σ_{t≤i} g_t`` inside a chunk, row i sees key j of the same chunk through
  ``exp(b_i − b_j)``, computed as the *segment sum* ``Σ_{j<t≤i} g_t`` (:func:`segsum`) so that
  no two large cumulative sums are subtracted and a gate of −∞ (a hard reset) gives 0, not nan;
  the state carried into the chunk reaches row i scaled by ``exp(b_i)``; the state after the
  chunk is ``exp(b_{C−1}) S + Σ_j exp(Σ_{j<t<C} g_t) k_j v_jᵀ``. Every exponent is ≤ 0.
  O(T·C·(K + V) + T·K·V). Per-key gates use a (K, C, C) segment sum per chunk, one chunk at a
  time (memory O(B·H·K·C²), not O(T·K·C)).
* :mod:`linattn.ops.gated.native` — the recurrence itself, compiled (``kernels.c``): forward
  and backward (the reverse recurrence of the state's gradient through states recomputed from
  one checkpoint per chunk, docs/theory.md §10), float32 on CPU, V a multiple of 16; and the
  decoding step. The dispatcher (:mod:`linattn.ops.dispatch`, op "gated_linear_attention",
  forms "prefill", "prefill fwd+bwd", "step") takes it where the calibration measured it
  faster; the chunked form is the "portable" backend.
* :func:`gated_linear_attention_step` — the recurrence, one token, also with a per-value gate
  ``gv`` (``S ← S·diag(e^{gv})``, what fla's ``fused_recurrent_*`` functions accept).
* :func:`linattn.reference.gated_linear_attention` — the sequential float64 loop.

Variable-length packed batches: ``cu_seqlens`` (N + 1 cumulative lengths, batch dimension 1, as
flash-linear-attention takes them) run N independent sequences (:mod:`linattn.ops.varlen`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.ops import dispatch
from linattn.ops._common import (
    accumulation_dtype,
    check_chunk_size,
    check_flag,
    check_qkv,
    check_scale,
    check_step_inputs,
    check_values,
    needs_grad,
    to_chunks,
)
from linattn.ops._library import tracing
from linattn.ops.dispatch import Backend, Choice
from linattn.ops.gated import native as gated_native
from linattn.ops.native import one_thread_when_small
from linattn.ops.varlen import check_cu_seqlens, packed, unpacked

__all__ = [
    "gated_linear_attention",
    "gated_linear_attention_step",
    "segsum",
    "check_gate",
    "initial_state_for",
    "decayed",
    "portable_prefill",
    "OP",
]

#: The op's name in the dispatcher; its forms are "prefill", "prefill fwd+bwd" (the call wants
#: gradients) and "step".
OP = "gated_linear_attention"


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
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor, got {x.dtype}")
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
    check_values(gate <= 0,  # nan fails the comparison too
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


def resolve_scale(scale: float | None, K: int) -> float:
    """``scale`` or the default ``K**-0.5``; TypeError unless a real number (NumPy numbers
    taken, bools refused), ValueError unless finite (:func:`linattn.ops._common.check_scale`)."""
    return check_scale(scale, K)


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


@one_thread_when_small(gated_native.PARALLEL_MIN)
def gated_linear_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor | None = None,
    gk: Tensor | None = None,
    *,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    return_state: bool = False,
    chunk_size: int | None = None,
    cu_seqlens: Tensor | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """Causal gated linear attention, chunked parallel form (module docstring for the maths).

    Args:
        q, k: (..., T, K); v: (..., T, V). Leading dimensions usually (B, H).
        g: (..., T) log-gates ≤ 0, one per token (scalar / "simple" GLA, retention); None: 0.
        gk: (..., T, K) log-gates ≤ 0, one per key dimension (GLA); None: 0. Both may be given.
        scale: the query scale s (default ``K**-0.5``).
        initial_state: (..., K, V), the state after an earlier prefix (zeros if None); with
            ``cu_seqlens``, (N, ..., K, V) one per sequence (the batch dimension of q is 1).
        return_state: also return the state after the last token.
        chunk_size: C (default the policy's, :data:`linattn.ops.dispatch.DEFAULT_CHUNK_SIZE`).
        cu_seqlens: (N + 1,) integer cumulative sequence lengths of a packed batch (q of shape
            (1, ..., T, K) with T = cu_seqlens[-1]); each sequence starts from its own state.

    Returns:
        o: (..., T, V) in q's dtype; with ``return_state`` also the final state (..., K, V)
        ((N, ..., K, V) with ``cu_seqlens``) in float32 (float64 for float64 inputs).
    """
    check_qkv(q, k, v, same_length=True)
    *batch, T, K = q.shape
    V = v.shape[-1]
    g = check_gate(g, "g", (*batch, T), q)
    gk = check_gate(gk, "gk", (*batch, T, K), q)
    s = resolve_scale(scale, K)
    C = check_chunk_size(chunk_size, dispatch.policy().chunk_size)
    return_state = check_flag(return_state, "return_state")
    cu = None if cu_seqlens is None else check_cu_seqlens(cu_seqlens, q)
    states = (*batch, K, V) if cu is None else (len(cu) - 1, *batch[1:], K, V)
    S0 = initial_state_for(initial_state, "initial_state", states, q)
    traced = tracing(q, k, v, g, gk, initial_state)
    grad = needs_grad(q, k, v, g, gk, initial_state)
    choice = dispatch.select(OP, "prefill fwd+bwd" if grad else "prefill", q.dtype,
                             q.device.type, grad, _traits(V), None if traced else T, traced)
    o, S = _prefill(choice, q, k, v, g, gk, s, S0, cu, grad, C)
    return (o, S) if return_state else o


def _traits(V: int, per_value_gate: bool = False, step_grad: bool = False) -> tuple[str, ...]:
    """What the backends ask of a call beyond dtype, device and gradients."""
    traits = ("V:16",) if V and V % gated_native.V_MULTIPLE == 0 else ()
    if per_value_gate:
        traits += ("gates:v",)
    return (*traits, "step:grad") if step_grad else traits


def _prefill(choice: Choice, q: Tensor, k: Tensor, v: Tensor, g: Tensor | None,
             gk: Tensor | None, s: float, S0: Tensor, cu: Tensor | None, grad: bool, C: int
             ) -> tuple[Tensor, Tensor]:
    """The chosen backend on checked arguments (g, gk, S0 in the accumulation dtype)."""
    if choice.backend == "native":
        return gated_native.gla_prefill(q, k, v, g, gk, S0, cu, s, grad, choice.isa)
    return portable_prefill(q, k, v, g, gk, s, S0, cu, C)


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
        return (out + torch.stack(inter, dim=-3)).reshape(*batch, n * C, -1)[..., :T, :], S
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


def gated_linear_attention_step(
    q_t: Tensor,
    k_t: Tensor,
    v_t: Tensor,
    state: Tensor | None = None,
    *,
    g_t: Tensor | None = None,
    gk_t: Tensor | None = None,
    gv_t: Tensor | None = None,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    """One decoding step: ``S ← e^{g}·diag(e^{gk})·S·diag(e^{gv}) + k_t v_tᵀ``, ``o_t = Sᵀ(s·q_t)``.

    q_t, k_t: (..., K); v_t: (..., V); state (..., K, V) or None (zeros); g_t (...),
    gk_t (..., K), gv_t (..., V) log-gates ≤ 0 or None. Returns o_t (..., V) in q_t's dtype and
    the new state (float32, or float64 for float64 inputs); the old state is untouched."""
    check_step_inputs(q_t, k_t, v_t)
    *batch, K = q_t.shape
    V = v_t.shape[-1]
    S = initial_state_for(state, "state", (*batch, K, V), q_t)
    traced = tracing(q_t, k_t, v_t, state, g_t, gk_t, gv_t)
    grad = needs_grad(q_t, k_t, v_t, state, g_t, gk_t, gv_t)
    choice = dispatch.select(OP, "step", q_t.dtype, q_t.device.type, grad,
                             _traits(V, gv_t is not None, grad), None, traced)
    if choice.backend == "native":
        # shapes here; the gates' values (nan, > 0) are checked by the kernel, which costs
        # nothing there and a tensor reduction here (a good part of a decoding step)
        if g_t is not None:
            checked_tensor(g_t, "g_t", tuple(batch), q_t)
            g_t = g_t if g_t.dtype == torch.float32 else g_t.float()
        if gk_t is not None:
            checked_tensor(gk_t, "gk_t", (*batch, K), q_t)
            gk_t = gk_t if gk_t.dtype == torch.float32 else gk_t.float()
        return gated_native.gla_step(q_t, k_t, v_t, g_t, gk_t, S, resolve_scale(scale, K),
                                     choice.isa)
    acc = S.dtype
    S = decayed(S, g_t, gk_t, gv_t, q_t)
    S = S + k_t.to(acc).unsqueeze(-1) * v_t.to(acc).unsqueeze(-2)
    o = ((q_t.to(acc) * resolve_scale(scale, K)).unsqueeze(-2) @ S).squeeze(-2)
    return o.to(q_t.dtype), S


# ------------------------------------------------------------------------------- backends
dispatch.register(Backend(
    OP, "native", compiled=True, devices=("cpu",),
    dtypes=(torch.float32, torch.bfloat16, torch.float16), grad_dtypes=(torch.float32,),
    available=gated_native.unavailable,
    accepts=lambda traits: "needs V a multiple of 16" if "V:16" not in traits
    else "has no per-value gates" if "gates:v" in traits
    else "has no gradient for the decoding step" if "step:grad" in traits else None))
dispatch.register(Backend(OP, "portable"))

#: The calibration problems, float32, K = V = 64, scalar gates (the case where the chunked
#: torch form is fastest): a prefill of 4 heads × 512 tokens, forward and forward + backward,
#: and 10 decoding steps of 16 heads (a few tens of ms in all).
CALIBRATION = {"prefill": (4, 512, 64), "prefill fwd+bwd": (4, 512, 64), "step": (16, 1, 64)}


def _problem(form: str):
    def build():
        N, T, d = CALIBRATION[form]
        gen = torch.Generator().manual_seed(0)
        f32 = torch.float32  # whatever the default dtype of the triggering call
        q, k, v = (torch.randn(1, N, T, d, generator=gen, dtype=f32) for _ in range(3))
        g = torch.nn.functional.logsigmoid(torch.randn(1, N, T, generator=gen, dtype=f32))
        s, C = d ** -0.5, dispatch.DEFAULT_CHUNK_SIZE
        if form != "step":
            backward = form == "prefill fwd+bwd"
            S0 = torch.zeros(1, N, d, d, dtype=f32)

            def run(choice: Choice):
                def once():
                    xs = [x.detach().requires_grad_(backward) for x in (q, k, v, g)]
                    with torch.set_grad_enabled(backward):
                        o, _ = _prefill(choice, *xs[:3], xs[3], None, s, S0, None, backward, C)
                        if backward:
                            o.sum().backward()
                return once
            return run
        S = torch.randn(1, N, d, d, generator=gen, dtype=f32) * 0.1
        q, k, v, g = (t[:, :, 0] for t in (q, k, v, g))

        def run(choice: Choice):
            def steps():
                for _ in range(10):
                    if choice.backend == "native":
                        gated_native.gla_step(q, k, v, g, None, S, s, choice.isa)
                    else:
                        S1 = decayed(S, g, None, None, q) + k.unsqueeze(-1) * v.unsqueeze(-2)
                        (q * s).unsqueeze(-2) @ S1
            return steps
        return run

    return build


dispatch.register_calibration(OP, {form: _problem(form) for form in CALIBRATION})
