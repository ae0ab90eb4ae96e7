"""The compiled gated RMSNorm (ops/norm/native.py, ``la_norm_forward`` in ops/norm/kernels.c)
against the float64 reference and the torch form: rows not a multiple of any vector width,
groups, both orders, both activations, the three dtypes and mixed ones, strided rows, threads,
the lean path of a decoding step and the custom op."""

from __future__ import annotations

import pytest
import torch

from linattn import rms_norm_gated
from linattn.ops import dispatch
from linattn.ops import reference as ref
from linattn.ops.norm import native as norm_native
from linattn.ops.norm import op as norm_op

pytestmark = [
    pytest.mark.usefixtures("single_thread"),
    pytest.mark.skipif(norm_native.unavailable() is not None,
                       reason=f"compiled norm: {norm_native.unavailable()}"),
]

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16


@pytest.fixture
def native_calls(monkeypatch):
    """Force the compiled backend; count the kernel's calls (the lean path's and the op's)."""
    calls = []
    real = norm_native.kernels_here

    def counted(isa):
        fns = real(isa)
        kernel = fns["norm_forward"]
        return {**fns, "norm_forward": lambda **fields: calls.append(1) or kernel(**fields)}

    monkeypatch.setattr(norm_native, "kernels_here", counted)
    with dispatch.use(impl="native"):
        yield calls


def _inputs(*shape, dtype=F32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(*shape, generator=gen) * 3).to(dtype)
    g = (torch.randn(*shape, generator=gen) * 3).to(dtype)
    w = (torch.rand(shape[-1], generator=gen) + 0.5).to(dtype)
    return x, g, w


def _close(got, want, dtype, ulps=4.0):
    want = want.double()
    assert got.shape == want.shape and got.dtype == dtype
    scale = max(want.abs().max().item(), 1.0) if want.numel() else 1.0
    torch.testing.assert_close(got.double(), want, rtol=0,
                               atol=ulps * torch.finfo(dtype).eps * scale)


@pytest.mark.parametrize("D, G", [(1, None), (5, None), (16, None), (37, None), (128, None),
                                  (300, None), (64, 16), (60, 12), (48, 1)])
@pytest.mark.parametrize("activation", ["silu", "sigmoid"])
@pytest.mark.parametrize("before", [True, False])
@pytest.mark.parametrize("weighted", [True, False])
def test_matches_reference(native_calls, D, G, activation, before, weighted):
    x, g, w = _inputs(3, 7, D)
    w = w if weighted else None
    y = rms_norm_gated(x, g, w, eps=1e-5, activation=activation, group_size=G,
                       norm_before_gate=before)
    assert native_calls
    want = ref.rms_norm_gated(x, g, w, eps=1e-5, activation=activation, group_size=G,
                              norm_before_gate=before)
    _close(y, want, F32)


@pytest.mark.parametrize("dtype", [BF16, F16])
@pytest.mark.parametrize("before", [True, False])
def test_half_dtypes_round_once(native_calls, dtype, before):
    x, g, w = _inputs(9, 130, dtype=dtype)
    y = rms_norm_gated(x, g, w, norm_before_gate=before)
    _close(y, ref.rms_norm_gated(x, g, w, norm_before_gate=before), dtype, ulps=1.0)
    with dispatch.use(impl="portable"):
        y_t = rms_norm_gated(x, g, w, norm_before_gate=before)
    _close(y, y_t.double(), dtype, ulps=1.0)


def test_mixed_dtypes_and_no_gate(native_calls):
    x, g, w = _inputs(4, 6, 40, dtype=BF16)
    g32, w64 = g.float() * 1.01, w.double()
    _close(rms_norm_gated(x, g32, w64), ref.rms_norm_gated(x, g32, w64), BF16, ulps=1.0)
    _close(rms_norm_gated(x.float(), None, w, group_size=8),
           ref.rms_norm_gated(x.float(), None, w, group_size=8), F32)


def test_strided_rows(native_calls):
    x, g, w = _inputs(6, 50)
    big = torch.zeros(12, 64)
    big[::2, 7:57] = x
    xt = x.t().contiguous().t()  # channels not contiguous: copied
    for xv in (big[::2, 7:57], xt):
        _close(rms_norm_gated(xv, g, w), ref.rms_norm_gated(x, g, w), F32)


def test_rows_on_threads_equal_one_call(native_calls, monkeypatch):
    x, g, w = _inputs(301, 96)
    one = rms_norm_gated(x, g, w, activation="sigmoid")
    monkeypatch.setattr(norm_native, "threads_for", lambda work, parts, m: min(parts, 3))
    assert torch.equal(rms_norm_gated(x, g, w, activation="sigmoid"), one)


def test_lean_path_of_a_decoding_step(monkeypatch):
    """16 rows of 128 (one token of 16 heads): straight to the kernel."""
    x, g, w = _inputs(1, 16, 128)
    with dispatch.use(impl="native"):
        want = norm_op._lean(x, g, w, 1e-6, "silu", None, True)
        assert want is not None
        monkeypatch.setattr(norm_native, "rms_norm_native",
                            lambda *a: pytest.fail("the lean path was not taken"))
        y = rms_norm_gated(x, g, w)
    assert torch.equal(y, want)
    _close(y, ref.rms_norm_gated(x, g, w), F32)


def test_opcheck():
    x, g, w = _inputs(3, 5, 40)
    torch.library.opcheck(torch.ops.linattn.rms_norm_gated.default,
                          (x, g, w, 1e-6, False, 40, True, "native"))
    torch.library.opcheck(torch.ops.linattn.rms_norm_gated.default,
                          (x, None, None, 1e-6, True, 8, False, "native"))


def test_the_op_computes_the_same_function_without_kernels(monkeypatch):
    x, g, w = _inputs(3, 5, 40)
    want = norm_native.rms_norm_native(x, g, w, 1e-6, True, 10, False, "native")
    monkeypatch.setattr(norm_native, "kernels", lambda isa="native": None)
    got = norm_native.rms_norm_native(x, g, w, 1e-6, True, 10, False, "native")
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
