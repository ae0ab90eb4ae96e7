"""linattn.profiling: the CPU description the benchmarks print beside their figures."""

from __future__ import annotations

from pathlib import Path

from linattn import profiling


def test_cpu_model_and_description_read_cpuinfo():
    model = profiling.cpu_model()
    assert model and "\n" not in model
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [ln.partition(":")[2].strip() for ln in cpuinfo.read_text().splitlines()
                 if ln.startswith("model name")]
        if names:
            assert model == names[0]
    isa = [f for f in ("avx2", "avx512f") if f in profiling.cpu_flags()]
    assert profiling.cpu_description() == f"{model} ({', '.join(isa) or 'no avx2'})"


def test_median_time_is_the_median_of_the_timed_calls():
    calls = []
    assert profiling.median_time(lambda: calls.append(1), repeats=5, warmup=2) >= 0
    assert len(calls) == 7
