r"""References: the ground truth that every fast path is tested against.

The attention references build the explicit T×T similarity matrix; the gated and delta-rule
recurrences, whose weights are not a fixed matrix of the scores, are walked token by token in
float64. They cost O(T²) time and memory or a Python loop over T by design: never call them on
a fast path.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from linattn.feature_maps import FeatureMap
from linattn.ops._common import (
    accumulation_dtype,
    causal_mask,
    check_eps,
    check_gamma,
    check_qkv,
    features,
    key_mask_for,
    normalise,
    resolve,
    zero_padded,
)
from linattn.ops.cosformer import CosFormerFeatures
from linattn.ops.decay_softmax import check_decay_softmax_inputs
from linattn.ops.flowformer import flow_eps, flow_feature_map, query_mask_for
from linattn.ops.window import check_window

__all__ = [
    "linear_attention",
    "relative_linear_attention",
    "cosformer_attention",
    "decay_linear_attention",
    "decay_softmax_attention",
    "window_linear_attention",
    "flowformer_attention",
    "gated_linear_attention",
    "delta_rule",
]


def _attend(sim: Tensor, v: Tensor, eps: float, is_causal: bool) -> Tensor:
    """o_i = Σ_j sim_ij v_j / Σ_j sim_ij (j ≤ i if causal). sim: (..., Tq, Tk), v: (..., Tk, Dv)."""
    if is_causal:
        T = sim.shape[-1]
        sim = sim * causal_mask(T, sim.device)
    return normalise(sim @ v, sim.sum(-1), eps)


def linear_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    feature_map: str | FeatureMap = "elu",
    is_causal: bool = False,
    key_padding_mask: Tensor | None = None,
    eps: float | None = None,
) -> Tensor:
    r"""o_i = Σ_j φ(q_i)·φ(k_j) v_j / Σ_j φ(q_i)·φ(k_j), with the T×T matrix built explicitly.

    q: (..., Tq, D), k: (..., Tk, D), v: (..., Tk, Dv) -> (..., Tq, Dv). Masked keys (True in
    ``key_padding_mask``, (B, Tk)) and, when causal, keys j > i get similarity 0."""
    check_qkv(q, k, v, same_length=is_causal)
    fmap, eps = resolve(feature_map, eps)
    keep = key_mask_for(key_padding_mask, k)
    fq, fk = features(fmap, q, k, keep)
    sim = fq @ fk.transpose(-1, -2)
    return _attend(sim, zero_padded(v.to(fq.dtype), keep), eps, is_causal).to(q.dtype)


def relative_linear_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    r: Tensor,
    *,
    feature_map: str | FeatureMap = "elu",
    is_causal: bool = False,
    key_padding_mask: Tensor | None = None,
    eps: float | None = None,
) -> Tensor:
    r"""sim(i, j) = φ(q_i)·φ(k_j) + φ(q_i)·φ(r_{j−i}), built as an explicit T×T matrix.

    q, k: (B, H, T, D), v: (B, H, T, Dv), r: (H, 2T−1, D) with r[:, m + T − 1] the vector of lag
    m = j − i. Returns (B, H, T, Dv)."""
    check_qkv(q, k, v, same_length=True)
    fmap, eps = resolve(feature_map, eps)
    keep = key_mask_for(key_padding_mask, k)
    fq, fk = features(fmap, q, k, keep)
    fr = fmap.forward_keys(r.to(fq.dtype))  # (H, 2T-1, L)
    T = q.shape[-2]
    pos = torch.arange(T, device=q.device)
    lag = pos[None, :] - pos[:, None] + T - 1  # lag[i, j] = j - i, shifted to index r
    fr_ij = fr[:, lag]  # (H, T, T, L)
    sim = fq @ fk.transpose(-1, -2) + torch.einsum("...il,...ijl->...ij", fq, fr_ij)
    if keep is not None:
        sim = sim * keep.squeeze(-1).unsqueeze(-2)
    return _attend(sim, zero_padded(v.to(fq.dtype), keep), eps, is_causal).to(q.dtype)


def cosformer_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    is_causal: bool = False,
    key_padding_mask: Tensor | None = None,
    eps: float | None = None,
) -> Tensor:
    r"""sim(i, j) = relu(q_i)·relu(k_j)·cos(π/2 · (i − j)/T), built as an explicit T×T matrix.

    q, k: (..., T, D), v: (..., T, Dv) -> (..., T, Dv). ``eps`` None: the op's default,
    :attr:`linattn.ops.cosformer.CosFormerFeatures.eps`."""
    check_qkv(q, k, v, same_length=True)
    eps = check_eps(CosFormerFeatures.eps if eps is None else eps)
    acc = accumulation_dtype(q.dtype)
    keep = key_mask_for(key_padding_mask, k)
    fk = zero_padded(torch.relu(k.to(acc)), keep)
    T = q.shape[-2]
    pos = torch.arange(T, device=q.device, dtype=acc)
    cos = torch.cos(math.pi / 2 * (pos[:, None] - pos[None, :]) / T)
    sim = (torch.relu(q.to(acc)) @ fk.transpose(-1, -2)) * cos
    return _attend(sim, zero_padded(v.to(acc), keep), eps, is_causal).to(q.dtype)


def decay_linear_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    gamma: float | Tensor,
    *,
    feature_map: str | FeatureMap = "elu",
    eps: float | None = None,
) -> Tensor:
    r"""Causal decayed linear attention with explicit weights ``W[i, j] = γ^{i−j} φ(q_i)·φ(k_j)``
    for j ≤ i (0 above the diagonal): the ground truth of :mod:`linattn.ops.decay`.

    q, k: (..., T, D); v: (..., T, Dv); gamma in [0, 1] broadcastable to ``...``.
    Returns (..., T, Dv)."""
    check_qkv(q, k, v, same_length=True)
    fmap, eps = resolve(feature_map, eps)
    fq, fk = features(fmap, q, k)
    T = q.shape[-2]
    g = check_gamma(gamma, tuple(q.shape[:-2]), fq)[..., None, None]
    idx = torch.arange(T, device=q.device)
    lag = (idx[:, None] - idx[None, :]).to(fq.dtype)
    W = (fq @ fk.transpose(-1, -2)) * torch.where(lag >= 0, g.pow(lag.clamp(min=0)), 0.0)
    return normalise(W @ v.to(fq.dtype), W.sum(-1), eps).to(q.dtype)


def decay_softmax_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    gamma: float | Tensor,
    *,
    scale: float | None = None,
) -> Tensor:
    r"""Causal softmax attention with the explicit biased scores
    ``scale·q_i·k_j + (i − j)·log γ`` (j ≤ i, −∞ above), queries at the last T of S positions:
    the ground truth of :mod:`linattn.ops.decay_softmax`, in float64.

    q: (..., T, D); k: (..., S, D); v: (..., S, Dv); gamma in (0, 1] broadcastable to ``...``.
    Returns (..., T, Dv) in q's dtype."""
    logg, scale = check_decay_softmax_inputs(q, k, v, gamma, scale)
    T, S = q.shape[-2], k.shape[-2]
    f64 = torch.float64
    i = torch.arange(S - T, S, device=q.device, dtype=f64)[:, None]
    j = torch.arange(S, device=q.device, dtype=f64)[None, :]
    bias = (i - j) * logg.to(f64)[..., None, None]
    scores = scale * (q.to(f64) @ k.to(f64).transpose(-1, -2)) + bias
    scores = scores.masked_fill(j > i, -math.inf)
    return (scores.softmax(-1) @ v.to(f64)).to(q.dtype)


def window_linear_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    window: int,
    feature_map: str | FeatureMap = "elu",
    is_causal: bool = True,
    key_padding_mask: Tensor | None = None,
    eps: float | None = None,
) -> Tensor:
    r"""Sliding-window softmax + linear attention with the explicit T×T weights: the ground
    truth of :mod:`linattn.ops.window`.

    ``W[i, j] = exp(s_ij − m_i)`` inside the window (causal: ``0 ≤ i − j < w``; non-causal:
    ``|i − j| < w``), ``φ(q_i)·φ(k_j)·exp(−m_i)`` outside it (causal: j ≤ i − w only), 0 for
    padded keys; ``s_ij = q_i·k_j/√D``; ``o_i = Σ_j W[i, j] v_j / (Σ_j W[i, j] + ε·exp(−m_i))``,
    exactly the unscaled quotient. ``m_i = max(max of s_ij in the window, log|D_F + ε|)`` with
    D_F the row's linear normaliser, as in the op: every weight is at most 1, and exp(−m_i)
    overflows only when |D_F + ε| is below the dtype's smallest normal number.
    q, k: (..., T, D); v: (..., T, Dv). Returns (..., T, Dv)."""
    check_qkv(q, k, v, same_length=True)
    w = check_window(window)
    fmap, eps = resolve(feature_map, eps)
    keep = key_mask_for(key_padding_mask, k)
    fq, fk = features(fmap, q, k, keep)
    acc = fq.dtype
    T = q.shape[-2]
    if T == 0:
        return q.new_zeros(*q.shape[:-2], 0, v.shape[-1])
    s = q.to(acc) @ zero_padded(k.to(acc), keep).transpose(-1, -2) / math.sqrt(q.shape[-1])
    idx = torch.arange(T, device=q.device)
    lag = idx[:, None] - idx[None, :]  # i − j
    near = (lag >= 0) & (lag < w) if is_causal else lag.abs() < w
    far = lag >= w if is_causal else lag.abs() >= w
    if keep is not None:
        kept = keep.squeeze(-1).unsqueeze(-2)  # (B, 1, ..., 1, T)
        near, far = near & kept, far & kept
    kern = torch.where(far, fq @ fk.transpose(-1, -2), 0.0)
    far_den = (kern.sum(-1, keepdim=True) + eps).detach().abs()
    m = torch.maximum(torch.where(near, s, float("-inf")).amax(-1, keepdim=True).detach(),
                      torch.where(far_den > 0, far_den.log(), float("-inf")))
    m = torch.where(m == float("-inf"), 0.0, m)  # a row with no key: zeros
    # exp(−m) ≤ 1/|D_F + ε| where D_F + ε ≠ 0; elsewhere ε = 0 and no far key: no scale needed
    scale = torch.where(far_den > 0, torch.exp(-m), 0.0)
    W = torch.where(near, torch.exp(torch.where(near, s, 0.0) - m), kern * scale)
    den = W.sum(-1) + eps * scale[..., 0]
    return normalise(W @ zero_padded(v.to(acc), keep), den, 0.0).to(q.dtype)


def flowformer_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    feature_map: str | FeatureMap = "sigmoid",
    is_causal: bool = False,
    key_padding_mask: Tensor | None = None,
    query_padding_mask: Tensor | None = None,
    eps: float | None = None,
) -> Tensor:
    r"""Flow-Attention with every flow a row or column sum of an explicit Tq×Tk matrix: the
    ground truth of :mod:`linattn.ops.flowformer` (whose docstring has the formulas).

    ``A[i, j] = (φ(q_i)+ε)·φ(k_j)`` for the sinks' flows, ``B[j, i] = (φ(k_j)+ε)·φ(q_i)`` for
    the sources'; a sink sees the sources ``j`` of ``L_in[i, j]`` (unpadded, and j ≤ i when
    causal), a source the sinks ``i`` of ``L_out[j, i]`` (unpadded, and i ≤ j when causal); the
    position counts are the row sums of these masks. ``o = W v`` with
    ``W[i, j] = L_in[i, j] σ(Î_i·r) φ(q_i)·φ(k_j) c_j / I_i`` (r = n/m, or 1 when causal).
    q: (..., Tq, D), k: (..., Tk, D), v: (..., Tk, Dv) -> (..., Tq, Dv)."""
    check_qkv(q, k, v, same_length=is_causal)
    fmap, eps = flow_feature_map(feature_map), flow_eps(eps)
    keep_k = key_mask_for(key_padding_mask, k)
    keep_q = query_mask_for(query_padding_mask, q)
    acc = accumulation_dtype(q.dtype)
    fq = fmap.forward_queries(q.to(acc))
    fk = zero_padded(fmap.forward_keys(zero_padded(k.to(acc), keep_k)), keep_k)
    v = zero_padded(v.to(acc), keep_k)
    Tq, Tk = q.shape[-2], k.shape[-2]
    dev = q.device
    if is_causal:
        link_in = causal_mask(Tq, dev)  # [i, j]: j ≤ i
        link_out = link_in  # [j, i]: i ≤ j (the sinks up to the source, as in the authors' code)
    else:
        link_in = torch.ones(Tq, Tk, dtype=torch.bool, device=dev)
        link_out = link_in.transpose(0, 1)
    kk = torch.ones(Tk, dtype=torch.bool, device=dev) if keep_k is None \
        else keep_k.squeeze(-1)  # (B, 1, …, Tk): the unpadded sources
    kq = torch.ones(Tq, dtype=torch.bool, device=dev) if keep_q is None \
        else keep_q.squeeze(-1)  # the unpadded sinks
    L_in = link_in & kk.unsqueeze(-2)  # (…, Tq, Tk)
    L_out = link_out & kq.unsqueeze(-2)  # (…, Tk, Tq)
    zero = fq.new_zeros(())
    A = torch.where(L_in, (fq + eps) @ fk.transpose(-1, -2), zero)
    B = torch.where(L_out, (fk + eps) @ fq.transpose(-1, -2), zero)
    eps_q, eps_k = eps * (fq + eps).sum(-1), eps * (fk + eps).sum(-1)  # (φ + ε)·ε1
    I_raw = A.sum(-1) + eps_q  # (…, Tq)
    O_raw = B.sum(-1) + eps_k  # (…, Tk)
    I_raw = torch.where(I_raw == 0, torch.ones_like(I_raw), I_raw)
    O_raw = torch.where(O_raw == 0, torch.ones_like(O_raw), O_raw)
    if is_causal:  # flows per visible term: divided by the position counts
        n_in, n_out = L_in.to(acc).sum(-1), L_out.to(acc).sum(-1)  # N_k(i), N_q(j)
    else:
        n_in, n_out = fq.new_ones(()), fq.new_ones(())
    inv_I, inv_O = n_in / I_raw, n_out / O_raw  # 1/I_i, 1/O_j
    conserved_sink = ((A * inv_O.unsqueeze(-2)).sum(-1) + eps_q) / n_in.clamp(min=1)
    sink_terms = torch.where(L_out, B * inv_I.unsqueeze(-2), zero)
    conserved_source = ((sink_terms.sum(-1) + eps_k) / n_out.clamp(min=1)).clamp(-1.0, 1.0)
    e = conserved_source.exp() * kk  # padded sources 0 (bounded: Ô ≤ 1)
    if is_causal:  # c_j over the running sum of the sources j' ≤ j
        key_link = causal_mask(Tk, dev) & kk.unsqueeze(-2)  # (…, Tk, Tk)
        den = torch.where(key_link, e.unsqueeze(-2), zero).sum(-1)
        n_src = key_link.to(acc).sum(-1)  # N_k(j)
        allocation = torch.sigmoid(conserved_sink)
    else:
        den = e.sum(-1, keepdim=True)
        n_src = kk.to(acc).sum(-1, keepdim=True)  # m
        n_sink = kq.to(acc).sum(-1, keepdim=True)  # n
        allocation = torch.sigmoid(conserved_sink * n_sink / n_src.clamp(min=1))
    competition = e * n_src / torch.where(den == 0, torch.ones_like(den), den)  # c_j: (…, Tk)
    W = torch.where(L_in, fq @ fk.transpose(-1, -2), zero) * competition.unsqueeze(-2)
    W = W * (allocation / I_raw).unsqueeze(-1)
    return (W @ v).to(q.dtype)


def _recurrence(q: Tensor, k: Tensor, v: Tensor, beta: Tensor | None, g: Tensor | None,
                gk: Tensor | None, gv: Tensor | None, scale: float | None,
                initial_state: Tensor | None, qk_l2norm: bool) -> tuple[Tensor, Tensor]:
    """The gated (β None) or delta-rule recurrence in float64, one token at a time."""
    f64 = torch.float64
    q, k, v = q.to(f64), k.to(f64), v.to(f64)
    if qk_l2norm:
        q = q / (q * q).sum(-1, keepdim=True).add(1e-6).sqrt()
        k = k / (k * k).sum(-1, keepdim=True).add(1e-6).sqrt()
    *batch, T, K = q.shape
    s = K ** -0.5 if scale is None else scale
    S = q.new_zeros(*batch, K, v.shape[-1]) if initial_state is None else initial_state.to(f64)
    outs = []
    for t in range(T):
        if g is not None:
            S = S * g[..., t].to(f64).exp()[..., None, None]
        if gk is not None:
            S = S * gk[..., t, :].to(f64).exp()[..., :, None]
        if gv is not None:
            S = S * gv[..., t, :].to(f64).exp()[..., None, :]
        k_t, v_t = k[..., t, :], v[..., t, :]
        if beta is not None:  # write β(v − Sᵀk): the state's prediction for k_t is replaced
            v_t = beta[..., t, None].to(f64) * (v_t - torch.einsum("...k,...kv->...v", k_t, S))
        S = S + k_t[..., :, None] * v_t[..., None, :]
        outs.append(torch.einsum("...k,...kv->...v", s * q[..., t, :], S))
    o = torch.stack(outs, dim=-2) if outs else q.new_zeros(*batch, 0, v.shape[-1])
    return o, S


def gated_linear_attention(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor | None = None, gk: Tensor | None = None,
    gv: Tensor | None = None, *, scale: float | None = None,
    initial_state: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """``S_t = e^{g_t}·diag(e^{gk_t})·S_{t−1}·diag(e^{gv_t}) + k_t v_tᵀ``, ``o_t = S_tᵀ(s·q_t)``,
    walked token by token in float64 (:mod:`linattn.ops.gated` for the fast form).

    q, k: (..., T, K); v: (..., T, V); g (..., T), gk (..., T, K), gv (..., T, V) log-gates or
    None; scale default ``K**-0.5``; initial_state (..., K, V) or None. Returns (o (..., T, V),
    final state (..., K, V)), both float64."""
    return _recurrence(q, k, v, None, g, gk, gv, scale, initial_state, False)


def delta_rule(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None = None,
    gk: Tensor | None = None, gv: Tensor | None = None, *, scale: float | None = None,
    initial_state: Tensor | None = None, qk_l2norm: bool = False,
) -> tuple[Tensor, Tensor]:
    """The (gated) delta rule ``S' = e^{g}·diag(e^{gk})·S·diag(e^{gv})``,
    ``S_t = S' + k_t β_t (v_t − S'ᵀk_t)ᵀ``, ``o_t = S_tᵀ(s·q_t)``, token by token in float64
    (:mod:`linattn.ops.delta` for the fast form).

    q, k: (..., T, K); v: (..., T, V); beta, g: (..., T); gk (..., T, K), gv (..., T, V) or
    None. Returns (o (..., T, V), final state (..., K, V)), both float64."""
    return _recurrence(q, k, v, beta, g, gk, gv, scale, initial_state, qk_l2norm)
