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
(2.6–5× for training at T = 4,096 here: docs/bench-recurrences.md). Two identities make the
fast kernel do it:

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

from linattn.ops._common import (
    block_ranges,
    check_gamma,
    check_positive_int,
    check_qkv,
    check_scale,
    check_values,
    graph_grads,
    needs_grad,
    shown,
)
from linattn.ops._library import takes_inference_tensors, tracing

DEFAULT_BLOCK_SIZE = 512
#: Scales above √max of the working dtype are computed in float64: a score of scale·q·k
#: overflows there at |q·k| > √max (at scale 1e38, float32's scores of random q, k were inf).
_LARGE_SCALE = {dt: torch.finfo(dt).max ** 0.5 for dt in (torch.float32, torch.float64)}


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
    check_values(g, lambda g: g != 0,
                 "gamma: expected decays in (0, 1] (log γ must be finite)",
                 lambda: f", got {shown(gamma)}")
    return g.log(), check_scale(scale, q.shape[-1], positive=True, dtype=q.dtype)


@takes_inference_tensors()
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
    broadcastable to ``...`` (e.g. (H,) for q of shape (B, H, T, D)); scale, a finite positive
    number, defaults to ``D**-0.5``; ``block_size`` query rows per kernel call. Returns
    (..., T, Dv) in q's dtype (T = 0: an empty output). T = S is a whole sequence, T < S a
    chunk after a KV cache of S − T tokens.

    Differentiable twice: the backward of the CPU flash kernel is not differentiable itself, so
    with ``create_graph=True`` (gradient penalties, Hessian-vector products) the backward
    differentiates a recomputation in plain torch operations (:func:`_math_attention`, a
    (block_size, S) score matrix per block) instead.
    """
    logg, scale = check_decay_softmax_inputs(q, k, v, gamma, scale)
    block_size = check_positive_int(block_size, "block_size")
    if q.shape[-2] == 0:  # no query: an empty output, still connected to every input
        return v[..., :0, :] + (q[..., :1] + k[..., :0, :1]) * 0 + logg[..., None, None] * 0
    o = _blocked(q, k, v, logg, scale, block_size, F.scaled_dot_product_attention)
    if needs_grad(q, k, v, logg) and not tracing(q, k, v, logg):
        return _SecondOrder.apply(o, q, k, v, logg, scale, block_size)
    return o


def _blocked(q: Tensor, k: Tensor, v: Tensor, logg: Tensor, scale: float, block_size: int,
             attention) -> Tensor:
    """The blocked computation of the module docstring on checked arguments (T ≥ 1), with
    ``attention`` in place of ``F.scaled_dot_product_attention`` (same signature)."""
    dtype = q.dtype
    work = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    if scale > _LARGE_SCALE[work]:  # scores beyond √max overflow the dtype at |q·k| > √max
        work = torch.float64
    # the scale goes into q (the kernels run at scale 1): the bias coordinate below is then
    # (p − j)·log γ itself, where dividing it by a tiny scale (1e-39) overflowed to ±inf
    q = q.to(work) * scale
    k, v, logg = k.to(work), v.to(work), logg.to(work)
    T, S, D, Dv = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    key_pos = torch.arange(S, device=q.device, dtype=work)
    if T == 1:  # a decoding step: its bias row is S numbers, cheaper than extending k by one
        bias = ((S - 1 - key_pos) * logg[..., None])[..., None, :]  # (..., 1, S), ≤ 0
        o = attention(q, k, v, attn_mask=bias, scale=1.0)
        return o.to(dtype)
    width = max(D + 1, Dv)
    batch = q.shape[:-2]
    q_ext = torch.cat([q, q.new_ones(*batch, T, 1), q.new_zeros(*batch, T, width - D - 1)], -1)
    v_pad = F.pad(v, (0, width - Dv))
    rate = logg[..., None]  # (..., 1): the coordinate per unit of lag
    outs = []
    for lo, hi in block_ranges(T, block_size):
        p, end = S - T + lo, S - T + hi  # the block's first position; keys [0, end)
        coord = ((p - key_pos[:end]) * rate)[..., None]  # (..., end, 1)
        k_ext = torch.cat([k[..., :end, :], coord.expand(*batch, end, 1),
                           k.new_zeros(*batch, end, width - D - 1)], -1)
        if p == 0:
            o = attention(q_ext[..., lo:hi, :], k_ext, v_pad[..., :end, :], is_causal=True,
                          scale=1.0)
        else:  # row r sees keys j <= p + r (lower-right causal)
            mask = (torch.arange(end, device=q.device)[None, :]
                    <= torch.arange(p, end, device=q.device)[:, None])
            o = attention(q_ext[..., lo:hi, :], k_ext, v_pad[..., :end, :], attn_mask=mask,
                          scale=1.0)
        outs.append(o[..., :Dv])
    return torch.cat(outs, -2).to(dtype)


def _math_attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None,
                    is_causal: bool = False, scale: float = 1.0) -> Tensor:
    """``F.scaled_dot_product_attention``'s function for the calls :func:`_blocked` makes (a
    float bias, a bool mask, or causal with as many keys as queries), in plain torch
    operations: differentiable any number of times."""
    scores = (q @ k.transpose(-1, -2)) * scale
    if is_causal:
        attn_mask = (torch.arange(k.shape[-2], device=q.device)[None, :]
                     <= torch.arange(q.shape[-2], device=q.device)[:, None])
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attn_mask, float("-inf"))  # every row keeps a key
    elif attn_mask is not None:
        scores = scores + attn_mask
    return scores.softmax(-1) @ v


class _SecondOrder(torch.autograd.Function):
    """The identity on the op's output ``o``, which also takes the op's inputs, so that its
    backward can choose the path of the gradient.

    A plain backward passes the gradient on to ``o``'s own graph: the flash kernel's backward,
    as without this node (which costs ~30 µs per call). With ``create_graph=True`` that backward
    is not differentiable, so this node sends nothing into ``o``'s graph and returns the inputs'
    gradients itself instead: a recomputation of the output with :func:`_math_attention` from
    the saved inputs, differentiated by autograd with the graph kept."""

    @staticmethod
    def forward(ctx, o, q, k, v, logg, scale, block_size):
        ctx.save_for_backward(q, k, v, logg)
        ctx.cfg = (scale, block_size)
        return o.detach()

    @staticmethod
    def backward(ctx, grad):
        if not torch.is_grad_enabled():
            return grad, None, None, None, None, None, None
        q, k, v, logg = ctx.saved_tensors  # create_graph=True: a differentiable gradient
        o = _blocked(q, k, v, logg, *ctx.cfg, _math_attention)
        grads = graph_grads([o], [grad], [q, k, v, logg], list(ctx.needs_input_grad[1:5]))
        return None, *grads, None, None
