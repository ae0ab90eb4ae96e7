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

* :func:`decay_linear_attention` — the chunked parallel form (chunk size C). Inside a chunk a
  C×C block masked by ``D[i, j] = γ^{i−j}`` (j ≤ i, else 0); across chunks the state after the
  previous chunks, reaching row i of the chunk scaled by ``γ^{i+1}``; the state after a chunk is
  ``γ^C S + Σ_j γ^{C−1−j} φ(k_j)[v_j, 1]ᵀ``. Every exponent is ≥ 0, so nothing overflows
  (the tempting ``γ^i / γ^j`` factorisation does, for long chunks and small γ). The chunks
  are walked by a Python loop over T/C steps, each a few small matmuls.
* :func:`decay_linear_attention_step` — the recurrence above, one token.
* :func:`reference_decay_linear_attention` — the explicit T×T weights, the ground truth.

States are :class:`~linattn.ops.recurrent.LinearAttentionState` (S: (..., ℓ, Dv), z: (..., ℓ)),
accumulated in float32 at least, exactly as the undecayed ops keep them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from linattn.feature_maps import FeatureMap
from linattn.ops._common import check_qkv, features, normalise, resolve, values_with_ones
from linattn.ops.recurrent import LinearAttentionState

__all__ = [
    "decay_linear_attention",
    "decay_linear_attention_step",
    "reference_decay_linear_attention",
]

DEFAULT_CHUNK_SIZE = 64


def _gamma(gamma: float | Tensor, batch: tuple[int, ...], like: Tensor) -> Tensor:
    """γ as a tensor of shape ``batch`` in ``like``'s dtype/device; ValueError outside [0, 1]."""
    g = torch.as_tensor(gamma, dtype=like.dtype, device=like.device)
    if g.isnan().any() or (g < 0).any() or (g > 1).any():
        raise ValueError(f"gamma: expected decays in [0, 1], got {gamma!r}")
    try:
        return g.broadcast_to(batch)
    except RuntimeError:
        raise ValueError(
            f"gamma: shape {tuple(g.shape)} does not broadcast to the batch shape {batch}"
        ) from None


def _state_matrix(state: LinearAttentionState, name: str, batch, L: int, Dv: int, dtype):
    if not isinstance(state, LinearAttentionState):
        raise TypeError(f"{name}: expected a LinearAttentionState, got {type(state).__name__}")
    state.check(name, batch, L, Dv)
    return torch.cat([state.S, state.z.unsqueeze(-1)], dim=-1).to(dtype)


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
        chunk_size: C (default 64).
        initial_state: the state after an earlier prefix (batch shape ``...``).
        return_state: also return the state after the last token.

    Returns:
        (..., T, Dv) in q's dtype (and the final state if ``return_state``).
    """
    check_qkv(q, k, v, same_length=True)
    fmap, eps = resolve(feature_map, eps)
    fq, fk = features(fmap, q, k)
    v1 = values_with_ones(v, fq.dtype)  # (..., T, Dv+1): numerator and normaliser together
    *batch, T, L = fq.shape
    batch = tuple(batch)
    g = _gamma(gamma, batch, fq)
    chunk = DEFAULT_CHUNK_SIZE if chunk_size is None else chunk_size
    if not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk_size: expected a positive integer, got {chunk_size!r}")
    C = max(1, min(chunk, T))
    S = None
    if initial_state is not None:
        S = _state_matrix(initial_state, "initial_state", batch, L, v.shape[-1], fq.dtype)
    if S is None:
        S = fq.new_zeros(*batch, L, v1.shape[-1])
    if T == 0:
        out = v1.new_zeros(*batch, 0, v1.shape[-1])
    else:
        n = -(-T // C)
        pad = n * C - T
        if pad:  # zero features on padded rows add nothing; the final state is fixed below
            fq, fk, v1 = (F.pad(x, (0, 0, 0, pad)) for x in (fq, fk, v1))
        fq = fq.reshape(*batch, n, C, L)
        fk = fk.reshape(*batch, n, C, L)
        v1 = v1.reshape(*batch, n, C, v1.shape[-1])
        idx = torch.arange(C, device=fq.device)
        lag = (idx[:, None] - idx[None, :]).to(fq.dtype)  # i - j
        gb = g[..., None, None]  # (..., 1, 1)
        # γ^(i−j) on and below the diagonal, 0 above; exponents ≥ 0 only
        D = torch.where(lag >= 0, gb.pow(lag.clamp(min=0)), fq.new_zeros(()))  # (..., C, C)
        scores = (fq @ fk.transpose(-1, -2)) * D.unsqueeze(-3)  # (..., n, C, C)
        out = scores @ v1  # intra-chunk part
        into = gb.squeeze(-1).pow(idx.to(fq.dtype) + 1)  # (..., C): γ^(i+1), state -> row i
        outof = gb.squeeze(-1).pow((C - 1 - idx).to(fq.dtype))  # (..., C): γ^(C-1-j)
        # each chunk's own contribution to the state at its end: (..., n, L, Dv+1)
        own = (fk * outof[..., None, :, None]).transpose(-1, -2) @ v1
        gC = g.pow(C)[..., None, None]
        fq_in = fq * into[..., None, :, None]
        inter = []
        for c in range(n):
            inter.append(fq_in[..., c, :, :] @ S)
            if c < n - 1 or not pad:
                S = gC * S + own[..., c, :, :]
        if pad:  # the last chunk holds r = C − pad real rows: decay by γ^r, weights γ^(r−1−j)
            r = C - pad
            w = g[..., None].pow((r - 1 - idx).clamp(min=0).to(fq.dtype))  # padded fk are 0
            S = g.pow(r)[..., None, None] * S + (fk[..., -1, :, :] * w[..., :, None]).transpose(
                -1, -2
            ) @ v1[..., -1, :, :]
        out = out + torch.stack(inter, dim=-3)
        out = out.reshape(*batch, n * C, -1)[..., :T, :]
    o = normalise(out[..., :-1], out[..., -1], eps).to(q.dtype)
    if return_state:
        return o, LinearAttentionState(S=S[..., :-1], z=S[..., -1])
    return o


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
    check_qkv(q_t.unsqueeze(-2), k_t.unsqueeze(-2), v_t.unsqueeze(-2), same_length=True)
    fmap, eps = resolve(feature_map, eps)
    fq, fk = features(fmap, q_t, k_t)
    batch = tuple(q_t.shape[:-1])
    if not isinstance(state, LinearAttentionState):
        raise TypeError(f"state: expected a LinearAttentionState, got {type(state).__name__}")
    state.check("state", batch, fk.shape[-1], v_t.shape[-1])
    g = _gamma(gamma, batch, fq)[..., None]
    S = g.unsqueeze(-1) * state.S.to(fq.dtype) + fk.unsqueeze(-1) * v_t.to(fk.dtype).unsqueeze(-2)
    z = g * state.z.to(fq.dtype) + fk
    num = (fq.unsqueeze(-2) @ S).squeeze(-2)
    den = (fq * z).sum(-1)
    return normalise(num, den, eps).to(q_t.dtype), LinearAttentionState(S, z)


def reference_decay_linear_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    gamma: float | Tensor,
    *,
    feature_map: str | FeatureMap = "elu",
    eps: float | None = None,
) -> Tensor:
    """The quadratic ground truth: explicit ``W[i, j] = γ^{i−j} φ(q_i)·φ(k_j)`` for j ≤ i.

    q, k: (..., T, D); v: (..., T, Dv) -> (..., T, Dv)."""
    check_qkv(q, k, v, same_length=True)
    fmap, eps = resolve(feature_map, eps)
    fq, fk = features(fmap, q, k)
    T = q.shape[-2]
    g = _gamma(gamma, tuple(q.shape[:-2]), fq)[..., None, None]
    idx = torch.arange(T, device=q.device)
    lag = (idx[:, None] - idx[None, :]).to(fq.dtype)
    W = (fq @ fk.transpose(-1, -2)) * torch.where(lag >= 0, g.pow(lag.clamp(min=0)), 0.0)
    return normalise(W @ v.to(fq.dtype), W.sum(-1), eps).to(q.dtype)
