r"""Causal linear attention with a per-head exponential decay of the state (retention-style).

With φ the feature map and γ ∈ [0, 1] one decay per batch slice (usually per head), row i is

.. math::
    o_i = \frac{\sum_{j\le i} \gamma^{i-j}\,\varphi(q_i)^\top\varphi(k_j)\, v_j}
               {\sum_{j\le i} \gamma^{i-j}\,\varphi(q_i)^\top\varphi(k_j)}

— causal linear attention whose weights fade with the lag ``i − j``. This is a *relative*
position signal that a recurrence carries for free: the state obeys

.. math::
    S_t = \gamma S_{t-1} + \varphi(k_t) v_t^\top, \quad z_t = \gamma z_{t-1} + \varphi(k_t),
    \quad o_t = \frac{S_t^\top\varphi(q_t)}{z_t\cdot\varphi(q_t)},

so decoding stays O(ℓ·Dv) per token and the state never grows. γ = 1 is plain causal linear
attention (:func:`linattn.ops.linear.linear_attention`), γ = 0 attends to the current token only.

Three forms, held together by tests:

* :func:`decay_linear_attention` — the chunked parallel form (chunk size C): the scalar-gated
  form of :mod:`linattn.ops.gated` with the constant log-gate ``log γ``, run on φ(q), φ(k) and
  the values extended by a column of ones (numerator and normaliser in one pass). Inside a
  chunk a C×C block masked by ``γ^{i−j}`` (j ≤ i, else 0); across chunks the state after the
  previous chunks, reaching row i of the chunk scaled by ``γ^{i+1}``; the state after a chunk
  is ``γ^C S + Σ_j γ^{C−1−j} φ(k_j)[v_j, 1]ᵀ``. Every exponent is ≤ 0 in log space, so
  nothing overflows (the tempting ``γ^i / γ^j`` factorisation does, for long chunks and
  small γ).
* :func:`decay_linear_attention_step` — the recurrence above, one token.
* :func:`linattn.reference.decay_linear_attention` — the explicit T×T weights, the ground
  truth, beside the other quadratic references.

States are :class:`~linattn.ops.linear.recurrent.LinearAttentionState` (S: (..., ℓ, Dv),
z: (..., ℓ)), accumulated in float32 at least, exactly as the undecayed ops keep them.
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.feature_maps import FeatureMap
from linattn.ops import dispatch
from linattn.ops._common import (
    check_chunk_size,
    check_flag,
    check_gamma,
    check_qkv,
    check_step_inputs,
    features,
    normalise,
    resolve,
    values_with_ones,
)
from linattn.ops._library import takes_inference_tensors
from linattn.ops.dispatch import DEFAULT_CHUNK_SIZE
from linattn.ops.gated.chunk import chunked_form
from linattn.ops.linear.recurrent import LinearAttentionState, checked_state

# DEFAULT_CHUNK_SIZE is re-exported from ops/dispatch.py, the one home of that number.
__all__ = [
    "decay_linear_attention",
    "decay_linear_attention_step",
    "DEFAULT_CHUNK_SIZE",
]


@takes_inference_tensors()
def decay_linear_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    gamma: float | Tensor,
    *,
    feature_map: str | FeatureMap = "elu",
    eps: float | None = None,
    chunk_size: int | None = None,
    initial_state: LinearAttentionState | None = None,
    return_state: bool = False,
) -> Tensor | tuple[Tensor, LinearAttentionState]:
    """Causal decayed linear attention, chunked parallel form.

    Args:
        q, k: (..., T, D); v: (..., T, Dv). Leading dimensions usually (B, H).
        gamma: decays in [0, 1], a float or a tensor broadcastable to the batch shape ``...``
            (e.g. (H,) for (B, H, T, D) inputs: one decay per head).
        feature_map, eps: as in :func:`linattn.linear_attention`.
        chunk_size: C, a positive integer (default
            the policy's, :data:`linattn.ops.dispatch.DEFAULT_CHUNK_SIZE`).
        initial_state: the state after an earlier prefix (batch shape ``...``).
        return_state: also return the state after the last token.

    Returns:
        (..., T, Dv) in q's dtype (and the final state if ``return_state``).
    """
    check_qkv(q, k, v, same_length=True)
    return_state = check_flag(return_state, "return_state")
    fmap, eps = resolve(feature_map, eps)
    fq, fk = features(fmap, q, k)
    v1 = values_with_ones(v, fq.dtype)  # (..., T, Dv+1): numerator and normaliser together
    *batch, T, L = fq.shape
    batch = tuple(batch)
    g = check_gamma(gamma, batch, fq)
    C = max(1, min(check_chunk_size(chunk_size, dispatch.policy().chunk_size), T))
    if initial_state is None:
        S = fq.new_zeros(*batch, L, v1.shape[-1])
    else:  # [S, z] in one matrix, in the accumulation dtype
        st = checked_state(initial_state, "initial_state", batch, L, v.shape[-1], q.device)
        S = torch.cat([st.S, st.z.unsqueeze(-1)], dim=-1).to(fq.dtype)
    # γ^(i−j) is exp of the segment sum of log γ: the scalar-gated chunked form, with the
    # normaliser as the extra value column (γ = 0 gives log γ = −∞, a reset every token)
    g_log = g.log()[..., None]  # (..., 1): one gate for every token
    out, S = chunked_form(fq, fk, v1, g_log, None, 1.0, S, C)
    o = normalise(out[..., :-1], out[..., -1], eps).to(q.dtype)
    if return_state:
        return o, LinearAttentionState(S=S[..., :-1], z=S[..., -1])
    return o


@takes_inference_tensors()
def decay_linear_attention_step(
    q_t: Tensor,
    k_t: Tensor,
    v_t: Tensor,
    gamma: float | Tensor,
    state: LinearAttentionState,
    *,
    feature_map: str | FeatureMap = "elu",
    eps: float | None = None,
) -> tuple[Tensor, LinearAttentionState]:
    """One decoding step: ``S ← γS + φ(k_t)v_tᵀ``, ``z ← γz + φ(k_t)``, ``o_t = Sᵀφ(q_t)/z·φ(q_t)``.

    q_t, k_t: (..., D); v_t: (..., Dv); gamma broadcastable to ``...``; state for batch ``...``.
    Returns o_t: (..., Dv) in q_t's dtype and the new state (the old one is untouched)."""
    check_step_inputs(q_t, k_t, v_t)
    fmap, eps = resolve(feature_map, eps)
    fq, fk = features(fmap, q_t, k_t)
    batch = tuple(q_t.shape[:-1])
    checked_state(state, "state", batch, fk.shape[-1], v_t.shape[-1], q_t.device)
    g = check_gamma(gamma, batch, fq)[..., None]
    S = g.unsqueeze(-1) * state.S.to(fq.dtype) + fk.unsqueeze(-1) * v_t.to(fk.dtype).unsqueeze(-2)
    z = g * state.z.to(fq.dtype) + fk
    num = (fq.unsqueeze(-2) @ S).squeeze(-2)
    den = (fq * z).sum(-1)
    return normalise(num, den, eps).to(q_t.dtype), LinearAttentionState(S, z)

