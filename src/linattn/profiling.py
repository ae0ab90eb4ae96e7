"""Measuring helpers shared by the benchmarks, ``linattn bench`` and the memory tests.

Peak memory is read from Linux's per-process counters: ``VmHWM`` (the peak resident set),
reset by writing ``5`` to ``/proc/self/clear_refs``. That counts every allocation that became
resident — torch's, BLAS's and OpenMP's — unlike allocator statistics, and unlike
``ru_maxrss`` it can be reset, so one process can measure several calls in turn.
"""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from linattn._cbuild import _cpu_lines, cpu_flags

__all__ = ["median_time", "PeakMemory", "matmul_gflops", "cpu_model", "cpu_flags",
           "cpu_description"]

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
