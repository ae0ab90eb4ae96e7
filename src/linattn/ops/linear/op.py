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

from linattn.feature_maps import FeatureMap
from linattn.ops import dispatch
from linattn.ops._common import (
    check_chunk_size,
    check_qkv,
    clamped_chunk,
    key_mask_for,
    needs_grad,
    portable_forward,
    resolve,
)
from linattn.ops.dispatch import DEFAULT_CHUNK_SIZE
from linattn.ops.linear import native
from linattn.ops.linear.fused import fused_linear_attention, fused_supported
from linattn.ops.linear.native import native_linear_attention, native_supported
from linattn.ops.linear.recurrent import LinearAttentionState, checked_state
from linattn.ops.varlen import check_cu_seqlens, packed, unpacked

# DEFAULT_CHUNK_SIZE is re-exported (users import it from here); its home is ops/dispatch.py.
__all__ = ["linear_attention", "DEFAULT_CHUNK_SIZE"]


_REPLACED = {"FUSED_MIN_T": "fused_min_t", "NATIVE_MIN_T": "impl", "FUSED_BLOCK_SIZE": "block_size"}


def __getattr__(name: str):
    # The module globals that used to steer the dispatch: say where they went rather than let
    # old code read a name that no longer exists.
    if name in _REPLACED:
        raise AttributeError(f"linattn.ops.linear.{name} was replaced by the dispatch policy: "
                             f"use linattn.ops.dispatch.use({_REPLACED[name]}=...)")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _choose(fmap, q, k, v, S0, is_causal: bool) -> str:
    """"native", "fused" or "portable" for this call, by the policy in force (ops/dispatch.py)."""
    pol = dispatch.policy()
    if pol.impl == "portable":
        return "portable"
    can_native = native_supported(fmap, q, k, v, S0)
    can_fused = fused_supported(fmap, q)
    if pol.impl in ("native", "fused"):
        if not (can_native if pol.impl == "native" else can_fused):
            raise ValueError(f"dispatch impl={pol.impl!r}: that path cannot take this call "
                             f"({type(fmap).__name__}, {q.dtype}, {q.device.type})")
        return pol.impl
    if pol.impl == "fast":
        return "native" if can_native else "fused" if can_fused else "portable"
    if can_native and pol.impl == "auto":
        if dispatch.native_setting() == "1" or native.wins(is_causal, needs_grad(q, k, v, S0)):
            return "native"
    return "fused" if can_fused and q.shape[-2] >= pol.fused_min_t else "portable"


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
    (ops/native.py: float32 with 1+elu or 1+relu, where it was measured to beat torch on this
    machine) or the chunked torch path (ops/fused.py, token-wise maps, long sequences), else
    the portable form. The fast paths have a hand-written backward; with ``create_graph=True``
    (double backward) they differentiate a torch recomputation instead, so higher-order
    gradients are exact. They read the saved output, so modifying the output in place before
    ``backward`` raises autograd's usual error. ``LINATTN_NATIVE=0`` (set before the first
    call) turns the compiled path off, ``LINATTN_NATIVE=1`` skips the measurement.
    """
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

    path = _choose(fmap, q, k, v, S0, is_causal)
    if path != "portable":
        fast = native_linear_attention if path == "native" else fused_linear_attention
        block = pol.block_for(chunk)
        o, total = fast(
            q, k, v, fmap, is_causal=is_causal, keep=keep, eps=eps, chunk=chunk, block=block,
            S0=S0,
        )
    else:
        o, total = portable_forward(fmap, q, k, v, keep, eps, chunk, is_causal, S0)
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
