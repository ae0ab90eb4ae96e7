"""linattn.profiling: the CPU description the benchmarks print beside their figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from linattn import profiling
from linattn.ops import native


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


@pytest.fixture
def peak_cache(tmp_path, monkeypatch):
    """A private cache file and an empty in-process memo, so the tests measure afresh (the
    compiled libraries' cache stays where it is: moving it would rebuild them)."""
    monkeypatch.setattr(profiling, "_peak_cache", lambda: tmp_path / "peaks-test.json")
    monkeypatch.setattr(profiling, "_peaks", {})
    monkeypatch.setattr(profiling, "_PEAK_SECONDS", 0.01)
    return tmp_path


def test_core_peak_is_measured_once_cached_and_refreshed_upwards(peak_cache):
    if native.load() is None:
        assert profiling.core_peak("float32") is None
        return
    peak = profiling.core_peak("float32")
    # a multiply-add peak of one core: more than a scalar at 100 MHz, less than 64 lanes of
    # FMAs at 10 GHz (any CPU this runs on lies between)
    assert 0.2 < peak < 64 * 2 * 10
    (stored,) = peak_cache.glob("peaks-*.json")
    assert json.loads(stored.read_text()) == {"native:fma": peak}
    # the memo and the cache answer without measuring; a refresh keeps the larger figure
    assert profiling.core_peak("float32") == peak
    stored.write_text(json.dumps({"native:fma": 1e6}))
    profiling._peaks.clear()
    assert profiling.core_peak("float32") == 1e6
    assert profiling.core_peak("float32", refresh=True) == 1e6
    stored.write_text("[[[")  # a damaged cache is measured again, not an error
    profiling._peaks.clear()
    assert 0.2 < profiling.core_peak("float32") < 1e6


def test_bfloat16_peak_is_the_dot_product_where_the_build_has_it(peak_cache):
    bf16 = "avx512_bf16" in profiling.cpu_flags()
    assert profiling.peak_kind("bfloat16") == ("bf16 dot" if bf16 else "fma")
    assert profiling.peak_kind("bfloat16", "avx2") == "fma"
    assert profiling.peak_kind("float32") == "fma"
    if native.load() is None:
        return
    f32, b16 = profiling.core_peak("float32"), profiling.core_peak("bfloat16")
    if not bf16:
        assert b16 == f32  # widened to float32: the same limit
    else:
        # vdpbf16ps does twice an FMA's work per lane; allow for a busy machine's noise
        assert b16 > 0.8 * f32
