"""linattn.profiling: the CPU description the benchmarks print beside their figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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


def test_bfloat16_peak_is_the_tiles_or_dot_product_where_the_build_has_them(peak_cache):
    flags = profiling.cpu_flags()
    bf16, tiles = "avx512_bf16" in flags, native.amx_tiles()
    assert profiling.peak_kind("bfloat16") == ("amx" if tiles else "bf16 dot" if bf16 else "fma")
    assert profiling.peak_kind("bfloat16", "avx2") == "fma"
    assert profiling.peak_kind("float32") == "fma"
    if native.load() is None:
        return
    f32, b16 = profiling.core_peak("float32"), profiling.core_peak("bfloat16")
    if tiles:
        # a tile product is 8,192 multiply-adds (16x an FMA's peak on Sapphire Rapids); a busy
        # machine's noise does not close a gap that wide
        assert b16 > 2 * f32
    elif bf16:
        # vdpbf16ps does twice an FMA's work per lane, but its rate differs by core: about twice
        # the FMA peak on AMD Zen 4, half of it on Intel Sapphire Rapids
        assert 0.25 * f32 < b16 < 4 * f32
    else:
        assert b16 == f32  # widened to float32: the same limit


def test_amx_off_in_the_environment_is_the_dot_product_peak():
    """LINATTN_AMX=0 is read by the kernel library when it first asks for the tiles: a fresh
    process sees the dot products' peak kind."""
    if "amx_bf16" not in profiling.cpu_flags() or native.load() is None:
        pytest.skip("no AMX tiles on this CPU")
    code = "from linattn import profiling; print(profiling.peak_kind('bfloat16'))"
    env = {**os.environ, "LINATTN_AMX": "0"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.strip().splitlines()
    assert out[-1] == ("bf16 dot" if "avx512_bf16" in profiling.cpu_flags() else "fma")
