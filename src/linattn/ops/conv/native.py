r"""The compiled CPU short causal convolution (``la_conv_forward``, ``la_conv_step`` in
``kernels.c``).

:func:`linattn.ops.conv.causal_conv1d` and :func:`~linattn.ops.conv.causal_conv1d_step` hand a
call here, after their argument checks, when the dispatcher chose this backend
(:mod:`linattn.ops.dispatch`, op "causal_conv1d", forms "prefill" and "step"): a CPU call in
float32, bfloat16 or float16 (read and written in that dtype by the kernels themselves, sums in
float32), no gradient wanted, an ISA build that loads and (by default) the compiled path measured
faster than the torch one on this machine.

The prefill reads x (B, T, D) with its own batch and token strides (a (B, D, T) tensor
transposed, as the layers of Qwen3-Next or Mamba2 hold it, goes in without a copy), writes a
fresh y (B, T, D) — most of the cost: its pages are asked for as huge pages — and the final
states; channel blocks (and rows or sequences) run in parallel on torch's threads once a call
is large enough (:func:`linattn.ops.native.threads_for`). The step updates the state and
returns the output in one call, on the calling thread.

Inside PyTorch: ``linattn::conv_forward`` and ``linattn::conv_step`` (forward only), with fake
implementations, so that ``torch.compile`` and ``torch.export`` keep them in the graph; where no
compiled library loads they compute the same function with torch operations. Plain eager calls
run the kernels directly.
"""

from __future__ import annotations

from ctypes import c_long

import torch
from torch import Tensor

from linattn.ops._library import KernelOp
from linattn.ops.conv.portable import torch_prefill, torch_step
from linattn.ops.native import (
    DTYPE_CODES,
    KernelSet,
    build_or_native,
    check_rc,
    empty_hugepage,
    in_kernel_dtype,
    run_jobs,
    scratch,
    threads_for,
)

__all__ = ["conv_prefill_native", "one_thread", "conv_step_native", "kernels", "unavailable",
           "kernels_here", "step_into", "PARALLEL_MIN"]

#: A pass splits across threads from this many elements (B·T·D), through the library's thread
#: policy: one element is a few multiply-adds and ~6 bytes of memory traffic, ~1 ns; below
#: ~65 µs of work the hand-over to a helper thread costs more than it saves.
PARALLEL_MIN = 1 << 16
#: Channels per part when a pass is split (whole cache lines of every dtype).
_BLOCK = 64


# --------------------------------------------------------------------------- the C boundary


def _work_size(lib) -> dict:
    lib.la_conv_work.restype, lib.la_conv_work.argtypes = c_long, [c_long]
    return {"work": lib.la_conv_work}


_KERNELS = KernelSet("la_conv_abi", extra=_work_size)


def kernels(isa: str = "native") -> dict | None:
    """The convolution kernels of one ISA build (name -> a function taking its struct's fields
    by keyword; "work": the scratch size in floats for a width), or None where that build cannot
    be had."""
    return _KERNELS.get(isa)


def unavailable(isa: str = "native") -> str | None:
    """Why :func:`kernels` gives None for ``isa``, or None if it loads."""
    return _KERNELS.unavailable(isa)


def kernels_here(isa: str) -> dict | None:
    """The kernels of ``isa``, else of the native build, else None."""
    return build_or_native(kernels, isa)


# ------------------------------------------------------------------------------------ the calls
def _jobs(D: int, rows: int, threads: int) -> list[tuple[int, int, int, int]]:
    """(c0, c1, s0, s1) parts: channel blocks of whole :data:`_BLOCK` s, about four per
    thread, and with too few of them, groups of rows (sequences) too."""
    if threads <= 1:
        return [(0, D, 0, rows)]
    blocks = -(-D // _BLOCK)
    cparts = min(blocks, 4 * threads)
    cuts = [min(D, _BLOCK * (blocks * i // cparts)) for i in range(cparts + 1)]
    sparts = 1 if cparts >= 2 * threads else min(rows, -(-4 * threads // cparts))
    rcuts = [rows * i // sparts for i in range(sparts + 1)]
    return [(cuts[i], cuts[i + 1], rcuts[r], rcuts[r + 1])
            for r in range(sparts) for i in range(cparts)
            if cuts[i] < cuts[i + 1] and rcuts[r] < rcuts[r + 1]]


def _forward(fns: dict, x: Tensor, weight: Tensor, bias: Tensor | None, silu: bool,
             S0: Tensor | None, segs: Tensor | None, y: Tensor, S: Tensor) -> None:
    """The kernel over x (B, T, D) with contiguous channels into y (B, T, D) and the final
    states S (rows or segments, D, W − 1); in parts on torch's threads when large enough."""
    B, T, D = x.shape
    width = weight.shape[1]
    rows = B if segs is None else segs.shape[0]
    threads = threads_for(B * T * D, max(1, -(-D // _BLOCK)) * max(rows, 1), PARALLEL_MIN)
    fn = fns["conv_forward"]
    xe, ye = x.element_size(), y.element_size()
    xp, yp, wp, Sp = x.data_ptr(), y.data_ptr(), weight.data_ptr(), S.data_ptr()
    bp = None if bias is None else bias.data_ptr()
    s0p = None if S0 is None else S0.data_ptr()
    s0s = (0, 0, 0) if S0 is None else S0.stride()
    s0dt = 0 if S0 is None else DTYPE_CODES[S0.dtype]
    s0e = 4 if S0 is None else S0.element_size()
    Se = S.element_size()
    gp = None if segs is None else segs.data_ptr()
    work = fns["work"](width)

    def part(c0: int, c1: int, r0: int, r1: int) -> None:
        if segs is None:  # rows r0..r1: offset the row pointers
            xo, yo, s0o, sfo, sg, n = (xp + xe * r0 * x.stride(0), yp + ye * r0 * y.stride(0),
                                       None if s0p is None else s0p + s0e * r0 * s0s[0],
                                       Sp + Se * r0 * S.stride(0), None, r1 - r0)
            Bp = r1 - r0
        else:  # segments r0..r1 (absolute rows and states)
            xo, yo, s0o, sfo, sg, n, Bp = xp, yp, s0p, Sp, gp + 32 * r0, r1 - r0, B
        rc = fn(
            x=xo, xb=x.stride(0), xt=x.stride(1), xdt=DTYPE_CODES[x.dtype], y=yo,
            yb=y.stride(0), yt=y.stride(1), ydt=DTYPE_CODES[y.dtype], B=Bp, T=T, D=D,
            width=width, c0=c0, c1=c1, w=wp, wd=weight.stride(0), wj=weight.stride(1),
            wdt=DTYPE_CODES[weight.dtype], bias=bp, bs=0 if bias is None else bias.stride(0),
            bdt=0 if bias is None else DTYPE_CODES[bias.dtype], act=1 if silu else 0, seg=sg,
            nseg=n, s0=s0o, s0n=s0s[0], s0c=s0s[1], s0k=s0s[2], s0dt=s0dt, sf=sfo,
            sfn=S.stride(0), sfc=S.stride(1), sfk=S.stride(2), sfdt=DTYPE_CODES[S.dtype],
            work=scratch(work).data_ptr())
        check_rc(rc, "la_conv_forward")

    run_jobs(part, _jobs(D, rows, threads), threads)


def _prefill(x: Tensor, weight: Tensor, bias: Tensor | None, initial_state: Tensor | None,
             segs: Tensor | None, silu: bool, isa: str) -> tuple[Tensor, Tensor]:
    """``linattn::conv_forward``: x (B, T, D) float32, bfloat16 or float16 (any strides),
    weight (D, W), bias (D,) or None, initial_state (B, D, W − 1) or None (zeros), or with
    ``segs`` (N, 4) int64 rows (b, t0, t1, n) (token ranges of the rows, each one sequence
    from state n; :func:`linattn.ops.conv.op.segments`) (N, D, W − 1). Returns y (B, T, D) in
    x's dtype and the final states in x's dtype."""
    fns = kernels_here(isa)
    if fns is None:
        return torch_prefill(x, weight, bias, silu, initial_state, segs)
    B, T, D = x.shape
    width = weight.shape[1]
    if x.stride(2) != 1 and D > 1:
        x = x.contiguous()
    weight, bias = in_kernel_dtype(weight), in_kernel_dtype(bias)
    S0 = in_kernel_dtype(initial_state)
    if segs is not None and not segs.is_contiguous():
        segs = segs.contiguous()
    rows = B if segs is None else segs.shape[0]
    y = empty_hugepage(x, B, T, D)
    S = x.new_empty(rows, D, width - 1)
    _forward(fns, x, weight, bias, silu, S0, segs, y, S)
    return y, S


def _prefill_fake(x, weight, bias, initial_state, segs, silu, isa):
    B, T, D = x.shape
    rows = B if segs is None else segs.shape[0]
    return x.new_empty(B, T, D), x.new_empty(rows, D, weight.shape[1] - 1)


def _small(x: Tensor, *_) -> bool:
    """Whether a call stays on one thread (its torch operations too)."""
    return threads_for(x.numel(), x.shape[-1] // _BLOCK + 1, PARALLEL_MIN) == 1


def step_into(fns: dict, x: Tensor, state: Tensor, out: Tensor, y: Tensor, weight: Tensor,
              bias: Tensor | None, silu: bool) -> int:
    """One compiled step: x (B, D) with contiguous channels, state (B, D, S) read and ``out``
    (same shape, any strides; may be ``state``: the update in place) written, y (B, D)
    contiguous written; every tensor in a dtype the kernels read. Returns the kernel's code
    (0; -1 on sizes it does not take). A large batch runs in parts on threads; a model's
    decoding step (a few µs of kernel) is one call on this thread, its arguments read once."""
    B, D = x.shape
    width = weight.shape[1]
    xb, yb = x.stride(0), y.stride(0)
    sib, sic, sik = state.stride()
    sob, soc, sok = out.stride()
    wd, wj = weight.stride()
    codes = DTYPE_CODES
    xdt, ydt, sdt = codes[x.dtype], codes[y.dtype], codes[state.dtype]
    if bias is None:
        bp, bs, bdt = None, 0, 0
    else:
        bp, bs, bdt = bias.data_ptr(), bias.stride(0), codes[bias.dtype]
    xp, yp, sp, op = x.data_ptr(), y.data_ptr(), state.data_ptr(), out.data_ptr()
    args = dict(xb=xb, xdt=xdt, yb=yb, ydt=ydt, D=D, width=width, slen=state.shape[2],
                w=weight.data_ptr(), wd=wd, wj=wj, wdt=codes[weight.dtype], bias=bp, bs=bs,
                bdt=bdt, act=1 if silu else 0, sib=sib, sic=sic, sik=sik, sob=sob, soc=soc,
                sok=sok, sdt=sdt)
    fn = fns["conv_step"]
    threads = threads_for(B * D * width, B, PARALLEL_MIN)
    if threads <= 1:
        return fn(x=xp, y=yp, B=B, si=sp, so=op, **args)
    xe, ye, se = x.element_size(), y.element_size(), state.element_size()
    codes_seen: list[int] = []

    def part(b0: int, b1: int) -> None:
        codes_seen.append(fn(
            x=xp + xe * b0 * xb, y=yp + ye * b0 * yb, B=b1 - b0, si=sp + se * b0 * sib,
            so=op + se * b0 * sob, **args))

    cuts = [B * i // threads for i in range(threads + 1)]
    run_jobs(part, [(cuts[i], cuts[i + 1]) for i in range(threads) if cuts[i] < cuts[i + 1]],
             threads)
    return next((c for c in codes_seen if c), 0)


def _step(x: Tensor, state: Tensor, weight: Tensor, bias: Tensor | None, silu: bool,
          isa: str) -> tuple[Tensor, Tensor]:
    """``linattn::conv_step``: x (B, D) float32, bfloat16 or float16, state (B, D, S) with
    S ≥ W − 1 (not modified), weight (D, W), bias (D,) or None. Returns y (B, D) in x's dtype
    and the new state (state's dtype, contiguous)."""
    fns = kernels_here(isa)
    if fns is None or state.dtype not in DTYPE_CODES:
        return torch_step(x, state, weight, bias, silu)
    if x.stride(1) != 1 and x.shape[1] > 1:
        x = x.contiguous()
    weight, bias = in_kernel_dtype(weight), in_kernel_dtype(bias)
    y = torch.empty(x.shape, dtype=x.dtype)
    out = torch.empty(state.shape, dtype=state.dtype)
    check_rc(step_into(fns, x, state, out, y, weight, bias, silu), "la_conv_step")
    return y, out


def _step_fake(x, state, weight, bias, silu, isa):
    return x.new_empty(x.shape), state.new_empty(state.shape)


conv_prefill_native = KernelOp("conv_forward", _prefill, _prefill_fake, small=_small)
conv_step_native = KernelOp("conv_step", _step, _step_fake)
#: The op's small-call rule for a whole call (its entry's own torch work too): see KernelOp.
one_thread = conv_prefill_native.one_thread
