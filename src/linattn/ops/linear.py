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
from linattn.ops._common import (
    causal_chunked,
    check_qkv,
    features,
    key_mask_for,
    resolve,
    split_normalised,
    values_with_ones,
)
from linattn.ops.fused import fused_linear_attention, fused_supported
from linattn.ops.native import native_linear_attention, native_supported
from linattn.ops.recurrent import LinearAttentionState

__all__ = [
    "linear_attention", "DEFAULT_CHUNK_SIZE", "FUSED_MIN_T", "NATIVE_MIN_T", "FUSED_BLOCK_SIZE"
]

#: Chunk length of the portable causal form.
DEFAULT_CHUNK_SIZE = 64
#: Sequences of at least this many tokens take the fused chunked path (ops/fused.py) where it
#: applies; shorter ones are cheaper in a few whole-tensor operations.
FUSED_MIN_T = 2048
#: The compiled float32 path (ops/native.py, 1 + elu and 1 + relu) is faster than the portable
#: form from T = 64 up, forward and backward (docs/benchmarks.md), so it takes every length.
NATIVE_MIN_T = 1
#: Tokens mapped and processed per step of the fused path: 512 keeps a block's features of
#: 8 heads in L2 (measured with ``linattn bench``: 512 beat 256 and 1024 on every row).
FUSED_BLOCK_SIZE = 512


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

    Returns:
        (..., Tq, Dv) in q's dtype, and the final :class:`LinearAttentionState` if
        ``return_state``. Sums run in float32 at least (float64 for float64 inputs).

    On CPU the fast paths (ops/native.py for float32 with 1+elu or 1+relu at any length,
    ops/fused.py for other token-wise maps from ``FUSED_MIN_T`` tokens) have a hand-written
    backward: it cannot be differentiated again (double backward, ``torch.func`` transforms)
    and it reads the saved output, so modifying the output in place before ``backward`` raises
    autograd's usual error. ``LINATTN_NATIVE=0`` (set before the first call) turns the
    compiled path off.
    """
    check_qkv(q, k, v, same_length=is_causal)
    if not is_causal and (initial_state is not None or return_state):
        raise ValueError("initial_state/return_state: only defined for is_causal=True")
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"chunk_size: expected a positive integer, got {chunk_size!r}")
    fmap, eps = resolve(feature_map, eps)
    keep = key_mask_for(key_padding_mask, k)
    S0 = None
    if initial_state is not None:
        if not isinstance(initial_state, LinearAttentionState):
            raise TypeError(
                "initial_state: expected a LinearAttentionState, "
                f"got {type(initial_state).__name__}"
            )
        L = fmap.num_features(q.shape[-1])
        initial_state.check("initial_state", tuple(q.shape[:-2]), L, v.shape[-1])
        S0 = torch.cat([initial_state.S, initial_state.z.unsqueeze(-1)], dim=-1)

    T = q.shape[-2]
    if T >= NATIVE_MIN_T and native_supported(fmap, q, k, v, S0):
        fast = native_linear_attention
    elif T >= FUSED_MIN_T and fused_supported(fmap, q):
        fast = fused_linear_attention
    else:
        fast = None
    if fast is not None:
        chunk = DEFAULT_CHUNK_SIZE if chunk_size is None else chunk_size
        block = max(chunk, FUSED_BLOCK_SIZE // chunk * chunk)  # whole chunks per block
        o, total = fast(
            q, k, v, fmap, is_causal=is_causal, keep=keep, eps=eps, chunk=chunk, block=block,
            S0=S0,
        )
    else:
        fq, fk = features(fmap, q, k, keep)
        v1 = values_with_ones(v, fq.dtype, keep)
        if not is_causal:
            return split_normalised(fq @ (fk.transpose(-1, -2) @ v1), eps).to(q.dtype)
        chunk = min(DEFAULT_CHUNK_SIZE if chunk_size is None else chunk_size, q.shape[-2]) or 1
        out, total = causal_chunked(fq, fk, v1, chunk, None if S0 is None else S0.to(fq.dtype))
        o = split_normalised(out, eps).to(q.dtype)
    if return_state:
        return o, LinearAttentionState(S=total[..., :-1], z=total[..., -1])
    return o
