"""Memory of the compiled passes (part of :mod:`linattn.ops.native`): large outputs in recycled
buffers backed by huge pages (:func:`empty_hugepage`, :func:`empty_cache`) and each thread's
scratch buffer (:func:`scratch`)."""

from __future__ import annotations

import ctypes
import math
import mmap
import os
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
_MADV_HUGEPAGE = 14


class _Recycler:
    """Large outputs of the compiled passes, recycled instead of mapped afresh on every call.

    A fresh (8, 65536, 64) float32 output is 128 MiB of untouched memory: its first touch costs
    32768 page faults (~50 ms), and 2 MiB pages, which make that 64 faults, are cheap only where
    the machine has them ready. On a virtual machine that hands freed 2 MiB blocks back to its
    host (free page reporting), every huge page is faulted in again from the host: measured
    on this project's EPYC VM, a B1 H8 T65536 forward + backward took 0.4-4.5 s from call to
    call. A training loop frees the last step's outputs before the next step asks for the same
    sizes, so outputs here live in buffers that stay mapped (and advised onto 2 MiB pages) after
    the tensors made from them are freed; a buffer is handed out again once nothing refers to
    it (its reference count is back to the pool's own). Free buffers are kept up to
    :attr:`keep_bytes` in all, the oldest dropped first; :func:`empty_cache` drops them all.
    """

    MIN_BYTES = 16 << 20  # smaller outputs fault in quickly and are not worth holding

    def __init__(self) -> None:
        self._bufs: list[mmap.mmap] = []
        self._lock = threading.Lock()
        self.keep_bytes = min(2 << 30, _mem_total() // 16)

    def take(self, nbytes: int) -> mmap.mmap:
        with self._lock:
            free = [b for b in self._bufs if _refs(b) <= _FREE_REFS]
            for buf in free:
                if len(buf) == nbytes:
                    self._bufs.remove(buf)
                    self._bufs.append(buf)  # most recently used last
                    return buf
            spare = sum(len(b) for b in free)
            for buf in free:  # oldest first: make room under the cap for a new one
                if spare + nbytes <= self.keep_bytes:
                    break
                self._bufs.remove(buf)
                spare -= len(buf)
            try:
                buf = mmap.mmap(-1, nbytes)
            except OSError as err:  # as torch's allocator would: an allocation that failed
                raise MemoryError(f"cannot allocate {nbytes} bytes for an output: {err}") from None
            if _LIBC is not None:
                address = ctypes.addressof(ctypes.c_char.from_buffer(buf))
                _LIBC.madvise(address, nbytes, _MADV_HUGEPAGE)
            self._bufs.append(buf)
            return buf

    def empty_cache(self) -> None:
        with self._lock:
            self._bufs = [b for b in self._bufs if _refs(b) > _FREE_REFS]


def _mem_total() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def _refs(buf: mmap.mmap) -> int:
    return sys.getrefcount(buf)


# What _refs reports for a buffer held by a list only, asked from a comprehension over that list
# (as the recycler asks): anything above it is a tensor still using the buffer.
_FREE_REFS = [_refs(b) for b in [mmap.mmap(-1, 4096)]][0]
_RECYCLER = _Recycler()


def empty_hugepage(like: Tensor, *shape: int) -> Tensor:
    """An uninitialised tensor of ``like``'s dtype for a compiled pass's output: from the
    recycled buffers of :class:`_Recycler` when it is large (a recycled one has its pages
    already), else an ordinary allocation."""
    nbytes = math.prod(shape) * like.element_size()
    if nbytes < _Recycler.MIN_BYTES or like.device.type != "cpu":
        return like.new_empty(*shape)
    buf = _RECYCLER.take(nbytes)
    return torch.frombuffer(buf, dtype=like.dtype).view(*shape)


_FLOAT32 = torch.empty(0)


def float32_rows(x: Tensor, N: int) -> Tensor:
    """x (..., T, F) as float32 (N, T, F) with a contiguous last dimension: a view where it is
    one already, else a contiguous float32 copy (a widened bfloat16 or float16 input), in a
    recycled buffer when large: fresh memory for a 16 MiB copy costs ~5 ms of page faults where
    the copy itself costs ~1 ms (EPYC Zen 4, one thread)."""
    x = x.reshape(N, *x.shape[-2:])
    if x.dtype == torch.float32 and (x.stride(-1) == 1 or x.shape[-1] <= 1):
        return x
    return empty_hugepage(_FLOAT32, *x.shape).copy_(x)


def empty_cache() -> None:
    """Release the free output buffers the compiled passes keep for reuse (see
    :class:`_Recycler`); buffers still referenced by a tensor are released when it is."""
    _RECYCLER.empty_cache()


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
