r"""The compiled CPU fast path of ``linear_attention`` for 1 + elu and 1 + relu (``_native.c``).

Measured on this project's CPU (docs/benchmarks.md), the chunked torch path spent most of its
time outside the matrix products: 1 + elu costs ~0.8 ns per element in torch, the [V, 1]
column made every product 65 wide where MKL is 15–20 % slower than at 64, fresh outputs cost
32768 page faults each, and the backward differentiated φ through autograd. Here the state is
(S, z) with S = Σ φ(k)ᵀ v (ℓ×Dv) and z = Σ φ(k) (ℓ), outputs are advised onto huge pages, and
φ' needs no second exp (1 for x > 0, else φ itself for 1 + elu and 0 for 1 + relu). Two tiers:

* **one pass per head** (float32; bfloat16 forwards too; no padding mask, ℓ, Dv and the causal
  chunk multiples of 16): compiled kernels walk each head chunk by chunk with the chunk's
  features in L1 and do every product in a register-blocked tile, skipping the zero half of
  each causal score block:

  non-causal   S += φ(k)ᵀ v,  z += Σ φ(k);   o = φ(q) S / (φ(q)·z)
  causal       o_c = (A v_c + φ(q_c) S_c) / (rowsum A + φ(q_c)·z_c),  (S, z) += chunk's own,
               A = tril(φ(q_c) φ(k_c)ᵀ)

  The vector width and the tile follow the ISA the library was built for (_native.c's
  header): 16 floats and 6×64 accumulators on AVX-512, 8 floats and 6×16 on AVX2 (16
  registers), 4 floats on NEON and SSE2, scalars elsewhere. With several torch threads, groups
  of heads run in parallel.
* **block passes** (everything else: padding masks, other widths): torch matmuls on blocks of
  tokens, with φ, the column sums, the normaliser, the division and φ' as one compiled pass
  each over a block still in cache.

The backward keeps one (S, z) per block of tokens (never one per token) and recomputes the
rest. With s the normaliser, dnum = g / s and ds = −(g·o) / s (from the saved output):

  non-causal   G = Σ φ(q)ᵀ dnum, g_z = Σ φ(q) ds;  dφ(q) = dnum Sᵀ + ds zᵀ,
               dφ(k) = v Gᵀ + g_z,  dv = φ(k) G
  causal       dA = mask(dnum vᵀ + ds), dφ(q) = dA φ(k) + dnum S_cᵀ + ds z_cᵀ,
               dφ(k) = dAᵀ φ(q) + v G_cᵀ + g_z,c,  dv = Aᵀ dnum + φ(k) G_c, with G_c, g_z,c
               the gradients of the state after chunk c (a reverse prefix sum).

bfloat16 inputs without gradients: the one-pass forwards read and write bfloat16 and keep
every sum in float32 (the float32 arithmetic on half the memory traffic, on any CPU); the block
passes multiply bfloat16 blocks where the CPU has bf16 dot products (:func:`bf16_products`) and
otherwise widen to float32 once. Chunk states are float32 sums either way. bfloat16 with
gradients takes the torch chunked path (float32 throughout).

The compiled library is built on first use (:mod:`linattn._cbuild`: cached per source, flags
and CPU, verified before loading, one build at a time) for the CPU at hand (``-march=native``;
``LINATTN_NATIVE_ISA=avx2|avx512|generic|scalar`` builds another variant, to measure or test
it). :func:`linattn.linear_attention` takes it only where :func:`calibration` measured it to
beat the torch paths on this machine (ops/dispatch.py). Without a C compiler, or with
``LINATTN_NATIVE=0``, :func:`native_supported` is False and the torch paths run instead.
"""


from __future__ import annotations

import dataclasses
import os
import threading
from pathlib import Path

import torch
from torch import Tensor

from linattn import _cbuild
from linattn.feature_maps import EluPlusOne, FeatureMap, ReluPlusOne
from linattn.ops import dispatch
from linattn.ops._common import (
    block_ranges,
    flatten_heads,
    graph_grads,
    needs_grad,
    portable_forward,
)
from linattn.ops.native import (
    _check,
    bf16_products,
    cached_measurement,
    empty_hugepage,
    load,
    pool,
    selected_isa,
)
from linattn.profiling import median_time

__all__ = ["native_supported", "native_linear_attention", "load", "phi"]


_KINDS = {EluPlusOne: 0, ReluPlusOne: 1}


_MAP_OF_KIND = {kind: cls for cls, kind in _KINDS.items()}


#: Tokens per chunk of the one-pass non-causal kernels (their features stay in L1).
NONCAUSAL_CHUNK = 64


def native_supported(
    fmap: FeatureMap, q: Tensor, k: Tensor, v: Tensor, S0: Tensor | None = None
) -> bool:
    """Whether this call can take the native path: 1 + elu or 1 + relu on CPU (the initial
    state S0 too), float32, or bfloat16 without gradients (forwards only)."""
    if type(fmap) not in _KINDS or q.device.type != "cpu":
        return False
    if S0 is not None and S0.device != q.device:
        return False  # the torch paths report the device mismatch
    if q.dtype == torch.bfloat16:
        return not needs_grad(q, k, v, S0) and load() is not None
    return q.dtype == torch.float32 and load() is not None


# ------------------------------------------------------------------ does it win on this machine?
#: The calibration problem: 4 heads of 2048 tokens, d = Dv = 64, float32, 1 + elu (about a
#: second in all: median of 3 calls per path and form, after a warm-up call).
CALIBRATION_SHAPE = (4, 2048, 64)


_FORMS = {(c, b): f"{'causal' if c else 'non-causal'} {'fwd+bwd' if b else 'forward'}"
          for c in (False, True) for b in (False, True)}


_verdicts: dict[tuple[str, int], dict] = {}


def wins(is_causal: bool, backward: bool) -> bool:
    """Whether the compiled path beat plain torch on this machine for this form (see
    :func:`calibration`); :func:`linattn.linear_attention` takes it only then. Where the
    measurement itself fails, the torch paths run (and a warning says why), never an error."""
    try:
        verdicts = calibration()
    except Exception as exc:  # noqa: BLE001 - a failed measurement must not fail the user's call
        _cbuild.warn_once("calibration", f"linattn: could not measure the compiled path "
                          f"({type(exc).__name__}: {exc}); using the PyTorch path")
        _verdicts[selected_isa(), torch.get_num_threads()] = {
            name: {"native": False} for name in _FORMS.values()}
        return False
    return verdicts[_FORMS[is_causal, backward]]["native"]


_CALIBRATION_LOCK = threading.Lock()


def _forget_lock() -> None:
    global _CALIBRATION_LOCK
    _CALIBRATION_LOCK = threading.Lock()  # a forked child may inherit it held


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_lock)


@torch.compiler.disable  # measured eagerly, never traced into a compiled graph
def calibration(threads: int | None = None) -> dict[str, dict]:
    """Per form ("non-causal forward", ..., "causal fwd+bwd"): the median times of the compiled
    path and of the faster torch path (fused or portable) on :data:`CALIBRATION_SHAPE`, and
    whether the compiled one won. Measured at the first call of each thread count (about a
    second) and cached beside the compiled library, so it is measured once per build and CPU;
    delete the ``.calib.json`` file to measure again."""
    threads = torch.get_num_threads() if threads is None else threads
    key = (selected_isa(), threads)
    if key in _verdicts:
        return _verdicts[key]
    with _CALIBRATION_LOCK:  # concurrent first calls measure once, not against each other
        if key not in _verdicts:
            _verdicts[key] = _calibrate(threads)
    return _verdicts[key]


def _calibrate(threads: int) -> dict[str, dict]:
    lib = load()
    if lib is None:
        raise RuntimeError("linattn native path: no compiled library to calibrate")
    entry = f"threads={threads} shape={'x'.join(map(str, CALIBRATION_SHAPE))}"
    return cached_measurement(
        Path(lib._name).with_suffix(".calib.json"), entry, threads, _measure,
        lambda r: isinstance(r, dict) and set(r) == set(_FORMS.values()))


def _measure(repeats: int = 3) -> dict[str, dict]:
    # Gradients even if the first call (which triggers this) runs under no_grad or
    # inference_mode: inputs made here must not be inference tensors.
    with torch.inference_mode(False), torch.enable_grad():
        return _measure_forms(repeats)


def _measure_forms(repeats: int) -> dict[str, dict]:
    from linattn.ops.linear.op import linear_attention  # (linear imports this module)

    N, T, d = CALIBRATION_SHAPE
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, N, T, d, generator=g, dtype=torch.float32, device="cpu") * 0.5
               for _ in range(3))

    def run(is_causal, backward):
        if not backward:
            with torch.no_grad():
                linear_attention(q, k, v, is_causal=is_causal)
            return
        xs = [x.detach().requires_grad_(True) for x in (q, k, v)]
        linear_attention(*xs, is_causal=is_causal).sum().backward()

    result = {}
    for (is_causal, backward), name in _FORMS.items():
        ms = {}
        for impl in ("native", "fused", "portable"):
            # the default sizes, whatever policy the caller is under
            with dispatch.use(**dataclasses.asdict(dispatch.Policy(impl=impl))):
                # one warm-up call: buffers, pages, kernels
                ms[impl] = 1e3 * median_time(
                    lambda c=is_causal, b=backward: run(c, b), repeats)
        torch_ms = min(ms["fused"], ms["portable"])
        result[name] = {"native_ms": round(ms["native"], 3), "torch_ms": round(torch_ms, 3),
                        "native": ms["native"] < torch_ms}
    return result


def _ptr(x: Tensor | None) -> int | None:
    return None if x is None else x.data_ptr()


def _rows_contiguous(x: Tensor) -> bool:
    """Whether each head's rows of a (N, T, F) tensor lie one after another in memory (any
    head stride): what the compiled passes read and write."""
    return x.stride(-1) == 1 and (x.shape[1] <= 1 or x.stride(1) == x.shape[2])


def _head_stride(x: Tensor) -> int:
    """Elements from one head to the next of a (N, T, F) view whose rows are contiguous."""
    if not _rows_contiguous(x):
        raise ValueError(f"native pass: rows must be contiguous, got strides {x.stride()}")
    return x.stride(0)


def _rows_of(x: Tensor, scratch: Tensor | None) -> Tensor:
    """x itself, or x copied into the first rows of ``scratch`` (N, R >= T, F) where x's rows are
    not contiguous (the gradient of a ``.sum()`` arrives expanded, with stride 0): one block at
    a time, so a whole-size copy is never made."""
    return x if scratch is None else scratch[:, : x.shape[1]].copy_(x)


def phi(kind: int, x: Tensor, out: Tensor, z: Tensor | None = None, keep: Tensor | None = None):
    """out[:, :T] = φ(x), zero rows where keep is False; z += Σ_t out[:, t] when z is given.

    x: (N, T, D) view; out: contiguous (N, R, D); z: contiguous (N, D); keep: bool (N, T)."""
    N, T, D = x.shape
    if not out.is_contiguous() or out.shape[1] < T:
        raise ValueError("native phi: out must be a contiguous (N, R >= T, D) buffer")
    ks = 0 if keep is None else keep.stride(0)
    load().la_phi(kind, x.data_ptr(), _bf(x), N, T, D, _head_stride(x), out.data_ptr(), _bf(out),
                  out.shape[1], _ptr(z), _ptr(keep), ks)


def _bf(x: Tensor) -> int:
    """The compiled passes' dtype flag: 1 for bfloat16, 0 for float32."""
    return int(x.dtype == torch.bfloat16)


def _normalise(num, fq, z, zrows, sx, eps, out):
    N, R, Dv = num.shape
    load().la_normalise(num.data_ptr(), _bf(num), fq.data_ptr(), _bf(fq), z.data_ptr(), zrows,
                        _ptr(sx), N, out.shape[1], R, fq.shape[2], Dv, eps, out.data_ptr(),
                        _bf(out), _head_stride(out))


def _norm_grad(o, fq, z, zrows, sx, g, eps, dnum, ds):
    N, R, L = fq.shape
    load().la_norm_grad(o.data_ptr(), _head_stride(o), fq.data_ptr(), z.data_ptr(), zrows,
                        _ptr(sx), g.data_ptr(), _head_stride(g), N, g.shape[1], R, L,
                        dnum.shape[2], eps, dnum.data_ptr(), ds.data_ptr())


def _prefix(P: Tensor, S0: Tensor, S1: Tensor, reverse: bool = False) -> Tensor:
    """In place: P (N, n, ...) of per-chunk sums -> S0 + the chunks before each (after it if
    ``reverse``); S1 (may be S0) <- S0 + all chunks. All contiguous."""
    N, n = P.shape[:2]
    F = P[0, 0].numel() if N * n else 0  # an empty batch: nothing to sum
    load().la_prefix(P.data_ptr(), N, n, F, S0.data_ptr(), S1.data_ptr(), int(reverse))
    return P


def _grad_phi(kind, dphi, x, f, coef, vec, vrows, keep, dx):
    N, R, L = dphi.shape
    ks = 0 if keep is None else keep.stride(0)
    load().la_grad_phi(kind, dphi.data_ptr(), x.data_ptr(), _head_stride(x), f.data_ptr(),
                       _ptr(coef), _ptr(vec), vrows, N,
                       dx.shape[1], R, L, _ptr(keep), ks, dx.data_ptr(), _head_stride(dx))


class _Block:
    """The inputs (N, T, ·) and reusable contiguous block buffers."""

    def __init__(self, kind, q, k, v, keep):
        self.kind, self.q, self.k, self.v, self.keep = kind, q, k, v, keep
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
        phi(self.kind, x[:, t0:t1], out, z, keep)
        out[:, t1 - t0:].zero_()
        return out


def _g_scratch(g_out: Tensor, heads: int, block: int) -> Tensor | None:
    """A block-sized buffer for :func:`_rows_of` where the output gradient needs one."""
    return None if _rows_contiguous(g_out) else g_out.new_empty(heads, block, g_out.shape[2])


def _noncausal_forward(b: _Block, S, z, eps, block, out):
    if _single_pass(b, NONCAUSAL_CHUNK):
        C, L, Dv = NONCAUSAL_CHUNK, b.L, b.Dv

        def heads(h0, h1, work):
            q, k, v, o = (x[h0:h1] for x in (b.q, b.k, b.v, out))
            rc = load().la_noncausal_forward(
                b.kind, _bf(q), *_ptrs(q, k, v), h1 - h0, q.shape[1], k.shape[1], L, Dv, C,
                eps, S[h0].data_ptr(), z[h0].data_ptr(), *_ptrs(o), work.data_ptr())
            _check(rc, "la_noncausal_forward")

        return _over_heads(b, C * L + 2 * C * Dv, heads)
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
        _normalise(num, fq, z, T, None, eps, out[:, t0:t1])


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
    S_before = _prefix(S_before.view(N, n, L, Dv), S, S if S_next is None else S_next)
    z_before = torch.sum(fk.view(N, n, chunk, L), 2, dtype=torch.float32,
                         out=b.buf("z", n, L, acc=True))
    z_before = _prefix(z_before, z, z if z_next is None else z_next)
    A = b.buf("A", n, chunk, chunk).view(-1, chunk, chunk)
    A = torch.bmm(fq3, fk3.transpose(1, 2), out=A)
    rs = b.buf("rs", R, acc=True)
    load().la_mask_rowsum(A.data_ptr(), _bf(A), N * n, chunk, rs.data_ptr())
    c = dict(n=n, R=R, fq=fq, fk=fk, fq3=fq3, fk3=fk3, v3=v3, S_before=S_before,
             z_before=z_before, A=A, rs=rs)
    if numerator:
        Sm = S_before if fq.dtype == torch.float32 else S_before.to(fq.dtype)
        num = torch.bmm(fq3, Sm.view(N * n, L, Dv), out=b.buf("num", R, Dv).view(-1, chunk, Dv))
        c["num"] = num.baddbmm_(A, v3).view(N, R, Dv)
    return c


def _ptrs(*views: Tensor) -> list[int]:
    """(data pointer, head stride) of each (N, T, F) view, flattened: the compiled passes'
    argument pairs."""
    return [a for x in views for a in (x.data_ptr(), _head_stride(x))]


def _over_heads(b: _Block, size: int, fn) -> None:
    """fn(h0, h1, work) over groups of heads, one group per torch thread: the compiled passes
    are single-threaded and heads are independent. ctypes releases the GIL during the call,
    so Python threads run them in parallel. work: a float32 scratch buffer of ``size``."""
    if b.N == 0:
        return
    groups = min(torch.get_num_threads(), b.N)
    bounds = [b.N * g // groups for g in range(groups + 1)]
    works = [b.q.new_empty(size, dtype=torch.float32) for _ in range(groups)]
    if groups == 1:
        fn(0, b.N, works[0])
        return
    workers = pool(groups)
    jobs = [workers.submit(fn, bounds[g], bounds[g + 1], works[g]) for g in range(groups)]
    for job in jobs:
        job.result()


def _fits_one_pass(L: int, Dv: int, chunk: int, masked: bool) -> bool:
    """The one-pass kernels' sizes: no padding, chunk and widths multiples of 16 (whole vectors
    of every ISA's width)."""
    return not masked and chunk % 16 == 0 and L % 16 == 0 and Dv % 16 == 0


def _single_pass(b: _Block, chunk: int, backward: bool = False) -> bool:
    """Whether the one-pass kernels apply: :func:`_fits_one_pass`, float32 (forwards: bfloat16
    too)."""
    dtypes = (torch.float32,) if backward else (torch.float32, torch.bfloat16)
    return b.q.dtype in dtypes and _fits_one_pass(b.L, b.Dv, chunk, b.keep is not None)


def _causal_forward(b: _Block, S, z, eps, block, chunk, out, S_states, z_states):
    if _single_pass(b, chunk):
        L, Dv = b.L, b.Dv
        size = 2 * chunk * L + L * chunk + chunk * chunk + 2 * chunk * Dv

        def heads(h0, h1, work):
            for i, (t0, t1) in enumerate(block_ranges(b.q.shape[1], block)):
                S_states[i, h0:h1], z_states[i, h0:h1] = S[h0:h1], z[h0:h1]
                q, k, v, o = (x[h0:h1, t0:t1] for x in (b.q, b.k, b.v, out))
                rc = load().la_causal_forward(
                    b.kind, _bf(q), *_ptrs(q, k, v), h1 - h0, t1 - t0, L, Dv, chunk, eps,
                    S[h0].data_ptr(), z[h0].data_ptr(), *_ptrs(o), work.data_ptr())
                _check(rc, "la_causal_forward")

        return _over_heads(b, size, heads)
    for i, (t0, t1) in enumerate(block_ranges(b.q.shape[1], block)):
        S_states[i], z_states[i] = S, z
        c = _causal_block(b, t0, t1, chunk, S_states[i], z_states[i], S, z)
        _normalise(c["num"], c["fq"], c["z_before"], chunk, c["rs"], eps, out[:, t0:t1])


def _noncausal_backward(b: _Block, S, z, out, g_out, G, Gz, eps, block, dq, dk, dv):
    kind, Dv, L = b.kind, b.Dv, b.L
    if _single_pass(b, NONCAUSAL_CHUNK, backward=True):
        C = NONCAUSAL_CHUNK
        S, z = S.contiguous(), z.contiguous()

        def run(parts, h0, h1, q0, q1, g, work):
            """parts 1: the query pass over queries [q0, q1); 2: the key pass; 3: both."""
            qv, ov, dqv = (x[h0:h1, q0:q1] for x in (b.q, out, dq))
            k, v, dk_, dv_ = (x[h0:h1] for x in (b.k, b.v, dk, dv))
            rc = load().la_noncausal_backward(
                kind, parts, *_ptrs(qv, k, v, ov, g), h1 - h0, q1 - q0, k.shape[1], L, Dv, C,
                eps, S[h0].data_ptr(), z[h0].data_ptr(), G[h0].data_ptr(), Gz[h0].data_ptr(),
                *_ptrs(dqv, dk_, dv_), work.data_ptr())
            _check(rc, "la_noncausal_backward")

        def heads(h0, h1, work):
            Tq = b.q.shape[1]
            g_buf = _g_scratch(g_out, h1 - h0, min(block, Tq))
            if g_buf is None:  # one call for both passes
                return run(3, h0, h1, 0, Tq, g_out[h0:h1], work)
            for t0, t1 in block_ranges(Tq, block):  # the query pass fed block by block
                run(1, h0, h1, t0, t1, _rows_of(g_out[h0:h1, t0:t1], g_buf), work)
            run(2, h0, h1, 0, 0, g_buf[:, :0], work)

        return _over_heads(b, 2 * C * L + 2 * L * Dv + C * Dv, heads)
    g_buf = _g_scratch(g_out, b.N, block)
    for t0, t1 in block_ranges(b.q.shape[1], block):  # queries: dq, and the state's gradient
        T = t1 - t0
        fq = b.features("q", t0, t1, T)
        dn, ds = b.buf("dnum", T, Dv), b.buf("ds", T)
        _norm_grad(out[:, t0:t1], fq, z, T, None, _rows_of(g_out[:, t0:t1], g_buf), eps, dn, ds)
        G.baddbmm_(fq.transpose(1, 2), dn)
        Gz.unsqueeze(1).baddbmm_(ds.unsqueeze(1), fq)
        d = torch.bmm(dn, S.transpose(1, 2), out=b.buf("dphi", T, L))
        _grad_phi(kind, d, b.q[:, t0:t1], fq, ds, z, T, None, dq[:, t0:t1])
    for t0, t1 in block_ranges(b.k.shape[1], block):  # keys and values
        T = t1 - t0
        fk = b.features("k", t0, t1, T)
        vb = b.values(t0, t1, T, view_ok=True)
        d = torch.bmm(vb, G.transpose(1, 2), out=b.buf("dphi", T, L))
        _grad_phi(kind, d, b.k[:, t0:t1], fk, None, Gz, T, b.keep_at(t0, t1), dk[:, t0:t1])
        dv[:, t0:t1] = torch.bmm(fk, G, out=b.buf("dnum", T, Dv))


def _causal_backward(b: _Block, S_states, z_states, out, g_out, G, Gz, eps, block, chunk,
                     dq, dk, dv):
    kind, N, L, Dv = b.kind, b.N, b.L, b.Dv
    if _single_pass(b, chunk, backward=True):
        nc = -(-block // chunk)
        size = (nc * (2 * chunk * L + L * Dv + L) + 2 * chunk * chunk + Dv * chunk + 2 * Dv * L
                + 2 * chunk * L + chunk * Dv + chunk)
        def heads(h0, h1, work):
            g_buf = _g_scratch(g_out, h1 - h0, block)
            for i, (t0, t1) in reversed(list(enumerate(block_ranges(b.q.shape[1], block)))):
                g = _rows_of(g_out[h0:h1, t0:t1], g_buf)
                ins = (*(x[h0:h1, t0:t1] for x in (b.q, b.k, b.v, out)), g)
                grads = (x[h0:h1, t0:t1] for x in (dq, dk, dv))
                rc = load().la_causal_backward(
                    kind, *_ptrs(*ins), h1 - h0, t1 - t0, L, Dv, chunk, eps,
                    S_states[i, h0].data_ptr(), z_states[i, h0].data_ptr(), G[h0].data_ptr(),
                    Gz[h0].data_ptr(), *_ptrs(*grads), work.data_ptr())
                _check(rc, "la_causal_backward")

        return _over_heads(b, size, heads)
    g_buf = _g_scratch(g_out, N, block)
    for i, (t0, t1) in reversed(list(enumerate(block_ranges(b.q.shape[1], block)))):
        T = t1 - t0
        c = _causal_block(b, t0, t1, chunk, S_states[i], z_states[i], numerator=False)
        n, R = c["n"], c["R"]
        dn, ds = b.buf("dnum", R, Dv), b.buf("ds", R)
        dn[:, T:].zero_()
        ds[:, T:].zero_()
        _norm_grad(out[:, t0:t1], c["fq"], c["z_before"], chunk, c["rs"],
                   _rows_of(g_out[:, t0:t1], g_buf), eps, dn, ds)
        dn3, ds3 = dn.view(N * n, chunk, Dv), ds.view(N * n, chunk)
        # Gradient of the state after each chunk: G (after the block) plus what the later
        # chunks of the block read from it; G, Gz become the gradient before the block.
        G_after = b.buf("G", n, L, Dv).view(-1, L, Dv)
        G_after = torch.bmm(c["fq3"].transpose(1, 2), dn3, out=G_after)
        G_after = _prefix(G_after.view(N, n, L, Dv), G, G, reverse=True)
        Gz_after = torch.bmm(ds3.unsqueeze(1), c["fq3"], out=b.buf("Gz", n, L).view(-1, 1, L))
        Gz_after = _prefix(Gz_after.view(N, n, L), Gz, Gz, reverse=True)
        dA = b.buf("dA", n, chunk, chunk).view(-1, chunk, chunk)
        dA = torch.bmm(dn3, c["v3"].transpose(1, 2), out=dA)
        load().la_mask_add(dA.data_ptr(), N * n, chunk, ds3.data_ptr())
        dphi = b.buf("dphi", R, L)
        d = torch.bmm(dA, c["fk3"], out=dphi.view(N * n, chunk, L))
        d.baddbmm_(dn3, c["S_before"].view(N * n, L, Dv).transpose(1, 2))
        _grad_phi(kind, dphi, b.q[:, t0:t1], c["fq"], ds, c["z_before"], chunk, None,
                  dq[:, t0:t1])
        d = torch.bmm(dA.transpose(1, 2), c["fq3"], out=dphi.view(N * n, chunk, L))
        d.baddbmm_(c["v3"], G_after.view(N * n, L, Dv).transpose(1, 2))
        _grad_phi(kind, dphi, b.k[:, t0:t1], c["fk"], None, Gz_after, chunk, b.keep_at(t0, t1),
                  dk[:, t0:t1])
        dvb = torch.bmm(c["A"].transpose(1, 2), dn3, out=b.buf("dv", R, Dv).view(-1, chunk, Dv))
        dvb = dvb.baddbmm_(c["fk3"], G_after.view(N * n, L, Dv)).view(N, R, Dv)[:, :T]
        if b.keep is not None:
            dvb = torch.where(b.keep[:, t0:t1].unsqueeze(-1), dvb, dvb.new_zeros(()))
        dv[:, t0:t1] = dvb


class _NativeLinearAttention(torch.autograd.Function):
    """Inputs flattened to (N, T, ·) with contiguous rows, float32. Returns (output, S, z)."""

    @staticmethod
    def forward(ctx, q, k, v, S0, z0, keep, kind, eps, block, chunk, is_causal):
        N, Tq, L = q.shape
        Dv = v.shape[2]
        out = empty_hugepage(q, N, Tq, Dv)
        b = _Block(kind, q, k, v, keep)
        S, z = S0.clone(), z0.clone()
        with torch.no_grad():
            if not is_causal:
                _noncausal_forward(b, S, z, eps, block, out)
                S_states, z_states = S.unsqueeze(0), z.unsqueeze(0)
            else:
                nb = -(-Tq // block)
                S_states = S0.new_empty(nb, N, L, Dv)
                z_states = S0.new_empty(nb, N, L)
                _causal_forward(b, S, z, eps, block, chunk, out, S_states, z_states)
        # S0, z0 only serve a differentiable (create_graph) backward
        ctx.save_for_backward(q, k, v, keep, S_states, z_states, out, S0, z0)
        ctx.cfg = (kind, eps, block, chunk, is_causal)
        return out, S, z

    @staticmethod
    def backward(ctx, g_out, g_S, g_z):
        q, k, v, keep, S_states, z_states, out = ctx.saved_tensors[:7]
        if q.dtype != torch.float32:  # native_supported routes bfloat16 with gradients away
            raise RuntimeError(f"linattn native path: no backward for {q.dtype}")
        kind, eps, block, chunk, is_causal = ctx.cfg
        if torch.is_grad_enabled():  # create_graph=True: a gradient that is differentiable
            return _differentiable_backward(ctx, (g_out, g_S, g_z))
        with torch.no_grad():
            return _fast_backward(ctx, q, k, v, keep, S_states, z_states, out, g_out, g_S, g_z)


def _differentiable_backward(ctx, grads):
    """The backward for ``create_graph=True`` (gradient penalties, Hessian-vector products):
    the forward again in differentiable torch operations (ops/_common.py), differentiated by
    autograd with the graph kept. The compiled backward's own result is not differentiable, and
    a first gradient that silently did not require grad would drop every term built on it."""
    q, k, v, keep, *_, S0, z0 = ctx.saved_tensors
    kind, eps, _, chunk, is_causal = ctx.cfg
    fmap = _MAP_OF_KIND[kind]()
    keep = None if keep is None else keep.unsqueeze(-1)
    out, total = portable_forward(fmap, q, k, v, keep, eps, chunk, is_causal,
                                  torch.cat([S0, z0.unsqueeze(-1)], -1))
    outs = [out, total[..., :-1], total[..., -1]]
    grads = graph_grads(outs, list(grads), [q, k, v, S0, z0], ctx.needs_input_grad[:5])
    return (*grads, None, None, None, None, None, None)


def _fast_backward(ctx, q, k, v, keep, S_states, z_states, out, g_out, g_S, g_z):
    """The compiled backward (one pass per head, or block passes); not differentiable."""
    kind, eps, block, chunk, is_causal = ctx.cfg
    N, Tq, L = q.shape
    Dv = v.shape[2]
    b = _Block(kind, q, k, v, keep)
    dq, dk, dv = (empty_hugepage(x, *x.shape) for x in (q, k, v))
    G = q.new_zeros(N, L, Dv) if g_S is None else g_S.contiguous().clone()
    Gz = q.new_zeros(N, L) if g_z is None else g_z.contiguous().clone()
    if g_out is None:
        g_out = q.new_zeros(()).expand(N, Tq, Dv)
    if is_causal:
        _causal_backward(b, S_states, z_states, out, g_out, G, Gz, eps, block, chunk,
                         dq, dk, dv)
    else:
        _noncausal_backward(b, S_states[0], z_states[0], out, g_out, G, Gz, eps, block,
                            dq, dk, dv)
    return dq, dk, dv, G, Gz, None, None, None, None, None, None


def native_linear_attention(q, k, v, fmap, *, is_causal, keep, eps, chunk, block, S0=None):
    """Same contract as :func:`linattn.ops.linear.fused.fused_linear_attention` (float32, or
    bfloat16 without gradients):
    q (..., Tq, D), k (..., T, D), v (..., T, Dv), keep bool broadcastable to (..., T, 1) or
    None, S0 (..., ℓ, Dv + 1) or None. Returns the output (..., Tq, Dv) and the final state
    (..., ℓ, Dv + 1)."""
    L, Dv = q.shape[-1], v.shape[-1]
    one_pass = _fits_one_pass(L, Dv, chunk if is_causal else NONCAUSAL_CHUNK, keep is not None)
    if q.dtype == torch.bfloat16 and not one_pass and not bf16_products():
        # The block passes would multiply bfloat16 blocks, which a CPU without bf16 dot
        # products does slower than float32: widen once, round the output once.
        o, state = native_linear_attention(q.float(), k.float(), v.float(), fmap,
                                           is_causal=is_causal, keep=keep, eps=eps,
                                           chunk=chunk, block=block, S0=S0)
        return o.to(q.dtype), state
    batch, flat, keep = flatten_heads(q, k, v, keep)
    flat = [x if _rows_contiguous(x) else x.contiguous() for x in flat]
    N = flat[0].shape[0]
    if keep is not None:
        keep = keep[..., 0].contiguous()  # (N, T) bytes for the compiled passes
    if S0 is None:
        S0, z0 = q.new_zeros(N, L, Dv, dtype=torch.float32), q.new_zeros(N, L, dtype=torch.float32)
    else:
        S0 = S0.to(torch.float32).reshape(N, L, Dv + 1)
        S0, z0 = S0[..., :-1].contiguous(), S0[..., -1].contiguous()
    out, S, z = _NativeLinearAttention.apply(
        *flat, S0, z0, keep, _KINDS[type(fmap)], float(eps), block, chunk, is_causal
    )
    state = torch.cat([S, z.unsqueeze(-1)], -1)
    return out.reshape(*batch, *out.shape[-2:]), state.reshape(*batch, L, Dv + 1)

