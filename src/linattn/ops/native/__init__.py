"""The compiled CPU library of linattn: every op's C kernels, built per ISA and loaded with ctypes.

The package ships C sources, not binaries. Each op with compiled kernels keeps them beside it
(``ops/<op>/kernels.c``); they share the vector helpers and the argument-struct macros of
``ops/native/common.h``. :func:`load` joins ``native.c`` and every ``ops/*/kernels.c`` into one
translation unit and builds it on first use (:mod:`linattn._cbuild`: cached per source, flags
and CPU, test-loaded in a child interpreter before its first use, one build at a time) for the
CPU at hand (``-march=native``) or for another ISA variant (``avx512``, ``avx2``, ``generic``,
``scalar``). Ops bind their kernels with :func:`linattn.ops.native.abi.bind`, which checks every
argument struct's layout against the C side first.

A library is used only if it has the library-wide entry points (:func:`required_symbols`:
``la_width``, ``la_tile`` and every op's layout table ``la_<op>_abi``); anything else (a
foreign file in the cache, a build that does not load) means "no compiled library", one
warning, and the torch paths. A native build falls back to the compiler's baseline flags only
where the compiler refused ``-march=native`` (or what it built did not load), never after a
hang or a full disk, which would fail the same way and only hide the cause.

Which build (if any) a call runs is decided by :mod:`linattn.ops.dispatch`, which owns
``LINATTN_NATIVE`` and ``LINATTN_NATIVE_ISA``; this module only builds and loads. Without a C
compiler, or where the build fails in any way, :func:`load` returns None (it never raises)
and the torch paths run instead.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import Tensor

from linattn import _cbuild
from linattn.ops.native.abi import Args, LayoutError, bind

__all__ = ["ISA_FLAGS", "SOURCES", "load", "source", "required_symbols", "unavailable_reason",
           "describe", "runnable_isas", "bf16_products", "empty_hugepage", "pool", "check_rc",
           "KernelSet", "PARALLEL_MIN", "threads_for", "run_parts", "torch_on_one_thread",
           "torch_threads", "torch_threads_in_this_thread", "scratch", "is_small", "head_jobs",
           "run_jobs", "DTYPE_CODES"]

_HERE = Path(__file__).parent
#: The shared header and the library-wide entry points; the op kernels are found beside their
#: ops (``ops/*/kernels.c``), so an op with new kernels needs no line here.
HEADER = _HERE / "common.h"
SOURCES: list[Path] = [_HERE / "native.c", *sorted(_HERE.parent.glob("*/kernels.c"))]

#: Compiler flags of each build. "native" (the default) targets the CPU at hand, whose vector
#: width and register tiles common.h picks from the compiler's macros; the others build a
#: narrower ISA, to run it where it is faster (the dispatcher's calibration may choose it per
#: form), to measure it on a wider CPU, or to test the scalar form.
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

#: The dtype code of a buffer for the kernels that read or write several dtypes (``LA_F32``,
#: ``LA_BF16``, ``LA_F16`` in common.h): what ``vload_dt`` / ``vstore_dt`` take.
DTYPE_CODES: dict[torch.dtype, int] = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}

_libs: dict[str, ctypes.CDLL | None] = {}
_reasons: dict[str, str] = {}  # isa -> why load(isa) gave None
_LOAD_LOCK = threading.Lock()


def source() -> bytes:
    """The one translation unit that is compiled: common.h, then native.c and each op's
    kernels.c, with ``#line`` markers so that compiler messages name the real files. (Each .c
    includes common.h under ``#ifndef LA_COMMON_H``, so the files also compile on their own.)"""
    parts = []
    for path in (HEADER, *SOURCES):
        parts.append(f'#line 1 "{path.parent.name}/{path.name}"\n{path.read_text()}\n')
    return "".join(parts).encode()


def required_symbols(src: bytes) -> tuple[str, ...]:
    """The entry points a library built from ``src`` must have: ``la_width``, ``la_tile`` and
    the layout table of each op (``LA_ABI_TABLE(la_<op>_abi, ...)`` in its kernels.c)."""
    tables = sorted(set(re.findall(rb"LA_ABI_TABLE\((la_\w+_abi)\b", src)))
    return ("la_width", "la_tile", *(t.decode() for t in tables))


def _check_code(symbols: tuple[str, ...]) -> str:
    """The test call of a fresh build (run in a child interpreter by :mod:`linattn._cbuild`):
    vector width and register tile are sane and each layout table answers."""
    tables = [s for s in symbols if s.endswith("_abi")]
    return (
        "for name in ('la_width', 'la_tile'):\n"
        "    getattr(lib, name).restype, getattr(lib, name).argtypes = ctypes.c_int, []\n"
        "if lib.la_width() < 1 or lib.la_tile() < 101:\n"
        "    raise SystemExit(f'la_width() = {lib.la_width()}, la_tile() = {lib.la_tile()}')\n"
        f"for name in {tables!r}:\n"
        "    fn = getattr(lib, name)\n"
        "    fn.restype, fn.argtypes = ctypes.c_void_p, [ctypes.c_long]\n"
        "    if not fn(0):\n"
        "        raise SystemExit(name + '(0) is NULL')\n"
    )


def _check_isa(isa: str) -> str:
    if isa not in ISA_FLAGS:
        raise ValueError(f"isa: expected one of {', '.join(ISA_FLAGS)}, got {isa!r}")
    return isa


def can_run(isa: str) -> bool:
    """Whether this CPU can run the ``isa`` build (x86 feature flags; other builds: yes)."""
    return _ISA_NEEDS.get(_check_isa(isa), set()) <= _cbuild.cpu_flags()


def runnable_isas() -> list[str]:
    """The builds worth calibrating against each other on this CPU: "native", and "avx2" too
    where native is wider (an AVX-512 CPU). On some AVX-512 CPUs (AMD Zen 4) the 256-bit build
    is as fast or faster; elsewhere native is the only sensible build."""
    out = ["native"]
    if "avx512f" in _cbuild.cpu_flags() and can_run("avx2"):
        out.append("avx2")
    return out


def load(isa: str = "native") -> ctypes.CDLL | None:
    """The compiled library of one build variant, built on first use, or None where that is not
    possible (no compiler, an ISA this CPU lacks, a refused build): remembered per process."""
    isa = _check_isa(isa)
    lib = _libs.get(isa, False)
    if lib is False:
        with _LOAD_LOCK:
            if isa not in _libs:
                try:
                    _libs[isa] = _load(isa)
                except Exception as e:  # unforeseen: the torch path, never an error in an op
                    _reasons[isa] = f"unexpected {type(e).__name__}: {e}"
                    _cbuild.warn_once(f"load:{isa}", f"linattn: could not load the {isa} build "
                                      f"of the compiled path ({_reasons[isa]}); using the "
                                      "PyTorch path.")
                    _libs[isa] = None
            lib = _libs[isa]
    return lib


def flag_sets(isa: str) -> list[list[str]]:
    """The compiler flags :func:`load` tries for ``isa``, in order."""
    tries = [["-O3", "-fno-math-errno", *ISA_FLAGS[_check_isa(isa)]]]
    if isa == "native":
        tries.append(["-O3"])  # a compiler that refuses -march=native
    return tries


def _load(isa: str) -> ctypes.CDLL | None:
    if not can_run(isa):
        _reasons[isa] = f"this CPU cannot run the {isa} build"
        warnings.warn(f"linattn: this CPU cannot run the {isa} build of the compiled path "
                      f"(needs {', '.join(sorted(_ISA_NEEDS[isa]))}); using the PyTorch path",
                      RuntimeWarning, stacklevel=4)
        return None
    try:
        src = source()
    except OSError as e:
        _reasons[isa] = f"the C sources cannot be read ({e})"
        _cbuild.warn_once("native-sources", f"linattn: {_reasons[isa]}; using the PyTorch path.")
        return None
    symbols = required_symbols(src)
    tries = flag_sets(isa)
    for flags in tries:
        try:
            lib = _cbuild.build_library(src, "native", flags, check=_check_code(symbols),
                                        symbols=symbols)
        except _cbuild.BuildError as err:
            if err.other_flags_may_help and flags is not tries[-1]:
                continue  # the compiler refused -march=native: its baseline, without a warning
            _reasons[isa] = err.reason
            _cbuild.warn_failure("native", err)  # once per process
            return None
        for name in ("la_width", "la_tile"):
            getattr(lib, name).restype, getattr(lib, name).argtypes = ctypes.c_int, []
        return lib
    return None


def unavailable_reason(isa: str = "native") -> str | None:
    """Why :func:`load` gives None (for skip messages and warnings), or None if it loads."""
    if load(isa) is not None:
        return None
    if isa in _reasons:
        return _reasons[isa]
    missing = [p.name for p in (HEADER, *SOURCES) if not p.exists()]
    if missing:
        return f"the C sources {', '.join(missing)} are not installed beside {__name__}"
    if not can_run(isa):
        return f"this CPU cannot run the {isa} build"
    if _cbuild.compiler() is None:
        return "no C compiler found (cc, gcc, clang or $CC)"
    return "the compiler refused the kernels (its output is in a .failed file in the cache)"


def describe(isa: str = "native") -> str:
    """One line on a build: ISA, vector width, register tile (or why there is none)."""
    lib = load(isa)
    if lib is None:
        return f"{isa}: not available ({unavailable_reason(isa)})"
    tile = lib.la_tile()
    return f"{isa}: {lib.la_width()}-float vectors, {tile // 100}x{tile % 100} register tile"


class KernelSet:
    """One op's kernels — its ``la_<name>_call`` entry points, each with its argument struct's
    mirror (``mirrors``: name -> :class:`~linattn.ops.native.abi.Args`), described by the C
    layout table ``table`` — bound per ISA build on first use, after the layout check.
    ``extra(lib)`` may add plain functions of the library (name -> typed ctypes function)."""

    def __init__(self, table: str, mirrors: dict[str, type[Args]],
                 extra: Callable[[ctypes.CDLL], dict] | None = None) -> None:
        self.table, self.mirrors, self.extra = table, mirrors, extra
        self._bound: dict[str, dict | None] = {}
        self._why: dict[str, str] = {}

    def get(self, isa: str = "native") -> dict | None:
        """The kernels of the ``isa`` build (name -> ctypes function), or None where that build
        cannot be had or its layouts do not match (:meth:`unavailable` says why)."""
        fns = self._bound.get(isa, False)
        if fns is False:
            lib = load(isa)
            fns = None
            if lib is not None:
                try:
                    fns = bind(lib, self.table, self.mirrors)
                    if self.extra is not None:
                        fns.update(self.extra(lib))
                except (LayoutError, AttributeError) as err:
                    fns = None
                    self._why[isa] = f"its argument structs do not match the C side ({err})"
            self._bound[isa] = fns
        return fns

    def unavailable(self, isa: str = "native") -> str | None:
        """Why :meth:`get` gives None for ``isa``, or None if it loads."""
        if self.get(isa) is not None:
            return None
        return self._why.get(isa) or unavailable_reason(isa)


def build_or_native(get: Callable[[str], dict | None], isa: str) -> dict | None:
    """``get(isa)``, else this machine's native build: a traced program names the build chosen
    where it was traced, which another CPU may lack. None where neither loads (the ops then
    compute the same function with torch operations)."""
    fns = get(isa)
    return fns if fns is not None or isa == "native" else get("native")


def check_rc(rc: int, name: str) -> None:
    """The kernels return -1 on sizes they do not take: a bug in the caller, never silence (an
    ``assert`` would vanish under ``python -O``)."""
    if rc != 0:
        raise RuntimeError(f"linattn native path: {name} refused its sizes (rc={rc})")


def bf16_products() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AVX512-BF16 or AMX on x86, the BF16
    extension on aarch64), so that torch's bfloat16 matmuls beat float32 ones."""
    return bool({"avx512_bf16", "amx_bf16", "bf16"} & _cbuild.cpu_flags())


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
    global _POOL, _POOL_LOCK, _LOAD_LOCK
    _POOL, _POOL_LOCK, _LOAD_LOCK = None, threading.Lock(), threading.Lock()


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


# ------------------------------------------------------------------------- the thread policy
#: The work (in the callers' unit: multiply-adds, about a nanosecond's worth each ten) below
#: which a compiled pass stays on the calling thread. Handing parts to the pool costs a wake-up
#: and a hand-back, 20-60 µs on a free core (benchmarks/threads.py); a part is worth a thread
#: from about 2^20 state-element updates (~0.1 ms of kernel). Each op may pass its own unit's
#: threshold to :func:`threads_for`; this is the default and the delta rule's.
PARALLEL_MIN = 1 << 20


#: After a helper thread was late (:func:`run_parts`), passes below ``BACKOFF_WORK`` times
#: their threshold stay on the calling thread for ``BACKOFF_S`` seconds: another process holds
#: the other core, and every hand-over would wait for the scheduler. The first call after that
#: tries threads again (one slow call a second at most).
BACKOFF_S = 1.0
BACKOFF_WORK = 64
_late_until = 0.0


def threads_for(work: int, parts: int, min_work: int = PARALLEL_MIN) -> int:
    """The one thread policy of the compiled passes: how many threads (the calling one
    included) a pass of ``work`` units that splits into at most ``parts`` independent parts
    should use. 1 below ``min_work`` (a decoding step, a short prefill: the hand-over would cost
    more than it saves), and 1 below ``BACKOFF_WORK · min_work`` for ``BACKOFF_S`` after a helper
    was late (another process on the other core); else at most torch's thread count, the parts,
    and one thread per ``min_work`` of work, so that no thread is woken for less than it
    costs."""
    n = torch_threads()
    if n <= 1 or parts <= 1 or work < min_work:
        return 1
    if work < BACKOFF_WORK * min_work and time.monotonic() < _late_until:
        return 1
    return max(1, min(n, parts, work // max(min_work, 1)))


# Torch's thread count is not one for the process. With its OpenMP backend (the wheels' on
# Linux, macOS and Windows), torch.set_num_threads(n) sets the calling thread's OpenMP count
# (omp_set_num_threads: a per-thread setting) and a default that every other thread copies
# once, at its first parallel operation or get_num_threads() call; get_num_threads() reads the
# calling thread's own count. Narrowing with torch.set_num_threads(1) under one process-wide
# counter ("the first narrows, the last restores") therefore went wrong three ways:
#   - with two calls overlapping in two threads, the last one out restored its own count,
#     not the first one's: that thread stayed on 1 thread for good (and the other was never
#     narrowed at all). Its next call keyed the calibration on 1 thread and measured again:
#     test_calibration_is_isolated_from_the_triggering_call, 1 run in 10 (its three threads
#     overlap, and checkpointing calls the op again in the backward);
#   - while a narrowing lasted, the default was 1: a thread starting then kept 1 for good
#     (the calibration thread's torch.set_num_threads did the same with its own count);
#   - torch_threads() read the counter and then the count without the lock: a narrowing
#     could begin in between.
# So the record is per thread (only its own thread writes it: no lock, no race), and the
# count is set with the OpenMP runtime's own omp_set_num_threads, which changes the calling
# thread's count only, never the default other threads start from. (Unlike
# torch.set_num_threads it leaves MKL's own count alone: what is narrowed here is torch's
# OpenMP loops, the state copies and joins around the kernels.)


class _ThreadCount(threading.local):
    """This thread's narrowing: :func:`torch_on_one_thread` calls in progress in it, and its
    count before the outermost of them (0 outside any)."""
    depth = 0
    saved = 0


_own = _ThreadCount()


@functools.cache
def _omp_set_num_threads() -> Callable[[int], None] | None:
    """``omp_set_num_threads`` of the OpenMP runtime that torch reads its count from (checked:
    torch.get_num_threads() must see what it sets), or None: not found, another runtime, or a
    torch without OpenMP. Looked up once (two first calls at once may both look: harmless)."""
    return _find_omp_setter()


def _find_omp_setter() -> Callable[[int], None] | None:
    # the process's global symbols (Linux, macOS), then the runtime torch ships beside itself
    # (dlopen of a library already loaded returns that one); another OpenMP runtime loaded
    # first (numpy's BLAS, say) fails the check and the next one is tried
    names: list[str | None] = [None] if os.name != "nt" else []
    names += sorted(str(p) for p in (Path(torch.__file__).parent / "lib").glob("*omp*"))
    for name in names:
        try:
            fn = ctypes.CDLL(name).omp_set_num_threads
            fn.restype = None  # (no argtypes: a Python int goes as a C int, 0.15 µs faster)
            if _torch_reads(fn):
                return fn
        except Exception:  # noqa: BLE001 - no setter only means no narrowing
            continue
    return None


def _torch_reads(fn: Callable[[int], None]) -> bool:
    """Whether torch.get_num_threads() returns what ``fn`` set, tried in a thread of its own
    (what it sets there ends with it)."""
    seen: list[bool] = []
    # torch._C's own function, not the torch attribute: the answer is cached for the process,
    # and a caller that replaced torch.get_num_threads (tests faking a core count do) when the
    # first narrowing came would otherwise turn narrowing off for good (seen in CI)
    count = torch._C.get_num_threads

    def probe():
        n = count()  # torch's own first setting of this thread, done now
        want = 2 if n == 1 else 1
        fn(want)
        seen.append(count() == want)

    t = threading.Thread(target=probe, name="linattn-omp-probe", daemon=True)
    t.start()
    t.join()
    return seen == [True]


def torch_threads() -> int:
    """Torch's thread count as the user set it for the calling thread: inside a
    :func:`torch_on_one_thread` call of this thread, the count it will restore, not its
    temporary 1 (narrowings in other threads never change this thread's count). What the
    thread policy, the dispatcher's memo and the calibration's cache key read."""
    # one thread-local read, no lock (this is on every decoding step): only this thread
    # writes its record
    return _own.saved or torch.get_num_threads()


@contextmanager
def torch_on_one_thread(small: bool) -> Iterator[None]:
    """Torch's own operations inside a small compiled call (zeroing or copying a state,
    joining the final state) on one thread, when ``small``. Torch splits every operation on
    more than 32,768 elements over its OpenMP threads; around a kernel of a fraction of a
    millisecond the hand-over costs more than the operation, and with the other core busy each
    one waits for a descheduled thread: a causal ``linear_attention`` at T = 64 took 29 ms on
    2 threads against 0.95 ms on 1 (benchmarks/threads.py). Only the calling thread's count is
    narrowed (torch's OpenMP count is per thread: see above), nested calls are counted (the
    outermost narrows and restores), and the default other threads start from is never
    touched. Where the OpenMP runtime cannot be reached, nothing is narrowed (slower, never
    wrong: torch.set_num_threads would change that default). Not for traced code (the caller
    checks)."""
    if not small:
        yield
        return
    own = _own
    setter = None
    if own.depth == 0:
        # also torch's first setting of this thread's count if it had none yet, which would
        # otherwise overwrite the 1 set below at the first parallel operation
        saved = torch.get_num_threads()
        if saved > 1:
            setter = _omp_set_num_threads()
        own.saved = saved  # recorded last: nothing above may leave a record without a call
    own.depth += 1
    try:
        if setter is not None:
            setter(1)
        yield
    finally:
        if setter is not None:
            setter(own.saved)
        own.depth -= 1
        if own.depth == 0:
            own.saved = 0


@contextmanager
def torch_threads_in_this_thread(n: int) -> Iterator[None]:
    """The calling thread's torch count set to ``n`` for a block, then restored: for a thread
    that works for another one (the calibration's), to run with that thread's count. Through
    the OpenMP runtime, so that threads starting meanwhile still copy the user's default;
    torch.set_num_threads where it cannot be reached (which sets that default too)."""
    before = torch.get_num_threads()  # and torch's first setting of this thread, done now
    if n == before:
        yield
        return
    setter = _omp_set_num_threads() or torch.set_num_threads
    setter(n)
    try:
        yield
    finally:
        setter(before)


def is_small(q: Tensor, v: Tensor, min_work: int = PARALLEL_MIN) -> bool:
    """Whether a pass over queries q (..., T, K) and values v (..., T, V) stays on one thread
    (:func:`threads_for` with the N·T·K·V state-element updates of a recurrence, the heads as
    its parts): what decides :func:`torch_on_one_thread` for the torch operations around the
    kernels too."""
    heads = q.numel() // max(q.shape[-1] * q.shape[-2], 1) if q.dim() >= 2 else 1
    return threads_for(q.numel() * v.shape[-1], heads, min_work) == 1


def head_jobs(N: int, V: int, threads: int, columns: bool = True, block: int = 16
              ) -> list[tuple[int, int, int, int]]:
    """(h0, h1, v0, v1) parts of a pass over N heads of V value columns for ``threads``
    threads: about four groups of heads per thread (taken one at a time, so that a thread
    slowed by another process does not hold the others up), or, with fewer heads than threads
    and ``columns`` (the kernel can split a head's columns), each head's columns in whole
    blocks of ``block`` (each part prepares q and k again, so no more parts than threads)."""
    if threads <= 1 or N == 0:
        return [(0, N, 0, V)]
    if N >= threads or not columns:
        parts = min(N, 4 * threads)
        bounds = [N * i // parts for i in range(parts + 1)]
        return [(bounds[i], bounds[i + 1], 0, V) for i in range(parts)]
    parts = min(threads // N, V // block)
    blocks = V // block
    cuts = [block * (blocks * i // parts) for i in range(parts + 1)]
    return [(h, h + 1, cuts[i], cuts[i + 1]) for h in range(N) for i in range(parts)]


def run_jobs(part: Callable, jobs: list, threads: int) -> None:
    """``part(*job)`` for every job: :func:`run_parts` for a part that needs no thread slot."""
    run_parts(lambda _slot, *job: part(*job), jobs, threads)


def run_parts(part: Callable, jobs: list, threads: int) -> None:
    """``part(slot, *job)`` for every job, on at most ``threads`` threads, the calling one
    included; ``slot`` (0 for the calling thread, 1, 2, ... for helpers) is the index of the
    thread running it, for per-thread scratch buffers. Threads take the next job when done with
    one (ctypes releases the GIL), so a thread slowed by another process on its core holds no
    one up; and a helper that has not started by the time the calling thread has run out of
    jobs is cancelled, not waited for: with the other core busy, waiting for a descheduled
    helper to wake only to find nothing left costs a scheduler time slice (milliseconds), so
    the call falls back to the calling thread alone. Every job runs even when one fails; the
    first error is raised after all have."""
    if len(jobs) <= 1 or threads <= 1:
        for job in jobs:
            part(0, *job)
        return
    todo, lock = iter(jobs), threading.Lock()
    errors: list[BaseException] = []

    def worker(slot: int) -> None:
        while True:
            with lock:
                job = next(todo, None)
            if job is None:
                return
            try:
                part(slot, *job)
            except BaseException as e:  # noqa: BLE001 -- re-raised below, after every job
                errors.append(e)

    global _late_until
    helpers = min(threads, len(jobs)) - 1
    workers = pool(helpers)  # the one pool of all compiled passes
    start = time.monotonic()
    futures = [workers.submit(worker, slot) for slot in range(1, helpers + 1)]
    worker(0)
    mine = time.monotonic() - start
    late = False
    for f in futures:
        if f.cancel():  # never started while this thread ran every job: late
            late = True
        else:  # started: it may hold a job, so wait for it
            f.result()
    # late too: waiting for the helpers took longer than this thread's own share
    if late or time.monotonic() - start > 2 * mine:
        _late_until = time.monotonic() + BACKOFF_S
    if errors:
        raise errors[0]
