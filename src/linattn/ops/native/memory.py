"""Memory of the compiled passes (part of :mod:`linattn.ops.native`): fresh outputs backed by
huge pages (:func:`empty_hugepage`) and each thread's scratch buffer (:func:`scratch`)."""

from __future__ import annotations

import ctypes
import sys
import threading

import torch
from torch import Tensor


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _libc() if sys.platform == "linux" else None
_MADV_HUGEPAGE, _HUGE = 14, 1 << 21


def empty_hugepage(like: Tensor, *shape: int) -> Tensor:
    """An uninitialised float32 tensor whose pages the kernel backs with 2 MiB pages.

    A fresh (8, 65536, 64) output is 128 MiB of untouched memory: filling it costs 32768 page
    faults, ~50 ms here, a third of the whole forward. With transparent huge pages in
    "madvise" mode (common), MADV_HUGEPAGE makes that 64 faults. Advice only: where it is not
    available nothing changes."""
    t = like.new_empty(*shape)
    nbytes = t.numel() * t.element_size()
    if _LIBC is not None and nbytes >= 4 * _HUGE:
        start = (t.data_ptr() + _HUGE - 1) & ~(_HUGE - 1)
        end = (t.data_ptr() + nbytes) & ~(_HUGE - 1)
        _LIBC.madvise(start, end - start, _MADV_HUGEPAGE)
    return t


_SCRATCH = threading.local()


def scratch(floats: int) -> Tensor:
    """This thread's scratch buffer for one kernel call, at least ``floats`` float32 long (grown
    when a call needs more, never shrunk). Asked by size, not by the call's shapes: a kernel's
    scratch depends on its build's vector width too, and the calibration runs an AVX2 and an
    AVX-512 build in one thread (a buffer cached per head dimension alone was sized by one and
    overrun by the other: heap corruption). One call at a time per thread uses it."""
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or buf.numel() < floats:
        buf = _SCRATCH.buf = torch.empty(max(floats, 1), dtype=torch.float32)
    return buf
