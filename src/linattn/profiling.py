"""Measuring helpers shared by the benchmarks, ``linattn bench`` and the memory tests.

Peak memory is read from Linux's per-process counters: ``VmHWM`` (the peak resident set),
reset by writing ``5`` to ``/proc/self/clear_refs``. That counts every allocation that became
resident — torch's, BLAS's and OpenMP's — unlike allocator statistics, and unlike
``ru_maxrss`` it can be reset, so one process can measure several calls in turn.
"""

from __future__ import annotations

import ctypes
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from linattn._io import read_json, user_cache_dir, write_json
from linattn._native_env import _cpu_lines, cpu_flags, cpu_tag

__all__ = ["median_time", "PeakMemory", "matmul_gflops", "core_peak", "peak_kind", "PEAK_KINDS",
           "cpu_model", "cpu_flags", "cpu_description"]

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_kib(field: str) -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


class PeakMemory:
    """Context manager: ``with PeakMemory() as m: f()`` then ``m.extra_bytes`` is how far the
    resident set rose above its level at entry (None where the counters are unavailable)."""

    def __enter__(self) -> PeakMemory:
        self.extra_bytes: int | None = None
        try:
            _CLEAR_REFS.write_text("5")
            self._start = _status_kib("VmRSS")
        except OSError:
            self._start = None
        return self

    def __exit__(self, *exc) -> None:
        peak = _status_kib("VmHWM")
        if self._start is not None and peak is not None:
            self.extra_bytes = max(0, peak - self._start) * 1024


def median_time(fn: Callable[[], object], repeats: int = 3, warmup: int = 1) -> float:
    """Median wall time of ``fn()`` in seconds over ``repeats`` calls after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def matmul_gflops(n: int = 2048, dtype: torch.dtype = torch.float32, repeats: int = 5) -> float:
    """GFLOP/s of one n×n by n×n matmul in ``dtype``: the roofline the ops are compared to."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    return 2 * n**3 / median_time(lambda: a @ b, repeats=repeats) / 1e9


#: Seconds one timing of the peak loop runs: long beside a timer tick and the clock's ramp-up,
#: short enough that `linattn bench` does not wait on it (5 timings, once per machine).
_PEAK_SECONDS = 0.1
_PEAK_TIMINGS = 5
_peaks: dict[str, float | None] = {}

#: Each kind of peak (:func:`peak_kind`): the compiled loop that measures it
#: (ops/native/native.c) and what it counts.
PEAK_KINDS: dict[str, tuple[str, str]] = {
    "fma": ("la_peak_f32", "float32 FMAs"),
    "bf16 dot": ("la_peak_bf16", "bfloat16 dot products"),
    "amx": ("la_peak_amx", "bfloat16 AMX tile products"),
}


def _peak_cache() -> Path:
    return user_cache_dir() / f"peaks-{cpu_tag()}.json"


def _measure_peak(lib, kind: str) -> float | None:
    """Best GFLOP/s of the library's loop for peak ``kind`` over a few timings (a peak: noise
    only slows it), or None where the build or the OS lacks the instruction."""
    fn = getattr(lib, PEAK_KINDS[kind][0])
    fn.restype, fn.argtypes = ctypes.c_double, [ctypes.c_long, ctypes.POINTER(ctypes.c_float)]
    io = (ctypes.c_float * 4)(0.999999, 1e-7, 1.0, 0.0)
    iters = 1 << 16
    while True:  # grow the loop until one run is long enough to time
        t0 = time.perf_counter()
        flops = fn(iters, io)
        dt = time.perf_counter() - t0
        if flops < 0:
            return None
        if dt >= _PEAK_SECONDS / 4 or iters >= 1 << 40:
            break
        iters *= 4
    iters = max(1, int(iters * _PEAK_SECONDS / max(dt, 1e-9)))
    best = 0.0
    for _ in range(_PEAK_TIMINGS):
        t0 = time.perf_counter()
        flops = fn(iters, io)
        best = max(best, flops / (time.perf_counter() - t0) / 1e9)
    return best


def peak_kind(dtype: str, isa: str = "native") -> str:
    """What :func:`core_peak` measures for kernels of ``dtype`` in the ``isa`` build: "amx"
    (tile products) where that build multiplies bfloat16 on AMX tiles (the native build on an
    AMX-BF16 CPU), "bf16 dot" where it multiplies them on AVX512-BF16 dot products, "fma"
    otherwise (float32 FMAs: bfloat16 inputs widened to float32 have that limit too)."""
    from linattn.ops.native import amx_tiles

    native16 = dtype == "bfloat16" and isa == "native"
    if native16 and amx_tiles():
        return "amx"
    return "bf16 dot" if native16 and "avx512_bf16" in cpu_flags() else "fma"


def core_peak(dtype: str = "float32", isa: str = "native", refresh: bool = False
              ) -> float | None:
    """One core's multiply-add peak in GFLOP/s, the limit a kernel of ``dtype`` compiled for
    the ``isa`` build is measured against (:func:`peak_kind`): float32 (and float64, which the
    kernels do not vectorise beyond it) -> FMAs at the build's vector width
    (``la_peak_f32`` in ops/native/native.c); bfloat16 -> the AMX tile product ``tdpbf16ps``
    (``la_peak_amx``) where the build has it and the kernel hands the tiles out, else the
    AVX512-BF16 dot product ``vdpbf16ps`` (2 products and 2 adds per float32 lane,
    ``la_peak_bf16``) where the build has it, else the float32 FMA peak. On an AMX CPU the
    bfloat16 forwards of linear attention and the GLA and delta-rule prefills multiply on the
    tiles, but spend most of their time between the products: they sit far below that peak.

    Measured once per machine (the CPU tag of the compiled builds), build and kind, on the
    calling thread, and cached in the user cache (``peaks-<tag>.json``), as the dispatcher's
    calibration is. A peak is a maximum (a busy machine only lowers a timing), so
    ``refresh=True`` measures again and keeps the larger figure. None where no compiled build
    loads (no C compiler)."""
    from linattn.ops import native

    kind = peak_kind(dtype, isa)
    key = f"{isa}:{kind}"
    if not refresh and key in _peaks:
        return _peaks[key]
    path = _peak_cache()
    cached: dict = {}
    try:
        stored = read_json(path)
        cached = stored if isinstance(stored, dict) else {}
    except (OSError, ValueError):
        pass
    value = cached.get(key)
    value = value if isinstance(value, (int, float)) and value > 0 else None
    if refresh or value is None:
        lib = native.load(isa)
        fresh = None if lib is None else _measure_peak(lib, kind)
        if fresh is not None:
            value = max(fresh, value or 0.0)
            cached[key] = value
            try:
                write_json(path, cached)
            except OSError:
                pass  # a read-only cache: measured again by the next process
    _peaks[key] = value
    return value


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or the platform's processor or machine string
    where there is none: what the benchmarks name beside their figures, with :func:`cpu_flags`
    for its vector ISA."""
    for line in _cpu_lines():
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    return platform.processor() or platform.machine()


def cpu_description() -> str:
    """``"model (avx2, avx512f)"``: the CPU and the AVX levels it has ("no avx2" for none)."""
    isa = sorted(f for f in ("avx512f", "avx2") if f in cpu_flags())
    return f"{cpu_model()} ({', '.join(isa) or 'no avx2'})"
