r"""The delta rule and the gated delta rule (DeltaNet, Gated DeltaNet).

For one batch slice (usually one head), state S: (K, V), strengths ``β_t`` and log-gates
``g_t ≤ 0`` (0 gives the ungated delta rule):

.. math::
    S_t = e^{g_t} S_{t-1} + k_t\,\beta_t\,(v_t - e^{g_t} S_{t-1}^\top k_t)^\top
        = e^{g_t} S_{t-1}(I - \beta_t k_t k_t^\top) + \beta_t k_t v_t^\top
    \quad\text{(in the (V, K) layout of the papers)}, \qquad o_t = S_t^\top (s\,q_t).

Each token writes the value it carries and erases what the state predicted for its key: a
learned online regression, not the sum of linear attention. With ``qk_l2norm=True`` q and k are
divided by their L2 norm first (``x / sqrt(Σx² + 1e-6)``), as the published models do, which
keeps ``I − β k kᵀ`` a contraction for β ∈ (0, 2).

Three forms, held together by tests in float64 (``tests/ops/delta/test_op.py``):

* :func:`delta_rule` — the chunked parallel form (the WY / UT-transform representation). Inside
  a chunk of C tokens with decays ``Γ[i, j] = exp(Σ_{j<t≤i} g_t)`` (a segment sum,
  :func:`linattn.ops.gated.segsum`) and ``γ_i = Γ[i, −1]`` from the chunk start, the
  pseudo-values ``u_i = β_i (v_i − (e^{g_i} S_{i−1})ᵀ k_i)`` solve the unit lower-triangular
  system

  .. math::
      (I + \mathrm{tril}(\mathrm{diag}(\beta)\,(K K^\top \odot \Gamma), -1))\,U
      = \mathrm{diag}(\beta) V - \mathrm{diag}(\beta\gamma) K S_0,

  so ``U = Ũ − W S_0`` with ``Ũ`` and ``W`` from one triangular solve per chunk, all chunks at
  once; then ``O = diag(γ) Q S_0 + (Q Kᵀ ⊙ Γ) U`` and ``S_C = γ_C S_0 + (K ⊙ Γ[C−1, :])ᵀ U``.
  Only the last three products walk the chunks in order. O(T·C·(K + V) + T·K·V), memory
  O(T·C) beside the inputs.
  Per-key gates ``gk`` (Kimi Delta Attention) have a chunked form of their own, with per-key
  segment sums (:mod:`linattn.ops.delta.kda`); per-value gates ``gv`` run token by token.
* :func:`delta_rule_step` — one token, also with fla's per-key (``gk``) and per-value (``gv``)
  gates applied to S before the update.
* :func:`linattn.reference.delta_rule` — the sequential float64 loop.

Grouped value attention (GVA, the layers of Qwen3-Next and Kimi Linear): q and k may have H
heads while v, β, the gates and the state have HV = G·H (the heads dimension is the one before
T, or before the last one in the step); value head j reads q/k head j // G (fla's and
transformers' convention: consecutive value heads share a q/k head). The compiled kernels read
the shared q/k rows in place (:mod:`linattn.ops.delta.native`); the torch forms repeat them.

The compiled backend (:mod:`linattn.ops.delta.native`) takes the prefill and the step without
gates, with a scalar gate, with per-key gates ``gk`` (with or without ``g``) and GVA, forward
only for ``gk``: a call that wants gradients with ``gk``, or that has per-value gates ``gv``,
takes the torch forms.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from linattn.ops import dispatch
from linattn.ops._common import (
    accumulation_dtype,
    check_chunk_size,
    check_dense,
    check_flag,
    check_own_memory,
    check_qkv,
    check_range,
    check_step_inputs,
    needs_grad,
    nonfinite,
    split_scale,
)
from linattn.ops._library import lean_step_dtype, lean_step_scale, takes_inference_tensors, tracing
from linattn.ops.delta import native as delta_native
from linattn.ops.delta.chunk import L2_EPS, grouped, l2_normalised, torch_prefill, torch_step
from linattn.ops.dispatch import Choice
from linattn.ops.gated.chunk import (
    check_gate,
    checked_tensor,
    initial_state_for,
    resolve_scale,
)
from linattn.ops.varlen import check_cu_seqlens

__all__ = ["delta_rule", "delta_rule_step", "l2_normalised", "L2_EPS", "check_beta", "OP"]

#: The op's name in the dispatcher; its forms are "prefill" and "prefill fwd+bwd" (delta_rule
#: without and with gradients wanted) and "step".
OP = "delta_rule"

def check_beta(beta: object, name: str, shape: tuple[int, ...], like: Tensor) -> Tensor:
    """β of exactly ``shape`` in the accumulation dtype; errors name ``name``: a nan or ±inf
    β turns every later output into nan."""
    checked_tensor(beta, name, shape, like)
    check_range(beta, -math.inf, math.inf, f"{name}: expected finite values",
                lambda: f", got {nonfinite(beta)}", open_ends=True)
    return beta.to(accumulation_dtype(like.dtype))


def check_heads(q: object, k: object, v: object, dim: int, names: tuple[str, str, str]
                ) -> int:
    """G = HV / H for q, k with H heads and v with HV (dimension ``dim``: -3 in a prefill, -2 in
    a step), after the usual checks of q, k, v (:func:`linattn.ops._common.check_qkv` on v's
    first H heads); ValueError naming v unless HV is a multiple of H and v's other dimensions
    match q's. 1 where the heads agree (or there is no heads dimension)."""
    for name, t in zip(names, (q, k, v), strict=True):
        if isinstance(t, Tensor):
            check_dense(t, name)
    if not (isinstance(q, Tensor) and isinstance(v, Tensor) and q.dim() >= -dim
            and v.dim() == q.dim() and q.shape[dim] != v.shape[dim]):
        return 1
    qn, kn, vn = names
    H, HV = q.shape[dim], v.shape[dim]
    if H == 0 or HV % H:
        raise ValueError(
            f"{vn}: expected a number of value heads (dimension {dim}) that is a multiple of "
            f"the {H} heads of {qn} and {kn} (grouped value attention: HV = G·H, value head j "
            f"reads head j // G), got {HV} ({vn} {tuple(v.shape)}, {qn} {tuple(q.shape)})")
    if isinstance(k, Tensor) and k.shape[:-1] != q.shape[:-1]:
        raise ValueError(f"{kn}: shape {tuple(k.shape)} does not match {qn} {tuple(q.shape)} "
                         "before the last dimension (q and k share their heads)")
    if v.shape[:dim] + v.shape[dim + 1:-1] != q.shape[:dim] + q.shape[dim + 1:-1]:
        raise ValueError(
            f"{vn}: shape {tuple(v.shape)} does not match {qn} {tuple(q.shape)} apart from the "
            f"heads (dimension {dim}) and the last dimension")
    return HV // H


@takes_inference_tensors()
def delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    g: Tensor | None = None,
    gk: Tensor | None = None,
    gv: Tensor | None = None,
    *,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    return_state: bool = False,
    chunk_size: int | None = None,
    cu_seqlens: Tensor | None = None,
    qk_l2norm: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Causal (gated) delta rule, chunked parallel form (module docstring for the maths).

    Args:
        q, k: (..., H, T, K); v: (..., HV, T, V), usually (B, H, T, K) and (B, HV, T, V).
            HV = G·H with G ≥ 1 (grouped value attention: value head j reads q/k head
            j // G; G = 1, the usual case, gives every dimension before T equal); any other
            leading dimensions must match.
        beta: (..., HV, T) write strengths (usually sigmoid outputs, in (0, 1); (0, 2) allows
            negative eigenvalues).
        g: (..., HV, T) log-gates ≤ 0 (the gated delta rule); None: the plain delta rule.
        gk: (..., HV, T, K) per-key log-gates ≤ 0 (Kimi Delta Attention:
            ``S ← diag(e^{gk}) S`` before the update), −∞ allowed (a reset); the compiled
            kernel without gradients, else chunked in chunks of at most
            :data:`linattn.ops.delta.kda.KDA_CHUNK` tokens (:mod:`linattn.ops.delta.kda`).
        gv: (..., HV, T, V) per-value log-gates ≤ 0 (``S ← S diag(e^{gv})``): token by token.
        scale: the query scale s (default ``K**-0.5``).
        initial_state: (..., HV, K, V) (zeros if None); with ``cu_seqlens``,
            (N, ..., HV, K, V).
        return_state: also return the state after the last token.
        chunk_size: C (default the policy's, :data:`linattn.ops.dispatch.DEFAULT_CHUNK_SIZE`).
        cu_seqlens: (N + 1,) cumulative lengths of a packed batch (q (1, ..., T, K),
            v (1, ..., T, V)).
        qk_l2norm: L2-normalise q and k along K first.

    Returns:
        o: (..., HV, T, V) in q's dtype; with ``return_state`` also the final state
        (..., HV, K, V) ((N, ..., HV, K, V) with ``cu_seqlens``) in float32 (float64 for
        float64 inputs).
    """
    G = check_heads(q, k, v, -3, ("q", "k", "v"))
    check_qkv(q, k, v if G == 1 else v.narrow(-3, 0, q.shape[-3]), same_length=True)
    T, K = q.shape[-2:]
    V = v.shape[-1]
    batch = tuple(v.shape[:-2])  # the value heads' (as many as q's when G = 1)
    beta = check_beta(beta, "beta", (*batch, T), q)
    g = check_gate(g, "g", (*batch, T), q)
    gk = check_gate(gk, "gk", (*batch, T, K), q)
    gv = check_gate(gv, "gv", (*batch, T, V), q)
    s = resolve_scale(scale, K, q.dtype)
    C = check_chunk_size(chunk_size, dispatch.policy().chunk_size)
    qk_l2norm = check_flag(qk_l2norm, "qk_l2norm")
    return_state = check_flag(return_state, "return_state")
    cu = None if cu_seqlens is None else check_cu_seqlens(cu_seqlens, q)
    if cu is not None and v.shape[0] != 1:  # (q (1, T, K) and v (HV, T, V): heads, no batch)
        raise ValueError("cu_seqlens: packed sequences need a batch dimension of 1, got v of "
                         f"shape {tuple(v.shape)}")
    states = (*batch, K, V) if cu is None else (len(cu) - 1, *batch[1:], K, V)
    S0 = initial_state_for(initial_state, "initial_state", states, q)
    traced = tracing(q, k, v, beta, g, gk, gv, initial_state)
    grad = needs_grad(q, k, v, beta, g, gk, gv, initial_state)
    choice = dispatch.select(OP, "prefill fwd+bwd" if grad else "prefill", q.dtype,
                             q.device.type, grad,
                             _traits(V, gk is not None, gv is not None, grad),
                             None if traced else T, traced)
    s, p = split_scale(s)
    if traced:  # a graph's operations are the graph's
        o, S = _prefill(choice, q, k, v, beta, g, s, S0, cu, qk_l2norm, C, grad, gk, gv)
    else:  # a small call's torch operations (casts, state copies) on one thread, as its kernels
        # (the compiled op's rule, also where the portable backend runs: native._small)
        with delta_native.one_thread(q, k, v):
            o, S = _prefill(choice, q, k, v, beta, g, s, S0, cu, qk_l2norm, C, grad, gk, gv)
    o = o if p == 1.0 else o * p
    return (o, S) if return_state else o


def _traits(V: int, gk: bool = False, gv: bool = False, grad: bool = False,
            step: bool = False) -> tuple[str, ...]:
    """What the compiled backend's ``accepts`` (:func:`_refuses`) reads: "V:16" (V a multiple
    of 16), "gates:k" (per-key gates), "gates:k+grad" (per-key gates in a prefill that wants
    gradients), "gates:v" (per-value gates), "step:grad" (a step that wants gradients)."""
    traits = ("V:16",) if V and V % delta_native.V_MULTIPLE == 0 else ()
    if gk:
        traits = (*traits, "gates:k+grad" if grad and not step else "gates:k")
    if gv:
        traits = (*traits, "gates:v")
    return (*traits, "step:grad") if step and grad else traits


def _prefill(choice: Choice, q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None,
             s: float, S0: Tensor, cu: Tensor | None, qk_l2norm: bool, C: int,
             grad: bool = False, gk: Tensor | None = None,
             gv: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The chosen backend on checked arguments (beta, the gates, S0 in the accumulation dtype;
    q, k with H heads, the rest with HV = G·H). The compiled forward takes GVA (q, k read in
    place) and per-key gates; with ``grad``, the compiled forward that saves what the compiled
    backward reads, on q, k repeated to HV heads (autograd sums the group), never with per-key
    or per-value gates (the dispatcher sends those calls to the torch forms)."""
    if choice.backend == "native":
        if grad:
            q, k = grouped(q, k, v, -3)
            return delta_native.delta_rule_native_train(q, k, v, beta, g, S0, cu, s,
                                                        qk_l2norm, choice.isa)
        return delta_native.delta_rule_native(q, k, v, beta, g, S0, cu, s, qk_l2norm,
                                              choice.isa, gk)
    return torch_prefill(q, k, v, beta, g, s, S0, cu, qk_l2norm, C, gk, gv)


@takes_inference_tensors(written_if_inplace=("state",))
def delta_rule_step(
    q_t: Tensor,
    k_t: Tensor,
    v_t: Tensor,
    beta_t: Tensor,
    state: Tensor | None = None,
    *,
    g_t: Tensor | None = None,
    gk_t: Tensor | None = None,
    gv_t: Tensor | None = None,
    scale: float | None = None,
    qk_l2norm: bool = False,
    inplace: bool = False,
) -> tuple[Tensor, Tensor]:
    """One decoding step of the (gated) delta rule.

    ``S' = e^{g}·diag(e^{gk})·S·diag(e^{gv})``, ``u = β_t (v_t − S'ᵀk_t)``, ``S ← S' + k_t uᵀ``,
    ``o_t = Sᵀ(s·q_t)``. q_t, k_t: (..., H, K); v_t: (..., HV, V) with HV = G·H, G ≥ 1 (grouped
    value attention: value head j reads q/k head j // G; G = 1: the same leading dimensions);
    beta_t, g_t: (..., HV); gk_t (..., HV, K); gv_t (..., HV, V); state (..., HV, K, V) or None
    (zeros). Returns o_t (..., HV, V) in q_t's dtype and the new state (float32, or float64 for
    float64 inputs). The compiled step takes scalar and per-key gates (no gradient, no
    per-value gates).

    With ``inplace=True`` the new state is written into ``state`` (which must then be given, in
    the accumulation dtype: float32, float64 for float64 inputs) and ``state`` itself is
    returned: no new state per token (fla's ``inplace_final_state``). β must be finite and
    log-gates ≤ 0 (ValueError otherwise, on every path; the compiled kernel checks nan β and the
    gates itself, before it writes anything)."""
    if gv_t is None:
        fast = _plain_step(q_t, k_t, v_t, beta_t, state, g_t, scale, qk_l2norm, inplace, None,
                           gk_t)
        if fast is not None:
            return fast
    G = check_heads(q_t, k_t, v_t, -2, ("q_t", "k_t", "v_t"))
    check_step_inputs(q_t, k_t, v_t if G == 1 else v_t.narrow(-2, 0, q_t.shape[-2]))
    K = q_t.shape[-1]
    batch = tuple(v_t.shape[:-1])  # the value heads' (as many as q_t's when G = 1)
    V = v_t.shape[-1]
    checked_tensor(beta_t, "beta_t", batch, q_t)
    S = initial_state_for(state, "state", (*batch, K, V), q_t)
    qk_l2norm = check_flag(qk_l2norm, "qk_l2norm")
    if check_flag(inplace, "inplace") and (state is None or state.dtype != S.dtype):
        raise ValueError(f"state: inplace=True needs a state in {S.dtype}, got "
                         f"{'None' if state is None else state.dtype}")
    if inplace:
        check_own_memory(state, "state")
    s, p = split_scale(resolve_scale(scale, K, q_t.dtype))
    traced = tracing(q_t, k_t, v_t, beta_t, state)
    grad = needs_grad(q_t, k_t, v_t, beta_t, state, g_t, gk_t, gv_t)
    choice = dispatch.select(OP, "step", q_t.dtype, q_t.device.type, grad,
                             _traits(V, gk_t is not None, gv_t is not None, grad, step=True),
                             None, traced)
    beta_t = check_beta(beta_t, "beta_t", batch, q_t)
    if choice.backend == "native":
        # the gates' values (nan, > 0) are checked by the kernel, before it writes anything
        if g_t is not None:
            checked_tensor(g_t, "g_t", batch, q_t)
            g_t = g_t if g_t.dtype == torch.float32 else g_t.float()
        if gk_t is not None:
            checked_tensor(gk_t, "gk_t", (*batch, K), q_t)
            gk_t = gk_t if gk_t.dtype == torch.float32 else gk_t.float()
        o, S_new = delta_native.delta_rule_step_native(q_t, k_t, v_t, beta_t, g_t, S, s,
                                                       qk_l2norm, choice.isa, gk_t)
    else:
        o, S_new = torch_step(q_t, k_t, v_t, beta_t, S, g_t, gk_t, gv_t, s, qk_l2norm)
    o = o if p == 1.0 else o * p
    if inplace:  # (the fast path above writes in place; here a copy, e.g. on the torch path)
        state.copy_(S_new)
        return o, state
    return o, S_new


#: The traits of a step the compiled backend takes (V a multiple of 16, no per-value gate, no
#: gradient), without and with per-key gates: what :func:`_plain_step` asks the dispatcher
#: about (as :func:`_traits` spells them).
_PLAIN_TRAITS = ("V:16",)
_PLAIN_TRAITS_GK = ("V:16", "gates:k")

def _plain_step(q_t: object, k_t: object, v_t: object, beta_t: object, state: object,
                g_t: object, scale: object, qk_l2norm: object, inplace: object,
                state_shape: tuple[int, ...] | None = None,
                gk_t: object = None) -> tuple[Tensor, Tensor] | None:
    """The common decoding step, straight to the compiled kernel, or None when the call is
    anything else (then the full checks run, and they raise the errors).

    The common step: plain CPU tensors, contiguous, of one dtype (float32, bfloat16 or float16:
    the kernel reads the 16-bit ones as float32; the state float32), of consistent shapes (q_t,
    k_t (..., H, K), v_t (..., HV, V) with V a multiple of 16 and HV = G·H (G = 1: v_t's leading
    dimensions are q_t's), beta_t and g_t (..., HV), gk_t (..., HV, K), state (..., HV, K, V)
    given, or of ``state_shape``, a shape with the same elements in the same order: fla's front
    door passes its (B, 1, H, ·) tensors and (B, H, K, V) state as they are, so that no view is
    made), no gradient wanted, not traced, bool flags, a float scale, and the dispatcher
    choosing the compiled backend. Returns o_t shaped as v_t and the new state shaped as
    ``state``. Each check here is a comparison of attributes (a few hundred ns each, ~5 µs in
    all) rather than the general checks' conversions and reductions, because at H = 16, K = V =
    64 the kernel itself takes ~7 µs. Values: β (nan, ±inf) and the gates (scalar and per-key)
    in the kernel, before it writes anything."""
    if (q_t is None or k_t is None or v_t is None or beta_t is None
            or not (qk_l2norm is True or qk_l2norm is False)
            or not (inplace is True or inplace is False)):
        return None
    dt = lean_step_dtype((q_t, k_t, v_t, beta_t, g_t, gk_t), state)
    if dt is None:
        return None
    shape = q_t.shape
    if not shape or k_t.shape != shape:
        return None
    batch, K = shape[:-1], shape[-1]
    V = v_t.shape[-1]
    vbatch = v_t.shape[:-1]
    if vbatch != batch and not (  # grouped value heads: HV a multiple of H, the rest equal
            len(vbatch) == len(batch) and batch and batch[-1]
            and vbatch[-1] % batch[-1] == 0 and vbatch[:-1] == batch[:-1]):
        return None
    if not (K and V and V % delta_native.V_MULTIPLE == 0
            and beta_t.shape == vbatch and (g_t is None or g_t.shape == vbatch)
            and (gk_t is None or gk_t.shape == (*vbatch, K))
            and state.shape == ((*vbatch, K, V) if state_shape is None else state_shape)):
        return None
    s = lean_step_scale(scale, K)
    if s is None:
        return None
    fns = dispatch.step_kernels(OP, dt, delta_native.kernels_here,
                                _PLAIN_TRAITS if gk_t is None else _PLAIN_TRAITS_GK)
    if fns is None:
        return None
    if inplace and state.is_inference() and not torch.is_inference_mode_enabled():
        return None  # the full checks refuse it
    o = torch.empty_like(v_t)
    S_out = state if inplace else torch.empty_like(state)
    if delta_native.step_into(fns, q_t, k_t, v_t, beta_t, g_t, state, S_out, o, s, qk_l2norm,
                              gk_t):
        return None  # refused a value (nothing written): the full checks say which
    return o, S_out


# ------------------------------------------------------------------------------- backends
def _refuses(traits: tuple[str, ...]) -> str | None:
    """Why the compiled backend cannot take a call with these traits, or None."""
    if "V:16" not in traits:
        return "needs V a multiple of 16"
    if "gates:v" in traits:
        return "has no per-value gates"
    if "gates:k+grad" in traits:
        return "has no gradient with per-key gates (the torch forms have)"
    if "step:grad" in traits:
        return "has no gradient for the decoding step"
    return None


dispatch.register_compiled(OP, delta_native.unavailable, differentiable=True,
                           accepts=_refuses)

#: The calibration problems, float32, K = V = 64, qk_l2norm, gated: a prefill of 4 heads × 512
#: tokens, forward only and forward and backward (the gradients of every input), and 10
#: decoding steps of 16 heads (a few tens of ms in all).
CALIBRATION = {"prefill": (4, 512, 64), "prefill fwd+bwd": (4, 512, 64), "step": (16, 1, 64)}


def _problem(form: str, sizes: tuple[int, int, int], gen: torch.Generator):
    N, T, d = sizes
    f32 = torch.float32
    q, k, v = (torch.randn(1, N, T, d, generator=gen, dtype=f32) for _ in range(3))
    beta = torch.rand(1, N, T, generator=gen, dtype=f32)
    g = -torch.rand(1, N, T, generator=gen, dtype=f32)
    s, C = d ** -0.5, dispatch.DEFAULT_CHUNK_SIZE
    if form == "prefill":
        S0 = torch.zeros(1, N, d, d, dtype=f32)

        def run(choice: Choice):
            return lambda: _prefill(choice, q, k, v, beta, g, s, S0, None, True, C)
        return run
    if form == "prefill fwd+bwd":
        S0 = torch.zeros(1, N, d, d, dtype=f32)

        def run(choice: Choice):
            def once():
                xs = [x.detach().requires_grad_(True) for x in (q, k, v, beta, g, S0)]
                with torch.enable_grad():
                    o, S = _prefill(choice, *xs[:5], s, xs[5], None, True, C, True)
                    torch.autograd.backward([o, S], [torch.ones_like(o), torch.ones_like(S)])
            return once
        return run
    S = torch.randn(1, N, d, d, generator=gen, dtype=f32) * 0.1
    q, k, v, beta, g = (t[:, :, 0] for t in (q, k, v, beta, g))
    return dispatch.decoding_steps(
        lambda isa: delta_native.delta_rule_step_native(q, k, v, beta, g, S, s, True, isa),
        lambda: torch_step(q, k, v, beta, S, g, None, None, s, True))


dispatch.register_problems(OP, CALIBRATION, _problem)
