r"""Causal softmax attention with a per-head exponential decay (ALiBi), fast on CPU.

The softmax analogue of :mod:`linattn.ops.decay`, and the attention of the language model's
softmax baseline. With the queries at the last T of S positions (the KV-cache convention:
query r sits at position ``i = S − T + r``) and γ ∈ (0, 1] one decay per batch slice, row i is

.. math::
    o_i = \sum_{j \le i} \operatorname{softmax}_j\bigl(\text{scale}\; q_i\cdot k_j
          + (i - j)\log\gamma\bigr)\, v_j,

an additive bias ``(i − j)·log γ ≤ 0`` (ALiBi): weights ``e^{s_{ij}}·γ^{i−j}``, so the
softmax weights fade with the lag exactly as the linear model's do.

Why not ``scaled_dot_product_attention(q, k, v, attn_mask=bias)``: a float mask costs a
materialised (T, S) bias per head and, on CPU, a kernel several times slower than the causal one
(2.6–5× for training at T = 4,096 here: docs/benchmarks.md). Two identities make the fast kernel
do it:

* ``(i − j)·log γ = (i − p)·log γ + (p − j)·log γ`` for any p. The first term is constant along
  the row, and softmax ignores a row constant; the second depends on the key only, so it is one
  more coordinate of the dot product: ``q̃ = [q, 1]``, ``k̃_j = [k_j, (p − j)·log γ / scale]``
  (``scale·q̃·k̃_j`` is then the biased score up to the row constant).
* Queries go through in blocks of ``block_size`` rows, each with p its first row's position,
  against the keys up to its last row, masked by a boolean lower-right triangle
  (``is_causal`` when the block starts at position 0). The coordinate is then at most
  ``block_size·|log γ|`` for the keys a row can weigh (older keys are more negative, and
  vanish), so float32 rounding stays at ``ulp(block_size·|log γ|)`` in the score; one p for
  the whole sequence would put ``S·|log γ|`` there (18,000 at S = 64k, γ = 0.75: errors of
  10⁻³ in every score).

A single query (T = 1, a decoding step) takes its bias row directly as a float mask of S
numbers per head instead: exact, and cheaper than extending every cached key.

Values are zero-padded to the width of q̃ (the CPU flash kernel wants one head dimension for
q, k and v) and the padding is cut off the output. Half-precision inputs are computed in
float32 (the extra coordinate needs the mantissa) and returned in their dtype. Cost: O(T·S·D)
time, O(block_size·S) memory for a block's mask and scores; never (T, S) per head.

:func:`linattn.reference.decay_softmax_attention` materialises the biased scores in float64:
the ground truth the tests hold this to.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from linattn.ops._common import block_ranges, check_gamma, check_qkv, check_values

DEFAULT_BLOCK_SIZE = 512


def check_decay_softmax_inputs(q: Tensor, k: Tensor, v: Tensor, gamma: float | Tensor,
                               scale: float | None) -> tuple[Tensor, float]:
    """Validated ``log γ`` (shape ``q.shape[:-2]``, q's dtype) and scale; errors name the
    argument. q: (..., T, D), k: (..., S, D), v: (..., S, Dv) with S ≥ T."""
    check_qkv(q, k, v, same_length=False)
    T, S = q.shape[-2], k.shape[-2]
    if S < T:
        raise ValueError(f"k: expected at least as many keys as queries (the queries are the "
                         f"last T of S positions), got {S} keys for {T} queries")
    g = check_gamma(gamma, tuple(q.shape[:-2]), q)
    check_values(g != 0, "gamma: expected decays in (0, 1] (log γ must be finite)",
                 lambda: f", got {gamma!r}")
    if scale is None:
        scale = q.shape[-1] ** -0.5
    elif not isinstance(scale, (int, float)) or isinstance(scale, bool) or not scale > 0:
        raise ValueError(f"scale: expected a positive number, got {scale!r}")
    return g.log(), float(scale)


def decay_softmax_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    gamma: float | Tensor,
    *,
    scale: float | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> Tensor:
    """Causal softmax attention with the bias ``(i − j)·log γ`` (module docstring).

    q: (..., T, D) at positions S − T … S − 1; k: (..., S, D); v: (..., S, Dv); gamma in (0, 1]
    broadcastable to ``...`` (e.g. (H,) for q of shape (B, H, T, D)); scale defaults to
    ``D**-0.5``; ``block_size`` query rows per kernel call. Returns (..., T, Dv) in q's dtype.
    T = S is a whole sequence, T < S a chunk after a KV cache of S − T tokens.
    """
    logg, scale = check_decay_softmax_inputs(q, k, v, gamma, scale)
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
        raise ValueError(f"block_size: expected a positive int, got {block_size!r}")
    dtype = q.dtype
    work = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    q, k, v, logg = q.to(work), k.to(work), v.to(work), logg.to(work)
    T, S, D, Dv = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    key_pos = torch.arange(S, device=q.device, dtype=work)
    if T == 1:  # a decoding step: its bias row is S numbers, cheaper than extending k by one
        bias = ((S - 1 - key_pos) * logg[..., None])[..., None, :]  # (..., 1, S), ≤ 0
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)
        return o.to(dtype)
    width = max(D + 1, Dv)
    batch = q.shape[:-2]
    q_ext = torch.cat([q, q.new_ones(*batch, T, 1), q.new_zeros(*batch, T, width - D - 1)], -1)
    v_pad = F.pad(v, (0, width - Dv))
    rate = (logg / scale)[..., None]  # (..., 1): the coordinate per unit of lag
    outs = []
    for lo, hi in block_ranges(T, block_size):
        p, end = S - T + lo, S - T + hi  # the block's first position; keys [0, end)
        coord = ((p - key_pos[:end]) * rate)[..., None]  # (..., end, 1)
        k_ext = torch.cat([k[..., :end, :], coord.expand(*batch, end, 1),
                           k.new_zeros(*batch, end, width - D - 1)], -1)
        if p == 0:
            o = F.scaled_dot_product_attention(q_ext[..., lo:hi, :], k_ext, v_pad[..., :end, :],
                                               is_causal=True, scale=scale)
        else:  # row r sees keys j <= p + r (lower-right causal)
            mask = (torch.arange(end, device=q.device)[None, :]
                    <= torch.arange(p, end, device=q.device)[:, None])
            o = F.scaled_dot_product_attention(q_ext[..., lo:hi, :], k_ext, v_pad[..., :end, :],
                                               attn_mask=mask, scale=scale)
        outs.append(o[..., :Dv])
    return torch.cat(outs, -2).to(dtype)
