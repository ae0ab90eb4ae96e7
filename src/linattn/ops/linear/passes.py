r"""The compiled passes of ``linear_attention`` for 1 + elu and 1 + relu (``kernels.c``): the
implementation of the custom ops that :mod:`linattn.ops.linear.native` registers.

Measured on this project's CPU (docs/bench-ops.md), the chunked torch path spent most of its
time outside the matrix products: 1 + elu costs ~0.8 ns per element in torch, the [V, 1]
column made every product 65 wide where MKL is 15–20 % slower than at 64, fresh outputs cost
32768 page faults each, and the backward differentiated φ through autograd. Here the state is
(S, z) with S = Σ φ(k)ᵀ v (ℓ×Dv) and z = Σ φ(k) (ℓ), outputs are advised onto huge pages, and
φ' needs no second exp (1 for x > 0, else φ itself for 1 + elu and 0 for 1 + relu). Two tiers:

* **one pass per head** (float32; bfloat16 too; no padding mask, ℓ, Dv and the causal
  chunk multiples of 16): compiled kernels walk each head chunk by chunk with the chunk's
  features in L1 and do every product in a register-blocked tile, skipping the zero half of
  each causal score block:

  non-causal   S += φ(k)ᵀ v,  z += Σ φ(k);   o = φ(q) S / (φ(q)·z)
  causal       o_c = (A v_c + φ(q_c) S_c) / (rowsum A + φ(q_c)·z_c),  (S, z) += chunk's own,
               A = tril(φ(q_c) φ(k_c)ᵀ)

  The vector width and the tile follow the ISA the library was built for
  (ops/native/common.h): 16 floats and 6×64 accumulators on AVX-512, 8 floats and 6×16 on AVX2 (16
  registers), 4 floats on NEON and SSE2, scalars elsewhere. With several torch threads, groups
  of heads run in parallel.
* **block passes** (everything else: padding masks, other widths): torch matmuls on blocks of
  tokens, with φ, the column sums, the normaliser, the division and φ' as one compiled pass
  each over a block still in cache.

The backward keeps one (S, z) per block of tokens (never one per token) and recomputes the
rest. With s the normaliser, dnum = g / s and ds = −(g·o) / s: from the saved output in the
block passes and the causal chunked form, and in the one-pass backwards as −φ(q)·(S dnum) / s,
the same value from the state they hold, which needs no output and keeps dφ(q) = S dnum + ds z
cancelling where it should (from a bfloat16 output, rounded, it did not: kernels.c, out_ds):

  non-causal   G = Σ φ(q)ᵀ dnum, g_z = Σ φ(q) ds;  dφ(q) = dnum Sᵀ + ds zᵀ,
               dφ(k) = v Gᵀ + g_z,  dv = φ(k) G
  causal       dA = mask(dnum vᵀ + ds), dφ(q) = dA φ(k) + dnum S_cᵀ + ds z_cᵀ,
               dφ(k) = dAᵀ φ(q) + v G_cᵀ + g_z,c,  dv = Aᵀ dnum + φ(k) G_c, with G_c, g_z,c
               the gradients of the state after chunk c (a reverse prefix sum).

bfloat16 inputs without gradients: the one-pass forwards read and write bfloat16 and keep
every sum in float32. Where the build has AVX512-BF16 (and ℓ is a multiple of 32) their products
run on bfloat16 dot products (on AMX tiles where the CPU has them), φ(k), φ(q), the state and
the causal scores rounded to bfloat16 (|o − exact| ≤ 3u·max|v| + u·|o|, u = 2⁻⁸, and
4·2⁻¹⁷·max|v| more in the non-causal form, whose φ is made to 2⁻¹⁷; tiles.h), the non-causal
forward ~1.6× the speed of the float32 pass (AMD Zen 4; 2.6× on AMX tiles, Intel Xeon);
elsewhere they are the float32 arithmetic on half the memory traffic. The block
passes multiply bfloat16 blocks where the CPU has bf16 dot products
(:func:`linattn.ops.native.bf16_products`) and otherwise widen to float32 once. Chunk states
are float32 sums either way. With gradients, the one-pass backwards read and write bfloat16
rows themselves (the float32 arithmetic on the values the rows hold, each gradient rounded
once; the causal one in its recurrent form: :func:`backward_takes_bf16`); elsewhere bfloat16
is widened to float32 before the forward (native.py, by differentiable casts into recycled
buffers).

The C boundary: one argument struct per kernel, declared in kernels.c only; each kernel is
called with its fields by keyword, through a mirror built from the library's own layout table
when it loads (ops/native/abi.py).
"""

from __future__ import annotations

from ctypes import c_int, c_long

import torch
from torch import Tensor

from linattn.feature_maps import EluPlusOne, ReluPlusOne
from linattn.ops._common import block_ranges, graph_grads
from linattn.ops.linear.portable import portable_forward
from linattn.ops.native import (
    KernelSet,
    build_or_native,
    check_rc,
    empty_hugepage,
    run_parts,
    threads_for,
)

__all__ = ["kernels", "unavailable", "phi", "forward", "backward",
           "rows_contiguous", "fits_one_pass", "backward_takes_bf16", "REC_MAX_STATE",
           "MAP_KINDS", "MAP_OF_KIND", "PARALLEL_MIN", "NONCAUSAL_CHUNK"]

#: The feature maps the kernels compute, by their kind number in kernels.c.
MAP_KINDS = {EluPlusOne: 0, ReluPlusOne: 1}
MAP_OF_KIND = {kind: cls for cls, kind in MAP_KINDS.items()}

#: Tokens per chunk of the one-pass non-causal kernels (their features stay in L1).
NONCAUSAL_CHUNK = 64
#: The non-causal backward's: its query pass sums G += φ(q)ᵀ dn, whose register tiles of G are
#: loaded and stored once per chunk (256: 4 % faster than 64 on AMD Zen 4 at T = 65,536; the
#: forward's key pass takes four chunks at a time in C for the same reason).
NONCAUSAL_BACKWARD_CHUNK = 256
#: A call splits its heads across threads from this many state-element updates
#: (N·T·ℓ·Dv; :func:`linattn.ops.native.threads_for`): below it the hand-over to the pool costs
#: more than the second thread saves (measured: benchmarks/threads.py, docs/bench-ops.md).
PARALLEL_MIN = 1 << 22


# --------------------------------------------------------------------------- the C boundary
#: the passes of la_linear_work (kernels.c): the scratch each one-pass kernel needs
NONCAUSAL_FORWARD, CAUSAL_FORWARD, NONCAUSAL_BACKWARD, CAUSAL_BACKWARD = range(4)


def _work_size(lib) -> dict:
    lib.la_linear_work.restype = c_long
    lib.la_linear_work.argtypes = [c_int, c_long, c_long, c_long, c_long]
    lib.la_linear_backward_bf16.restype = c_int
    lib.la_linear_backward_bf16.argtypes = [c_int, c_long, c_long]
    return {"work": lib.la_linear_work, "backward_bf16": lib.la_linear_backward_bf16}


_KERNELS = KernelSet("la_linear_abi", extra=_work_size)


def kernels(isa: str = "native") -> dict | None:
    """The linear-attention kernels of one ISA build (name -> a function taking its struct's
    fields by keyword), or None where that build cannot be had (see :func:`unavailable`)."""
    return _KERNELS.get(isa)


def unavailable(isa: str = "native") -> str | None:
    """Why :func:`kernels` gives None for ``isa``, or None if it loads."""
    return _KERNELS.unavailable(isa)


def _ptr(x: Tensor | None) -> int | None:
    return None if x is None else x.data_ptr()


def rows_contiguous(x: Tensor) -> bool:
    """Whether each head's rows of a (N, T, F) tensor lie one after another in memory (any
    head stride): what the compiled passes read and write. The stride of a size-1 dimension is
    any number (``.contiguous()`` keeps it): not asked."""
    return ((x.shape[2] <= 1 or x.stride(2) == 1)
            and (x.shape[1] <= 1 or x.stride(1) == x.shape[2]))


def _head_stride(x: Tensor) -> int:
    """Elements from one head to the next of a (N, T, F) view whose rows are contiguous."""
    if not rows_contiguous(x):
        raise ValueError(f"native pass: rows must be contiguous, got strides {x.stride()}")
    return x.stride(0)


def _rows_of(x: Tensor, scratch: Tensor | None) -> Tensor:
    """x itself, or x copied into the first rows of ``scratch`` (N, R >= T, F) where x's rows are
    not contiguous (the gradient of a ``.sum()`` arrives expanded, with stride 0): one block at
    a time, so a whole-size copy is never made."""
    return x if scratch is None else scratch[:, : x.shape[1]].copy_(x)


def phi(kind: int, x: Tensor, out: Tensor, z: Tensor | None = None, keep: Tensor | None = None,
        *, isa: str = "native") -> None:
    """out[:, :T] = φ(x), zero rows where keep is False; z += Σ_t out[:, t] when z is given.

    x: (N, T, D) view; out: contiguous (N, R, D); z: contiguous (N, D); keep: bool (N, T)."""
    fns = kernels(isa)
    if fns is None:
        raise RuntimeError(f"linattn native path: {unavailable(isa)}")
    _phi(fns, kind, x, out, z, keep)


def _phi(fns, kind, x, out, z=None, keep=None) -> None:
    N, T, D = x.shape
    if not out.is_contiguous() or out.shape[1] < T:
        raise ValueError("native phi: out must be a contiguous (N, R >= T, D) buffer")
    fns["phi"](kind=kind, x=x.data_ptr(), xbf=_bf(x), N=N, T=T, D=D, xs=_head_stride(x),
               out=out.data_ptr(), obf=_bf(out), R=out.shape[1], z=_ptr(z),
               keep=_ptr(keep), ks=0 if keep is None else keep.stride(0))


def _bf(x: Tensor) -> int:
    """The compiled passes' dtype flag: 1 for bfloat16, 0 for float32."""
    return int(x.dtype == torch.bfloat16)


def _normalise(fns, num, fq, z, zrows, sx, eps, out):
    N, R, Dv = num.shape
    fns["normalise"](
        num=num.data_ptr(), nbf=_bf(num), fq=fq.data_ptr(), fbf=_bf(fq), z=z.data_ptr(),
        zrows=zrows, sx=_ptr(sx), N=N, T=out.shape[1], R=R, L=fq.shape[2], Dv=Dv, eps=eps,
        out=out.data_ptr(), obf=_bf(out), os=_head_stride(out))


def _norm_grad(fns, o, fq, z, zrows, sx, g, eps, dnum, ds):
    N, R, L = fq.shape
    fns["norm_grad"](
        o=o.data_ptr(), os=_head_stride(o), fq=fq.data_ptr(), z=z.data_ptr(), zrows=zrows,
        sx=_ptr(sx), g=g.data_ptr(), gs=_head_stride(g), N=N, T=g.shape[1], R=R, L=L,
        Dv=dnum.shape[2], eps=eps, dnum=dnum.data_ptr(), ds=ds.data_ptr())


def _prefix(fns, P: Tensor, S0: Tensor, S1: Tensor, reverse: bool = False) -> Tensor:
    """In place: P (N, n, ...) of per-chunk sums -> S0 + the chunks before each (after it if
    ``reverse``); S1 (may be S0) <- S0 + all chunks. All contiguous."""
    N, n = P.shape[:2]
    F = P[0, 0].numel() if N * n else 0  # an empty batch: nothing to sum
    fns["prefix"](P=P.data_ptr(), N=N, n=n, F=F, S0=S0.data_ptr(), S1=S1.data_ptr(),
                  reverse=int(reverse))
    return P


def _grad_phi(fns, kind, dphi, x, f, coef, vec, vrows, keep, dx):
    N, R, L = dphi.shape
    fns["grad_phi"](
        kind=kind, dphi=dphi.data_ptr(), x=x.data_ptr(), xs=_head_stride(x), f=f.data_ptr(),
        coef=_ptr(coef), vec=_ptr(vec), vrows=vrows, N=N, T=dx.shape[1], R=R, L=L,
        keep=_ptr(keep), ks=0 if keep is None else keep.stride(0), dx=dx.data_ptr(),
        dxs=_head_stride(dx))


class _Block:
    """The inputs (N, T, ·) and reusable contiguous block buffers."""

    def __init__(self, fns, kind, q, k, v, keep):
        self.fns, self.kind, self.q, self.k, self.v, self.keep = fns, kind, q, k, v, keep
        self.L, self.Dv, self.N = q.shape[2], v.shape[2], q.shape[0]
        self._bufs: dict[tuple, Tensor] = {}

    def buf(self, name: str, *shape: int, acc: bool = False) -> Tensor:
        """A contiguous (N, *shape) buffer, allocated once per name and shape: in the inputs'
        dtype (what the matmuls read), or float32 with ``acc`` (sums and states)."""
        key = (name, shape)
        if key not in self._bufs:
            dtype = torch.float32 if acc else self.q.dtype
            self._bufs[key] = self.q.new_empty(self.N, *shape, dtype=dtype)
        return self._bufs[key]

    def keep_at(self, t0, t1):
        return None if self.keep is None else self.keep[:, t0:t1]

    def values(self, t0, t1, R, view_ok=False):
        """v[:, t0:t1] as (N, R, Dv), padded keys and rows zeroed: with ``view_ok`` the view
        itself where nothing is padded (bmm takes any head stride at full speed), else a
        contiguous buffer."""
        T = t1 - t0
        src = self.v[:, t0:t1]
        if view_ok and self.keep is None and R == T:
            return src
        vb = self.buf("v", R, self.Dv)
        if self.keep is not None:
            src = torch.where(self.keep[:, t0:t1].unsqueeze(-1), src, src.new_zeros(()))
        vb[:, :T].copy_(src)
        vb[:, T:].zero_()
        return vb

    def features(self, which, t0, t1, R, z=None):
        """φ of q or k on [t0, t1) into a (N, R, ℓ) buffer (rows from t1 - t0 on zeroed)."""
        out = self.buf("f" + which, R, self.L)
        x, keep = (self.q, None) if which == "q" else (self.k, self.keep_at(t0, t1))
        _phi(self.fns, self.kind, x[:, t0:t1], out, z, keep)
        out[:, t1 - t0:].zero_()
        return out


def _g_scratch(g_out: Tensor, heads: int, block: int) -> Tensor | None:
    """A block-sized buffer for :func:`_rows_of` where the output gradient needs one."""
    return None if rows_contiguous(g_out) else g_out.new_empty(heads, block, g_out.shape[2])


def _noncausal_forward(b: _Block, S, z, eps, block, out):
    if _single_pass(b, NONCAUSAL_CHUNK):
        C, L, Dv = NONCAUSAL_CHUNK, b.L, b.Dv

        def heads(h0, h1, work):
            q, k, v, o = (x[h0:h1] for x in (b.q, b.k, b.v, out))
            rc = b.fns["noncausal_forward"](
                kind=b.kind, bf=_bf(q), q=q.data_ptr(), qs=_head_stride(q), k=k.data_ptr(),
                ks=_head_stride(k), v=v.data_ptr(), vs=_head_stride(v), N=h1 - h0,
                Tq=q.shape[1], Tk=k.shape[1], L=L, Dv=Dv, C=C, eps=eps, S=S[h0].data_ptr(),
                z=z[h0].data_ptr(), out=o.data_ptr(), os=_head_stride(o), work=work.data_ptr())
            check_rc(rc, "la_noncausal_forward")

        return _over_heads(b, b.fns["work"](NONCAUSAL_FORWARD, C, L, Dv, 0), heads)
    bf16 = b.q.dtype == torch.bfloat16  # block products in bfloat16, S summed in float32
    for t0, t1 in block_ranges(b.k.shape[1], block):
        fk = b.features("k", t0, t1, t1 - t0, z=z)
        vb = b.values(t0, t1, t1 - t0, view_ok=True)
        if bf16:
            S += torch.bmm(fk.transpose(1, 2), vb)
        else:
            S.baddbmm_(fk.transpose(1, 2), vb)
    Sm = S.to(b.q.dtype)
    for t0, t1 in block_ranges(b.q.shape[1], block):
        T = t1 - t0
        fq = b.features("q", t0, t1, T)
        num = torch.bmm(fq, Sm, out=b.buf("num", T, b.Dv))
        _normalise(b.fns, num, fq, z, T, None, eps, out[:, t0:t1])


def _causal_block(b: _Block, t0, t1, chunk, S, z, S_next=None, z_next=None, numerator=True):
    """Features, chunk states and masked scores of one causal block (and, with ``numerator``,
    the numerators), shared by the forward and the backward. S, z: the state before the block;
    S_next, z_next (may be S, z) receive the state after it. Returns the pieces as a dict;
    3-D views are (N·n, C, ·)."""
    N, L, Dv = b.N, b.L, b.Dv
    n = -(-(t1 - t0) // chunk)
    R = n * chunk
    fq, fk, vb = b.features("q", t0, t1, R), b.features("k", t0, t1, R), b.values(t0, t1, R)
    fq3, fk3, v3 = fq.view(N * n, chunk, L), fk.view(N * n, chunk, L), vb.view(N * n, chunk, Dv)
    # Each chunk's own state, turned in place into the state before the chunk (float32).
    S_before = b.buf("S", n, L, Dv, acc=True).view(-1, L, Dv)
    # In float32 for bfloat16 blocks too: a bfloat16 product would round each chunk's state.
    torch.bmm(fk3.transpose(1, 2).float(), v3.float(), out=S_before)
    S_before = _prefix(b.fns, S_before.view(N, n, L, Dv), S, S if S_next is None else S_next)
    z_before = torch.sum(fk.view(N, n, chunk, L), 2, dtype=torch.float32,
                         out=b.buf("z", n, L, acc=True))
    z_before = _prefix(b.fns, z_before, z, z if z_next is None else z_next)
    A = b.buf("A", n, chunk, chunk).view(-1, chunk, chunk)
    A = torch.bmm(fq3, fk3.transpose(1, 2), out=A)
    rs = b.buf("rs", R, acc=True)
    b.fns["mask_rowsum"](A=A.data_ptr(), abf=_bf(A), B=N * n, C=chunk,
                         rs=rs.data_ptr())
    c = dict(n=n, R=R, fq=fq, fk=fk, fq3=fq3, fk3=fk3, v3=v3, S_before=S_before,
             z_before=z_before, A=A, rs=rs)
    if numerator:
        Sm = S_before if fq.dtype == torch.float32 else S_before.to(fq.dtype)
        num = torch.bmm(fq3, Sm.view(N * n, L, Dv), out=b.buf("num", R, Dv).view(-1, chunk, Dv))
        c["num"] = num.baddbmm_(A, v3).view(N, R, Dv)
    return c


def _over_heads(b: _Block, size: int, fn) -> None:
    """fn(h0, h1, work) over groups of heads, on threads where the call is large enough
    (:func:`linattn.ops.native.threads_for`, the library's one thread policy): the compiled
    passes are single-threaded and heads are independent. ctypes releases the GIL during the
    call, so Python threads run them in parallel. About four groups per thread, a contiguous
    run of them each, the rest taken as threads finish (:func:`linattn.ops.native.run_parts`).
    work: a float32 scratch buffer of ``size``, one per thread."""
    if b.N == 0:
        return
    work = b.N * max(b.q.shape[1], b.k.shape[1]) * b.L * b.Dv  # state-element updates
    threads = threads_for(work, b.N, PARALLEL_MIN)
    works = [b.q.new_empty(size, dtype=torch.float32) for _ in range(threads)]
    if threads == 1:
        fn(0, b.N, works[0])
        return
    parts = min(b.N, 4 * threads)
    bounds = [b.N * i // parts for i in range(parts + 1)]
    run_parts(lambda slot, h0, h1: fn(h0, h1, works[slot]),
              [(bounds[i], bounds[i + 1]) for i in range(parts)], threads)


def fits_one_pass(L: int, Dv: int, chunk: int, masked: bool) -> bool:
    """The one-pass kernels' sizes: no padding, chunk and widths multiples of 16 (whole vectors
    of every ISA's width)."""
    return not masked and chunk % 16 == 0 and L % 16 == 0 and Dv % 16 == 0


#: The largest state (ℓ·Dv floats a head) the causal backward's recurrent form takes, the form
#: that reads bfloat16 rows: REC_MAX_STATE in kernels_forms.c, mirrored here so that the choice
#: is plain Python under ``torch.compile`` (tests/ops/linear check the two agree:
#: ``la_linear_backward_bf16``).
REC_MAX_STATE = 128 * 128


def backward_takes_bf16(L: int, Dv: int, chunk: int, is_causal: bool, masked: bool) -> bool:
    """Whether the one-pass backward of these sizes reads and writes bfloat16 rows itself:
    :func:`fits_one_pass`, and for the causal one its recurrent form (states up to
    :data:`REC_MAX_STATE`; the chunked form reads float32 only). Else bfloat16 with gradients
    is widened first (native.py)."""
    C = chunk if is_causal else NONCAUSAL_BACKWARD_CHUNK
    return fits_one_pass(L, Dv, C, masked) and (not is_causal or L * Dv <= REC_MAX_STATE)


def _single_pass(b: _Block, chunk: int, backward: bool = False, causal: bool = False) -> bool:
    """Whether the one-pass kernels apply: :func:`fits_one_pass`, float32 or bfloat16 (the
    backwards: bfloat16 where :func:`backward_takes_bf16`)."""
    if not fits_one_pass(b.L, b.Dv, chunk, b.keep is not None):
        return False
    if b.q.dtype == torch.float32 or (b.q.dtype == torch.bfloat16 and not backward):
        return True
    return b.q.dtype == torch.bfloat16 and backward_takes_bf16(b.L, b.Dv, chunk, causal, False)


def _causal_forward(b: _Block, S, z, eps, block, chunk, out, S_states, z_states):
    if _single_pass(b, chunk):
        L, Dv = b.L, b.Dv
        size = b.fns["work"](CAUSAL_FORWARD, chunk, L, Dv, 0)

        def heads(h0, h1, work):
            # one call for all T: the kernel keeps the state before each block in S_states
            q, k, v, o = (x[h0:h1] for x in (b.q, b.k, b.v, out))
            rc = b.fns["causal_forward"](
                kind=b.kind, bf=_bf(q), q=q.data_ptr(), qs=_head_stride(q), k=k.data_ptr(),
                ks=_head_stride(k), v=v.data_ptr(), vs=_head_stride(v), N=h1 - h0,
                T=q.shape[1], L=L, Dv=Dv, C=chunk, eps=eps, S=S[h0].data_ptr(),
                z=z[h0].data_ptr(), out=o.data_ptr(), os=_head_stride(o),
                Ss=S_states[0, h0].data_ptr(), sb=S_states.stride(0),
                zss=z_states[0, h0].data_ptr(), zb=z_states.stride(0), block=block,
                work=work.data_ptr())
            check_rc(rc, "la_causal_forward")

        return _over_heads(b, size, heads)
    for i, (t0, t1) in enumerate(block_ranges(b.q.shape[1], block)):
        S_states[i], z_states[i] = S, z
        c = _causal_block(b, t0, t1, chunk, S_states[i], z_states[i], S, z)
        _normalise(b.fns, c["num"], c["fq"], c["z_before"], chunk, c["rs"], eps,
                   out[:, t0:t1])


def _noncausal_backward(b: _Block, S, z, out, g_out, G, Gz, eps, block, dq, dk, dv):
    kind, Dv, L = b.kind, b.Dv, b.L
    if _single_pass(b, NONCAUSAL_BACKWARD_CHUNK, backward=True):
        C = NONCAUSAL_BACKWARD_CHUNK
        S, z = S.contiguous(), z.contiguous()

        def run(parts, h0, h1, q0, q1, g, work):
            """parts 1: the query pass over queries [q0, q1); 2: the key pass; 3: both."""
            qv, dqv = (x[h0:h1, q0:q1] for x in (b.q, dq))
            k, v, dk_, dv_ = (x[h0:h1] for x in (b.k, b.v, dk, dv))
            rc = b.fns["noncausal_backward"](
                kind=kind, parts=parts, bf=_bf(qv), q=qv.data_ptr(), qs=_head_stride(qv),
                k=k.data_ptr(), ks=_head_stride(k), v=v.data_ptr(), vs=_head_stride(v),
                g=g.data_ptr(), gs=_head_stride(g), N=h1 - h0,
                Tq=q1 - q0, Tk=k.shape[1], L=L, Dv=Dv, C=C, eps=eps, S=S[h0].data_ptr(),
                z=z[h0].data_ptr(), G=G[h0].data_ptr(), Gz=Gz[h0].data_ptr(),
                dq=dqv.data_ptr(), dqs=_head_stride(dqv), dk=dk_.data_ptr(),
                dks=_head_stride(dk_), dv=dv_.data_ptr(), dvs=_head_stride(dv_),
                work=work.data_ptr())
            check_rc(rc, "la_noncausal_backward")

        def heads(h0, h1, work):
            Tq = b.q.shape[1]
            g_buf = _g_scratch(g_out, h1 - h0, min(block, Tq))
            if g_buf is None:  # one call for both passes
                return run(3, h0, h1, 0, Tq, g_out[h0:h1], work)
            for t0, t1 in block_ranges(Tq, block):  # the query pass fed block by block
                run(1, h0, h1, t0, t1, _rows_of(g_out[h0:h1, t0:t1], g_buf), work)
            run(2, h0, h1, 0, 0, g_buf[:, :0], work)

        return _over_heads(b, b.fns["work"](NONCAUSAL_BACKWARD, C, L, Dv, 0), heads)
    g_buf = _g_scratch(g_out, b.N, block)
    for t0, t1 in block_ranges(b.q.shape[1], block):  # queries: dq, and the state's gradient
        T = t1 - t0
        fq = b.features("q", t0, t1, T)
        dn, ds = b.buf("dnum", T, Dv), b.buf("ds", T)
        _norm_grad(b.fns, out[:, t0:t1], fq, z, T, None, _rows_of(g_out[:, t0:t1], g_buf), eps,
                   dn, ds)
        G.baddbmm_(fq.transpose(1, 2), dn)
        Gz.unsqueeze(1).baddbmm_(ds.unsqueeze(1), fq)
        d = torch.bmm(dn, S.transpose(1, 2), out=b.buf("dphi", T, L))
        _grad_phi(b.fns, kind, d, b.q[:, t0:t1], fq, ds, z, T, None, dq[:, t0:t1])
    for t0, t1 in block_ranges(b.k.shape[1], block):  # keys and values
        T = t1 - t0
        fk = b.features("k", t0, t1, T)
        vb = b.values(t0, t1, T, view_ok=True)
        d = torch.bmm(vb, G.transpose(1, 2), out=b.buf("dphi", T, L))
        _grad_phi(b.fns, kind, d, b.k[:, t0:t1], fk, None, Gz, T, b.keep_at(t0, t1),
                  dk[:, t0:t1])
        dv[:, t0:t1] = torch.bmm(fk, G, out=b.buf("dnum", T, Dv))


def _causal_backward(b: _Block, S_states, z_states, out, g_out, G, Gz, eps, block, chunk,
                     dq, dk, dv):
    kind, N, L, Dv = b.kind, b.N, b.L, b.Dv
    if _single_pass(b, chunk, backward=True, causal=True):
        size = b.fns["work"](CAUSAL_BACKWARD, chunk, L, Dv, -(-block // chunk))

        def run(h0, h1, t0, t1, g, blocks, work):
            """la_causal_backward_blocks over tokens [t0, t1) of heads [h0, h1), g the output
            gradient's rows there, in blocks of ``blocks`` tokens (block i + t0 // block's
            states)."""
            i = t0 // block
            q, k, v, o = (x[h0:h1, t0:t1] for x in (b.q, b.k, b.v, out))
            dq_, dk_, dv_ = (x[h0:h1, t0:t1] for x in (dq, dk, dv))
            rc = b.fns["causal_backward_blocks"](
                kind=kind, bf=_bf(q), q=q.data_ptr(), qs=_head_stride(q), k=k.data_ptr(),
                ks=_head_stride(k), v=v.data_ptr(), vs=_head_stride(v), o=o.data_ptr(),
                os=_head_stride(o), g=g.data_ptr(), gs=_head_stride(g), N=h1 - h0, T=t1 - t0,
                L=L, Dv=Dv, C=chunk, eps=eps, S_in=S_states[i, h0].data_ptr(),
                sb=S_states.stride(0), z_in=z_states[i, h0].data_ptr(), zb=z_states.stride(0),
                block=blocks, G=G[h0].data_ptr(), Gz=Gz[h0].data_ptr(), dq=dq_.data_ptr(),
                dqs=_head_stride(dq_), dk=dk_.data_ptr(), dks=_head_stride(dk_),
                dv=dv_.data_ptr(), dvs=_head_stride(dv_), work=work.data_ptr())
            check_rc(rc, "la_causal_backward_blocks")

        def heads(h0, h1, work):
            T = b.q.shape[1]
            g_buf = _g_scratch(g_out, h1 - h0, block)
            if g_buf is None:  # every block in one call, from the last
                return run(h0, h1, 0, T, g_out[h0:h1], block, work)
            for t0, t1 in reversed(block_ranges(T, block)):  # g's rows copied block by block
                run(h0, h1, t0, t1, _rows_of(g_out[h0:h1, t0:t1], g_buf), t1 - t0, work)

        return _over_heads(b, size, heads)
    g_buf = _g_scratch(g_out, N, block)
    for i, (t0, t1) in reversed(list(enumerate(block_ranges(b.q.shape[1], block)))):
        T = t1 - t0
        c = _causal_block(b, t0, t1, chunk, S_states[i], z_states[i], numerator=False)
        n, R = c["n"], c["R"]
        dn, ds = b.buf("dnum", R, Dv), b.buf("ds", R)
        dn[:, T:].zero_()
        ds[:, T:].zero_()
        _norm_grad(b.fns, out[:, t0:t1], c["fq"], c["z_before"], chunk, c["rs"],
                   _rows_of(g_out[:, t0:t1], g_buf), eps, dn, ds)
        dn3, ds3 = dn.view(N * n, chunk, Dv), ds.view(N * n, chunk)
        # Gradient of the state after each chunk: G (after the block) plus what the later
        # chunks of the block read from it; G, Gz become the gradient before the block.
        G_after = b.buf("G", n, L, Dv).view(-1, L, Dv)
        G_after = torch.bmm(c["fq3"].transpose(1, 2), dn3, out=G_after)
        G_after = _prefix(b.fns, G_after.view(N, n, L, Dv), G, G, reverse=True)
        Gz_after = torch.bmm(ds3.unsqueeze(1), c["fq3"], out=b.buf("Gz", n, L).view(-1, 1, L))
        Gz_after = _prefix(b.fns, Gz_after.view(N, n, L), Gz, Gz, reverse=True)
        dA = b.buf("dA", n, chunk, chunk).view(-1, chunk, chunk)
        dA = torch.bmm(dn3, c["v3"].transpose(1, 2), out=dA)
        b.fns["mask_add"](A=dA.data_ptr(), B=N * n, C=chunk, ds=ds3.data_ptr())
        dphi = b.buf("dphi", R, L)
        d = torch.bmm(dA, c["fk3"], out=dphi.view(N * n, chunk, L))
        d.baddbmm_(dn3, c["S_before"].view(N * n, L, Dv).transpose(1, 2))
        _grad_phi(b.fns, kind, dphi, b.q[:, t0:t1], c["fq"], ds, c["z_before"], chunk, None,
                  dq[:, t0:t1])
        d = torch.bmm(dA.transpose(1, 2), c["fq3"], out=dphi.view(N * n, chunk, L))
        d.baddbmm_(c["v3"], G_after.view(N * n, L, Dv).transpose(1, 2))
        _grad_phi(b.fns, kind, dphi, b.k[:, t0:t1], c["fk"], None, Gz_after, chunk,
                  b.keep_at(t0, t1),
                  dk[:, t0:t1])
        dvb = torch.bmm(c["A"].transpose(1, 2), dn3, out=b.buf("dv", R, Dv).view(-1, chunk, Dv))
        dvb = dvb.baddbmm_(c["fk3"], G_after.view(N * n, L, Dv)).view(N, R, Dv)[:, :T]
        if b.keep is not None:
            dvb = torch.where(b.keep[:, t0:t1].unsqueeze(-1), dvb, dvb.new_zeros(()))
        dv[:, t0:t1] = dvb


# ------------------------------------------------- the custom ops' implementations
def forward(q: Tensor, k: Tensor, v: Tensor, S0: Tensor, z0: Tensor, keep: Tensor | None,
            kind: int, eps: float, block: int, chunk: int, is_causal: bool, isa: str
            ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``linattn::linear_attention_fwd``. q, k, v: (N, T, ·) with contiguous rows (float32, or
    bfloat16 without gradients); S0 (N, L, Dv), z0 (N, L) float32; keep (N, T) bool or None.
    Returns the output (N, Tq, Dv), the final state S, z, and what the backward reads: the
    state before each block (nb, N, L, Dv), (nb, N, L) when causal, empty tensors otherwise
    (the backward then reads the final S, z)."""
    fns = _kernels_here(isa)
    if fns is None:  # a traced program run where the kernels cannot be had: the same function
        out, S, z = _portable(q, k, v, S0, z0, keep, kind, eps, chunk, is_causal)
        return out, S, z, S0.new_empty(0), z0.new_empty(0)
    N, Tq, L = q.shape
    Dv = v.shape[2]
    out = empty_hugepage(q, N, Tq, Dv)
    b = _Block(fns, kind, q, k, v, keep)
    S, z = S0.clone(), z0.clone()
    if not is_causal:
        _noncausal_forward(b, S, z, eps, block, out)
        return out, S, z, S0.new_empty(0), z0.new_empty(0)
    nb = -(-Tq // block)
    S_states, z_states = empty_hugepage(S0, nb, N, L, Dv), S0.new_empty(nb, N, L)
    _causal_forward(b, S, z, eps, block, chunk, out, S_states, z_states)
    return out, S, z, S_states, z_states


def backward(q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, S0: Tensor, z0: Tensor,
             S_states: Tensor, z_states: Tensor, S: Tensor, z: Tensor, out: Tensor,
             g_out: Tensor | None, g_S: Tensor | None, g_z: Tensor | None, kind: int,
             eps: float, block: int, chunk: int, is_causal: bool, isa: str
             ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``linattn::linear_attention_bwd``: the gradients of q, k, v and of the initial state
    (S0, z0) from those of the output and the final state (None: zero). Not differentiable
    itself (``create_graph`` takes the recomputing formula in
    :func:`linattn.ops.linear.native._backward_formula`)."""
    fns = _kernels_here(isa)
    if fns is None:  # as in forward: the portable form, differentiated by autograd
        with torch.enable_grad():
            leaves = [x.detach().requires_grad_(True) for x in (q, k, v, S0, z0)]
            outs = _portable(*leaves, keep, kind, eps, chunk, is_causal)
            grads = graph_grads(list(outs), [g_out, g_S, g_z], leaves, [True] * 5)
        return tuple(g.detach() for g in grads)
    N, Tq, L = q.shape
    Dv = v.shape[2]
    if q.dtype != torch.float32 and not (  # (native.py widens bfloat16 the kernels cannot take)
            q.dtype == torch.bfloat16
            and backward_takes_bf16(L, Dv, chunk, is_causal, keep is not None)):
        raise RuntimeError(f"linattn native path: no backward for {q.dtype} at L={L}, Dv={Dv}")
    b = _Block(fns, kind, q, k, v, keep)
    dq, dk, dv = (empty_hugepage(x, *x.shape) for x in (q, k, v))
    f32 = torch.float32  # the state's gradients: float32 sums, as the state
    G = q.new_zeros(N, L, Dv, dtype=f32) if g_S is None else g_S.to(f32).contiguous().clone()
    Gz = q.new_zeros(N, L, dtype=f32) if g_z is None else g_z.to(f32).contiguous().clone()
    if g_out is None:
        g_out = q.new_zeros(()).expand(N, Tq, Dv)
    elif g_out.dtype != q.dtype:  # the kernels read it in the inputs' dtype
        g_out = g_out.to(q.dtype)
    if is_causal:
        _causal_backward(b, S_states, z_states, out, g_out, G, Gz, eps, block, chunk,
                         dq, dk, dv)
    else:
        _noncausal_backward(b, S, z, out, g_out, G, Gz, eps, block, dq, dk, dv)
    return dq, dk, dv, G, Gz


def _kernels_here(isa: str) -> dict | None:
    return build_or_native(kernels, isa)


def _portable(q, k, v, S0, z0, keep, kind, eps, chunk, is_causal):
    """(out, S, z) of the custom op's inputs by the portable form (new tensors)."""
    keep = None if keep is None else keep.unsqueeze(-1)
    out, total = portable_forward(MAP_OF_KIND[kind](), q, k, v, keep, eps, chunk, is_causal,
                                  torch.cat([S0, z0.unsqueeze(-1)], -1))
    return out, total[..., :-1].contiguous(), total[..., -1].contiguous()
