"""The path selector (ops/dispatch.py) and the measured rule behind ``impl="auto"``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import linattn
from linattn.ops import dispatch, native
from linattn.ops.linear import native as lnative
from linattn.ops.linear import op as linear_mod

needs_native = pytest.mark.skipif(
    native.load() is None, reason=f"compiled path: {native.unavailable_reason()}"
)


def _qkv(T=40, D=16, Dv=16):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, 2, T, d, generator=g) for d in (D, D, Dv)]


@pytest.fixture
def calls(monkeypatch):
    """Which path each call took: a list of "native" / "fused" entries."""
    seen: list[str] = []
    for name, label in (("native_linear_attention", "native"),
                        ("fused_linear_attention", "fused")):
        real = getattr(linear_mod, name)
        monkeypatch.setattr(linear_mod, name,
                            lambda *a, _r=real, _l=label, **kw: seen.append(_l) or _r(*a, **kw))
    return seen


def test_policy_validates_and_nests():
    assert dispatch.policy() == dispatch.Policy()
    with pytest.raises(ValueError, match="impl"):
        dispatch.Policy(impl="fastest")
    with pytest.raises(ValueError, match="block_size"):
        dispatch.Policy(block_size=0)
    with dispatch.use(impl="portable", block_size=8) as outer:
        assert outer.impl == "portable" and outer.block_size == 8
        with dispatch.use(chunk_size=4) as inner:
            assert (inner.impl, inner.block_size, inner.chunk_size) == ("portable", 8, 4)
        assert dispatch.policy() == outer
    assert dispatch.policy() == dispatch.Policy()


def test_block_holds_whole_chunks():
    pol = dispatch.Policy(block_size=8)
    assert pol.block_for(4) == 8 and pol.block_for(3) == 6 and pol.block_for(16) == 16


def test_small_blocks_really_cross_block_boundaries(fast_path_calls, monkeypatch):
    """The test fixture's promise: T = 9 spans two blocks (and three causal chunks)."""
    seen = []
    target = "native_linear_attention" if native.load() else "fused_linear_attention"
    real = getattr(linear_mod, target)
    monkeypatch.setattr(linear_mod, target,
                        lambda *a, **kw: seen.append((kw["block"], kw["chunk"])) or real(*a, **kw))
    q, k, v = _qkv(T=9, D=4, Dv=3)
    linattn.linear_attention(q, k, v, is_causal=True)
    assert seen == [(8, 4)]


def test_portable_and_forced_paths(calls):
    q, k, v = _qkv()
    with dispatch.use(impl="portable"):
        want = linattn.linear_attention(q, k, v, is_causal=True)
    assert calls == []
    with dispatch.use(impl="fused"):
        got = linattn.linear_attention(q, k, v, is_causal=True)
    assert calls == ["fused"]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    with dispatch.use(impl="torch"):  # what runs with LINATTN_NATIVE=0: portable below 2048
        linattn.linear_attention(q, k, v, is_causal=True)
    with dispatch.use(impl="torch", fused_min_t=16):
        linattn.linear_attention(q, k, v, is_causal=True)
    assert calls == ["fused", "fused"]
    with dispatch.use(impl="native"), pytest.raises(ValueError, match="cannot take this call"):
        linattn.linear_attention(q, k, v, feature_map="taylor")


@needs_native
def test_auto_follows_the_measurement(calls, monkeypatch):
    """``auto`` takes the compiled path only where the calibration says it wins;
    ``LINATTN_NATIVE=1`` takes it regardless, ``LINATTN_NATIVE=0`` never."""
    q, k, v = _qkv()
    monkeypatch.delenv("LINATTN_NATIVE", raising=False)
    monkeypatch.setattr(lnative, "wins", lambda is_causal, backward: False)
    linattn.linear_attention(q, k, v)
    assert calls == []  # T = 40 < fused_min_t: portable
    monkeypatch.setattr(lnative, "wins", lambda is_causal, backward: is_causal)
    linattn.linear_attention(q, k, v)
    linattn.linear_attention(q, k, v, is_causal=True)
    assert calls == ["native"]
    monkeypatch.setattr(lnative, "wins", lambda is_causal, backward: False)
    monkeypatch.setenv("LINATTN_NATIVE", "1")
    linattn.linear_attention(q, k, v)
    assert calls == ["native", "native"]


@needs_native
def test_calibration_is_cached_beside_the_library(monkeypatch):
    result = lnative.calibration()
    assert set(result) == {"non-causal forward", "non-causal fwd+bwd", "causal forward",
                           "causal fwd+bwd"}
    for cell in result.values():
        assert cell["native_ms"] > 0 and cell["torch_ms"] > 0
        assert cell["native"] == (cell["native_ms"] < cell["torch_ms"])
    path = Path(native.load()._name).with_suffix(".calib.json")
    cached = json.loads(path.read_text())
    shape = "x".join(map(str, lnative.CALIBRATION_SHAPE))
    assert cached[f"threads={torch.get_num_threads()} shape={shape}"] == result
    # A new process reads the file instead of measuring again.
    monkeypatch.setattr(lnative, "_verdicts", {})
    monkeypatch.setattr(lnative, "_measure", lambda: pytest.fail("measured again"))
    assert lnative.calibration() == result
    assert lnative.wins(True, True) == result["causal fwd+bwd"]["native"]


@needs_native
def test_calibration_runs_under_no_grad_and_small_blocks():
    """The first call, which measures, may come from inference code or from inside a policy:
    the measurement still times gradients, with the default sizes."""
    seen = []
    real = linear_mod.native_linear_attention

    def spy(*a, **kw):
        seen.append(kw["block"])
        return real(*a, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(linear_mod, "native_linear_attention", spy)
        with torch.inference_mode(), dispatch.use(block_size=8, chunk_size=4):
            result = lnative._measure(repeats=1)
    assert all(cell["native_ms"] > 0 for cell in result.values())
    assert seen and set(seen) == {dispatch.Policy().block_size}


@needs_native
def test_calibration_is_isolated_from_the_triggering_call(monkeypatch):
    """The first call may run under a float64 default dtype, inside activation checkpointing
    (whose recording must not see the measurement's tensors) and from several threads at
    once: the calibration measures once, in float32, in a thread of its own."""
    import threading

    from torch.utils.checkpoint import checkpoint

    runs = []
    real = lnative._measure

    def measure():
        runs.append(threading.current_thread().name)
        return real(repeats=1)

    monkeypatch.setattr(lnative, "_verdicts", {})
    monkeypatch.setattr(lnative, "_measure", measure)
    monkeypatch.setattr(native, "write_atomic", lambda *a: None)  # leave the real cache alone
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **kw: "{}")  # nothing cached
    monkeypatch.delenv("LINATTN_NATIVE", raising=False)
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        x = torch.randn(1, 2, 32, 16, dtype=torch.float32, requires_grad=True)
        errors = []

        def call():
            try:
                out = checkpoint(lambda a: linattn.linear_attention(a, a, a, is_causal=True), x,
                                 use_reentrant=False)
                out.sum().backward()
            except Exception as exc:  # noqa: BLE001
                errors.append(exc)

        threads = [threading.Thread(target=call) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        torch.set_default_dtype(before)
    assert not errors, errors
    assert runs == ["linattn-calibration"]


def test_removed_module_globals_point_to_the_policy():
    with pytest.raises(AttributeError, match="dispatch.use"):
        _ = linear_mod.FUSED_MIN_T


# ------------------------------------------------------------------ every ISA build this CPU runs

ISAS = list(native.ISA_FLAGS)
EXPECTED_WIDTH = {"avx512": 16, "avx2": 8, "scalar": 1}


@pytest.mark.parametrize("isa", ISAS)
def test_every_isa_build_matches_the_reference(monkeypatch, isa):
    """Each build variant this CPU can run (the vector width and register tiles differ) against
    the float64 reference: one-pass kernels (widths multiples of 16, partial chunks), block
    passes (a padding mask), forward and backward."""
    if native.load(isa) is None:
        pytest.skip(f"{isa} build: {native.unavailable_reason(isa)}")
    lib = native.load(isa)
    if isa in EXPECTED_WIDTH:
        assert lib.la_width() == EXPECTED_WIDTH[isa]
    monkeypatch.setenv("LINATTN_NATIVE_ISA", isa)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 2, 83, d, generator=g) * 0.8 for d in (32, 32, 16))
    w = torch.randn(2, 2, 83, 16, generator=g)
    mask = torch.zeros(2, 83, dtype=torch.bool)
    mask[1, 70:] = True
    for is_causal in (False, True):
        for kpm in (None, mask):
            kw = dict(is_causal=is_causal, key_padding_mask=kpm)
            leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
            with dispatch.use(impl="native"):
                out = linattn.linear_attention(*leaves, chunk_size=16, **kw)
            (out * w).sum().backward()
            ref_leaves = [x.double().requires_grad_(True) for x in (q, k, v)]
            ref = linattn.reference.linear_attention(*ref_leaves, **kw)
            (ref * w.double()).sum().backward()
            torch.testing.assert_close(out.double(), ref, rtol=2e-5, atol=2e-5)
            for a, b in zip(leaves, ref_leaves, strict=True):
                scale = b.grad.abs().max().item()
                assert (a.grad.double() - b.grad).abs().max().item() < 2e-5 * scale


@needs_native
@pytest.mark.parametrize("is_causal", [False, True])
def test_bfloat16_without_bf16_units_widens_to_float32(monkeypatch, is_causal):
    """Block passes (here: a padding mask) on a CPU without bfloat16 products run in float32
    and round the output once: the float32 result, rounded."""
    monkeypatch.setattr(lnative, "bf16_products", lambda: False)
    q, k, v = (x.bfloat16() for x in _qkv(T=37, D=8, Dv=8))
    mask = torch.zeros(1, 37, dtype=torch.bool)
    mask[0, -5:] = True
    with torch.no_grad(), dispatch.use(impl="native"):
        got = linattn.linear_attention(q, k, v, is_causal=is_causal, key_padding_mask=mask)
        want = linattn.linear_attention(q.float(), k.float(), v.float(), is_causal=is_causal,
                                        key_padding_mask=mask)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, want.bfloat16(), rtol=0, atol=0)


@needs_native
def test_refused_sizes_raise_even_under_python_O():
    with pytest.raises(RuntimeError, match="la_causal_forward refused"):
        native._check(-1, "la_causal_forward")
    native._check(0, "la_causal_forward")
