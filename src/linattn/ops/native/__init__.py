"""The compiled CPU library of linattn: every op's C kernels, built per ISA and loaded with ctypes.

The package ships C sources, not binaries: :func:`load` builds them on first use
(:mod:`linattn._cbuild`: cached per source, flags and CPU, verified before loading, one build at a
time) for the CPU at hand (``-march=native``) or for another ISA variant (``LINATTN_NATIVE_ISA``
or ``isa=``: ``avx512``, ``avx2``, ``generic``, ``scalar``). Without a C compiler, or with
``LINATTN_NATIVE=0``, :func:`load` returns None and the torch paths run instead.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from torch import Tensor

from linattn import _cbuild
from linattn._io import write_atomic
from linattn.ops import dispatch

SOURCE = Path(__file__).with_name("_native.c")


_lib: ctypes.CDLL | None = None


_tried = False


_P, _L, _F, _I = ctypes.c_void_p, ctypes.c_long, ctypes.c_float, ctypes.c_int


#: name: (return type, argument types) of each function of _native.c; the one-pass kernels
#: return 0, or -1 on sizes they do not take.
_SIGNATURES = {
    "la_phi": (None, [_I, _P, _I, _L, _L, _L, _L, _P, _I, _L, _P, _P, _L]),
    "la_normalise": (None, [_P, _I, _P, _I, _P, _L, _P, _L, _L, _L, _L, _L, _F, _P, _I, _L]),
    "la_norm_grad": (None, [_P, _L, _P, _P, _L, _P, _P, _L, _L, _L, _L, _L, _L, _F, _P, _P]),
    "la_grad_phi": (None, [_I, _P, _P, _L, _P, _P, _P, _L, _L, _L, _L, _L, _P, _L, _P, _L]),
    "la_mask_rowsum": (None, [_P, _I, _L, _L, _P]),
    "la_mask_add": (None, [_P, _L, _L, _P]),
    "la_prefix": (None, [_P, _L, _L, _L, _P, _P, _I]),
    "la_causal_forward": (_I, [_I, _I, _P, _L, _P, _L, _P, _L, _L, _L, _L, _L, _L, _F, _P, _P,
                               _P, _L, _P]),
    "la_noncausal_forward": (_I, [_I, _I, _P, _L, _P, _L, _P, _L, _L, _L, _L, _L, _L, _L, _F,
                                  _P, _P, _P, _L, _P]),
    "la_noncausal_backward": (_I, [_I, _I, _P, _L, _P, _L, _P, _L, _P, _L, _P, _L, _L, _L, _L,
                                   _L, _L, _L, _F, _P, _P, _P, _P, _P, _L, _P, _L, _P, _L, _P]),
    "la_causal_backward": (_I, [_I, _P, _L, _P, _L, _P, _L, _P, _L, _P, _L, _L, _L, _L, _L, _L,
                                _F, _P, _P, _P, _P, _P, _L, _P, _L, _P, _L, _P]),
    "la_width": (_I, []),
    "la_tile": (_I, []),
}


#: Compiler flags of each build of _native.c. "native" (the default) targets the CPU at hand,
#: whose vector width and register tiles _native.c picks from the compiler's macros; the others
#: build a narrower ISA, to measure it on a wider CPU or to test the scalar form
#: (``LINATTN_NATIVE_ISA``, or ``isa=`` in :func:`load`).
ISA_FLAGS = {
    "native": ["-march=native"],
    "avx512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx2", "-mfma"],
    "avx2": ["-mavx2", "-mfma"],
    "generic": [],  # the compiler's baseline: SSE2 on x86-64, NEON on aarch64
    "scalar": ["-DLA_W=1"],
}


#: /proc/cpuinfo flags an ISA build needs to run (x86); a build this CPU cannot run is refused.
_ISA_NEEDS = {"avx512": {"avx512f", "avx512bw", "avx512vl", "avx512dq", "fma"},
              "avx2": {"avx2", "fma"}}


_libs: dict[str, ctypes.CDLL | None] = {}


def bf16_products() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AVX512-BF16 or AMX on x86, the BF16
    extension on aarch64), so that torch's bfloat16 matmuls beat float32 ones."""
    return bool({"avx512_bf16", "amx_bf16", "bf16"} & _cbuild.cpu_flags())


def selected_isa(isa: str | None = None) -> str:
    """``isa`` if given, else the build variant this process uses: ``LINATTN_NATIVE_ISA`` or
    "native"; checked against :data:`ISA_FLAGS`."""
    name = "isa"
    if isa is None:
        name, isa = "LINATTN_NATIVE_ISA", os.environ.get("LINATTN_NATIVE_ISA", "").strip()
        isa = isa or "native"
    if isa not in ISA_FLAGS:
        raise ValueError(f"{name}: expected one of {', '.join(ISA_FLAGS)}, got {isa!r}")
    return isa


def load(isa: str | None = None) -> ctypes.CDLL | None:
    """The compiled kernels of one build variant (default :func:`selected_isa`), built on first
    use, or None where that is not possible (no compiler, ``LINATTN_NATIVE=0``, an ISA this
    CPU lacks)."""
    isa = selected_isa(isa)
    if isa not in _libs:
        _libs[isa] = _load(isa)
    return _libs[isa]


def _load(isa: str) -> ctypes.CDLL | None:
    if dispatch.native_setting() == "0":
        return None
    need = _ISA_NEEDS.get(isa, set())
    if need and not need <= _cbuild.cpu_flags():
        warnings.warn(f"linattn: this CPU cannot run the {isa} build of the compiled path "
                      f"(needs {', '.join(sorted(need))}); using the PyTorch path",
                      RuntimeWarning, stacklevel=3)
        return None
    base = ["-O3", "-fno-math-errno"]
    tries = [base + ISA_FLAGS[isa]]
    if isa == "native":
        tries.append(["-O3"])  # a compiler without -march=native
    for flags in tries:  # warn (once) only when the last try fails too
        lib = _cbuild.load_library(SOURCE, "native", flags, warn=flags is tries[-1])
        if lib is not None:
            for name, (restype, argtypes) in _SIGNATURES.items():
                fn = getattr(lib, name)
                fn.restype, fn.argtypes = restype, argtypes
            return lib
    return None


def unavailable_reason(isa: str | None = None) -> str | None:
    """Why :func:`load` gives None (for skip messages and warnings), or None if it loads."""
    if load(isa) is not None:
        return None
    isa = selected_isa(isa)
    if dispatch.native_setting() == "0":
        return "turned off by LINATTN_NATIVE=0"
    if not SOURCE.exists():
        return f"the C source {SOURCE.name} is not installed beside {__name__}"
    if _ISA_NEEDS.get(isa, set()) - _cbuild.cpu_flags():
        return f"this CPU cannot run the {isa} build"
    if _cbuild.compiler() is None:
        return "no C compiler found (cc, gcc, clang or $CC)"
    return f"the compiler refused {SOURCE.name} (its output is in a .failed file in the cache)"


def describe(isa: str | None = None) -> str:
    """One line on the build in use: ISA, vector width, register tile (or why there is none)."""
    lib = load(isa)
    name = selected_isa(isa)
    if lib is None:
        return f"{name}: not available ({unavailable_reason(isa)})"
    tile = lib.la_tile()
    return f"{name}: {lib.la_width()}-float vectors, {tile // 100}x{tile % 100} register tile"


def _check(rc: int, name: str) -> None:
    """The one-pass kernels return -1 on sizes they do not take: a bug here, never silence (an
    ``assert`` would vanish under ``python -O``)."""
    if rc != 0:
        raise RuntimeError(f"linattn native path: {name} refused its sizes (rc={rc})")


def cached_measurement(path: Path, entry: str, threads: int, measure, valid) -> dict:
    """``measure()`` run with ``threads`` torch threads in a fresh thread, or its earlier
    result: the JSON file ``path`` (beside the compiled library) keeps one result per
    ``entry``; a missing, unreadable or not ``valid`` one is measured again and written back
    atomically (an unwritable cache only means measuring again in the next process)."""
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = {}
    result = cached.get(entry) if isinstance(cached, dict) else None
    if not valid(result):
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            result = _in_clean_thread(measure)
        finally:
            torch.set_num_threads(before)
        try:
            write_atomic(path, json.dumps({**cached, entry: result}, indent=1).encode())
        except OSError:
            pass
    return result


def _in_clean_thread(fn):
    """fn() in a new thread, whose autograd state (grad mode, inference mode, autocast,
    saved-tensor hooks, a checkpoint being recorded) and dispatch policy are the defaults, not
    those of the user's call that happened to trigger the measurement."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    worker = threading.Thread(target=run, name="linattn-calibration")
    worker.start()
    worker.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


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


_POOL: ThreadPoolExecutor | None = None


_POOL_LOCK = threading.Lock()


def _forget_pool() -> None:
    """A forked child inherits the pool object but not its threads (and maybe a lock held by
    one of them): start new ones there."""
    global _POOL, _POOL_LOCK
    _POOL, _POOL_LOCK = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def pool(workers: int) -> ThreadPoolExecutor:
    """The one thread pool of the compiled passes, with at least ``workers`` threads: a larger
    pool replaces a smaller one; none is shut down under a caller."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL._max_workers < workers:
            _POOL = ThreadPoolExecutor(max(workers, os.cpu_count() or 1),
                                       thread_name_prefix="linattn")
        return _POOL

