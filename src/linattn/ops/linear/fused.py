r"""Chunked, buffer-reusing linear attention with a recomputing backward (the CPU fast path).

The portable forms in :mod:`linattn.ops.linear.portable` apply φ to the whole sequence, build
[V, 1] and the per-chunk states as full-size temporaries, and let autograd keep all of them. On a
CPU that time goes to allocating and streaming T-sized tensors, not to the matmuls. Here every
pass walks the sequence in chunks of C tokens, so each temporary is (N, C, ·) and stays in cache:

non-causal, forward
    pass 1, keys:    KV1 += φ(k_c)ᵀ [v_c, 1]                     (N, ℓ, Dv+1)
    pass 2, queries: o_c  = φ(q_c) KV1, split into numerator / normaliser

causal, forward (chunk c, state S_c = Σ_{chunks < c} φ(k)ᵀ[v, 1])
    o_c = tril(φ(q_c) φ(k_c)ᵀ) [v_c, 1] + φ(q_c) S_c,   S_{c+1} = S_c + φ(k_c)ᵀ[v_c, 1]

backward
    Gradients of o = n / s with respect to [n, s] are dO1 = [g / s, −(g·o) / s]. Non-causal:
    dKV1 = Σ φ(q)ᵀ dO1, dφ(q) = dO1 KV1ᵀ, dφ(k) = [v, 1] dKV1ᵀ, d[v, 1] = φ(k) dKV1. Causal, in
    reverse chunk order with G = ∂L/∂S_{c+1} (the gradient flowing back from later chunks):
    dA = tril(dO1 [v, 1]ᵀ), dφ(q) = dA φ(k) + dO1 S_cᵀ, dφ(k) = dAᵀ φ(q) + [v, 1] Gᵀ,
    d[v, 1] = Aᵀ dO1 + φ(k) G, then G += φ(q)ᵀ dO1. φ is recomputed per chunk and
    differentiated with ``torch.autograd.grad``, so any token-wise map works. Only the chunk
    states S_c are kept from the forward ((T/C)·ℓ·(Dv+1) numbers, never one per token).
    With ``create_graph=True`` (double backward) the backward instead differentiates the
    portable formulas with autograd, so that the gradient itself has a graph.

Used by :func:`linattn.linear_attention` for long sequences on CPU when the feature map is
token-wise and has no trainable parameters (their gradients would need autograd's own graph);
everything else takes the portable path. Both agree to rounding, tested in float64. (float32
with 1 + elu or 1 + relu takes :mod:`linattn.ops.linear.native` instead, where that is
available.)
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.feature_maps import FeatureMap
from linattn.ops._common import (
    block_ranges,
    causal_chunked,
    causal_mask,
    clamped_chunk,
    flatten_heads,
    graph_grads,
    guarded,
    masked_key_features,
    split_normalised,
    to_chunks,
    values_with_ones,
    zero_padded,
)
from linattn.ops.linear.portable import portable_forward

__all__ = ["fused_linear_attention"]


def _split(o1: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """[n, s] -> (n / s, s): the output and the guarded normaliser the backward needs."""
    s = guarded(o1[..., -1:], eps)
    return o1[..., :-1] / s, s


def _grad_o1(g: Tensor, o: Tensor, s: Tensor) -> Tensor:
    """∂L/∂[n, s] from ∂L/∂o for o = n / s: (N, C, Dv) -> (N, C, Dv + 1)."""
    return torch.cat([g / s, -(g * o).sum(-1, keepdim=True) / s], dim=-1)


class _Chunks:
    """Per-chunk views and features of the flattened (N, T, ·) inputs."""

    def __init__(self, fmap, q, k, v, keep, chunk, acc):
        self.fmap, self.q, self.k, self.v, self.keep = fmap, q, k, v, keep
        self.chunk, self.acc = chunk, acc

    def ranges(self, x: Tensor):
        """(t0, t1) of the chunks of x's time axis (dimension 1)."""
        return block_ranges(x.shape[1], self.chunk)

    def keep_at(self, t0, t1):
        return None if self.keep is None else self.keep[:, t0:t1]

    def phi_q(self, t0, t1, x=None):
        return self.fmap.forward_queries(self.q[:, t0:t1].to(self.acc) if x is None else x)

    def phi_k(self, t0, t1, x=None):
        x = self.k[:, t0:t1].to(self.acc) if x is None else x
        return masked_key_features(self.fmap, x, self.keep_at(t0, t1))

    def v1(self, t0, t1):
        return values_with_ones(self.v[:, t0:t1], self.acc, self.keep_at(t0, t1))

    def leaf(self, x: Tensor, t0, t1) -> Tensor:
        return x[:, t0:t1].detach().to(self.acc).requires_grad_(True)


def _causal_block_backward(
    fq: Tensor, fk: Tensor, v1: Tensor, dO1: Tensor, S_in: Tensor, G_out: Tensor, chunk: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Gradients of one block of the chunked causal form, all its chunks at once.

    fq, fk: (N, Tb, L); v1, dO1: (N, Tb, Dv+1); S_in: state before the block; G_out: ∂L/∂(state
    after the block), both (N, L, Dv+1). Returns dφ(q), dφ(k), d[v, 1] and ∂L/∂S_in. Products
    run as 3-D ``bmm`` over (N·n) chunks, transposes as free views."""
    N, Tb, L = fq.shape
    Dv1 = v1.shape[-1]
    n = -(-Tb // chunk)  # chunks per sequence (not fq.shape[0] // N: N may be 0)
    fq, fk, v1, dO1 = (to_chunks(x, chunk).reshape(N * n, chunk, x.shape[-1])
                       for x in (fq, fk, v1, dO1))
    P = torch.bmm(fk.transpose(1, 2), v1).view(N, n, L, Dv1)  # each chunk's own state
    S = (P.cumsum(1) - P + S_in.unsqueeze(1)).view(-1, L, Dv1)  # state before each chunk
    Q = torch.bmm(fq.transpose(1, 2), dO1).view(N, n, L, Dv1)  # ∂L/∂S from each chunk
    G = (Q.flip(1).cumsum(1).flip(1) - Q + G_out.unsqueeze(1)).view(-1, L, Dv1)
    mask = causal_mask(chunk, fq.device)
    A = torch.bmm(fq, fk.transpose(1, 2)).mul_(mask)
    dA = torch.bmm(dO1, v1.transpose(1, 2)).mul_(mask)
    d_fq = torch.baddbmm(torch.bmm(dA, fk), dO1, S.transpose(1, 2))
    d_fk = torch.baddbmm(torch.bmm(dA.transpose(1, 2), fq), v1, G.transpose(1, 2))
    d_v1 = torch.baddbmm(torch.bmm(A.transpose(1, 2), dO1), fk, G)

    def unchunk(x: Tensor) -> Tensor:
        return x.reshape(N, n * chunk, x.shape[-1])[:, :Tb]

    return unchunk(d_fq), unchunk(d_fk), unchunk(d_v1), G_out + Q.sum(1)


class _FusedLinearAttention(torch.autograd.Function):
    """Inputs flattened to (N, T, ·); ``block`` tokens per pass step, ``chunk`` per causal
    chunk. Returns (output (N, Tq, Dv), final state (N, L, Dv+1))."""

    @staticmethod
    def forward(ctx, q, k, v, S0, keep, fmap, eps, block, chunk, is_causal):
        ch = _Chunks(fmap, q, k, v, keep, block, S0.dtype)
        out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)
        with torch.no_grad():
            S = S0.clone()
            if not is_causal:
                for t0, t1 in ch.ranges(k):
                    S.baddbmm_(ch.phi_k(t0, t1).transpose(1, 2), ch.v1(t0, t1))
                for t0, t1 in ch.ranges(q):
                    out[:, t0:t1] = split_normalised(ch.phi_q(t0, t1) @ S, eps)
                states = S.unsqueeze(0)
            else:
                blocks = ch.ranges(q)
                states = torch.empty(len(blocks), *S0.shape, dtype=S0.dtype, device=q.device)
                for b, (t0, t1) in enumerate(blocks):
                    states[b] = S
                    o1, S = causal_chunked(
                        ch.phi_q(t0, t1), ch.phi_k(t0, t1), ch.v1(t0, t1), chunk, S
                    )
                    out[:, t0:t1] = split_normalised(o1, eps)
        ctx.save_for_backward(q, k, v, keep, states, S0)  # S0: for the differentiable backward
        ctx.fmap, ctx.eps, ctx.block, ctx.chunk, ctx.is_causal = fmap, eps, block, chunk, is_causal
        return out, S

    @staticmethod
    def backward(ctx, g_out, g_state):
        if torch.is_grad_enabled():  # create_graph=True: the gradient must itself be differentiable
            return _differentiable_backward(ctx, g_out, g_state)
        q, k, v, keep, states, _ = ctx.saved_tensors
        acc = states.dtype
        ch = _Chunks(ctx.fmap, q, k, v, keep, ctx.block, acc)
        eps = ctx.eps
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        G = torch.zeros_like(states[0]) if g_state is None else g_state.to(acc).clone()
        if g_out is None:
            g_out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=acc, device=q.device)
        if not ctx.is_causal:
            S = states[0]
            for t0, t1 in ch.ranges(q):  # queries: dφ(q), and ∂L/∂KV1 collected in G
                xq = ch.leaf(q, t0, t1)
                with torch.enable_grad():
                    fq = ch.phi_q(t0, t1, xq)
                o, s = _split(fq.detach() @ S, eps)
                dO1 = _grad_o1(g_out[:, t0:t1].to(acc), o, s)
                (dq[:, t0:t1],) = torch.autograd.grad(fq, xq, dO1 @ S.transpose(1, 2))
                G.baddbmm_(fq.detach().transpose(1, 2), dO1)
            for t0, t1 in ch.ranges(k):  # keys and values
                xk = ch.leaf(k, t0, t1)
                with torch.enable_grad():
                    fk = ch.phi_k(t0, t1, xk)
                v1 = ch.v1(t0, t1)
                (dk[:, t0:t1],) = torch.autograd.grad(fk, xk, v1 @ G.transpose(1, 2))
                dv[:, t0:t1] = zero_padded(fk.detach() @ G, ch.keep_at(t0, t1))[..., :-1]
            return dq, dk, dv, None, None, None, None, None, None, None
        for b, (t0, t1) in reversed(list(enumerate(ch.ranges(q)))):
            xq, xk = ch.leaf(q, t0, t1), ch.leaf(k, t0, t1)
            with torch.enable_grad():
                fq, fk = ch.phi_q(t0, t1, xq), ch.phi_k(t0, t1, xk)
            fqd, fkd, v1 = fq.detach(), fk.detach(), ch.v1(t0, t1)
            o1, _ = causal_chunked(fqd, fkd, v1, ctx.chunk, states[b])
            o, s = _split(o1, eps)
            dO1 = _grad_o1(g_out[:, t0:t1].to(acc), o, s)
            d_fq, d_fk, d_v1, G = _causal_block_backward(
                fqd, fkd, v1, dO1, states[b], G, ctx.chunk
            )
            dq[:, t0:t1], dk[:, t0:t1] = torch.autograd.grad((fq, fk), (xq, xk), (d_fq, d_fk))
            dv[:, t0:t1] = zero_padded(d_v1, ch.keep_at(t0, t1))[..., :-1]
        return dq, dk, dv, G, None, None, None, None, None, None


def _differentiable_backward(ctx, g_out, g_state):
    """The backward for ``create_graph=True`` (gradient penalties, Hessian-vector products): the
    forward again in differentiable torch operations (the portable formulas), differentiated by
    autograd with the graph kept. The chunked backward's result has no graph, and a first
    gradient that silently did not require grad would drop every term built on it."""
    q, k, v, keep, _, S0 = ctx.saved_tensors
    out, S = portable_forward(ctx.fmap, q, k, v, keep, ctx.eps, ctx.chunk, ctx.is_causal, S0)
    grads = graph_grads([out, S], [g_out, g_state], [q, k, v, S0], ctx.needs_input_grad[:4])
    return (*grads, None, None, None, None, None, None)


def fused_linear_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    fmap: FeatureMap,
    *,
    is_causal: bool,
    keep: Tensor | None,
    eps: float,
    chunk: int,
    block: int,
    S0: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The fused path. q: (..., Tq, D), k: (..., T, D), v: (..., T, Dv), keep: bool
    broadcastable to (..., T, 1) (True = kept) or None, S0: (..., ℓ, Dv + 1) or None.

    Returns the output (..., Tq, Dv) in q's dtype and the final state (..., ℓ, Dv + 1) in the
    accumulation dtype (for non-causal: Σ φ(k)ᵀ[v, 1])."""
    batch, flat, keep = flatten_heads(q, k, v, keep)
    N = flat[0].shape[0]
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    L = fmap.num_features(q.shape[-1])
    chunk = clamped_chunk(chunk, q.shape[-2])  # also for callers other than linear_attention
    if S0 is None:
        S0 = torch.zeros(N, L, v.shape[-1] + 1, dtype=acc, device=q.device)
    else:
        S0 = S0.to(acc).reshape(N, L, v.shape[-1] + 1)
    out, S = _FusedLinearAttention.apply(*flat, S0, keep, fmap, eps, block, chunk, is_causal)
    return out.reshape(*batch, *out.shape[-2:]), S.reshape(*batch, *S.shape[-2:])
