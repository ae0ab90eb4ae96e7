r"""The compiled CPU gated RMSNorm (``la_norm_forward`` in ``kernels.c``).

:func:`linattn.ops.norm.rms_norm_gated` hands a call here, after its argument checks, when the
dispatcher chose this backend (:mod:`linattn.ops.dispatch`, op "rms_norm_gated", forms
"prefill" and "step"): a CPU call in float32, bfloat16 or float16 (x, gate, weight and output
read and written in their own dtypes by the kernel, sums in float32), no gradient wanted, an
ISA build that loads and (by default) the compiled path measured faster than torch's on this
machine. One pass per row for the sums of squares and one for the scaled, gated write
(torch's form makes about eight passes over the activations); blocks of rows run in parallel
on torch's threads once a call is large enough.

Inside PyTorch: ``linattn::rms_norm_gated`` (forward only) with a fake implementation, so that
``torch.compile`` and ``torch.export`` keep it in the graph; where no compiled library loads it
computes the same function with torch operations. Plain eager calls run the kernel directly.
"""

from __future__ import annotations

import math
from ctypes import c_long

from torch import Tensor

from linattn.ops._library import KernelOp
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
from linattn.ops.norm.portable import torch_norm

__all__ = ["rms_norm_native", "one_thread", "kernels", "unavailable", "kernels_here", "norm_into",
           "PARALLEL_MIN"]

#: A call splits across threads from this many elements (rows · D): ~1 ns each (a few
#: operations and 4-6 bytes of memory traffic); below ~65 µs a helper costs more than it saves.
PARALLEL_MIN = 1 << 16


def _work_size(lib) -> dict:
    lib.la_norm_work.restype, lib.la_norm_work.argtypes = c_long, [c_long]
    return {"work": lib.la_norm_work}


_KERNELS = KernelSet("la_norm_abi", extra=_work_size)


def kernels(isa: str = "native") -> dict | None:
    """The norm kernel of one ISA build (name -> a function taking its struct's fields by
    keyword; "work": the scratch size in floats for rows of D), or None where that build cannot
    be had."""
    return _KERNELS.get(isa)


def unavailable(isa: str = "native") -> str | None:
    """Why :func:`kernels` gives None for ``isa``, or None if it loads."""
    return _KERNELS.unavailable(isa)


def kernels_here(isa: str) -> dict | None:
    """The kernels of ``isa``, else of the native build, else None."""
    return build_or_native(kernels, isa)


def _rows(t: Tensor, R: int, D: int) -> Tensor:
    """t (..., D) as (R, D) rows with contiguous channels: a view where it is one, else a copy."""
    if t.dim() == 2 and t.stride(1) == 1:
        return t
    try:
        r = t.view(R, D)
    except RuntimeError:
        r = t.reshape(R, D)
    return r if r.stride(1) == 1 or D == 1 else r.contiguous()


def norm_into(fns: dict, x: Tensor, g: Tensor | None, w: Tensor | None, y: Tensor, eps: float,
              sigmoid: bool, group_size: int, before: bool) -> int:
    """The kernel on x, g (R, D) with contiguous channels (g may be None), w (D,) contiguous or
    None, into y (R, D) contiguous; every tensor in a dtype the kernel reads. Blocks of rows in
    parallel on torch's threads when large enough; a decoding step's few rows are one call, its
    struct built from each attribute read once. Returns the kernel's code (0; -1 on sizes it
    does not take)."""
    R, D = x.shape
    fn = fns["norm_forward"]
    codes = DTYPE_CODES
    xr, yr = x.stride(0), y.stride(0)
    gr, gdt = (0, 0) if g is None else (g.stride(0), codes[g.dtype])
    wp, wdt = (None, 0) if w is None else (w.data_ptr(), codes[w.dtype])
    xdt, ydt = codes[x.dtype], codes[y.dtype]
    act, bef = 1 if sigmoid else 0, 1 if before else 0
    work = scratch(fns["work"](D)).data_ptr()
    threads = threads_for(R * D, R, PARALLEL_MIN)
    if threads <= 1:
        return fn(x=x.data_ptr(), xr=xr, xdt=xdt,
                  g=None if g is None else g.data_ptr(), gr=gr, gdt=gdt,
                  y=y.data_ptr(), yr=yr, ydt=ydt, w=wp, wdt=wdt, R=R, D=D,
                  G=group_size, eps=eps, act=act, before=bef, work=work)
    xe, ye = x.element_size(), y.element_size()
    ge = 0 if g is None else g.element_size()
    xp, yp = x.data_ptr(), y.data_ptr()
    gp = None if g is None else g.data_ptr()
    codes_seen: list[int] = []

    def part(r0: int, r1: int) -> None:
        codes_seen.append(fn(
            x=xp + xe * r0 * xr, xr=xr, xdt=xdt, g=None if gp is None else gp + ge * r0 * gr,
            gr=gr, gdt=gdt, y=yp + ye * r0 * yr, yr=yr, ydt=ydt, w=wp, wdt=wdt, R=r1 - r0, D=D,
            G=group_size, eps=eps, act=act, before=bef,
            work=scratch(fns["work"](D)).data_ptr()))

    parts = min(R, 4 * threads)
    cuts = [R * i // parts for i in range(parts + 1)]
    run_jobs(part, [(cuts[i], cuts[i + 1]) for i in range(parts) if cuts[i] < cuts[i + 1]],
             threads)
    return next((c for c in codes_seen if c), 0)


def _norm(x: Tensor, gate: Tensor | None, weight: Tensor | None, eps: float, sigmoid: bool,
          group_size: int, norm_before_gate: bool, isa: str) -> Tensor:
    """``linattn::rms_norm_gated``: x (..., D) float32, bfloat16 or float16, gate (..., D) or
    None, weight (D,) or None. Returns y (..., D) in x's dtype, contiguous."""
    fns = kernels_here(isa)
    if fns is None:
        return torch_norm(x, gate, weight, eps, sigmoid, group_size, norm_before_gate)
    D = x.shape[-1]
    R = math.prod(x.shape[:-1])
    xr = _rows(x, R, D)
    gr = None if gate is None else _rows(in_kernel_dtype(gate), R, D)
    w = in_kernel_dtype(weight)
    if w is not None and not w.is_contiguous():
        w = w.contiguous()
    y = empty_hugepage(x, R, D)
    check_rc(norm_into(fns, xr, gr, w, y, eps, sigmoid, group_size, norm_before_gate),
             "la_norm_forward")
    return y.view(x.shape)


def _norm_fake(x, gate, weight, eps, sigmoid, group_size, norm_before_gate, isa):
    return x.new_empty(x.shape)


def _small(x: Tensor, *_) -> bool:
    return threads_for(x.numel(), 2, PARALLEL_MIN) == 1


rms_norm_native = KernelOp("rms_norm_gated", _norm, _norm_fake, small=_small)
#: The op's small-call rule for a whole call (its entry's own torch work too): see KernelOp.
one_thread = rms_norm_native.one_thread
