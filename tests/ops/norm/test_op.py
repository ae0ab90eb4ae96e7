"""The gated RMSNorm (ops/norm/op.py): the torch form against the float64 reference over
shapes, groups, activations and both orders of norm and gate; gradients; argument errors;
``torch.compile``. Runs without a C compiler."""

from __future__ import annotations

import shutil

import pytest
import torch
from torch._dynamo.backends.registry import lookup_backend

import linattn
from linattn import rms_norm_gated
from linattn.ops import dispatch
from linattn.ops import reference as ref
from linattn.ops.norm import native as norm_native

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64


def _inputs(*shape, dtype=F64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=gen, dtype=F64) * 2
    g = torch.randn(*shape, generator=gen, dtype=F64) * 2
    w = torch.rand(shape[-1], generator=gen, dtype=F64) + 0.5
    return x.to(dtype), g.to(dtype), w.to(dtype)


def _close(got, want, dtype, ulps=4.0):
    want = want.double()
    assert got.shape == want.shape and got.dtype == dtype
    scale = max(want.abs().max().item(), 1.0) if want.numel() else 1.0
    tol = 1e-12 * scale if dtype == F64 else ulps * torch.finfo(dtype).eps * scale
    torch.testing.assert_close(got.double(), want, rtol=0, atol=tol)


def test_reference_is_the_definition():
    """Written out once more with torch's own functions, in float64."""
    x, g, w = _inputs(3, 4, 12)
    y = ref.rms_norm_gated(x, g, w, eps=1e-5)
    want = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w * torch.nn.functional.silu(g)
    torch.testing.assert_close(y, want)
    y = ref.rms_norm_gated(x, g, w, activation="sigmoid", group_size=4, norm_before_gate=False)
    z = (x * torch.sigmoid(g)).view(3, 4, 3, 4)
    want = (z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + 1e-6)).view(3, 4, 12) * w
    torch.testing.assert_close(y, want)


@pytest.mark.parametrize("dtype", [F64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("D, G", [(1, None), (7, None), (128, None), (24, 6), (24, 24)])
@pytest.mark.parametrize("activation", ["silu", "swish", "sigmoid"])
@pytest.mark.parametrize("before", [True, False])
@pytest.mark.parametrize("weighted", [True, False])
def test_portable_matches_reference(dtype, D, G, activation, before, weighted):
    x, g, w = _inputs(2, 5, D, dtype=dtype)
    w = w if weighted else None
    want = ref.rms_norm_gated(x, g, w, eps=1e-5, activation=activation, group_size=G,
                              norm_before_gate=before)
    with dispatch.use(impl="portable"):
        y = rms_norm_gated(x, g, w, eps=1e-5, activation=activation, group_size=G,
                           norm_before_gate=before)
    _close(y, want, dtype, ulps=1.0 if dtype == torch.bfloat16 else 8.0)


@pytest.mark.parametrize("impl", ["auto", "portable"])
def test_no_gate_is_a_plain_rmsnorm(impl):
    x, _, w = _inputs(4, 33, dtype=torch.float32)
    with dispatch.use(impl=impl):
        y = rms_norm_gated(x, None, w, group_size=11)
    _close(y, ref.rms_norm_gated(x, None, w, group_size=11), torch.float32)


@pytest.mark.parametrize("impl", ["auto", "portable"])
def test_shapes_and_layouts(impl):
    """Any leading dimensions (none too), empty inputs, strided and transposed inputs and gates
    of another dtype."""
    with dispatch.use(impl=impl):
        for shape in [(16,), (0, 16), (3, 0, 16), (2, 3, 5, 16)]:
            x, g, w = _inputs(*shape, dtype=torch.float32)
            _close(rms_norm_gated(x, g, w), ref.rms_norm_gated(x, g, w), torch.float32)
        x, g, w = _inputs(16, 6, dtype=torch.float32)
        xt = x.t()  # (6, 16) with a row stride of 1
        gb = g.t().contiguous()[:, :].bfloat16()
        _close(rms_norm_gated(xt, gb, w[:1].expand(16).contiguous()),
               ref.rms_norm_gated(xt, gb, w[:1].expand(16)), torch.float32)


def test_gradients_of_the_portable_path():
    x, g, w = _inputs(3, 8)
    args = [t.detach().requires_grad_() for t in (x, g, w)]
    with dispatch.use(impl="portable"):
        for kw in ({}, {"activation": "sigmoid", "norm_before_gate": False, "group_size": 4}):
            torch.autograd.gradcheck(lambda x, g, w, kw=kw: rms_norm_gated(x, g, w, **kw), args)


def test_gradients_take_the_portable_path_by_default():
    x, g, w = _inputs(4, 32, dtype=torch.float32)
    x.requires_grad_()
    rms_norm_gated(x, g, w).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("call, kind, name", [
    (lambda x, g, w: rms_norm_gated(x.tolist(), g, w), TypeError, "x"),
    (lambda x, g, w: rms_norm_gated(x[..., :0], g[..., :0], None), ValueError, "x"),
    (lambda x, g, w: rms_norm_gated(x, g[:1], w), ValueError, "gate"),
    (lambda x, g, w: rms_norm_gated(x, g.long(), w), TypeError, "gate"),
    (lambda x, g, w: rms_norm_gated(x, g, w[:3]), ValueError, "weight"),
    (lambda x, g, w: rms_norm_gated(x, g, w, eps=-1.0), ValueError, "eps"),
    (lambda x, g, w: rms_norm_gated(x, g, w, eps=float("nan")), ValueError, "eps"),
    (lambda x, g, w: rms_norm_gated(x, g, w, eps="1e-6"), TypeError, "eps"),
    (lambda x, g, w: rms_norm_gated(x, g, w, activation="relu"), ValueError, "activation"),
    (lambda x, g, w: rms_norm_gated(x, g, w, activation=None), TypeError, "activation"),
    (lambda x, g, w: rms_norm_gated(x, g, w, group_size=5), ValueError, "group_size"),
    (lambda x, g, w: rms_norm_gated(x, g, w, group_size=True), ValueError, "group_size"),
    (lambda x, g, w: rms_norm_gated(x, g, w, norm_before_gate=0), TypeError,
     "norm_before_gate"),
])
def test_errors_name_the_argument(call, kind, name):
    x, g, w = _inputs(2, 3, 12, dtype=torch.float32)
    with pytest.raises(kind) as exc:
        call(x, g, w)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(f"{name}:"), msg


def test_public_names():
    assert linattn.rms_norm_gated is rms_norm_gated
    assert linattn.reference.rms_norm_gated is ref.rms_norm_gated


_CXX = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
BACKEND = "inductor" if _CXX else "aot_eager"


@pytest.mark.parametrize("setting", ["1", "0"])
def test_compile_fullgraph_equals_eager(setting, monkeypatch):
    monkeypatch.setenv("LINATTN_NATIVE", setting)
    torch._dynamo.reset()
    dispatch._memo.clear()
    x, g, w = _inputs(2, 6, 32, dtype=torch.float32)

    def f(x, g, w):
        y = rms_norm_gated(x, g, w, eps=1e-5)
        return rms_norm_gated(y * 2, g, None, activation="sigmoid", group_size=8,
                              norm_before_gate=False)

    graphs = []

    def backend(gm, inputs):
        graphs.append(str(gm.graph))
        return lookup_backend(BACKEND)(gm, inputs)

    try:
        want = f(x, g, w)
        got = torch.compile(f, fullgraph=True, backend=backend)(x, g, w)
    finally:
        torch._dynamo.reset()
        dispatch._memo.clear()
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    kernels = setting == "1" and norm_native.kernels() is not None
    assert ("linattn.rms_norm_gated" in graphs[0]) == kernels, graphs[0]


# issue 51 probe: finite float32 inputs whose squares overflow or underflow gave zeros or NaN
@pytest.mark.parametrize("impl", ["auto", "portable"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("magnitude, eps", [(1e19, 1e-6), (1e30, 0.0), (1e-30, 0.0),
                                            (1e-30, 1e-6), (1e-40, 0.0), (1.0, 0.0)])
@pytest.mark.parametrize("gated", [False, True])
def test_rows_whose_squares_overflow_or_underflow(impl, dtype, magnitude, eps, gated):
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(3, 16, generator=gen, dtype=F64) * magnitude).to(dtype)
    x[1] = torch.randn(16, generator=gen, dtype=F64).to(dtype)  # an ordinary row beside
    g = torch.randn(3, 16, generator=gen, dtype=F64).to(dtype) if gated else None
    w = torch.randn(16, generator=gen, dtype=F64).to(dtype)
    want = ref.rms_norm_gated(x, g, w, eps=eps, norm_before_gate=True)
    with dispatch.use(impl=impl):
        got = rms_norm_gated(x, g, w, eps=eps)
    assert got.isfinite().all()
    tol = 8 * torch.finfo(dtype).eps
    # relative to each row's largest value: tiny rows (1e-27 with eps 1e-6) are held too
    row = want.abs().amax(-1, keepdim=True).clamp_min(torch.finfo(F64).tiny)
    torch.testing.assert_close(got.double() / row, want / row, rtol=0, atol=tol)


# issue 51, second probe: with the gate before the norm, z = x·act(g) itself can leave float32
# (1e20·silu(1e20)) while every input is finite: the compiled kernel gave NaN (inf / inf)
@pytest.mark.parametrize("impl", ["auto", "portable"])
@pytest.mark.parametrize("x_mag, g_mag, eps", [(1e20, 1e20, 1e-6), (2e38, 2e38, 1e-6),
                                               (1e-30, 1e-30, 0.0), (1e-25, 1e-20, 0.0)])
def test_gate_before_norm_whose_product_leaves_float32(impl, x_mag, g_mag, eps):
    gen = torch.Generator().manual_seed(0)
    x = (torch.rand(3, 16, generator=gen, dtype=F64) + 0.5) * x_mag
    g = (torch.rand(3, 16, generator=gen, dtype=F64) + 0.5) * g_mag
    x, g = x.float(), g.float()
    x[1], g[1] = torch.randn(16, generator=gen), torch.randn(16, generator=gen)  # ordinary
    w = torch.randn(16, generator=gen)
    want = ref.rms_norm_gated(x, g, w, eps=eps, norm_before_gate=False)
    with dispatch.use(impl=impl):
        got = rms_norm_gated(x, g, w, eps=eps, norm_before_gate=False)
    assert got.isfinite().all()
    row = want.abs().amax(-1, keepdim=True).clamp_min(torch.finfo(F64).tiny)
    torch.testing.assert_close(got.double() / row, want / row, rtol=0,
                               atol=8 * torch.finfo(torch.float32).eps)


@pytest.mark.parametrize("impl", ["auto", "portable"])
@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("eps", [0.0, 1e-300, 1e-45])
def test_an_all_zero_row_normalises_to_zeros_whatever_eps(impl, dtype, eps):
    # defined: rmsnorm(0) = 0, also with eps = 0 (torch's rms_norm gives nan there) and an
    # eps that rounds to 0 in float32 (the probe's nan at eps=1e-300)
    x = torch.zeros(2, 4, dtype=dtype)
    x[1] = torch.tensor([1.0, -2.0, 3.0, 0.5], dtype=dtype)
    with dispatch.use(impl=impl):
        y = rms_norm_gated(x, None, eps=eps)
        yg = rms_norm_gated(x, torch.ones_like(x), torch.ones(4, dtype=dtype), eps=eps,
                            norm_before_gate=False)
    for out in (y, yg):
        assert torch.equal(out[0], torch.zeros(4, dtype=dtype))
        assert out[1].isfinite().all() and out[1].abs().max() > 0
    assert torch.equal(ref.rms_norm_gated(x, None, eps=0.0)[0], torch.zeros(4, dtype=F64))


def test_an_eps_float32_cannot_hold_is_named():
    x = torch.randn(2, 8)
    for eps in (1e39, 1e300):
        with pytest.raises(ValueError, match="^eps: .*float32"):
            rms_norm_gated(x, None, eps=eps)
        with pytest.raises(ValueError, match="^eps: .*float32"):
            rms_norm_gated(x, torch.randn(2, 8), torch.ones(8), eps=eps)
    assert rms_norm_gated(x.double(), None, eps=1e39).isfinite().all()  # float64 holds it
