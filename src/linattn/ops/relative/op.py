r"""Relative positions inside linear attention, without a T×T matrix.

A second positive kernel scores the lag between query and key:

.. math::
    \mathrm{sim}(i,j) = \varphi(q_i)\cdot\varphi(k_j) + \varphi(q_i)\cdot\varphi(r_{j-i}),
    \qquad o_i = \frac{\varphi(q_i)^\top\bigl(\varphi(K)^\top V + S_i\bigr)}
                     {\varphi(q_i)^\top\bigl(\varphi(K)^\top 1 + s_i\bigr)},

    S_i = \sum_j \varphi(r_{j-i})\, v_j^\top \;(\ell\times D_v),
    \qquad s_i = \sum_j \varphi(r_{j-i}).

The content term is ordinary linear attention. ``S_i`` is a cross-correlation along time of the
lag sequence ``a_m = φ(r_m)`` with the values. As everywhere in linattn the normaliser rides along
as a ones column of V (``v1 = [v, 1]``), so ``s_i`` is the last column of ``S_i``; this keeps one
code path and also handles key padding, which a prefix sum over lags alone could not.

FFT form. With ``w_t = v1_{T-1-t}`` (time reversed) and ``a`` indexed ``0 … 2T-2`` (index
``m + T - 1`` for lag m), ``S_i = (a * w)[2T-2-i]``, a linear convolution. Indices ``T-1 … 2T-2``
of a circular convolution of size ``n ≥ 2T-1`` are free of wrap-around, so one ``rfft`` of each
side, a product and one ``irfft`` give every ``S_i``: O(ℓ·Dv·n log n) time per (batch, head).
Causal attention keeps lags m ≤ 0 only (``a_m = 0`` for m > 0).

The spectrum product is the large intermediate: ``(n/2+1)·ℓ·(Dv+1)`` complex numbers per
(batch, head), then ``n·ℓ·(Dv+1)`` reals after the inverse. It is computed in blocks of
features (and of batch rows) sized to :data:`FFT_BLOCK_BYTES`, each block contracted with
``φ(q)`` at once, so peak memory stays bounded whatever ℓ.

Direct form. For short sequences the FFT's constant factors lose to the explicit lag scores
``P_ij = φ(q_i)·φ(r_{j−i})``: ``φ(Q)φ(R)ᵀ`` is (T, 2T−1), gathered into (T, T). That is T×T,
so it is used only below a measured crossover (:data:`DIRECT_MAX_T`); both forms are exact.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from linattn.feature_maps import FeatureMap
from linattn.ops import dispatch
from linattn.ops._common import (
    causal_chunked,
    check_chunk_size,
    check_flag,
    check_float_tensor,
    check_qkv,
    features,
    key_mask_for,
    needs_grad,
    resolve,
    split_normalised,
    values_with_ones,
)
from linattn.ops._library import takes_inference_tensors

__all__ = ["relative_linear_attention", "DIRECT_MAX_T", "FFT_BLOCK_BYTES"]

#: Sequences up to this length use the direct form. Measured by benchmarks/relative.py
#: (forward+backward, B=64, H=4, D=16): direct 1.9x faster at T=512, even at 1024 (where its
#: (T, T) scores already take 1 GiB), FFT 4x faster at 2048.
DIRECT_MAX_T = 512
#: Budget for one block of the FFT spectrum product (bytes).
FFT_BLOCK_BYTES = 256 * 2**20


def check_r(r: Tensor, q: Tensor) -> None:
    """r: (..., 2T−1, D) broadcastable against q's batch dimensions; ValueError naming r."""
    check_float_tensor(r, "r")
    T, D = q.shape[-2:]
    lags = max(2 * T - 1, 0)  # an empty sequence has no lags
    if r.dim() < 2 or r.shape[-2] != lags or r.shape[-1] != D:
        raise ValueError(
            f"r: expected shape (H, 2T-1, D) = (H, {lags}, {D}) for q of shape "
            f"{tuple(q.shape)}, got {tuple(r.shape)}"
        )
    try:
        torch.broadcast_shapes(r.shape[:-2], q.shape[:-2])
    except RuntimeError:
        raise ValueError(
            f"r: leading dimensions {tuple(r.shape[:-2])} do not broadcast against q's "
            f"{tuple(q.shape[:-2])}"
        ) from None


def _lag_features(fmap: FeatureMap, r: Tensor, dtype: torch.dtype, is_causal: bool) -> Tensor:
    """φ(r) in the accumulation dtype, lags m > 0 zeroed when causal. (..., 2T−1, L)."""
    fr = fmap.forward_keys(r.to(dtype))
    if is_causal:
        T = (r.shape[-2] + 1) // 2
        fr = torch.cat([fr[..., :T, :], torch.zeros_like(fr[..., T:, :])], dim=-2)
    return fr


def _relative_direct(fq: Tensor, fr: Tensor, v1: Tensor) -> Tensor:
    """Σ_j φ(q_i)·φ(r_{j−i}) v1_j with the explicit (T, T) lag scores. -> (..., T, Dv+1)."""
    T = fq.shape[-2]
    G = fq @ fr.transpose(-1, -2)  # (..., T, 2T-1): query i against every lag
    pos = torch.arange(T, device=fq.device)
    lag = (pos[None, :] - pos[:, None] + T - 1).expand(*G.shape[:-1], T)
    P = G.gather(-1, lag)  # P[i, j] = G[i, j - i + T - 1]; lower triangular when causal
    return P @ v1


def fft_size(m: int) -> int:
    """The smallest 2^a·3^b·5^c ≥ m: FFTs of such lengths avoid the slow prime-size paths."""
    n = max(1, m)
    while True:
        x = n
        for p in (2, 3, 5):
            while x % p == 0:
                x //= p
        if x == 1:
            return n
        n += 1


def _fft_block(fq: Tensor, A: Tensor, W: Tensor, n: int) -> Tensor:
    """One block: fq (b, T, l), A = rfft of the lag features (b, F, l), W = rfft of reversed v1
    (b, F, C) -> (b, T, C)."""
    T = fq.shape[-2]
    conv = torch.fft.irfft(A.unsqueeze(-1) * W.unsqueeze(-2), n=n, dim=-3)  # (b, n, l, C)
    S = conv[:, T - 1 : 2 * T - 1].flip(1)  # S_i = conv[2T - 2 - i]: (b, T, l, C)
    return torch.einsum("btl,btlc->btc", fq, S)


def _relative_fft(fq: Tensor, fr: Tensor, v1: Tensor) -> Tensor:
    """Σ_j φ(q_i)·φ(r_{j−i}) v1_j via the FFT, blocked over batch rows and features.

    fq: (..., T, L), fr: (..., 2T−1, L) broadcastable, v1: (..., T, C). -> (..., T, C)."""
    T, L = fq.shape[-2:]
    C = v1.shape[-1]
    batch = torch.broadcast_shapes(fq.shape[:-2], fr.shape[:-2])
    fq = fq.expand(*batch, T, L).reshape(-1, T, L)
    v1 = v1.expand(*batch, T, C).reshape(-1, T, C)
    n = fft_size(2 * T - 1)
    # the lag spectrum once per head (r is shared by the batch), then broadcast to the rows
    A = torch.fft.rfft(fr, n=n, dim=-2)
    F_ = A.shape[-2]
    A = A.expand(*batch, F_, L).reshape(-1, F_, L)  # (N, F, L)
    W = torch.fft.rfft(v1.flip(-2), n=n, dim=-2)  # (N, F, C)
    # One (batch row, feature) column of the product costs F·C complex + n·C real numbers.
    per_col = (F_ * C * 2 + n * C) * fq.element_size()
    cols = max(1, FFT_BLOCK_BYTES // per_col)
    rows = max(1, min(fq.shape[0], cols // L))
    feats = L if rows > 1 else min(L, cols)
    grad = needs_grad(fq, A, v1)
    row_blocks = []
    for b0 in range(0, fq.shape[0], rows):
        b1 = min(b0 + rows, fq.shape[0])
        acc = None
        for l0 in range(0, L, feats):
            l1 = min(l0 + feats, L)
            args = (fq[b0:b1, :, l0:l1], A[b0:b1, :, l0:l1], W[b0:b1], n)
            if grad:  # recompute the block in backward rather than keep every spectrum
                part = checkpoint(_fft_block, *args, use_reentrant=False)
            else:
                part = _fft_block(*args)
            acc = part if acc is None else acc + part
        row_blocks.append(acc)
    out = torch.cat(row_blocks)
    return out.reshape(*batch, T, C)


@takes_inference_tensors()
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
    method: Literal["auto", "fft", "direct"] = "auto",
    chunk_size: int | None = None,
) -> Tensor:
    """Linear attention with relative-position kernel φ(q_i)·φ(r_{j−i}) added to φ(q_i)·φ(k_j).

    Args:
        q, k: (B, H, T, D); v: (B, H, T, Dv) (any leading dims; q, k, v share them).
        r: (H, 2T−1, D), broadcast against q's leading dims; ``r[..., m + T − 1, :]`` is the
            vector of lag m = j − i, m ∈ [−(T−1), T−1].
        feature_map: name or FeatureMap; keys and lag vectors both go through ``forward_keys``.
        is_causal: keys j ≤ i only, in both terms.
        key_padding_mask: bool (B, T), True = padding; such keys leave both terms.
        eps: added to the normaliser (None: the map's default).
        method: "fft" (O(T log T)), "direct" (explicit (T, T) lag scores) or "auto"
            (direct up to :data:`DIRECT_MAX_T`, FFT beyond).
        chunk_size: chunk length of the causal content term, a positive integer (default
            the policy's, :data:`linattn.ops.dispatch.DEFAULT_CHUNK_SIZE`).

    Returns:
        (B, H, T, Dv) in q's dtype; sums in float32 at least, FFT in that dtype too.
    """
    check_qkv(q, k, v, same_length=True)
    is_causal = check_flag(is_causal, "is_causal")
    check_r(r, q)
    if method not in ("auto", "fft", "direct"):
        raise ValueError(f"method: expected 'auto', 'fft' or 'direct', got {method!r}")
    chunk_size = check_chunk_size(chunk_size, dispatch.policy().chunk_size)
    fmap, eps = resolve(feature_map, eps)
    keep = key_mask_for(key_padding_mask, k)
    fq, fk = features(fmap, q, k, keep)
    fr = _lag_features(fmap, r, fq.dtype, is_causal)
    v1 = values_with_ones(v, fq.dtype, keep)  # a padded key also leaves the positional term

    T = q.shape[-2]
    if is_causal:
        content, _ = causal_chunked(fq, fk, v1, max(1, min(chunk_size, T)), None)
    else:
        content = fq @ (fk.transpose(-1, -2) @ v1)
    # nothing to transform (T = 0: no FFT size; no sequence or head: MKL's FFT refuses an
    # empty batch); the direct form gives the empty output
    use_direct = method == "direct" or q.numel() == 0 or (method == "auto" and T <= DIRECT_MAX_T)
    positional = (
        _relative_direct(fq, fr, v1) if use_direct else _relative_fft(fq, fr, v1)
    )
    out = split_normalised(content + positional, eps)
    if keep is not None and not use_direct:
        # A query that sees no unpadded key has a normaliser of exactly 0 and a zero output;
        # the FFT leaves ~1e-17 of round-off there instead, so zero such rows explicitly.
        kept = keep.to(out.dtype)
        seen = kept.cumsum(-2) if is_causal else kept.sum(-2, keepdim=True)
        out = torch.where(seen > 0, out, 0.0)
    return out.to(q.dtype)
