r"""Linear attention in O(T·ℓ·Dv): non-causal and chunked causal.

With φ: ℝᴰ → ℝˡ, the output of row i is

.. math::
    o_i = \frac{\sum_j \varphi(q_i)^\top\varphi(k_j)\, v_j}{\sum_j \varphi(q_i)^\top\varphi(k_j)}
        = \frac{\varphi(q_i)^\top \bigl(\varphi(K)^\top V\bigr)}
               {\varphi(q_i)^\top\bigl(\varphi(K)^\top 1\bigr)}.

Computing ``φ(K)ᵀV`` (ℓ×Dv) first is what removes the T×T matrix. The normaliser is folded
into the same product by appending a column of ones to V: ``φ(K)ᵀ[V, 1]`` holds both sums.

The causal form sums over j ≤ i only. It runs chunk by chunk (chunk size C): inside a chunk a
dense C×C masked block, across chunks the running state S = Σ φ(k_j)[v_j, 1]ᵀ of all earlier
chunks. Time O(T·C·(ℓ+Dv) + T·ℓ·Dv), memory O(T·(C + ℓ + Dv) + (T/C)·ℓ·Dv), never T×T and
never one ℓ×Dv state per token.
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.feature_maps import EluPlusOne, FeatureMap
from linattn.ops import dispatch
from linattn.ops._common import (
    check_chunk_size,
    check_flag,
    check_qkv,
    clamped_chunk,
    key_mask_for,
    needs_grad,
    resolve,
)
from linattn.ops._library import takes_inference_tensors, tracing
from linattn.ops.dispatch import DEFAULT_CHUNK_SIZE, Backend, Choice
from linattn.ops.linear import native
from linattn.ops.linear.fused import fused_linear_attention
from linattn.ops.linear.native import native_linear_attention
from linattn.ops.linear.portable import portable_forward
from linattn.ops.linear.recurrent import LinearAttentionState, checked_state
from linattn.ops.varlen import check_cu_seqlens, packed, unpacked

# DEFAULT_CHUNK_SIZE is re-exported (users import it from here); its home is ops/dispatch.py.
__all__ = ["linear_attention", "DEFAULT_CHUNK_SIZE", "OP"]

#: The op's name in the dispatcher.
OP = "linear_attention"

_REPLACED = {"FUSED_MIN_T": "fused_min_t", "NATIVE_MIN_T": "impl", "FUSED_BLOCK_SIZE": "block_size"}


def __getattr__(name: str):
    # The module globals that used to steer the dispatch: say where they went rather than let
    # old code read a name that no longer exists.
    if name in _REPLACED:
        raise AttributeError(f"linattn.ops.linear.{name} was replaced by the dispatch policy: "
                             f"use linattn.ops.dispatch.use({_REPLACED[name]}=...)")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ------------------------------------------------------------------------------- backends
def _traits(fmap: FeatureMap, keep: Tensor | None) -> tuple[str, ...]:
    """What the backends ask of a call beyond dtype, device and gradients."""
    traits = []
    if type(fmap) in native.MAP_KINDS:  # token-wise, no parameters
        traits += ["map:compiled", "map:tokenwise"]
    elif getattr(fmap, "tokenwise", True) and not any(p.requires_grad
                                                      for p in fmap.parameters()):
        traits.append("map:tokenwise")
    if keep is not None:
        traits.append("masked")
    return tuple(traits)


def _form(is_causal: bool, grad: bool) -> str:
    return f"{'causal' if is_causal else 'non-causal'} {'fwd+bwd' if grad else 'forward'}"


def _run(choice: Choice, q, k, v, fmap, is_causal, keep, eps, chunk, block, S0):
    """One call of the chosen backend: (output, final state Σ φ(k)ᵀ[v, 1]). Values of width
    Dv = 0 take the torch form: the compiled passes' rows hold at least one value."""
    if choice.backend == "native" and v.shape[-1] > 0:
        return native_linear_attention(q, k, v, fmap, is_causal=is_causal, keep=keep, eps=eps,
                                       chunk=chunk, block=block, S0=S0, isa=choice.isa)
    if choice.backend == "fused":
        return fused_linear_attention(q, k, v, fmap, is_causal=is_causal, keep=keep, eps=eps,
                                      chunk=chunk, block=block, S0=S0)
    return portable_forward(fmap, q, k, v, keep, eps, chunk, is_causal, S0)


dispatch.register(Backend(
    OP, "native", compiled=True, devices=("cpu",), dtypes=(torch.float32, torch.bfloat16),
    grad_dtypes=(torch.float32, torch.bfloat16), available=native.unavailable,
    accepts=lambda traits: None if "map:compiled" in traits
    else "computes the feature maps 1 + elu and 1 + relu only"))
dispatch.register(Backend(
    OP, "fused", traceable=False, devices=("cpu",),
    accepts=lambda traits: None if "map:tokenwise" in traits
    else "needs a token-wise feature map without trainable parameters",
    prefer=lambda length, pol: length is not None and length >= pol.fused_min_t))
dispatch.register(Backend(OP, "portable"))

#: The calibration problem: 4 heads of 2048 tokens, d = Dv = 64, float32, 1 + elu (about a
#: second for the four forms: median of 3 calls per backend and build, after a warm-up call).
CALIBRATION = {_form(c, b): (4, 2048, 64) for c in (False, True) for b in (False, True)}


def _problem(form: str, sizes: tuple[int, int, int], gen: torch.Generator):
    N, T, d = sizes
    is_causal, backward = form.startswith("causal"), form.endswith("fwd+bwd")
    q, k, v = (torch.randn(1, N, T, d, generator=gen, dtype=torch.float32) * 0.5
               for _ in range(3))
    fmap, pol = EluPlusOne(), dispatch.Policy()  # the default sizes, whatever is in force
    chunk = clamped_chunk(pol.chunk_size, T)

    def run(choice: Choice):
        def once():
            xs = [x.detach().requires_grad_(backward) for x in (q, k, v)]
            with torch.set_grad_enabled(backward):
                o, _ = _run(choice, *xs, fmap, is_causal, None, fmap.eps, chunk,
                            pol.block_for(chunk), None)
                if backward:
                    o.sum().backward()
        return once
    return run


dispatch.register_problems(OP, CALIBRATION, _problem)


@takes_inference_tensors()
def linear_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    feature_map: str | FeatureMap = "elu",
    is_causal: bool = False,
    key_padding_mask: Tensor | None = None,
    eps: float | None = None,
    chunk_size: int | None = None,
    initial_state: LinearAttentionState | None = None,
    return_state: bool = False,
    cu_seqlens: Tensor | None = None,
) -> Tensor | tuple[Tensor, LinearAttentionState]:
    """Linear attention with kernel φ(q)·φ(k).

    Args:
        q: (..., Tq, D) queries; k: (..., Tk, D) keys; v: (..., Tk, Dv) values. Any leading
            batch dimensions, usually (B, H). Causal needs Tq == Tk.
        feature_map: a name from :data:`linattn.feature_maps.FEATURE_MAPS` or a FeatureMap.
        is_causal: row i attends to keys j ≤ i only (chunked parallel form).
        key_padding_mask: bool (B, Tk), True = padding: that key is absent from numerator
            and normaliser. Broadcast over the dimensions between B and T.
        eps: added to the normaliser; None takes the feature map's default.
        chunk_size: causal chunk length C (default :data:`DEFAULT_CHUNK_SIZE`).
        initial_state: causal only: the state after an earlier prefix of the sequence (batch
            shape ``...``), so that a prefill continues exactly.
        return_state: causal only: also return the state after the last token.
        cu_seqlens: (N + 1,) cumulative lengths of N sequences packed along T (q, k, v of
            batch size 1, as flash-linear-attention takes them): each attends within itself
            only (non-causal: to all of its own keys). ``initial_state`` and the returned
            state then have batch shape (N, ...). Not combinable with ``key_padding_mask``.

    Returns:
        (..., Tq, Dv) in q's dtype, and the final :class:`LinearAttentionState` if
        ``return_state``. Sums run in float32 at least (float64 for float64 inputs).

    The implementation is chosen by :mod:`linattn.ops.dispatch`: on CPU the compiled path
    (``native.py``: float32 or bfloat16 with 1+elu or 1+relu, bfloat16 gradients computed in
    float32, where it was measured to beat torch on this machine) or the chunked torch path
    (``fused.py``, token-wise maps, long sequences, eager only), else the portable form
    (``portable.py``). Inside
    ``torch.compile`` / ``torch.export`` the compiled path is the custom op
    ``linattn::linear_attention_fwd``. The fast paths have a hand-written backward; with
    ``create_graph=True`` (double backward) they differentiate a torch recomputation instead, so
    higher-order gradients are exact. They save the output (the block passes read it), so
    modifying the output in place before ``backward`` raises autograd's usual error.
    ``LINATTN_NATIVE=0`` turns the compiled path off, ``LINATTN_NATIVE=1`` skips the
    measurement.
    """
    is_causal = check_flag(is_causal, "is_causal")
    return_state = check_flag(return_state, "return_state")
    check_qkv(q, k, v, same_length=is_causal)
    if not is_causal and (initial_state is not None or return_state):
        raise ValueError("initial_state/return_state: only defined for is_causal=True")
    if cu_seqlens is not None:
        return _packed(q, k, v, cu_seqlens, feature_map=feature_map, is_causal=is_causal,
                       key_padding_mask=key_padding_mask, eps=eps, chunk_size=chunk_size,
                       initial_state=initial_state, return_state=return_state)
    pol = dispatch.policy()
    chunk = clamped_chunk(check_chunk_size(chunk_size, pol.chunk_size), q.shape[-2])
    fmap, eps = resolve(feature_map, eps)
    keep = key_mask_for(key_padding_mask, k)
    S0 = None
    if initial_state is not None:
        L = fmap.num_features(q.shape[-1])
        checked_state(initial_state, "initial_state", tuple(q.shape[:-2]), L, v.shape[-1],
                      q.device)
        S0 = torch.cat([initial_state.S, initial_state.z.unsqueeze(-1)], dim=-1)

    traced = tracing(q, k, v, S0)
    grad = needs_grad(q, k, v, S0)
    choice = dispatch.select(OP, _form(is_causal, grad), q.dtype, q.device.type, grad,
                             _traits(fmap, keep), None if traced else q.shape[-2], traced)
    # (pol.block_for(chunk), spelled out: a traced graph reads the policy's fields, not methods)
    block = max(chunk, pol.block_size // chunk * chunk)
    o, total = _run(choice, q, k, v, fmap, is_causal, keep, eps, chunk, block, S0)
    if return_state:
        return o, LinearAttentionState(S=total[..., :-1], z=total[..., -1])
    return o


def _packed(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, *, key_padding_mask, **kw):
    """:func:`linear_attention` on a packed batch: the N sequences as a padded batch whose
    padding is masked out of every sum (a zero key is not absent: φ(0) ≠ 0 for most maps)."""
    if key_padding_mask is not None:
        raise ValueError("key_padding_mask: not combinable with cu_seqlens (the packed lengths "
                         "already say which tokens exist)")
    if q.shape[-2] != k.shape[-2]:
        raise ValueError(f"cu_seqlens: packed sequences need as many keys as queries, got "
                         f"{k.shape[-2]} keys for {q.shape[-2]} queries")
    cu = check_cu_seqlens(cu_seqlens, q)
    (qp, kp, vp), keep = packed([q, k, v], cu)
    out = linear_attention(qp, kp, vp, key_padding_mask=~keep, **kw)
    o, state = out if kw["return_state"] else (out, None)
    o = unpacked(o, cu, keep)
    return (o, state) if kw["return_state"] else o
