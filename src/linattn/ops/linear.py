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
import torch.nn.functional as F
from torch import Tensor

from linattn.feature_maps import FeatureMap
from linattn.ops._common import (
    check_qkv,
    features,
    key_mask_for,
    normalise,
    resolve,
    values_with_ones,
)
from linattn.ops.recurrent import LinearAttentionState

__all__ = ["linear_attention", "DEFAULT_CHUNK_SIZE"]

DEFAULT_CHUNK_SIZE = 64


def _split(out: Tensor, eps: float) -> Tensor:
    """(..., T, Dv + 1) of [numerator, normaliser] -> the normalised (..., T, Dv)."""
    return normalise(out[..., :-1], out[..., -1], eps)


def _causal_chunked(
    fq: Tensor, fk: Tensor, v1: Tensor, chunk: int, S0: Tensor | None
) -> tuple[Tensor, Tensor]:
    """Chunked causal sums. fq, fk: (..., T, L), v1: (..., T, Dv+1), S0: (..., L, Dv+1) or None.

    Returns ([numerator, normaliser]: (..., T, Dv+1), final state (..., L, Dv+1))."""
    *batch, T, L = fq.shape
    n = -(-T // chunk)
    pad = n * chunk - T
    if pad:  # zero features on padded positions contribute nothing to any sum
        fq, fk, v1 = (F.pad(x, (0, 0, 0, pad)) for x in (fq, fk, v1))
    fq = fq.reshape(*batch, n, chunk, L)
    fk = fk.reshape(*batch, n, chunk, L)
    v1 = v1.reshape(*batch, n, chunk, v1.shape[-1])

    states = fk.transpose(-1, -2) @ v1  # (..., n, L, Dv+1): each chunk's own contribution
    prefix = states.cumsum(-3)
    total = prefix[..., -1, :, :]
    before = prefix - states  # exclusive prefix: the chunks strictly before
    if S0 is not None:
        before = before + S0.unsqueeze(-3)
        total = total + S0
    mask = torch.ones(chunk, chunk, dtype=torch.bool, device=fq.device).tril()
    scores = (fq @ fk.transpose(-1, -2)) * mask  # (..., n, C, C), j <= i inside the chunk
    out = scores @ v1 + fq @ before
    out = out.reshape(*batch, n * chunk, -1)[..., :T, :]
    return out, total


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
    """
    check_qkv(q, k, v, same_length=is_causal)
    if not is_causal and (initial_state is not None or return_state):
        raise ValueError("initial_state/return_state: only defined for is_causal=True")
    fmap, eps = resolve(feature_map, eps)
    keep = key_mask_for(key_padding_mask, k)
    fq, fk = features(fmap, q, k, keep)
    v1 = values_with_ones(v, fq.dtype, keep)

    if not is_causal:
        out = fq @ (fk.transpose(-1, -2) @ v1)
        return _split(out, eps).to(q.dtype)

    chunk = DEFAULT_CHUNK_SIZE if chunk_size is None else chunk_size
    if not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk_size: expected a positive integer, got {chunk_size!r}")
    chunk = min(chunk, q.shape[-2]) or 1
    S0 = None
    if initial_state is not None:
        if not isinstance(initial_state, LinearAttentionState):
            raise TypeError(
                "initial_state: expected a LinearAttentionState, "
                f"got {type(initial_state).__name__}"
            )
        initial_state.check("initial_state", tuple(q.shape[:-2]), fq.shape[-1], v.shape[-1])
        S0 = torch.cat([initial_state.S, initial_state.z.unsqueeze(-1)], dim=-1).to(fq.dtype)
    out, total = _causal_chunked(fq, fk, v1, chunk, S0)
    o = _split(out, eps).to(q.dtype)
    if return_state:
        return o, LinearAttentionState(S=total[..., :-1], z=total[..., -1])
    return o
