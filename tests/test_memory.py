"""linattn._memory: absurd sizes refused before anything is allocated, naming the option."""

from __future__ import annotations

import subprocess
import sys

import pytest

from linattn import _memory


def _need(v):
    return v["a"] * v["b"] ** 2


def test_check_fits_names_the_option_whose_default_shrinks_the_need_most():
    defaults = {"a": 1, "b": 10}
    _memory.check_fits(_need, {"a": 5, "b": 10}, defaults, "x", available=500)  # fits
    with pytest.raises(ValueError, match=r"^b: x needs about 9.77 KiB of memory, more than "
                                         r"the 500 bytes available$"):
        _memory.check_fits(_need, {"a": 1, "b": 100}, defaults, "x", available=500)
    with pytest.raises(ValueError, match=r"^a: "):  # b at its default: a is the one
        _memory.check_fits(_need, {"a": 1000, "b": 10}, defaults, "x", available=500)
    with pytest.raises(ValueError, match=r"^b: "):  # b**2 grows faster than a
        _memory.check_fits(_need, {"a": 20, "b": 100}, defaults, "x", available=500)
    with pytest.raises(ValueError, match=r"^a: "):  # all at their defaults: the first
        _memory.check_fits(_need, {"a": 1, "b": 10}, defaults, "x", available=10)


def test_available_memory_is_known_here_and_bounded_by_ulimit():
    have = _memory.available_bytes()
    assert have is None or have > 0
    code = ("import resource; from linattn._memory import available_bytes; "
            "resource.setrlimit(resource.RLIMIT_AS, (2**33, 2**33)); print(available_bytes())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert 0 < int(done.stdout) <= 2**33


@pytest.mark.parametrize("n, text", [(0, "0 bytes"), (1536, "1.5 KiB"), (3 * 2**40, "3 TiB"),
                                     (2**70, "1.02e+03 EiB")])
def test_format_bytes(n, text):
    assert _memory.format_bytes(n) == text


def test_out_of_memory_errors_are_recognised():
    assert _memory.is_out_of_memory(MemoryError())
    assert _memory.is_out_of_memory(RuntimeError(
        "DefaultCPUAllocator: not enough memory: you tried to allocate 8 bytes"))
    assert _memory.is_out_of_memory(RuntimeError("CUDA out of memory. Tried to allocate"))
    assert not _memory.is_out_of_memory(RuntimeError("shape mismatch"))
    assert not _memory.is_out_of_memory(ValueError("out of memory"))


def test_feature_counts_are_the_maps():
    torch = pytest.importorskip("torch")  # noqa: F841 - the maps need it
    from linattn.feature_maps import get_feature_map

    for name in ("elu", "relu", "taylor", "polynomial"):
        for d in (1, 4, 16):
            assert _memory.num_features(name, d) == get_feature_map(name).num_features(d)
