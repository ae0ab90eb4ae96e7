r"""The compiled CPU fast path of ``linear_attention`` for 1 + elu and 1 + relu inside PyTorch:
the entry the dispatcher calls (:func:`native_linear_attention`) and the custom ops.

The forward and the backward are the custom ops ``linattn::linear_attention_fwd`` and
``linattn::linear_attention_bwd`` (:class:`~linattn.ops._library.KernelOp`), with fake
(shape-only) implementations and the backward registered as the forward's autograd formula, so
that ``torch.compile`` and ``torch.export`` trace them as single nodes without touching a data
pointer (an exported program runs them wherever ``linattn`` is imported). Plain eager calls that
need no gradient skip the op dispatcher (about 8 µs a call). What the ops compute, the passes
over blocks and heads that call the C kernels, is :mod:`linattn.ops.linear.passes`; so a call
walks op.py → this module → ``_library.py`` (the custom op) → ``passes.py`` →
``ops/native/abi.py`` (the kernel's argument struct) → ``kernels.c``.

bfloat16 with gradients runs the one-pass backwards on its own rows (q, k, v, the output and
its gradient read as the float32 values they hold, dq, dk, dv rounded once: the float32
arithmetic), where they take it (:func:`~linattn.ops.linear.passes.backward_takes_bf16`); else
it is widened to float32 (a differentiable cast) and runs the float32 passes. The library is
built on first use (:mod:`linattn.ops.native`), in the ISA build the dispatcher chose
(:mod:`linattn.ops.dispatch`: where the calibration measured it to beat the torch paths on
this machine). Without a C compiler the torch paths run instead.
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.ops._common import flatten_heads, graph_grads, needs_grad
from linattn.ops._library import KernelOp
from linattn.ops.linear.passes import (
    MAP_KINDS,
    MAP_OF_KIND,
    NONCAUSAL_CHUNK,
    PARALLEL_MIN,
    backward,
    backward_takes_bf16,
    fits_one_pass,
    forward,
    kernels,
    phi,
    rows_contiguous,
    unavailable,
)
from linattn.ops.linear.portable import portable_forward
from linattn.ops.native import bf16_products, is_small, recycled_cast

__all__ = ["native_linear_attention", "kernels", "unavailable", "phi", "MAP_KINDS",
           "PARALLEL_MIN"]


# ------------------------------------------------------------------------ the custom ops
def _forward_fake(q, k, v, S0, z0, keep, kind, eps, block, chunk, is_causal, isa):
    N, Tq, L = q.shape
    Dv = v.shape[2]
    out, S, z = q.new_empty(N, Tq, Dv), S0.new_empty(N, L, Dv), z0.new_empty(N, L)
    if not is_causal:
        return out, S, z, S0.new_empty(0), z0.new_empty(0)
    nb = (Tq + block - 1) // block
    return out, S, z, S0.new_empty(nb, N, L, Dv), z0.new_empty(nb, N, L)


def _backward_fake(q, k, v, keep, S0, z0, S_states, z_states, S, z, out, g_out, g_S, g_z, kind,
                   eps, block, chunk, is_causal, isa):
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(S),
            torch.empty_like(z))


def _small(q: Tensor, k: Tensor, v: Tensor, *_) -> bool:
    """The small-call rule (:class:`~linattn.ops._library.KernelOp`): whether a call is below
    the thread policy's threshold, its torch operations then on one thread too."""
    return is_small(q, v, PARALLEL_MIN)


_BACKWARD = KernelOp("linear_attention_bwd", backward, _backward_fake, small=_small)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, S0, z0, keep, kind, eps, block, chunk, is_causal, isa = inputs
    out, S, z, S_states, z_states = output
    ctx.set_materialize_grads(False)  # no zero gradients for the block states
    ctx.mark_non_differentiable(S_states, z_states)
    ctx.save_for_backward(q, k, v, keep, S_states, z_states, S, z, out, S0, z0)
    ctx.cfg = (kind, eps, block, chunk, is_causal, isa)


def _backward_formula(ctx, g_out, g_S, g_z, _g_states, _g_zstates):
    q, k, v, keep, S_states, z_states, S, z, out, S0, z0 = ctx.saved_tensors
    kind, eps, block, chunk, is_causal, isa = ctx.cfg
    if torch.is_grad_enabled():  # create_graph=True: a gradient that is differentiable
        grads = _differentiable_backward(ctx, (g_out, g_S, g_z))
    else:
        grads = _BACKWARD(q, k, v, keep, S0, z0, S_states, z_states, S, z, out, g_out, g_S,
                          g_z, kind, eps, block, chunk, is_causal, isa)
    return (*grads, None, None, None, None, None, None, None)


_FORWARD = KernelOp("linear_attention_fwd", forward, _forward_fake,
                    backward=_backward_formula, setup_context=_setup_context, small=_small)


def _differentiable_backward(ctx, grads):
    """The backward for ``create_graph=True`` (gradient penalties, Hessian-vector products):
    the forward again in differentiable torch operations (:mod:`linattn.ops.linear.portable`),
    differentiated by autograd with the graph kept. The compiled backward's own result is not
    differentiable, and a first gradient that silently did not require grad would drop every
    term built on it."""
    q, k, v, keep, *_, S0, z0 = ctx.saved_tensors
    kind, eps, _, chunk, is_causal, _ = ctx.cfg
    fmap = MAP_OF_KIND[kind]()
    keep = None if keep is None else keep.unsqueeze(-1)
    # in float32, as the kernels compute (bfloat16 q, k, v are saved as given)
    out, total = portable_forward(fmap, *(x.float() for x in (q, k, v)), keep, eps, chunk,
                                  is_causal, torch.cat([S0, z0.unsqueeze(-1)], -1))
    outs = [out.to(q.dtype), total[..., :-1], total[..., -1]]
    return graph_grads(outs, list(grads), [q, k, v, S0, z0], ctx.needs_input_grad[:5])


def native_linear_attention(q, k, v, fmap, *, is_causal, keep, eps, chunk, block, S0=None,
                            isa: str = "native"):
    """Same contract as :func:`linattn.ops.linear.fused.fused_linear_attention` (float32 or
    bfloat16), on the ``isa`` build:
    q (..., Tq, D), k (..., T, D), v (..., T, Dv), keep bool broadcastable to (..., T, 1) or
    None, S0 (..., ℓ, Dv + 1) or None. Returns the output (..., Tq, Dv) and the final state
    (..., ℓ, Dv + 1)."""
    args = (q, k, v, fmap)
    kw = {"is_causal": is_causal, "keep": keep, "eps": eps, "chunk": chunk, "block": block,
          "S0": S0, "isa": isa}
    if torch.compiler.is_compiling():  # a traced graph: its operations are the graph's
        return _native_linear_attention(*args, **kw)
    with _FORWARD.one_thread(q, k, v):  # the flattening and the state's joins too
        return _native_linear_attention(*args, **kw)


def _native_linear_attention(q, k, v, fmap, *, is_causal, keep, eps, chunk, block, S0, isa):
    L, Dv = q.shape[-1], v.shape[-1]
    one_pass = fits_one_pass(L, Dv, chunk if is_causal else NONCAUSAL_CHUNK, keep is not None)
    if q.dtype == torch.bfloat16 and (
            needs_grad(q, k, v, S0)
            and not backward_takes_bf16(L, Dv, chunk, is_causal, keep is not None)
            or not one_pass and not bf16_products()):
        # The block passes' backward and the causal chunked one take float32 only, and the
        # block passes would multiply bfloat16 blocks, which a CPU without bf16 dot products
        # does slower than float32: widen once (a differentiable cast), round the output once.
        # (The one-pass backwards read and write bfloat16 rows themselves.)
        o, state = native_linear_attention(*(recycled_cast(x, torch.float32) for x in (q, k, v)),
                                           fmap, is_causal=is_causal, keep=keep, eps=eps,
                                           chunk=chunk, block=block, S0=S0, isa=isa)
        return recycled_cast(o, q.dtype), state
    batch, flat, keep = flatten_heads(q, k, v, keep)
    flat = [x if rows_contiguous(x) else x.contiguous() for x in flat]
    N = flat[0].shape[0]
    if keep is not None:
        keep = keep[..., 0].contiguous()  # (N, T) bytes for the compiled passes
    if S0 is None:
        S0, z0 = q.new_zeros(N, L, Dv, dtype=torch.float32), q.new_zeros(N, L, dtype=torch.float32)
    else:
        S0 = S0.to(torch.float32).reshape(N, L, Dv + 1)
        S0, z0 = S0[..., :-1].contiguous(), S0[..., -1].contiguous()
    out, S, z, _, _ = _FORWARD(*flat, S0, z0, keep, MAP_KINDS[type(fmap)], float(eps), block,
                               chunk, is_causal, isa)
    state = torch.cat([S, z.unsqueeze(-1)], -1)
    return out.reshape(*batch, *out.shape[-2:]), state.reshape(*batch, L, Dv + 1)
