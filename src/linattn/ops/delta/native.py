r"""The compiled CPU forward of the (gated) delta rule (``la_gdr_forward`` in ``kernels.c``).

:func:`linattn.ops.delta.delta_rule` and :func:`~linattn.ops.delta.delta_rule_step` hand a call
here, after their argument checks, when the dispatcher chose this backend
(:mod:`linattn.ops.dispatch`, op "delta_rule", forms "prefill", "prefill fwd+bwd" and "step"): a
CPU call in float32 accumulation (float32 inputs; bfloat16 and float16 rows are read a chunk at
a time by the kernels, forward and backward, and o and the gradients written in their dtype,
rounded once), V a multiple of 16, no
per-value gate, no per-key gate when a gradient is wanted (nor any gradient in the step), an
ISA build that loads, and (by default) the compiled path measured faster than the torch one on
this machine.

The kernel is the sequential recurrence, per value head and token, with row decays
``a_i = e^{g_t + gk_t,i}`` (a missing gate counts as 0: a scalar gate ``g`` gives every row the
same decay, per-key gates ``gk`` — Kimi Delta Attention — one per row), ``q̃ = s q_t``,
``k̃ = k_t`` (both L2-normalised first with ``qk_l2norm``)::

    S' = diag(a) S,   u = β_t (v_t − S'ᵀk̃),   S ← S' + k̃ uᵀ,   o_t = Sᵀq̃ = S'ᵀq̃ + (q̃·k̃) u

with ``S'ᵀx = Sᵀ(a∘x)``: exact in float32 arithmetic (no chunking error to bound), vectorised
over the columns of S: columns are independent, so a block of them stays in L1 through a chunk of
tokens, and the pass that writes token t's state (applying the row scale in the update) also
sums ``Sᵀ(a∘k̃)`` and ``Sᵀ(a∘q̃)`` for token t + 1 — one pass over S per token, ~4·K·V vector
operations (3·K·V multiply-adds and, with a gate, K·V multiplies), with per-key gates as with a
scalar one. At K = V = 64 that is fewer operations than the chunked WY form of
:mod:`linattn.ops.delta` (≈ 3·K·V + C·(3K/2 + V) multiply-adds per token: 22.5 K at C = 64,
17.4 K at C = 32, against 16.4 K operations here) with no triangular solve, and it runs near
the FMA units' rate (docs/bench-recurrences.md, "Gated delta rule"). Heads (and, for fewer
heads than threads, column blocks of a head) run in parallel on torch's threads once a call is large
enough to pay for the hand-over; a decoding step runs on the calling thread.

Grouped value attention (GVA): q and k may have H heads for HV = G·H value heads (β, the gates,
the states and the output have HV); value head n reads q/k head n // G, in place — the kernel
indexes the shared rows (a part of the heads handed to a thread that starts inside a group is
told its place there), so q and k are never repeated, forward or step. The training forward
and ``la_gdr_backward`` take as many q/k heads as value heads (the op repeats them there, and
autograd sums each group's gradients).

Inside PyTorch: the prefill and the step are the custom ops ``linattn::gdr_forward`` and
``linattn::gdr_step`` (forward only: the dispatcher never sends a call that wants gradients
there; ``linattn::gdr_forward_train`` and ``linattn::gdr_backward`` are the training pair), so
that ``torch.compile`` and ``torch.export`` keep them in the graph; plain eager calls run the
kernel directly (the op dispatcher's ~8 µs would be a quarter of a decoding step).
"""

from __future__ import annotations

import math
from ctypes import c_int, c_long

import torch
from torch import Tensor

from linattn.ops._common import all_finite, graph_grads, nonfinite
from linattn.ops._library import KernelOp
from linattn.ops.delta.chunk import torch_prefill, torch_step
from linattn.ops.gated.chunk import check_gate
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
from linattn.ops.native.abi import LayoutError

__all__ = ["delta_rule_native", "one_thread", "delta_rule_native_train", "delta_rule_step_native",
           "kernels", "unavailable", "kernels_here", "checkpoints", "step_into", "V_MULTIPLE",
           "CHECKPOINT"]

#: V must be a multiple of this (whole vectors of every ISA's width, up to AVX-512's 16).
V_MULTIPLE = 16
#: A call splits across threads from this many state-element updates (N·T·K·V), through the
#: library's thread policy (:func:`linattn.ops.native.threads_for`); 2^23 is ~0.7 ms of kernel.
#: Below it a split gained nothing (16 heads × 64 and 128 tokens, in a loop or called alone, the
#: parts on torch's OpenMP team or a Python pool: 1.0-1.6× one thread's time, AMD EPYC family
#: 25); from 16 × 256 tokens it does (0.79× in a loop, 0.61× at 512). As GLA's (gated/native.py).
PARALLEL_MIN = 1 << 23


# --------------------------------------------------------------------------- the C boundary


#: Tokens between two states the forward saves for the backward (GDR_TC in kernels.c, checked
#: when the library loads): the backward recomputes the states of one chunk from the last.
CHECKPOINT = 64


def _size_functions(lib) -> dict:
    lib.la_gdr_work.restype, lib.la_gdr_work.argtypes = c_long, [c_long]
    lib.la_gdr_backward_work.restype = c_long
    lib.la_gdr_backward_work.argtypes = [c_long, c_long]
    lib.la_gdr_chunk.restype, lib.la_gdr_chunk.argtypes = c_long, []
    lib.la_gdr_step_work.restype = c_long
    lib.la_gdr_step_work.argtypes = [c_long, c_long, c_long, c_long, c_int, c_int]
    lib.la_gdr_forward_work.restype = c_long
    lib.la_gdr_forward_work.argtypes = [c_long, c_long, c_int]
    if lib.la_gdr_chunk() != CHECKPOINT:
        raise LayoutError(f"la_gdr_chunk() is {lib.la_gdr_chunk()}, not CHECKPOINT = "
                          f"{CHECKPOINT}")
    return {"work": lib.la_gdr_work, "backward_work": lib.la_gdr_backward_work,
            "step_work": lib.la_gdr_step_work, "forward_work": lib.la_gdr_forward_work}


#: la_gdr_step's fields in the order :func:`step_into` passes them (by position: a decoding
#: step is ~18 µs, 18 keywords ~1.2 of it), checked against the C struct when the library loads.
STEP_FIELDS = ("q", "k", "v", "beta", "g", "gk", "dt", "N", "G", "K", "V", "scale", "l2norm",
               "S_in", "S_out", "o", "work", "threads")

_KERNELS = KernelSet("la_delta_abi", extra=_size_functions,
                     positional={"gdr_step": STEP_FIELDS})


def kernels(isa: str = "native") -> dict | None:
    """The delta-rule kernels of one ISA build (name -> a function taking its struct's fields by
    keyword; and "work": the scratch size in floats for a head dimension K), or None where that
    build cannot be had (see :func:`unavailable`)."""
    return _KERNELS.get(isa)


def unavailable(isa: str = "native") -> str | None:
    """Why :func:`kernels` gives None for ``isa``, or None if it loads."""
    return _KERNELS.unavailable(isa)


def kernels_here(isa: str) -> dict | None:
    """The kernels of ``isa``, else of the native build, else None
    (:func:`linattn.ops.native.build_or_native`)."""
    return build_or_native(kernels, isa)


# ------------------------------------------------------------------------------------ the calls
def _work(fns: dict, K: int, V: int | None = None) -> Tensor:
    """This thread's scratch buffer for head dimension K: la_gdr_work(K) floats of this build,
    or with V the backward's la_gdr_backward_work(K, V)."""
    return scratch(fns["work"](K) if V is None else fns["backward_work"](K, V))


def _forward(fns: dict, q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None,
             s: float, l2norm: bool, S_in: Tensor, S_out: Tensor, o: Tensor,
             ckpt: Tensor | None = None, w: Tensor | None = None,
             gk: Tensor | None = None) -> None:
    """The kernel over inputs whose last dimension is contiguous (any head and token strides):
    q, k (NQ, T, K), v (N, T, V) with N = G·NQ value heads (grouped value attention: value head
    n reads q/k head n // G, in place), beta and g (N, T) with any strides (fla's (1, T, H)
    read in place), gk (N, T, K) per-key log-gates or None, S_in, S_out contiguous (N, K, V)
    (may be one tensor), o (N, T, V); in parts on torch's threads when large enough (a part
    starting inside a group reads from the group's q/k head, told its place in the group).
    With ckpt (N, ceil(T / CHECKPOINT), K, V), contiguous per head) and w (N, T, V), rows
    contiguous), also what the backward reads: the state before each chunk, and w = v − a Sᵀk̃
    per token."""
    NQ, T, K = q.shape
    N, V = v.shape[0], v.shape[2]
    G = N // NQ if NQ else 1
    # parts: head groups, or a head's column blocks (see linattn.ops.native.head_jobs)
    threads = threads_for(N * T * K * V, max(N, V // V_MULTIPLE), PARALLEL_MIN)
    gs, gt = (0, 0) if g is None else g.stride()
    f4 = 4  # bytes per float32 element (beta, the gates, the states)
    e = q.element_size()  # of q, k, v and o: 2 for 16-bit rows (the kernel widens them)
    dt = DTYPE_CODES[q.dtype]
    qp, kp, vp, bp, Sp, Op, op = (x.data_ptr() for x in (q, k, v, beta, S_in, S_out, o))
    gp = None if g is None else g.data_ptr()
    gkp, gks, gkt = (None, 0, 0) if gk is None else (gk.data_ptr(), gk.stride(0), gk.stride(1))
    cp, cs = (None, 0) if ckpt is None else (ckpt.data_ptr(), ckpt.stride(0))
    wp, ws, wt = (None, 0, 0) if w is None else (w.data_ptr(), w.stride(0), w.stride(1))
    fn = fns["gdr_forward"]

    def part(h0: int, h1: int, v0: int, v1: int) -> None:
        m0 = h0 // G  # the q/k head of value head h0; h0 % G: its place in the group
        rc = fn(
            q=qp + e * m0 * q.stride(0), qs=q.stride(0), qt=q.stride(1),
            k=kp + e * m0 * k.stride(0), ks=k.stride(0), kt=k.stride(1), G=G, g0=h0 - m0 * G,
            v=vp + e * h0 * v.stride(0), vs=v.stride(0), vt=v.stride(1),
            beta=bp + f4 * h0 * beta.stride(0), bs=beta.stride(0), bt=beta.stride(1),
            g=None if gp is None else gp + f4 * h0 * gs, gs=gs, gt=gt,
            gk=None if gkp is None else gkp + f4 * h0 * gks, gks=gks, gkt=gkt, dt=dt, N=h1 - h0,
            T=T, K=K, V=V, v0=v0, v1=v1, scale=s, l2norm=int(bool(l2norm)),
            S_in=Sp + f4 * h0 * K * V, S_out=Op + f4 * h0 * K * V, o=op + e * h0 * o.stride(0),
            os=o.stride(0), ot=o.stride(1), ckpt=None if cp is None else cp + f4 * h0 * cs,
            cs=cs, w=None if wp is None else wp + f4 * h0 * ws, ws=ws, wt=wt,
            work=scratch(work_size(fns, "forward_work", K, V, dt)).data_ptr())
        check_rc(rc, "la_gdr_forward")

    run_jobs(part, head_jobs(N, V, threads, block=V_MULTIPLE), threads)



def _backward_heads(fns: dict, q: Tensor, k: Tensor, beta: Tensor, g: Tensor | None, s: float,
                    l2norm: bool, ckpt: Tensor, w: Tensor, g_o: Tensor, g_S: Tensor | None,
                    dS0: Tensor, dq: Tensor, dk: Tensor, dv: Tensor, dbeta: Tensor,
                    dg: Tensor | None) -> None:
    """la_gdr_backward over (N, T, ·) views with contiguous rows (any head and token strides;
    beta, g, dbeta, dg (N, T) with contiguous rows; g_S, dS0 contiguous (N, K, V)), groups of
    heads in parallel on torch's threads when large enough."""
    N, T, K = q.shape
    V = w.shape[2]
    threads = threads_for(N * T * K * V, N, PARALLEL_MIN)  # whole heads only (no column split)
    fn = fns["gdr_backward"]
    dt = DTYPE_CODES[q.dtype]  # of q, k, g_o, dq, dk, dv (16-bit: widened a chunk at a time)

    def at(x: Tensor | None, h0: int) -> int | None:
        return None if x is None else x.data_ptr() + x.element_size() * h0 * x.stride(0)

    def part(h0: int, h1: int, _v0: int, _v1: int) -> None:
        rc = fn(
            q=at(q, h0), qs=q.stride(0), qt=q.stride(1), k=at(k, h0), ks=k.stride(0),
            kt=k.stride(1), beta=at(beta, h0), bs=beta.stride(0), g=at(g, h0),
            gs=0 if g is None else g.stride(0), N=h1 - h0, T=T, K=K, V=V, scale=s,
            l2norm=int(bool(l2norm)), ckpt=at(ckpt, h0), cs=ckpt.stride(0), w=at(w, h0),
            ws=w.stride(0), wt=w.stride(1), dout=at(g_o, h0), dos=g_o.stride(0),
            dot=g_o.stride(1), dS=at(g_S, h0), dS0=at(dS0, h0), dq=at(dq, h0),
            dqs=dq.stride(0), dqt=dq.stride(1), dk=at(dk, h0), dks=dk.stride(0),
            dkt=dk.stride(1), dv=at(dv, h0), dvs=dv.stride(0), dvt=dv.stride(1),
            dbeta=at(dbeta, h0), dbs=dbeta.stride(0), dg=at(dg, h0),
            dgs=0 if dg is None else dg.stride(0), dt=dt, work=_work(fns, K, V).data_ptr())
        check_rc(rc, "la_gdr_backward")

    run_jobs(part, head_jobs(N, V, threads, block=V_MULTIPLE), threads)


def _spans(q: Tensor, v: Tensor, cu_seqlens: Tensor | None, *xs: Tensor | None
           ) -> tuple[int, int, list[tuple[int, int]], tuple]:
    """(H, HV, spans, xs as (heads, ...) sources): H the q/k heads and HV the value heads (their
    batch dimensions, less the packed batch of one); one span over every head, or with
    ``cu_seqlens`` (batch size 1) one span per packed sequence, each from its own state."""
    T = q.shape[-2]
    qb, vb = q.shape[:-2], v.shape[:-2]
    if cu_seqlens is None:
        return math.prod(qb), math.prod(vb), [(0, T)], xs
    spans = list(zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist(), strict=True))
    return (math.prod(qb[1:]), math.prod(vb[1:]), spans,
            tuple(None if x is None else x[0] for x in xs))


def _prefill(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None, S0: Tensor,
             cu_seqlens: Tensor | None, scale: float, l2norm: bool, isa: str,
             gk: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``linattn::gdr_forward``: q, k (..., H, T, K), v (..., HV, T, V) with HV = G·H (value
    head j reads q/k head j // G; G = 1: as many heads), beta, g (..., HV, T) float32, gk
    (..., HV, T, K) float32 per-key log-gates or None, S0 the checked initial state
    (..., HV, K, V) float32 — with ``cu_seqlens`` (batch size 1), (N, ..., HV, K, V), one per
    packed sequence. Returns (o (..., HV, T, V) in q's dtype, the final state float32, S0's
    shape)."""
    fns = kernels_here(isa)
    if fns is None:
        return torch_prefill(q, k, v, beta, g, scale, S0, cu_seqlens, l2norm, CHECKPOINT, gk)
    return _run_forward(fns, q, k, v, beta, g, S0, cu_seqlens, scale, l2norm, False, gk)[:2]


def _run_forward(fns: dict, q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None,
                 S0: Tensor, cu_seqlens: Tensor | None, scale: float, l2norm: bool,
                 save: bool, gk: Tensor | None = None
                 ) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    """The forward kernel over every span; with ``save``, also the backward's checkpoints
    (HV, :func:`checkpoints`, K, V) and w (HV, T, V). q and k are read in place (views when
    their rows are contiguous), never repeated for grouped value heads."""
    T, K = q.shape[-2:]
    V = v.shape[-1]
    H, HV, spans, src = _spans(q, v, cu_seqlens, q, k, v, beta, g, gk)
    if one_16_bit_dtype(q, k, v):  # the kernel reads 16-bit rows a chunk at a time
        qf, kf, vf = rows(src[0], H), rows(src[1], H), rows(src[2], HV)
    else:
        qf, kf = float32_rows(src[0], H), float32_rows(src[1], H)
        vf = float32_rows(src[2], HV)
    # beta and g read in place, any strides: fla's (B, T, H) with B = 1 (a prefill's) without
    # a copy (several sequences of a batch are copied into rows by the reshape)
    bf = src[3].reshape(HV, T)
    gf = None if g is None else src[4].reshape(HV, T)
    gkf = None if gk is None else float32_rows(src[5], HV)
    S_in = S0.reshape(-1, K, V)
    if cu_seqlens is None and T > 0 and S_in.is_contiguous():
        S = torch.empty_like(S_in)  # the kernel reads S0 and writes S: no copy (torch's copy
        # of a state this size splits over OpenMP threads, and waits for a busy partner)
    else:  # per packed sequence, each span updates its states in place
        S = S_in = S_in.clone(memory_format=torch.contiguous_format)
    o = empty_hugepage(qf, HV, T, V)
    ckpt = w = None
    if save:  # float32 whatever the rows' dtype
        ckpt = empty_hugepage(S, HV, checkpoints(T, cu_seqlens), K, V)
        w = empty_hugepage(S, HV, T, V)
    c = 0
    for i, (a, b) in enumerate(spans):
        heads = slice(i * HV, (i + 1) * HV)  # (in place where S is S_in)
        n = -(-(b - a) // CHECKPOINT)
        _forward(fns, qf[:, a:b], kf[:, a:b], vf[:, a:b], bf[:, a:b],
                 None if gf is None else gf[:, a:b], scale, l2norm, S_in[heads], S[heads],
                 o[:, a:b],
                 None if ckpt is None else ckpt[:, c:c + n], None if w is None else w[:, a:b],
                 None if gkf is None else gkf[:, a:b])
        c += n
    o = o.view(*v.shape[:-2], T, V)
    return (o if o.dtype == q.dtype else o.to(q.dtype)), S.view(S0.shape), ckpt, w


def _prefill_fake(q, k, v, beta, g, S0, cu_seqlens, scale, l2norm, isa, gk=None):
    return q.new_empty(*v.shape[:-2], q.shape[-2], v.shape[-1]), S0.new_empty(S0.shape)


# ---------------------------------------------------------------------- with gradients
def checkpoints(T: int, cu_seqlens: Tensor | None) -> int:
    """States the forward saves per head for the backward: one before each chunk of
    :data:`CHECKPOINT` tokens, ceil(T / C); with ``cu_seqlens`` (N sequences, each chunked on
    its own) room for T // C + N, a bound that reads no value (the shape function's)."""
    if cu_seqlens is None:
        return -(-T // CHECKPOINT)
    return T // CHECKPOINT + cu_seqlens.shape[0] - 1


def _train_forward(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None, S0: Tensor,
                   cu_seqlens: Tensor | None, scale: float, l2norm: bool, isa: str
                   ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``linattn::gdr_forward_train``: ``linattn::gdr_forward`` (same arguments, same o and
    final state) that also returns what ``linattn::gdr_backward`` reads, its autograd formula:
    the state before each chunk of :data:`CHECKPOINT` tokens (H, :func:`checkpoints`, K, V) and
    w = v − a Sᵀk̃ per token (H, T, V), H the heads (batch dimensions, less the packed batch of
    one). q and k have as many heads as v here (the op repeats them for grouped value heads:
    autograd then sums the group's gradients); no per-key gates (they take the torch forms
    when a gradient is wanted)."""
    fns = kernels_here(isa)
    *batch, T, K = q.shape
    V = v.shape[-1]
    if fns is None:  # no kernels here: the torch form (the backward differentiates it again)
        H = math.prod(batch if cu_seqlens is None else batch[1:])
        o, S = torch_prefill(q, k, v, beta, g, scale, S0, cu_seqlens, l2norm, CHECKPOINT)
        return (o, S, S0.new_empty(H, checkpoints(T, cu_seqlens), K, V),
                q.new_empty(H, T, V, dtype=torch.float32))
    return _run_forward(fns, q, k, v, beta, g, S0, cu_seqlens, scale, l2norm, True)


def _train_forward_fake(q, k, v, beta, g, S0, cu_seqlens, scale, l2norm, isa):
    *batch, T, K = q.shape
    V = v.shape[-1]
    H = math.prod(batch if cu_seqlens is None else batch[1:])
    return (q.new_empty(*q.shape[:-1], V), S0.new_empty(S0.shape),
            S0.new_empty(H, checkpoints(T, cu_seqlens), K, V),
            q.new_empty(H, T, V, dtype=torch.float32))


def _train_backward(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None,
                    S0: Tensor, cu_seqlens: Tensor | None, ckpt: Tensor, w: Tensor,
                    g_o: Tensor | None, g_S: Tensor | None, scale: float, l2norm: bool,
                    isa: str) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``linattn::gdr_backward``: the gradients of q, k, v, beta, g (an empty tensor when g is
    None) and of the initial state from those of the output and the final state (None: zero),
    with ckpt and w from ``linattn::gdr_forward_train``. Not differentiable itself
    (``create_graph`` takes :func:`_differentiable_backward`)."""
    fns = kernels_here(isa)
    if fns is None:  # as in _train_forward: the torch form, differentiated by autograd
        with torch.enable_grad():
            leaves = [None if x is None else x.detach().requires_grad_(True)
                      for x in (q, k, v, beta, g, S0)]
            outs = torch_prefill(*leaves[:5], scale, leaves[5], cu_seqlens, l2norm, CHECKPOINT)
            pairs = [(o, d) for o, d in zip(outs, (g_o, g_S), strict=True) if d is not None]
            wanted = [x for x in leaves if x is not None]
            got = torch.autograd.grad([o for o, _ in pairs], wanted, [d for _, d in pairs],
                                      allow_unused=True)
        got = iter(torch.zeros_like(x) if d is None else d for x, d in zip(wanted, got,
                                                                          strict=True))
        grads = [q.new_empty(0) if x is None else next(got).detach() for x in leaves]
        return tuple(grads)
    *batch, T, K = q.shape
    V = v.shape[-1]
    H, _, spans, (gq, gk, gb, gg, go) = _spans(q, q, cu_seqlens, q, k, beta, g, g_o)
    # 16-bit q, k and output gradient: read in place, a chunk at a time, by the kernel, which
    # writes dq, dk, dv in their dtype (rounded once); else float32 rows
    wide = one_16_bit_dtype(q, k, g_o)
    qf, kf = (rows(gq, H), rows(gk, H)) if wide else (float32_rows(gq, H), float32_rows(gk, H))
    bf = gb.reshape(H, T).contiguous()
    gf = None if g is None else gg.reshape(H, T).contiguous()
    # a missing output gradient: one zero row read for every token (token and head strides 0)
    go = (qf.new_zeros(1, 1, V).expand(H, T, V) if go is None
          else rows(go, H) if wide else float32_rows(go, H))
    gS = None if g_S is None else g_S.reshape(-1, K, V).contiguous()
    dq, dk = empty_hugepage(qf, H, T, K), empty_hugepage(qf, H, T, K)
    dv = empty_hugepage(qf, H, T, V)
    dbeta = bf.new_empty(H, T)  # float32, as beta and g
    dg = None if g is None else gf.new_empty(H, T)
    dS0 = S0.new_empty(len(spans) * H, K, V)
    c = 0
    for i, (a, b) in enumerate(spans):
        n = -(-(b - a) // CHECKPOINT)
        heads = slice(i * H, (i + 1) * H)
        _backward_heads(fns, qf[:, a:b], kf[:, a:b], bf[:, a:b],
                        None if gf is None else gf[:, a:b], scale, l2norm, ckpt[:, c:c + n],
                        w[:, a:b], go[:, a:b], None if gS is None else gS[heads], dS0[heads],
                        dq[:, a:b], dk[:, a:b], dv[:, a:b], dbeta[:, a:b],
                        None if dg is None else dg[:, a:b])
        c += n
    # in the inputs' dtypes (float32 rows of a 16-bit input, whose output gradient was not of
    # its dtype, rounded here)
    dq, dk, dv = (d.view(x.shape).to(x.dtype) for d, x in ((dq, q), (dk, k), (dv, v)))
    return (dq, dk, dv, dbeta.view(beta.shape),
            q.new_empty(0) if dg is None else dg.view(g.shape), dS0.view(S0.shape))


def _train_backward_fake(q, k, v, beta, g, S0, cu_seqlens, ckpt, w, g_o, g_S, scale, l2norm,
                         isa):
    # contiguous, as the kernels return them: ``empty_like`` would keep a strided input's
    # strides, and a compiled graph would then view the real (contiguous) gradients wrongly
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            beta.new_empty(beta.shape), q.new_empty(0) if g is None else g.new_empty(g.shape),
            S0.new_empty(S0.shape))


def _small(q: Tensor, k: Tensor, v: Tensor, *_) -> bool:
    """Whether a call stays on one thread (its torch operations too): the library's policy
    (:func:`linattn.ops.native.is_small`) with this op's threshold. Asked with v in q's place
    and q in v's: the parts are the value heads (HV·T·V / (T·V)) and the work HV·T·V·K the
    same product, which with grouped value heads counts every value head (q has only H)."""
    return is_small(v, q, PARALLEL_MIN)


_BACKWARD = KernelOp("gdr_backward", _train_backward, _train_backward_fake, small=_small)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, beta, g, S0, cu_seqlens, scale, l2norm, isa = inputs
    _, _, ckpt, w = output
    ctx.set_materialize_grads(False)  # no zero gradients for the saved states
    ctx.mark_non_differentiable(ckpt, w)
    ctx.save_for_backward(q, k, v, beta, g, S0, cu_seqlens, ckpt, w)
    ctx.cfg = (scale, l2norm, isa)


def _backward_formula(ctx, g_o, g_S, _g_ckpt, _g_w):
    q, k, v, beta, g, S0, cu_seqlens, ckpt, w = ctx.saved_tensors
    scale, l2norm, isa = ctx.cfg
    needs = ctx.needs_input_grad[:6]
    if (g_o is None and g_S is None) or not any(needs):
        return (None,) * 10
    if torch.is_grad_enabled():  # create_graph=True: a gradient that is differentiable
        grads = _differentiable_backward(ctx, g_o, g_S)
    else:
        grads = _BACKWARD(q, k, v, beta, g, S0, cu_seqlens, ckpt, w, g_o, g_S, scale, l2norm,
                          isa)
    return (*(d if need else None for d, need in zip(grads, needs, strict=True)),
            None, None, None, None)


def _differentiable_backward(ctx, g_o: Tensor | None, g_S: Tensor | None) -> list:
    """The backward for ``create_graph=True`` (gradient penalties, Hessian-vector products):
    the torch chunked form (:func:`linattn.ops.delta.chunk.torch_prefill`) on the saved
    inputs, differentiated by autograd with the graph kept. The compiled backward's own result
    is not differentiable, and a first gradient that silently did not require grad would drop
    every term built on it."""
    q, k, v, beta, g, S0, cu_seqlens, _, _ = ctx.saved_tensors
    scale, l2norm, _ = ctx.cfg
    # in float32, as the kernels compute (16-bit q, k, v are saved as given)
    o, S = torch_prefill(*(x.float() for x in (q, k, v)), beta, g, scale, S0, cu_seqlens,
                         l2norm, CHECKPOINT)
    o = o.to(q.dtype)
    inputs = [q, k, v, beta, g, S0]
    needs = [need and x is not None for x, need in zip(inputs, ctx.needs_input_grad[:6],
                                                       strict=True)]
    return graph_grads([o, S], [g_o, g_S], inputs, needs)


def _step(q_t: Tensor, k_t: Tensor, v_t: Tensor, beta_t: Tensor, g_t: Tensor | None,
          S: Tensor, scale: float, l2norm: bool, isa: str, gk_t: Tensor | None = None
          ) -> tuple[Tensor, Tensor]:
    """``linattn::gdr_step``: one decoding step. q_t, k_t (..., H, K), v_t (..., HV, V) with
    HV = G·H (grouped value attention; G = 1: as many heads), beta_t, g_t (..., HV) float32,
    gk_t (..., HV, K) float32 per-key log-gates or None, S the state (..., HV, K, V) float32,
    not modified. Returns (o_t in q_t's dtype, the new state float32 (..., HV, K, V)). Lean on
    purpose (contiguous inputs are passed as they are, outputs allocated in their final shape):
    this is the whole per-token cost of decoding."""
    fns = kernels_here(isa)
    if fns is None:
        _check_step_values(beta_t, g_t, gk_t)
        return torch_step(q_t, k_t, v_t, beta_t, S, g_t, gk_t, None, scale, l2norm)
    N = beta_t.numel()
    NQ = q_t.numel() // q_t.shape[-1]
    q, k, v = float32_step_rows(q_t, NQ), float32_step_rows(k_t, NQ), float32_step_rows(v_t, N)
    b = beta_t if beta_t.is_contiguous() else beta_t.contiguous()
    g = g_t if g_t is None or g_t.is_contiguous() else g_t.contiguous()
    gk = gk_t if gk_t is None or gk_t.is_contiguous() else gk_t.contiguous()
    S_in = S if S.is_contiguous() else S.contiguous()
    S_out = torch.empty_like(S_in)
    o = torch.empty(v_t.shape, dtype=torch.float32)  # (..., V), row-major
    rc = step_into(fns, q, k, v, b, g, S_in, S_out, o, scale, l2norm, gk)
    if rc:
        _refused_step(rc, beta_t, g_t, gk_t)
    return (o if o.dtype == q_t.dtype else o.to(q_t.dtype)), S_out


def step_into(fns: dict, q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None,
              S_in: Tensor, S_out: Tensor, o: Tensor, scale: float, l2norm: bool,
              gk: Tensor | None = None) -> int:
    """One compiled decoding step on contiguous tensors: q, k (..., H, K), v (..., HV, V) with
    HV = G·H value heads (value head n reads q/k row n // G), beta, g (..., HV) (g may be
    None), gk (..., HV, K) or None, and o (..., HV, V) written, all of one dtype (float32,
    bfloat16 or float16: the others are read as float32 and o rounded once); S_in
    (..., HV, K, V) float32 read, S_out (same; may be S_in: the update in place) written.
    Returns the kernel's code: 0, or -2 (a nan or infinite β) or -3 (a nan or positive gate,
    scalar or per-key) with nothing written. The kernel splits its heads over its own threads
    from :data:`linattn.ops.native.NATIVE_PARALLEL_MIN` state elements
    (:func:`linattn.ops.native.native_threads`)."""
    K, V = S_in.shape[-2], S_in.shape[-1]
    N = beta.numel()
    NQ = q.numel() // K
    G = N // NQ if NQ else 1
    dt = DTYPE_CODES[q.dtype]
    threads = native_threads(N * K * V, N)
    rc = fns["gdr_step:positional"](  # STEP_FIELDS
        q.data_ptr(), k.data_ptr(), v.data_ptr(), beta.data_ptr(),
        None if g is None else g.data_ptr(), None if gk is None else gk.data_ptr(), dt,
        N, G, K, V, scale, 1 if l2norm else 0, S_in.data_ptr(), S_out.data_ptr(), o.data_ptr(),
        scratch(work_size(fns, "step_work", N, G, K, V, threads, dt)).data_ptr(), threads)
    return split_done(rc, threads)


def _check_step_values(beta_t: Tensor, g_t: Tensor | None, gk_t: Tensor | None = None) -> None:
    """In Python, what la_gdr_step checks itself (for the calls that do not run it)."""
    if not all_finite(beta_t):
        _refused_step(-2, beta_t, g_t, gk_t)
    if g_t is not None:
        check_gate(g_t, "g_t", tuple(g_t.shape), g_t)
    if gk_t is not None:
        check_gate(gk_t, "gk_t", tuple(gk_t.shape), gk_t)


def _refused_step(rc: int, beta_t: Tensor, g_t: Tensor | None,
                  gk_t: Tensor | None = None) -> None:
    """The kernel's own value checks (la_gdr_step): the errors the torch path raises."""
    if rc == -2:
        raise ValueError(f"beta_t: expected finite values, got {nonfinite(beta_t)}")
    if rc == -3:  # raises, naming the values
        for gate, name in ((g_t, "g_t"), (gk_t, "gk_t")):
            if gate is not None:
                check_gate(gate, name, tuple(gate.shape), gate)
    check_rc(rc, "la_gdr_step")


def _step_fake(q_t, k_t, v_t, beta_t, g_t, S, scale, l2norm, isa, gk_t=None):
    return v_t.new_empty(v_t.shape, dtype=q_t.dtype), torch.empty_like(S)


delta_rule_native = KernelOp("gdr_forward", _prefill, _prefill_fake, small=_small)
#: The forward that saves what its backward reads, with ``linattn::gdr_backward`` as its
#: autograd formula: what the dispatcher runs when a gradient is wanted (returns o, S and the
#: saved states; :func:`delta_rule_native_train` the first two).
_FORWARD_TRAIN = KernelOp("gdr_forward_train", _train_forward, _train_forward_fake,
                          backward=_backward_formula, setup_context=_setup_context, small=_small)

#: The op's small-call rule for a whole call (its entry's own torch work too): see KernelOp.
one_thread = delta_rule_native.one_thread


def delta_rule_native_train(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None,
                            S0: Tensor, cu_seqlens: Tensor | None, scale: float, l2norm: bool,
                            isa: str) -> tuple[Tensor, Tensor]:
    """:data:`delta_rule_native`'s contract with the compiled backward: (o, S), differentiable
    in q, k, v, beta, g and S0. The passes are float32: 16-bit q, k, v of one dtype are read
    by the kernels a chunk at a time (o and their gradients written in it, rounded once);
    mixed dtypes, or no kernels here, are widened (and o rounded back) by differentiable
    casts. The gradients come back in the inputs' dtypes either way."""
    dt = q.dtype
    if one_16_bit_dtype(q, k, v) and kernels_here(isa) is not None:
        # the kernels read and write the 16-bit rows themselves, a chunk at a time: the same
        # float32 arithmetic without widened copies of q, k, v, o and of their gradients
        return _FORWARD_TRAIN(q, k, v, beta, g, S0, cu_seqlens, scale, l2norm, isa)[:2]
    q, k, v = (recycled_cast(x, torch.float32) for x in (q, k, v))
    o, S, _, _ = _FORWARD_TRAIN(q, k, v, beta, g, S0, cu_seqlens, scale, l2norm, isa)
    return recycled_cast(o, dt), S
delta_rule_step_native = KernelOp("gdr_step", _step, _step_fake)
