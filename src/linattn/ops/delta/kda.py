r"""The delta rule with per-key gates (Kimi Delta Attention) in chunks, and the token loop that
per-value gates take.

Per token, state S: (K, V), per-key log-gates ``gk_t ∈ [−∞, 0]^K`` (a scalar gate ``g_t`` is
folded in as ``gk_t + g_t``)::

    S'_t = diag(e^{gk_t}) S_{t−1},   u_t = β_t (v_t − S'_tᵀ k_t),   S_t = S'_t + k_t u_tᵀ,
    o_t = S_tᵀ (s q_t)

i.e. ``S_t = (I − β_t k_t k_tᵀ) diag(e^{gk_t}) S_{t−1} + β_t k_t v_tᵀ`` (fla's naive KDA, in
the (K, V) layout). Inside a chunk of C tokens, with ``b_i = Σ_{t≤i} gk_t`` (from the chunk
start) and the per-key segment sums ``Γ_ij = Σ_{j<t≤i} gk_t`` (a K-vector, every entry ≤ 0,
formed directly: no difference of two cumulative sums, no ``e^{−b}``), unrolling gives
``S'_i = diag(e^{b_i}) S_0 + Σ_{j<i} diag(e^{Γ_ij}) k_j u_jᵀ``, so the pseudo-values solve

.. math::
    (I + A) U = \mathrm{diag}(\beta) V - \mathrm{diag}(\beta) (K \odot e^{B}) S_0, \qquad
    A_{ij} = \beta_i \textstyle\sum_\kappa k_{i\kappa} k_{j\kappa} e^{\Gamma_{ij\kappa}}
    \ (j < i),

``U = Ũ − W S_0`` (one unit lower-triangular solve per chunk, all chunks at once), and

.. math::
    o_i = (q_i \odot e^{b_i})^\top S_0 + \textstyle\sum_{j\le i} P_{ij} u_j, \quad
    P_{ij} = \sum_\kappa q_{i\kappa} k_{j\kappa} e^{\Gamma_{ij\kappa}}, \qquad
    S_C = \mathrm{diag}(e^{b_{C-1}}) S_0 + \textstyle\sum_j (k_j \odot e^{\Gamma_{C-1,j}}) u_j^\top.

The scalar-gate form (:func:`linattn.ops.delta.chunk.chunked_form`) is the case of equal
entries. A hard reset ``gk = −∞`` makes every exponent through it −∞ (weight 0, gradient 0),
never ``−∞ − (−∞)``. The per-key weights cost a (C, C, K) block per chunk (memory and work
O(T·C·K)), against O(T·C) for a scalar gate, so per-key gates run in chunks of at most
:data:`KDA_CHUNK` tokens; what crosses chunks goes through the state, O(T·K·V) in matmuls,
whatever the chunk.

Per-value gates (``S ← S diag(e^{gv})``) do not fit this form: they scale the columns of S,
so each value column would need its own matrix A (V triangular systems per chunk); they run
token by token (:func:`recurrent_form`), with or without the other gates.

These are the portable forms (and what training runs). Without gradients, per-key gates take
the compiled kernel where the dispatcher chooses it (:mod:`linattn.ops.delta.native`: the
sequential recurrence, one pass over the state per token, the row decays applied in the
update). Grouped value heads reach these forms with q and k already repeated
(:func:`linattn.ops.delta.chunk.grouped`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.ops._common import to_chunks

__all__ = ["KDA_CHUNK", "GATE_FLOOR", "per_key_segsum", "per_key_chunked_form", "recurrent_form"]

#: The largest chunk the per-key form uses (measured, benchmarks/delta.py --kda): its (C, C, K)
#: weights grow with C while the work across chunks does not.
KDA_CHUNK = 16


#: Per-key log-gates are floored here before their segment sums: e^{−10⁴} is exactly 0 in
#: float32 and float64 (a hard reset, weight and gradient 0), and a finite floor keeps the
#: 0/1 matrix product of :func:`per_key_segsum` free of 0·(−∞) = nan; C·10⁴ cannot overflow.
GATE_FLOOR = -1e4


def _segment_mask(C: int, like: Tensor) -> Tensor:
    """(C·C, C) 0/1: row (i, j) selects the tokens t with j < t ≤ i (none for j ≥ i)."""
    idx = torch.arange(C, device=like.device)
    i, j, t = idx[:, None, None], idx[None, :, None], idx[None, None, :]
    return ((j < t) & (t <= i)).to(like.dtype).reshape(C * C, C)


def per_key_segsum(x: Tensor) -> Tensor:
    """Segment sums along time of per-feature values: (..., C, F) -> (..., C, C, F) with
    ``[i, j, f] = Σ_{j<t≤i} x[t, f]`` for j < i, 0 for j ≥ i (the caller masks above the
    diagonal). x must be finite (floor −∞ at :data:`GATE_FLOOR` first).

    Each entry is the sum of exactly its own terms (a product with a 0/1 matrix, one matrix
    multiplication for all of them), never the difference of two cumulative sums, so there is
    no cancellation between large sums; F stays innermost, so that the weights are products
    with k and q along their contiguous dimension. (A cumulative sum along the (C, C, F)
    tensor's middle dimension took five times as long.)"""
    C = x.shape[-2]
    return (_segment_mask(C, x) @ x).unflatten(-2, (C, C))


def per_key_chunked_form(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, gk: Tensor, S: Tensor,
                         C: int) -> tuple[Tensor, Tensor]:
    """The chunked form with per-key log-gates on checked inputs in the accumulation dtype.

    q (already scaled), k, gk: (..., T, K); v: (..., T, V); beta: (..., T); S: (..., K, V).
    Returns o (..., T, V) and the final state (..., K, V). Differentiable."""
    *batch, T, K = q.shape
    V = v.shape[-1]
    if T == 0:  # the state as it was, in a new tensor (never the caller's initial state)
        return q @ S, S.clone()
    C = max(1, min(C, KDA_CHUNK, T))
    # zero padding to whole chunks: k = v = 0, β = 0 and gate 0 leave the state as it was
    qc, kc, vc, gc = (to_chunks(x, C) for x in (q, k, v, gk))  # (..., n, C, ·)
    bc = to_chunks(beta.unsqueeze(-1), C)  # (..., n, C, 1)
    gc = gc.clamp_min(GATE_FLOOR)
    # e^{Γ}: (..., n, C, C, K), in place (the product's backward does not read its output);
    # above the diagonal it is e^0 = 1, masked out of A and P below
    decay = per_key_segsum(gc).exp_()
    k_decayed = kc.unsqueeze(-3) * decay  # [i, j, κ] = k_jκ e^{Γ_ijκ}
    A = torch.einsum("...ijk,...ik->...ij", k_decayed, kc)  # Σ_κ k_iκ k_jκ e^{Γ_ijκ}
    P = torch.einsum("...ijk,...ik->...ij", k_decayed, qc)  # Σ_κ q_iκ k_jκ e^{Γ_ijκ}
    idx = torch.arange(C, device=q.device)
    A = torch.where(idx[:, None] > idx[None, :], A * bc, q.new_zeros(()))
    P = torch.where(idx[:, None] >= idx[None, :], P, q.new_zeros(()))
    into = gc.cumsum(-2).exp()  # e^{b_i}: (..., n, C, K), exponents ≤ 0 (floored: finite)
    rhs = torch.cat([bc * vc, (bc * into) * kc], dim=-1)  # (..., n, C, V + K)
    X = torch.linalg.solve_triangular(A, rhs, upper=False, unitriangular=True)
    U_free, W = X[..., :V], X[..., V:]  # U = U_free − W S_0
    q_in = qc * into
    k_out = kc * decay[..., -1, :, :]  # k_j ⊙ e^{Γ_{C−1, j}}: key j -> the state after the chunk
    through = into[..., -1, :].unsqueeze(-1)  # e^{b_{C−1}}: (..., n, K, 1)
    outs = []
    # unbind, not x[..., c, :, :]: the backward of n slices would fill n full-size zero tensors
    for U_c, W_c, q_c, P_c, through_c, k_c in zip(
            *(x.unbind(-3) for x in (U_free, W, q_in, P, through, k_out.transpose(-1, -2))),
            strict=True):
        U = U_c - W_c @ S
        outs.append(q_c @ S + P_c @ U)
        S = through_c * S + k_c @ U
    return torch.cat(outs, dim=-2)[..., :T, :], S


def recurrent_form(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None,
                   gk: Tensor | None, gv: Tensor | None, S: Tensor) -> tuple[Tensor, Tensor]:
    """The recurrence token by token, any gates, on checked inputs in the accumulation dtype:
    ``S' = e^{g}·diag(e^{gk})·S·diag(e^{gv})``, ``S ← S' + k β (v − S'ᵀk)ᵀ``, ``o = Sᵀq``.

    q (already scaled), k: (..., T, K); v: (..., T, V); beta, g: (..., T); gk (..., T, K);
    gv (..., T, V). Returns o (..., T, V) and the final state. What per-value gates need (see
    the module docstring); a Python loop of a few small products per token."""
    *batch, T, _ = q.shape
    if T == 0:  # the state as it was, in a new tensor (never the caller's initial state)
        return q.new_zeros(*batch, 0, S.shape[-1]), S.clone()
    # the gates as one multiplicative factor per side, exponentiated once for all tokens
    rows = None if gk is None and g is None else \
        (gk if g is None else (g.unsqueeze(-1) if gk is None else gk + g.unsqueeze(-1))).exp()
    cols = None if gv is None else gv.exp()
    outs = []
    for t in range(T):
        if rows is not None:
            S = S * rows[..., t, :].unsqueeze(-1)
        if cols is not None:
            S = S * cols[..., t, :].unsqueeze(-2)
        k_t = k[..., t, :]
        u = beta[..., t, None] * (v[..., t, :] - (k_t.unsqueeze(-2) @ S).squeeze(-2))
        S = S + k_t.unsqueeze(-1) * u.unsqueeze(-2)
        outs.append((q[..., t, :].unsqueeze(-2) @ S).squeeze(-2))
    return torch.stack(outs, dim=-2), S
