"""The compiled CPU library of linattn: every op's C kernels, built per ISA and loaded with ctypes.

The package ships C sources, not binaries. Each op with compiled kernels keeps them beside it
(``ops/<op>/kernels.c``, which may include parts beside it: ``kernels_<part>.c``); they share the
vector helpers and the argument-struct macros of ``ops/native/common.h``. :func:`load` joins
``native.c`` and every ``ops/*/kernels.c`` (its parts written in) into one translation unit and
builds it on first use (:mod:`linattn._cbuild`: cached per source, flags and CPU, test-loaded in a
child interpreter before its first use, one build at a time) for the CPU at hand
(``-march=native``) or for another ISA variant (``avx512``, ``avx2``, ``generic``, ``scalar``). Ops
bind their kernels with :class:`KernelSet` (:func:`linattn.ops.native.abi.bind` builds each
argument struct's ctypes mirror from the library's own layout table).

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

The package is split by concern: :mod:`~linattn.ops.native.build` (the sources, the ISA
builds, loading, the kernel sets), :mod:`~linattn.ops.native.threads` (the pool, the thread
policy, torch's thread count around small calls) and :mod:`~linattn.ops.native.memory`
(huge-page outputs, scratch buffers). Every public name is importable from here; the state
each part keeps (the loaded libraries, the back-off after a late helper) lives in its part.
"""

from __future__ import annotations

from linattn.ops.native.build import (
    DTYPE_CODES,
    HEADER,
    ISA_FLAGS,
    SOURCES,
    KernelSet,
    _check_code,
    amx_tiles,
    bf16_products,
    build_or_native,
    can_run,
    check_rc,
    describe,
    flag_sets,
    in_kernel_dtype,
    load,
    required_symbols,
    runnable_isas,
    source,
    unavailable_reason,
)
from linattn.ops.native.memory import (
    empty_cache,
    empty_hugepage,
    float32_rows,
    float32_step_rows,
    one_16_bit_dtype,
    recycled_cast,
    rows,
    scratch,
    work_size,
)
from linattn.ops.native.threads import (
    BACKOFF_S,
    BACKOFF_WORK,
    NATIVE_PARALLEL_MIN,
    PARALLEL_MIN,
    _find_omp_setter,
    head_jobs,
    is_small,
    native_threads,
    note_late,
    note_on_time,
    pool,
    run_jobs,
    run_parts,
    split_done,
    threads_for,
    torch_on_one_thread,
    torch_threads,
    torch_threads_in_this_thread,
)

__all__ = ["ISA_FLAGS", "SOURCES", "load", "source", "required_symbols", "unavailable_reason",
           "describe", "runnable_isas", "bf16_products", "amx_tiles", "empty_cache",
           "empty_hugepage", "float32_rows", "recycled_cast", "pool", "check_rc", "work_size",
           "NATIVE_PARALLEL_MIN", "native_threads", "note_late", "note_on_time", "split_done",
           "rows", "float32_step_rows", "one_16_bit_dtype",
           "KernelSet", "PARALLEL_MIN", "threads_for", "run_parts", "torch_on_one_thread",
           "torch_threads", "torch_threads_in_this_thread", "scratch", "is_small", "head_jobs",
           "run_jobs", "DTYPE_CODES", "HEADER", "can_run", "flag_sets", "build_or_native",
           "in_kernel_dtype", "BACKOFF_S", "BACKOFF_WORK", "_check_code", "_find_omp_setter"]
