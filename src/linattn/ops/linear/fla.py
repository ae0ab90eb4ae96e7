"""flash-linear-attention's linear attention names (``*_linear_attn``: no feature map, fla's
optional normaliser) on :func:`linattn.gated_linear_attention` with no gate; see
:mod:`linattn.fla`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.ops._common import accumulation_dtype, split_scale
from linattn.ops._fla import (
    _flag,
    _kwargs,
    _qkv,
    _scale,
    _state,
    _tensor,
    _varlen,
)
from linattn.ops.gated.fla import _gla

__all__ = [
    "chunk_linear_attn",
    "fused_chunk_linear_attn",
    "fused_recurrent_linear_attn",
]


#: fla's ``normalize=True`` denominator guard: o / (⟨scale·q_t, Σ_{s≤t} k_s⟩ + eps).
NORMALIZE_EPS = 1e-10


# ----------------------------------------------------------------------------- linear attention


def _linear_attn(q, k, v, scale, initial_state, output_final_state, reverse, normalize,
                 cu_seqlens):
    B, T, H, _, K = _qkv(q, k, v)
    V = v.shape[-1]
    normalize = _flag("normalize", normalize)
    output_final_state = _flag("output_final_state", output_final_state)
    reverse = _flag("reverse", reverse)
    s = _scale(scale, K)
    cu = _varlen(cu_seqlens, q)
    N = B if cu is None else len(cu) - 1
    z0 = None
    if isinstance(initial_state, tuple):
        if not normalize:
            raise ValueError("initial_state: a (kv_state, z_state) tuple needs normalize=True")
        if len(initial_state) != 2:
            raise ValueError(f"initial_state: expected a (kv_state, z_state) pair, got "
                             f"{len(initial_state)} items")
        initial_state, z0 = initial_state
        if z0 is not None:
            z0 = _tensor("initial_state", z0, 4)
            if tuple(z0.shape) != (N, 1, H, K):
                raise ValueError(f"initial_state: expected z_state of shape (N, 1, H, K) = "
                                 f"{(N, 1, H, K)}, got {tuple(z0.shape)}")
    S0 = _state("initial_state", initial_state, N, H, K, V, False)
    if not normalize:
        o, S = _gla(q, k, v, scale=s, initial_state=S0, output_final_state=True,
                    reverse=reverse, cu=cu)
        return o, (S if output_final_state else None)
    m, p = split_scale(s)  # scale·q may overflow where the quotient does not
    o, S = _gla(q, k, v, scale=m, initial_state=S0, output_final_state=True, reverse=reverse,
                cu=cu)
    o, z = _normalized(o, q, k, m, z0, reverse, cu, p)
    return o, ((S, z) if output_final_state else None)


def _normalized(o: Tensor, q: Tensor, k: Tensor, scale: float, z0: Tensor | None, reverse: bool,
                cu: Tensor | None, p: float = 1.0) -> tuple[Tensor, Tensor]:
    """fla's ``normalize=True``: o_t / (⟨scale·q_t, z0 + Σ_{s≤t} k_s⟩ + 1e-10) (s ≥ t if
    ``reverse``), and the key sum after the last token (first if reverse): (B|N, 1, H, K).
    ``p`` (:func:`~linattn.ops._common.split_scale`): o and ``scale`` are the true scale's
    divided by p, so the quotient is the same with 1e-10 / p, in float64 (float32 cannot hold
    1e-10 / p) when p is not 1."""
    acc = accumulation_dtype(q.dtype)
    wide = acc if p == 1.0 else torch.float64
    B, T, H, K = q.shape
    spans = [(0, T)] if cu is None else list(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True))
    kk = k.to(acc)
    cums, zs = [], []
    for n, (a, b) in enumerate(spans):
        part = kk[:, a:b]
        c = part.flip(1).cumsum(1).flip(1) if reverse else part.cumsum(1)
        if z0 is not None:
            c = c + (z0 if cu is None else z0[n:n + 1]).to(acc)
        cums.append(c)
        if b > a:
            zs.append(c[:, :1] if reverse else c[:, -1:])
        else:
            zs.append(torch.zeros(c.shape[0], 1, H, K, dtype=acc, device=q.device)
                      if z0 is None else (z0 if cu is None else z0[n:n + 1]).to(acc))
    k_cum = torch.cat(cums, dim=1)
    den = (q.to(wide) * scale * k_cum.to(wide)).sum(-1, keepdim=True) + NORMALIZE_EPS / p
    return (o.to(wide) / den).to(o.dtype), torch.cat(zs, dim=0).to(k.dtype)


def chunk_linear_attn(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float | None = None,
    initial_state: Tensor | tuple | None = None,
    output_final_state: bool = False,
    normalize: bool = True,
    cu_seqlens: torch.LongTensor | None = None,
    **kwargs,
) -> tuple[Tensor, Tensor | tuple | None]:
    """Plain causal linear attention (fla's ``fla.ops.linear_attn.chunk_linear_attn``, and
    under its name ``fused_chunk_linear_attn`` too):
    ``S_t = S_{t−1} + k_t v_tᵀ``, ``o_t = S_tᵀ(scale·q_t)`` — no feature map (apply yours to q
    and k first) — divided, if ``normalize`` (default True here, as fla), by
    ``⟨scale·q_t, z0 + Σ_{s≤t} k_s⟩ + 1e-10``. Runs
    :func:`linattn.ops.gated.gated_linear_attention` with no gate (not
    :func:`linattn.linear_attention`, which applies a feature map and another normaliser).

    Args:
        q, k: (B, T, H, K); v: (B, T, H, V); scale: default ``K**-0.5``.
        initial_state: (N, H, K, V), or with ``normalize`` a tuple (kv (N, H, K, V) or None,
            z (N, 1, H, K) or None), the running key sum of the denominator.
        output_final_state: return the final state: (N, H, K, V), or with ``normalize`` the tuple
            (kv (N, H, K, V), z (N, 1, H, K) in k's dtype); else None.
        cu_seqlens: (N + 1,) packed sequences (B = 1).
        **kwargs: none taken (``head_first`` is a ValueError, other names a TypeError).

    Returns:
        o (B, T, H, V) in q's dtype, and the final state or None.
    """
    _kwargs("chunk_linear_attn", kwargs)
    return _linear_attn(q, k, v, scale, initial_state, output_final_state,
                        False, normalize, cu_seqlens)


#: fla's fused-chunk name of the same function: the same signature (normalize default True) and
#: the same maths (fla's variants differ only in GPU kernels), so one function serves both.
fused_chunk_linear_attn = chunk_linear_attn


def fused_recurrent_linear_attn(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float | None = None,
    initial_state: Tensor | tuple | None = None,
    output_final_state: bool = False,
    reverse: bool = False,
    normalize: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    **kwargs,
) -> tuple[Tensor, Tensor | tuple | None]:
    """:func:`chunk_linear_attn` with fla's recurrent signature: ``reverse`` (scan from the last
    token; the key sum runs backwards too) and ``normalize`` defaulting to **False** (as fla)."""
    _kwargs("fused_recurrent_linear_attn", kwargs)
    return _linear_attn(q, k, v, scale, initial_state,
                        output_final_state, reverse, normalize, cu_seqlens)


