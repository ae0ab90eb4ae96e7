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
    check_chunk_size,
    check_flag,
    check_qkv,
    check_step_inputs,
    needs_grad,
    split_scale,
)
from linattn.ops._library import lean_step_dtype, lean_step_scale, takes_inference_tensors, tracing
from linattn.ops.dispatch import Choice
from linattn.ops.gated import native as gated_native
from linattn.ops.gated.chunk import (
    check_gate,
    checked_tensor,
    decayed,
    initial_state_for,
    portable_prefill,
    resolve_scale,
)
from linattn.ops.varlen import check_cu_seqlens

__all__ = ["gated_linear_attention", "gated_linear_attention_step", "portable_prefill", "OP"]

#: The op's name in the dispatcher; its forms are "prefill", "prefill fwd+bwd" (the call wants
#: gradients) and "step".
OP = "gated_linear_attention"


@takes_inference_tensors()
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
    if tracing(q, k, v):
        return _checked(q, k, v, g, gk, scale, initial_state, return_state, chunk_size,
                        cu_seqlens)
    # a small call's torch operations (the gates' value checks, casts, state copies) on one
    # thread, as its kernels: the compiled op's rule, whichever backend runs
    with gated_native.one_thread(q, k, v):
        return _checked(q, k, v, g, gk, scale, initial_state, return_state, chunk_size,
                        cu_seqlens)


def _checked(q, k, v, g, gk, scale, initial_state, return_state, chunk_size, cu_seqlens):
    *batch, T, K = q.shape
    V = v.shape[-1]
    g = check_gate(g, "g", (*batch, T), q)
    gk = check_gate(gk, "gk", (*batch, T, K), q)
    s = resolve_scale(scale, K, q.dtype)
    C = check_chunk_size(chunk_size, dispatch.policy().chunk_size)
    return_state = check_flag(return_state, "return_state")
    cu = None if cu_seqlens is None else check_cu_seqlens(cu_seqlens, q)
    states = (*batch, K, V) if cu is None else (len(cu) - 1, *batch[1:], K, V)
    S0 = initial_state_for(initial_state, "initial_state", states, q)
    traced = tracing(q, k, v, g, gk, initial_state)
    grad = needs_grad(q, k, v, g, gk, initial_state)
    choice = dispatch.select(OP, "prefill fwd+bwd" if grad else "prefill", q.dtype,
                             q.device.type, grad, _traits(V), None if traced else T, traced)
    s, p = split_scale(s)
    o, S = _prefill(choice, q, k, v, g, gk, s, S0, cu, grad, C)
    o = o if p == 1.0 else o * p
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


@takes_inference_tensors()
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
    if gv_t is None:
        fast = _plain_step(q_t, k_t, v_t, state, g_t, gk_t, scale)
        if fast is not None:
            return fast
    check_step_inputs(q_t, k_t, v_t)
    *batch, K = q_t.shape
    V = v_t.shape[-1]
    S = initial_state_for(state, "state", (*batch, K, V), q_t)
    s, p = split_scale(resolve_scale(scale, K, q_t.dtype))
    if p != 1.0:
        o, S = gated_linear_attention_step(q_t, k_t, v_t, state, g_t=g_t, gk_t=gk_t, gv_t=gv_t,
                                           scale=s)
        return o * p, S
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
        return gated_native.gla_step(q_t, k_t, v_t, g_t, gk_t, S, s, choice.isa)
    return _torch_step(q_t, k_t, v_t, S, g_t, gk_t, gv_t, s)


def _torch_step(q_t: Tensor, k_t: Tensor, v_t: Tensor, S: Tensor, g_t: Tensor | None,
                gk_t: Tensor | None, gv_t: Tensor | None, s: float) -> tuple[Tensor, Tensor]:
    """The step in torch operations, on checked arguments (S in the accumulation dtype)."""
    acc = S.dtype
    S = decayed(S, g_t, gk_t, gv_t, q_t)
    S = S + k_t.to(acc).unsqueeze(-1) * v_t.to(acc).unsqueeze(-2)
    o = ((q_t.to(acc) * s).unsqueeze(-2) @ S).squeeze(-2)
    return o.to(q_t.dtype), S


def _plain_step(q_t: object, k_t: object, v_t: object, state: object, g_t: object,
                gk_t: object, scale: object, state_shape: tuple[int, ...] | None = None
                ) -> tuple[Tensor, Tensor] | None:
    """The common decoding step, straight to the compiled kernel, or None when the call is
    anything else (then the general checks run, and they raise the errors): the inputs as
    :func:`linattn.ops._library.lean_step_dtype` takes them, q_t, k_t and gk_t (..., K), v_t
    (..., V) with V a multiple of 16, g_t (...), the state (..., K, V) given, or of
    ``state_shape``, a shape with the same elements in the same order (fla's front door passes
    its (B, 1, H, ·) tensors and (B, H, K, V) state as they are), a float scale, and the
    dispatcher choosing the compiled backend. The gates' values are checked by the kernel,
    before it writes anything."""
    if q_t is None or k_t is None or v_t is None:
        return None
    dt = lean_step_dtype((q_t, k_t, v_t, g_t, gk_t), state)
    if dt is None:
        return None
    shape = q_t.shape
    if not shape or k_t.shape != shape:
        return None
    batch, K = shape[:-1], shape[-1]
    V = v_t.shape[-1]
    if not (K and V and V % gated_native.V_MULTIPLE == 0 and v_t.shape[:-1] == batch
            and (g_t is None or g_t.shape == batch) and (gk_t is None or gk_t.shape == shape)
            and state.shape == ((*batch, K, V) if state_shape is None else state_shape)):
        return None
    s = lean_step_scale(scale, K)
    if s is None:
        return None
    fns = dispatch.step_kernels(OP, dt, gated_native.kernels_here, _PLAIN_TRAITS)
    if fns is None:
        return None
    o, S_out = torch.empty_like(v_t), torch.empty_like(state)
    if gated_native.step_into(fns, q_t, k_t, v_t, g_t, gk_t, state, S_out, o, s):
        return None  # refused a gate's value (nothing written): the general checks say which
    return o, S_out


#: The traits of a step the compiled backend takes (as :func:`_traits` spells them).
_PLAIN_TRAITS = ("V:16",)


# ------------------------------------------------------------------------------- backends
dispatch.register_compiled(
    OP, gated_native.unavailable, differentiable=True,
    accepts=lambda traits: "needs V a multiple of 16" if "V:16" not in traits
    else "has no per-value gates" if "gates:v" in traits
    else "has no gradient for the decoding step" if "step:grad" in traits else None)

#: The calibration problems, float32, K = V = 64, scalar gates (the case where the chunked
#: torch form is fastest): a prefill of 4 heads × 512 tokens, forward and forward + backward,
#: and 10 decoding steps of 16 heads (a few tens of ms in all).
CALIBRATION = {"prefill": (4, 512, 64), "prefill fwd+bwd": (4, 512, 64), "step": (16, 1, 64)}


def _problem(form: str, sizes: tuple[int, int, int], gen: torch.Generator):
    N, T, d = sizes
    f32 = torch.float32
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
    return dispatch.decoding_steps(
        lambda isa: gated_native.gla_step(q, k, v, g, None, S, s, isa),
        lambda: _torch_step(q, k, v, S, g, None, None, s))


dispatch.register_problems(OP, CALIBRATION, _problem)
