r"""The compiled CPU forward and backward of gated linear attention (``kernels.c``).

:func:`linattn.ops.gated.gated_linear_attention` and
:func:`~linattn.ops.gated.gated_linear_attention_step` hand a call here, after their argument
checks, when the dispatcher chose this backend (:mod:`linattn.ops.dispatch`, op
"gated_linear_attention", forms "prefill", "prefill fwd+bwd" and "step"): a CPU call in float32
accumulation (float32 inputs; bfloat16 and float16 rows are read a chunk at a time by the
kernels, forward and backward, and o and the gradients written in their dtype, rounded once),
V a multiple of 16, an ISA build that
loads, and (by default) the compiled path measured faster than the torch one on this machine.
Scalar gates ``g``, per-key gates ``gk``, both or none.

The kernels run the recurrence itself, per head and token, with the row decays
``a_t = exp(g_t + gk_t)`` (module docstring of :mod:`linattn.ops.gated.op`)::

    S ← diag(a_t) S + k_t v_tᵀ,    o_t = s Sᵀ q_t

in float32 arithmetic (no chunking error), vectorised over the columns of S (a block of
columns stays in L1 through a chunk of tokens), two tokens a pass: a multiply and four
multiply-adds per element for both (ops/gated/kernels.c, gla_fwd_pair), or the four alone
where a chunk's decay stays above e^-20 (the state kept divided by the decay so far,
gla_rescaled). The forward stores
the state before every chunk of :func:`checkpoint_interval` tokens when gradients are wanted
— one state per chunk, never one per token: K·V/C floats per token and head (as much as q at
K = V = 64 and the C = 64 used with gradients). The backward (docs/theory.md §10, "GLA: the
compiled backward") walks the chunks from the last; in each, a forward sweep from the
checkpoint carries the state and gives dq, then a reverse sweep runs
``dS ← diag(a_t) (dS + s q_t do_tᵀ)`` and gives dk and dv (seven multiply-adds or multiplies
per element and token in all, and two row sums over V per key dimension and token); the gates'
gradients follow from dq and dk, and the initial state's from dS. Heads (and, in the forward,
column blocks of a head when there are fewer heads than threads) run in parallel on torch's
threads once a call is large enough to pay for the hand-over.

Inside PyTorch: ``linattn::gla_forward`` (its backward, ``linattn::gla_backward``, registered as
its autograd formula; ``create_graph=True`` differentiates the torch chunked form instead, so
higher-order gradients are exact) and ``linattn::gla_step`` (forward only), with fake
implementations, so that ``torch.compile`` and ``torch.export`` keep them in the graph; plain
eager calls that want no gradient run the kernels directly.
"""

from __future__ import annotations

import math
from ctypes import c_int, c_long

import torch
from torch import Tensor

from linattn.ops._common import graph_grads
from linattn.ops._library import KernelOp
from linattn.ops.gated.chunk import check_gate, decayed, portable_prefill
from linattn.ops.native import (
    DTYPE_CODES,
    KernelSet,
    build_or_native,
    check_rc,
    empty_hugepage,
    float32_rows,
    float32_step_rows,
    head_jobs,
    is_small,
    native_threads,
    one_16_bit_dtype,
    recycled_cast,
    rows,
    run_jobs,
    scratch,
    split_done,
    threads_for,
    work_size,
)

__all__ = ["gla_prefill", "one_thread", "gla_step", "kernels", "kernels_here", "unavailable",
           "step_into", "checkpoint_interval", "V_MULTIPLE"]

#: V must be a multiple of this (whole vectors of every ISA's width, up to AVX-512's 16).
V_MULTIPLE = 16
#: A call splits across threads from this many state-element updates (N·T·K·V; 2^23 is ~0.6 ms
#: of kernel). It was 2^25 while the parts ran on a Python pool, whose threads shared a core
#: with torch's spinning OpenMP workers (a 16-head, 256-token prefill then lost 1.8× in median
#: with the other core busy). On those workers' own team (:func:`linattn.ops.native.run_parts`)
#: calls made alone in a random order (benchmarks/threads.py, AMD EPYC family 25, per-key
#: gates, 16 heads) ran 256-512 tokens within 0.97-1.01× of one thread, free or busy, and 2,048
#: tokens 0.55× free; 64 tokens (2^22) split lost 1.2-1.7× when it found the other threads
#: asleep. It also sets which passes a late helper keeps on one thread (below 64× this).
PARALLEL_MIN = 1 << 23
_F4 = 4  # bytes per float32 element


#: The longest chunk the kernels take (GLA_CMAX in kernels.c).
CHUNK_MAX = 64


def checkpoint_interval(K: int, grad: bool = False) -> int:
    """Tokens per chunk for head dimension K: the forward's chunk and, with ``grad``, the
    interval between the checkpoints it stores for the backward (K·V/C floats per token and
    head). Without gradients min(64, max(8, 2048 / K)), 32 at K = 64 (64 there was no faster:
    1.009× float32, 1.026× bfloat16). With gradients :data:`CHUNK_MAX`: half the checkpoints
    at K = 64, and the backward's sweeps restart half as often (forward+backward 0.923×
    float32, 0.938× bfloat16; 16 heads × 4,096 tokens, Intel Xeon family 6 with avx512f,
    ``benchmarks/against_revision.py --base 75bd9c9 --forms gla``). The float32 recurrence
    gives the same bits at any C."""
    return CHUNK_MAX if grad else max(8, min(CHUNK_MAX, 2048 // max(K, 1)))


# --------------------------------------------------------------------------- the C boundary


def _size_functions(lib) -> dict:
    lib.la_gla_work.restype, lib.la_gla_work.argtypes = c_long, [c_long, c_long]
    lib.la_gla_step_work.restype = c_long
    lib.la_gla_step_work.argtypes = [c_long, c_long, c_long, c_int, c_int]
    lib.la_gla_forward_work.restype = c_long
    lib.la_gla_forward_work.argtypes = [c_long, c_long, c_long, c_int]
    lib.la_gla_backward_work.restype = c_long
    lib.la_gla_backward_work.argtypes = [c_long, c_long, c_long]
    return {"work": lib.la_gla_work, "step_work": lib.la_gla_step_work,
            "forward_work": lib.la_gla_forward_work, "backward_work": lib.la_gla_backward_work}


#: la_gla_step's fields in the order :func:`step_into` passes them (by position, as the delta
#: rule's step: linattn.ops.delta.native.STEP_FIELDS), checked when the library loads.
STEP_FIELDS = ("q", "k", "v", "g", "gk", "dt", "N", "K", "V", "scale", "S_in", "S_out", "o",
               "work", "threads")

_KERNELS = KernelSet("la_gated_abi", extra=_size_functions, positional={"gla_step": STEP_FIELDS})


def kernels(isa: str = "native") -> dict | None:
    """The GLA kernels of one ISA build (name -> a function taking its struct's fields by
    keyword; and "work": the scratch size in floats for head dimension K and chunk C), or None
    where that build cannot be had (see :func:`unavailable`)."""
    return _KERNELS.get(isa)


def unavailable(isa: str = "native") -> str | None:
    """Why :func:`kernels` gives None for ``isa``, or None if it loads."""
    return _KERNELS.unavailable(isa)


def kernels_here(isa: str) -> dict | None:
    """The kernels of ``isa``'s build, or of the native build where that one cannot be had."""
    return build_or_native(kernels, isa)


# ------------------------------------------------------------------------------ the calls
def _work(fns: dict, K: int, C: int, V: int | None = None) -> Tensor:
    """This thread's scratch buffer for head dimension K and chunk C: la_gla_work(K, C) floats
    of this build (the size depends on its vector width), or with V the backward's
    la_gla_backward_work(K, V, C)."""
    return scratch(fns["work"](K, C) if V is None else fns["backward_work"](K, V, C))


def _threads(N: int, T: int, K: int, V: int, columns: bool) -> int:
    """Threads for a pass over N heads of T tokens (:func:`linattn.ops.native.threads_for`);
    ``columns``: a head may also split into blocks of 16 columns (the forward)."""
    return threads_for(N * T * K * V, N * max(V // V_MULTIPLE, 1) if columns else N,
                       PARALLEL_MIN)


def _ptr(x: Tensor | None, h0: int = 0) -> int | None:
    """The address of head h0 of a (N, ...) tensor, or None."""
    return None if x is None else x.data_ptr() + x.element_size() * h0 * x.stride(0)


def _forward_span(fns: dict, q: Tensor, k: Tensor, v: Tensor, g: Tensor | None,
                  gk: Tensor | None, s: float, C: int, S: Tensor, o: Tensor,
                  ckpt: Tensor | None, first: int) -> None:
    """la_gla_forward over (N, T, ·) views (contiguous last dimension, any head and token
    strides), g (N, T) and gk (N, T, K) float32, the state S (N, K, V) contiguous, updated in
    place; o (N, T, V); q, k, v and o all float32, or all bfloat16 / float16 (read a chunk at a
    time as float32 by the kernel); ckpt (N, n, K, V) float32 or None, this span's chunks from
    index ``first`` on."""
    N, T, K = q.shape
    V = v.shape[2]
    threads = _threads(N, T, K, V, columns=True)
    fn, dt = fns["gla_forward"], DTYPE_CODES[q.dtype]
    size = work_size(fns, "forward_work", K, V, C, dt)

    def part(h0: int, h1: int, v0: int, v1: int) -> None:
        rc = fn(
            q=_ptr(q, h0), qs=q.stride(0), qt=q.stride(1), k=_ptr(k, h0), ks=k.stride(0),
            kt=k.stride(1), v=_ptr(v, h0), vs=v.stride(0), vt=v.stride(1), g=_ptr(g, h0),
            gs=0 if g is None else g.stride(0), gk=_ptr(gk, h0),
            gks=0 if gk is None else gk.stride(0), gkt=0 if gk is None else gk.stride(1), dt=dt,
            N=h1 - h0, T=T, K=K, V=V, v0=v0, v1=v1, C=C, scale=s, S_in=_ptr(S, h0),
            S_out=_ptr(S, h0), o=_ptr(o, h0), os=o.stride(0), ot=o.stride(1),
            ckpt=None if ckpt is None else _ptr(ckpt, h0) + _F4 * first * K * V,
            cks=0 if ckpt is None else ckpt.stride(0), work=scratch(size).data_ptr())
        check_rc(rc, "la_gla_forward")

    run_jobs(part, head_jobs(N, V, threads, columns=True, block=V_MULTIPLE), threads)


def _backward_span(fns: dict, q: Tensor, k: Tensor, v: Tensor, g: Tensor | None,
                   gk: Tensor | None, do: Tensor, s: float, C: int, ckpt: Tensor, first: int,
                   dS: Tensor, dq: Tensor, dk: Tensor, dv: Tensor, dg: Tensor | None,
                   dgk: Tensor | None) -> None:
    """la_gla_backward over one span, as :func:`_forward_span`; dS (N, K, V) contiguous holds
    the final state's gradient and is turned in place into the initial state's; do (N, T, V)
    any head and token strides (0 for none). q, k, v, do, dq, dk, dv all float32, or all of
    one 16-bit dtype (read and written a chunk at a time by the kernel); the gates and their
    gradients float32."""
    N, T, K = q.shape
    V = v.shape[2]
    threads = _threads(N, T, K, V, columns=False)
    fn, dt = fns["gla_backward"], DTYPE_CODES[q.dtype]

    def part(h0: int, h1: int, v0: int, v1: int) -> None:
        rc = fn(
            q=_ptr(q, h0), qs=q.stride(0), qt=q.stride(1), k=_ptr(k, h0), ks=k.stride(0),
            kt=k.stride(1), v=_ptr(v, h0), vs=v.stride(0), vt=v.stride(1), g=_ptr(g, h0),
            gs=0 if g is None else g.stride(0), gk=_ptr(gk, h0),
            gks=0 if gk is None else gk.stride(0), gkt=0 if gk is None else gk.stride(1),
            dout=_ptr(do, h0), dos=do.stride(0), dot=do.stride(1), N=h1 - h0, T=T, K=K, V=V,
            C=C, scale=s, ckpt=_ptr(ckpt, h0) + _F4 * first * K * V, cks=ckpt.stride(0),
            dS_in=_ptr(dS, h0), dS_out=_ptr(dS, h0), dq=_ptr(dq, h0), dqs=dq.stride(0),
            dqt=dq.stride(1), dk=_ptr(dk, h0), dks=dk.stride(0), dkt=dk.stride(1),
            dv=_ptr(dv, h0), dvs=dv.stride(0), dvt=dv.stride(1), dg=_ptr(dg, h0),
            dgs=0 if dg is None else dg.stride(0), dgk=_ptr(dgk, h0),
            dgks=0 if dgk is None else dgk.stride(0), dgkt=0 if dgk is None else dgk.stride(1),
            dt=dt, work=_work(fns, K, C, V).data_ptr())
        check_rc(rc, "la_gla_backward")

    run_jobs(part, head_jobs(N, V, threads, columns=False, block=V_MULTIPLE), threads)


def _spans(T: int, cu_seqlens: Tensor | None) -> list[tuple[int, int]]:
    if cu_seqlens is None:
        return [(0, T)]
    return list(zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist(), strict=True))


def _n_checkpoints(T, C: int, cu_seqlens: Tensor | None):
    """Checkpoint slots per head: ceil(T / C), plus one per packed sequence (each starts a new
    chunk); from the shapes only, so that the fake implementation gives the same."""
    n = (T + C - 1) // C
    return n if cu_seqlens is None else n + cu_seqlens.shape[0] - 1


def _layout(q: Tensor, cu_seqlens: Tensor | None) -> tuple[list[int], int]:
    """(the batch dimensions, the number of heads H that the kernels walk: every dimension
    but T and the features, less the packed batch dimension of size 1 with cu_seqlens)."""
    batch = list(q.shape[:-2])
    heads = batch if cu_seqlens is None else batch[1:]
    return batch, math.prod(heads)


def _flat(q, k, v, g, gk, cu_seqlens, keep_16_bit: bool = False):
    """The inputs as float32 (H, T, ·) rows (the packed batch dimension dropped); with
    ``keep_16_bit``, q, k and v of one 16-bit dtype stay in it (the forward kernel reads them a
    chunk at a time: no widened copy of the whole input), as views where their last dimension
    is contiguous. The gates are float32 either way."""
    _, H = _layout(q, cu_seqlens)
    T = q.shape[-2]
    gf = None if g is None else g.reshape(H, T).float().contiguous()
    gkf = None if gk is None else float32_rows(gk, H)
    if keep_16_bit and one_16_bit_dtype(q, k, v):
        return (H, *(rows(x, H) for x in (q, k, v)), gf, gkf)
    qf, kf, vf = (float32_rows(x, H) for x in (q, k, v))
    return H, qf, kf, vf, gf, gkf



# ------------------------------------------------------------------------ the custom ops
def _forward(q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, gk: Tensor | None, S0: Tensor,
             cu_seqlens: Tensor | None, scale: float, chunk: int, checkpoints: bool, isa: str
             ) -> tuple[Tensor, Tensor, Tensor]:
    """``linattn::gla_forward``: q, k (..., T, K), v (..., T, V), g (..., T) and gk (..., T, K)
    float32 or None, S0 the checked initial state (..., K, V) float32 — with ``cu_seqlens``
    (batch size 1), (N, ..., K, V), one per packed sequence. Returns o (..., T, V) in q's
    dtype, the final state (S0's shape, float32) and, with ``checkpoints``, the state before
    every chunk of ``chunk`` tokens of each sequence, (H, n, K, V) (else an empty tensor)."""
    K, V, T = q.shape[-1], v.shape[-1], q.shape[-2]
    batch, H = _layout(q, cu_seqlens)
    n = _n_checkpoints(T, chunk, cu_seqlens) if checkpoints else 0
    fns = kernels_here(isa)
    if fns is None:  # a traced program run where the kernels cannot be had: the same function
        o, S = _torch_prefill(q, k, v, g, gk, scale, S0, cu_seqlens)
        return o.to(q.dtype), S, S0.new_zeros((H, n, K, V) if checkpoints else (0,))
    H, qf, kf, vf, gf, gkf = _flat(q, k, v, g, gk, cu_seqlens, keep_16_bit=True)
    S = S0.reshape(-1, K, V).clone(memory_format=torch.contiguous_format)
    o = empty_hugepage(qf, H, T, V)
    ckpt = empty_hugepage(S0, H, n, K, V) if checkpoints else S0.new_empty(0)
    first = 0
    for i, (a, b) in enumerate(_spans(T, cu_seqlens)):
        _forward_span(fns, qf[:, a:b], kf[:, a:b], vf[:, a:b],
                      None if gf is None else gf[:, a:b], None if gkf is None else gkf[:, a:b],
                      scale, chunk, S[i * H:(i + 1) * H], o[:, a:b],
                      ckpt if checkpoints else None, first)
        first += -(-(b - a) // chunk)
    if checkpoints and first < n:  # slots the shapes reserve that no chunk used: no garbage
        ckpt[:, first:].zero_()
    o = o.view(*batch, T, V)
    return (o if o.dtype == q.dtype else o.to(q.dtype)), S.view(S0.shape), ckpt


def _forward_fake(q, k, v, g, gk, S0, cu_seqlens, scale, chunk, checkpoints, isa):
    K, V, T = q.shape[-1], v.shape[-1], q.shape[-2]
    _, H = _layout(q, cu_seqlens)
    ckpt = (S0.new_empty(H, _n_checkpoints(T, chunk, cu_seqlens), K, V) if checkpoints
            else S0.new_empty(0))
    return q.new_empty(*q.shape[:-1], V), _dense(S0), ckpt


def _backward(q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, gk: Tensor | None,
              S0: Tensor, ckpt: Tensor, cu_seqlens: Tensor | None, g_out: Tensor | None,
              g_S: Tensor | None, scale: float, chunk: int, isa: str
              ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``linattn::gla_backward``: the gradients of q, k, v, g, gk and S0 (empty tensors for
    absent gates) from those of the output and the final state (None: zero), with the
    forward's checkpoints (recomputed when empty). q, k, v float32, or of one 16-bit dtype
    (the kernel reads them, and the output's gradient, a chunk at a time and writes dq, dk, dv
    in it); not differentiable itself (``create_graph`` differentiates the torch form,
    :func:`_differentiable_backward`)."""
    fns = kernels_here(isa)
    if fns is None:  # as in _forward: the torch form, differentiated by autograd
        with torch.enable_grad():
            leaves = [None if x is None else x.detach().requires_grad_(True)
                      for x in (q, k, v, g, gk, S0)]
            outs = _torch_prefill(*leaves[:5], scale, leaves[5], cu_seqlens)
            grads = graph_grads(list(outs), [g_out, g_S], leaves,
                                [x is not None for x in leaves])
        return tuple(q.new_empty(0) if x is None else x.detach() for x in grads)
    K, V, T = q.shape[-1], v.shape[-1], q.shape[-2]
    wide = one_16_bit_dtype(q, k, v, g_out)
    H, qf, kf, vf, gf, gkf = _flat(q, k, v, g, gk, cu_seqlens, keep_16_bit=wide)
    if T and ckpt.numel() == 0:  # a forward run without checkpoints: take them now
        ckpt = _forward(q, k, v, g, gk, S0, cu_seqlens, scale, chunk, True, isa)[2]
    if g_out is None:
        do = qf.new_zeros(1, 1, V).expand(H, T, V)
    else:
        do = rows(g_out, H) if wide else float32_rows(g_out, H)
    dS = (S0.new_zeros(S0.shape) if g_S is None else g_S.float().clone()).reshape(-1, K, V)
    dS = dS.contiguous()
    dq, dk = empty_hugepage(qf, H, T, K), empty_hugepage(qf, H, T, K)
    dv = empty_hugepage(qf, H, T, V)
    dg = None if g is None else gf.new_empty(H, T)  # float32, as the gates
    dgk = None if gk is None else empty_hugepage(gkf, H, T, K)
    first = 0
    for i, (a, b) in enumerate(_spans(T, cu_seqlens)):
        _backward_span(fns, qf[:, a:b], kf[:, a:b], vf[:, a:b],
                       None if gf is None else gf[:, a:b], None if gkf is None else gkf[:, a:b],
                       do[:, a:b], scale, chunk, ckpt, first, dS[i * H:(i + 1) * H],
                       dq[:, a:b], dk[:, a:b], dv[:, a:b], None if dg is None else dg[:, a:b],
                       None if dgk is None else dgk[:, a:b])
        first += -(-(b - a) // chunk)
    # in the inputs' dtypes (float32 rows of 16-bit inputs whose output gradient was not of
    # their dtype, rounded here)
    dq, dk, dv = (d.view(x.shape).to(x.dtype) for d, x in ((dq, q), (dk, k), (dv, v)))
    return (dq, dk, dv,
            q.new_empty(0) if dg is None else dg.view(g.shape),
            q.new_empty(0) if dgk is None else dgk.view(gk.shape), dS.view(S0.shape))


def _dense(x: Tensor) -> Tensor:
    """An empty tensor of x's shape and dtype, contiguous as the kernels' results always are
    (``empty_like`` would keep a transposed input's strides, and a compiled graph then views
    the real, contiguous result with the wrong ones)."""
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _backward_fake(q, k, v, g, gk, S0, ckpt, cu_seqlens, g_out, g_S, scale, chunk, isa):
    return (_dense(q), _dense(k), _dense(v), q.new_empty(0) if g is None else _dense(g),
            q.new_empty(0) if gk is None else _dense(gk), _dense(S0))


def _small(q: Tensor, k: Tensor, v: Tensor, *_) -> bool:
    """Whether a call stays on one thread (its torch operations too): the library's policy
    (:func:`linattn.ops.native.is_small`) with this op's threshold."""
    return is_small(q, v, PARALLEL_MIN)


_BACKWARD = KernelOp("gla_backward", _backward, _backward_fake, small=_small)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, g, gk, S0, cu_seqlens, scale, chunk, checkpoints, isa = inputs
    ctx.set_materialize_grads(False)  # no zero gradients for the checkpoints
    ctx.mark_non_differentiable(output[2])
    ctx.save_for_backward(q, k, v, g, gk, S0, cu_seqlens, output[2])
    ctx.cfg = (scale, chunk, isa)


def _backward_formula(ctx, g_out, g_S, _g_ckpt):
    q, k, v, g, gk, S0, cu_seqlens, ckpt = ctx.saved_tensors
    scale, chunk, isa = ctx.cfg
    needs = ctx.needs_input_grad[:6]
    if g_out is None and g_S is None:
        return (None,) * 11
    if torch.is_grad_enabled():  # create_graph=True: a gradient that is differentiable
        grads = _differentiable_backward(ctx, g_out, g_S)
    else:
        grads = _BACKWARD(q, k, v, g, gk, S0, ckpt, cu_seqlens, g_out, g_S, scale, chunk, isa)
    grads = [x if need else None for x, need in zip(grads, needs, strict=True)]
    return (*grads, None, None, None, None, None)


_FORWARD = KernelOp("gla_forward", _forward, _forward_fake, backward=_backward_formula,
                    setup_context=_setup_context, small=_small)
#: The op's small-call rule for a whole call (its entry's own torch work too): see KernelOp.
one_thread = _FORWARD.one_thread


def _torch_prefill(q, k, v, g, gk, scale, S0, cu_seqlens):
    """(o, final state) by the torch chunked form, differentiable (float32 accumulation)."""

    return portable_prefill(q, k, v, g, gk, scale, S0, cu_seqlens, 64)


def _differentiable_backward(ctx, g_out, g_S):
    """The backward for ``create_graph=True`` (gradient penalties, Hessian-vector products):
    the forward again in differentiable torch operations (the chunked form), differentiated by
    autograd with the graph kept. The compiled backward's result is not differentiable, and a
    first gradient that silently did not require grad would drop every term built on it."""
    q, k, v, g, gk, S0, cu_seqlens, _ = ctx.saved_tensors
    scale = ctx.cfg[0]
    # in float32, as the kernels compute (16-bit q, k, v are saved as given)
    o, S = _torch_prefill(*(x.float() for x in (q, k, v)), g, gk, scale, S0, cu_seqlens)
    o = o.to(q.dtype)
    leaves = [q, k, v, g, gk, S0]
    needs = [need and x is not None for x, need in zip(leaves, ctx.needs_input_grad, strict=False)]
    return graph_grads([o, S], [g_out, g_S], leaves, needs)


def gla_prefill(q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, gk: Tensor | None,
                S0: Tensor, cu_seqlens: Tensor | None, scale: float, grad: bool, isa: str
                ) -> tuple[Tensor, Tensor]:
    """The compiled prefill on checked arguments (g, gk, S0 in float32; S0 (N, ..., K, V)
    with ``cu_seqlens``): (o in q's dtype, the final state). ``grad``: autograd will want
    gradients (the forward then stores its checkpoints). 16-bit q, k, v of one dtype are read
    by the kernels a chunk at a time, forward and backward (o and their gradients written in
    it, rounded once); with gradients, mixed dtypes or no kernels here are widened (and o
    rounded back) by differentiable casts."""
    dt = q.dtype
    if grad and not (one_16_bit_dtype(q, k, v) and kernels_here(isa) is not None):
        q, k, v = (recycled_cast(x, torch.float32) for x in (q, k, v))
    o, S, _ = _FORWARD(q, k, v, g, gk, S0, cu_seqlens, float(scale),
                       checkpoint_interval(q.shape[-1], bool(grad)), bool(grad), isa)
    return recycled_cast(o, dt), S


# ------------------------------------------------------------------------------- the step
def _step(q_t: Tensor, k_t: Tensor, v_t: Tensor, g_t: Tensor | None, gk_t: Tensor | None,
          S: Tensor, scale: float, isa: str) -> tuple[Tensor, Tensor]:
    """``linattn::gla_step``: one decoding step. q_t, k_t (..., K), v_t (..., V), g_t (...) and
    gk_t (..., K) float32 or None, S the state (..., K, V) float32, not modified. Returns (o_t
    in q_t's dtype, the new state float32 (..., K, V)). The kernel checks the gates' values."""
    fns = kernels_here(isa)
    if fns is None:

        S = decayed(S, g_t, gk_t, None, q_t)
        S = S + k_t.float().unsqueeze(-1) * v_t.float().unsqueeze(-2)
        o = ((q_t.float() * scale).unsqueeze(-2) @ S).squeeze(-2)
        return o.to(q_t.dtype), S
    K, V = S.shape[-2], S.shape[-1]
    N = S.numel() // (K * V) if K * V else 0
    q, k, v = float32_step_rows(q_t, N), float32_step_rows(k_t, N), float32_step_rows(v_t, N)
    g = None if g_t is None else float32_step_rows(g_t.unsqueeze(-1), N)
    gk = None if gk_t is None else float32_step_rows(gk_t, N)
    S_in = S if S.is_contiguous() else S.contiguous()
    S_out = torch.empty_like(S_in)
    o = torch.empty(v_t.shape, dtype=torch.float32)
    rc = step_into(fns, q, k, v, g, gk, S_in, S_out, o, scale)
    if rc == -3:
        _check_step_gates(g_t, gk_t)  # raises, naming the gate and its values
    check_rc(rc, "la_gla_step")
    return (o if o.dtype == q_t.dtype else o.to(q_t.dtype)), S_out


def step_into(fns: dict, q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, gk: Tensor | None,
              S_in: Tensor, S_out: Tensor, o: Tensor, scale: float) -> int:
    """One compiled decoding step on contiguous tensors: q, k, gk (..., K), v and o (..., V),
    g (...) (g, gk may be None), all of one dtype (float32, bfloat16 or float16: the others
    are read as float32 and o rounded once); S_in (..., K, V) float32 read, S_out (same; may be
    S_in) written. Returns the kernel's code: 0, or -3 (a nan or positive gate) with nothing
    written. The kernel splits its heads over its own threads
    (:func:`linattn.ops.native.native_threads`)."""
    K, V = S_in.shape[-2], S_in.shape[-1]
    N = q.numel() // K
    dt = DTYPE_CODES[q.dtype]
    threads = native_threads(N * K * V, N)
    rc = fns["gla_step:positional"](  # STEP_FIELDS
        q.data_ptr(), k.data_ptr(), v.data_ptr(), None if g is None else g.data_ptr(),
        None if gk is None else gk.data_ptr(), dt, N, K, V, scale, S_in.data_ptr(),
        S_out.data_ptr(), o.data_ptr(),
        scratch(work_size(fns, "step_work", N, K, V, threads, dt)).data_ptr(), threads)
    return split_done(rc, threads)


def _check_step_gates(g_t: Tensor | None, gk_t: Tensor | None) -> None:
    """In Python, what la_gla_step checks itself: the errors the torch path raises."""

    if g_t is not None:
        check_gate(g_t, "g_t", tuple(g_t.shape), g_t)
    if gk_t is not None:
        check_gate(gk_t, "gk_t", tuple(gk_t.shape), gk_t)


def _step_fake(q_t, k_t, v_t, g_t, gk_t, S, scale, isa):
    return v_t.new_empty(v_t.shape, dtype=q_t.dtype), _dense(S)


gla_step = KernelOp("gla_step", _step, _step_fake)
