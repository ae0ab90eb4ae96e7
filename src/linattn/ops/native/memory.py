"""Memory of the compiled passes (part of :mod:`linattn.ops.native`): large outputs in recycled
buffers backed by huge pages (:func:`empty_hugepage`, :func:`empty_cache`) and each thread's
scratch buffer (:func:`scratch`)."""

from __future__ import annotations

import ctypes
import math
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
_MADV_HUGEPAGE, _HUGE = 14, 1 << 21


class _Recycler:
    """Large outputs of the compiled passes, recycled instead of allocated afresh on every call.

    A fresh (8, 65536, 64) float32 output is 128 MiB of untouched memory: its first touch costs
    32768 page faults (~50 ms), and 2 MiB pages, which make that 64 faults, are cheap only where
    the machine has them ready. On a virtual machine that hands freed 2 MiB blocks back to its
    host (free page reporting), every huge page is faulted in again from the host: on this
    project's EPYC VM a fresh ``torch.ones(8, 65536, 64)`` took 49.6 ms against 6.1 ms to fill
    a kept one (docs/bench-ops.md). A training loop frees the last step's outputs before the
    next step asks for the same sizes, so outputs here are views of buffers (uint8 tensors,
    advised onto 2 MiB pages) that the pool keeps after the outputs are freed. A buffer is
    handed out again only when no other tensor uses its storage (the storage's own count of
    owners, not Python's reference counts, which frames held by a traceback or a tracer would
    change). The pool holds at most
    :attr:`keep_bytes` of buffers, in use or not, the oldest let go first: one still in use then
    lives on in its tensors and is freed with them. :func:`empty_cache` lets the free ones go.

    An output is otherwise a tensor like any other: ``resize_`` grows it (its storage moves to
    new memory), ``untyped_storage().resize_(0)`` frees it, ``share_memory_`` moves it to shared
    memory that another process may go on reading. The pool lets go of a buffer whose storage
    was so changed (:func:`_intact`) instead of handing it out again. (A tensor in shared
    memory cannot be resized: torch 2.13 itself crashes there, outputs or not.)
    """

    MIN_BYTES = 16 << 20  # smaller outputs fault in quickly and are not worth holding

    def __init__(self) -> None:
        self._bufs: list[Tensor] = []  # oldest first
        self._lock = threading.Lock()
        self.keep_bytes = min(2 << 30, _mem_total() // 16)

    def take(self, nbytes: int) -> Tensor:
        with self._lock:
            self._bufs = [b for b in self._bufs if _intact(b)]
            for i, buf in enumerate(self._bufs):
                if buf.numel() == nbytes and _owners(buf) <= _FREE_OWNERS:
                    del self._bufs[i]  # by position: == on tensors compares their elements
                    self._bufs.append(buf)  # most recently used last
                    return buf
            held = sum(b.numel() for b in self._bufs)
            while self._bufs and held + nbytes > self.keep_bytes:
                held -= self._bufs.pop(0).numel()
            buf = torch.empty(nbytes, dtype=torch.uint8)
            _advise_huge_pages(buf)
            if nbytes <= self.keep_bytes:
                self._bufs.append(buf)
            return buf

    def empty_cache(self) -> None:
        with self._lock:
            self._bufs = [b for b in self._bufs if _intact(b) and _owners(b) > _FREE_OWNERS]


def _mem_total() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


_USE_COUNT = getattr(torch._C, "_storage_Use_Count", None)


def _owners(buf: Tensor) -> int:
    """How many owners buf's storage has (every tensor using it, and the storage object asked)."""
    return _USE_COUNT(buf.untyped_storage()._cdata)


def _intact(buf: Tensor) -> bool:
    """Whether buf's storage is still the pool's own: the size it was made with (the user did
    not resize an output's storage) and not moved to shared memory (``share_memory_``)."""
    return buf.untyped_storage().nbytes() == buf.numel() and not buf.is_shared()


# What _owners reports for a buffer the pool alone holds: more is a tensor still using it.
_FREE_OWNERS = _owners(torch.empty(1, dtype=torch.uint8)) if _USE_COUNT is not None else 0
_RECYCLER = _Recycler()


def _forget_lock_after_fork() -> None:
    """A forked child (a DataLoader worker) may inherit the pool's lock held by another thread
    of its parent: give it a free one (the buffers it inherited are its own copies)."""
    _RECYCLER._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_lock_after_fork)


def _advise_huge_pages(buf: Tensor) -> None:
    """Ask for 2 MiB pages on the whole 2 MiB-aligned part of buf (advice only)."""
    if _LIBC is None:
        return
    start = (buf.data_ptr() + _HUGE - 1) & ~(_HUGE - 1)
    end = (buf.data_ptr() + buf.numel()) & ~(_HUGE - 1)
    if end > start:
        _LIBC.madvise(start, end - start, _MADV_HUGEPAGE)


def empty_hugepage(like: Tensor, *shape: int) -> Tensor:
    """An uninitialised tensor of ``like``'s dtype for a compiled pass's output: a view of a
    recycled buffer of :class:`_Recycler` when it is large (a recycled one has its pages
    already), else an ordinary allocation."""
    nbytes = math.prod(shape) * like.element_size()
    if nbytes < _Recycler.MIN_BYTES or like.device.type != "cpu" or _USE_COUNT is None:
        return like.new_empty(*shape)
    return _RECYCLER.take(nbytes).view(like.dtype).view(*shape)


_FLOAT32 = torch.empty(0)


class _RecycledCast(torch.autograd.Function):
    """x cast to ``dtype`` in a recycled buffer, its gradient cast back the same way."""

    @staticmethod
    def forward(ctx, x: Tensor, dtype: torch.dtype) -> Tensor:
        ctx.dtype = x.dtype
        return empty_hugepage(x.new_empty(0, dtype=dtype), *x.shape).copy_(x)

    @staticmethod
    def backward(ctx, g: Tensor) -> tuple[Tensor, None]:
        return empty_hugepage(g.new_empty(0, dtype=ctx.dtype), *g.shape).copy_(g), None


def recycled_cast(x: Tensor, dtype: torch.dtype) -> Tensor:
    """``x.to(dtype)``, differentiable, with the copy (and in the backward the gradient's copy
    back) in a recycled buffer where large: bfloat16 with gradients runs the float32 passes, and
    fresh memory for its casts (the inputs, the output, their gradients: ~1 GiB of 128 MiB
    tensors at T = 65,536) cost more than the passes themselves (EPYC Zen 4: 744 ms against
    340 ms in float32). Under torch.compile, a plain cast (the recycler reads storages)."""
    if x.dtype == dtype:
        return x
    if torch.compiler.is_compiling() or x.device.type != "cpu":
        return x.to(dtype)
    return _RecycledCast.apply(x, dtype)


def one_16_bit_dtype(*xs: Tensor | None) -> bool:
    """Whether the given tensors (None: not there) are all of one 16-bit dtype, bfloat16 or
    float16: the rows the recurrences' kernels read and write themselves, a chunk at a time."""
    dtypes = {x.dtype for x in xs if x is not None}
    return len(dtypes) == 1 and dtypes <= {torch.bfloat16, torch.float16}


def rows(x: Tensor, N: int) -> Tensor:
    """x (..., T, F) as (N, T, F) in its own dtype with a contiguous last dimension: a view
    where it has one (what a kernel reading 16-bit rows itself takes)."""
    x = x.reshape(N, *x.shape[-2:])
    return x if x.stride(-1) == 1 or x.shape[-1] <= 1 else x.contiguous()


def float32_rows(x: Tensor, N: int) -> Tensor:
    """x (..., T, F) as float32 (N, T, F) with a contiguous last dimension: a view where it is
    one already, else a contiguous float32 copy (a widened bfloat16 or float16 input), in a
    recycled buffer when large: fresh memory for a 16 MiB copy costs ~5 ms of page faults where
    the copy itself costs ~1 ms (EPYC Zen 4, one thread)."""
    x = x.reshape(N, *x.shape[-2:])
    if x.dtype == torch.float32 and (x.stride(-1) == 1 or x.shape[-1] <= 1):
        return x
    return empty_hugepage(_FLOAT32, *x.shape).copy_(x)


def float32_step_rows(x: Tensor, N: int) -> Tensor:
    """One decoding step's x (..., F) as float32 rows, contiguous (what the steps' kernels
    read): x itself when it is one already (the usual case, no reshape), else an (N, F) copy.
    Small: no recycled buffer."""
    if x.dtype == torch.float32 and x.is_contiguous():
        return x
    return x.reshape(N, x.shape[-1]).to(torch.float32).contiguous()


def empty_cache() -> None:
    """Release the free output buffers the compiled passes keep for reuse (see
    :class:`_Recycler`); buffers still referenced by a tensor are released when it is."""
    _RECYCLER.empty_cache()


_SCRATCH = threading.local()


_SIZES: dict[tuple, tuple[dict, int]] = {}


def work_size(fns: dict, name: str, *args: int) -> int:
    """``fns[name](*args)``: a scratch size in floats that a kernel set's build reports
    (``la_<kernel>_work``), asked once per arguments: a ctypes call is ~0.3 µs of a ~20 µs
    decoding step. Kept per build (the sizes depend on its vector width), which is held here
    so that its id is never another build's."""
    key = (id(fns), name, *args)
    held = _SIZES.get(key)
    if held is None:
        if len(_SIZES) > 1024:
            _SIZES.clear()
        held = _SIZES[key] = (fns, fns[name](*args))
    return held[1]


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
