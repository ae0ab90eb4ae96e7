"""The short causal convolution (ops/conv/op.py): the torch form against the float64 reference
over shapes, layouts, states and packed sequences; the decoding step against the prefill;
gradients; argument errors; ``torch.compile``. Runs without a C compiler (the portable path
is forced where a test says which path; elsewhere the default path runs, whichever it is)."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.backends.registry import lookup_backend

import linattn
from linattn import causal_conv1d, causal_conv1d_step
from linattn.ops import dispatch
from linattn.ops import reference as ref
from linattn.ops.conv import native as conv_native

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64


def _inputs(B=2, T=13, D=7, W=4, *, dtype=F64, bias=True, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, D, generator=gen, dtype=F64)
    w = torch.randn(D, W, generator=gen, dtype=F64) * 0.7
    b = torch.randn(D, generator=gen, dtype=F64) if bias else None
    S0 = torch.randn(B, D, W - 1, generator=gen, dtype=F64)
    cast = (lambda t: None if t is None else t.to(dtype))  # noqa: E731
    return cast(x), cast(w), cast(b), cast(S0)


def _tol(dtype, scale=1.0, ulps=8.0):
    """Absolute tolerance at the size ``scale`` of the values: ``ulps`` unit roundoffs of
    dtype (float64: the bar for matching the reference)."""
    return 1e-12 * scale if dtype == F64 else ulps * torch.finfo(dtype).eps * scale


def _close(got, want, dtype, ulps=8.0):
    want = want.double()
    scale = max(want.abs().max().item(), 1.0) if want.numel() else 1.0
    assert got.shape == want.shape, (got.shape, want.shape)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=_tol(dtype, scale, ulps))


# ------------------------------------------------------------------------- the reference
def test_reference_is_a_depthwise_conv1d_padded_on_the_left():
    """The definition, checked against torch's grouped convolution in float64."""
    x, w, b, _ = _inputs(B=3, T=11, D=5, W=3)
    y, S = ref.causal_conv1d(x, w, b)
    want = F.conv1d(F.pad(x.transpose(1, 2), (2, 0)), w.unsqueeze(1), b, groups=5)
    torch.testing.assert_close(y, want.transpose(1, 2), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(S, x[:, -2:].transpose(1, 2))
    ys, _ = ref.causal_conv1d(x, w, b, activation="silu")
    torch.testing.assert_close(ys, F.silu(y), rtol=1e-12, atol=1e-12)


def test_reference_state_of_a_short_sequence_keeps_its_history():
    x, w, _, S0 = _inputs(B=1, T=2, D=3, W=5)
    _, S = ref.causal_conv1d(x, w, initial_state=S0)
    torch.testing.assert_close(S, torch.cat([S0[..., 2:], x.transpose(1, 2)], -1))


# --------------------------------------------------------------- the portable path, dtypes
@pytest.mark.parametrize("dtype", [F64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("W", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("T", [0, 1, 3, 40])
@pytest.mark.parametrize("activation", [None, "silu", "swish"])
def test_portable_matches_reference(dtype, W, T, activation):
    x, w, b, S0 = _inputs(B=2, T=T, D=19, W=W, dtype=dtype, bias=W % 2 == 0)
    want_y, want_S = ref.causal_conv1d(x, w, b, activation=activation, initial_state=S0)
    with dispatch.use(impl="portable"):
        y, S = causal_conv1d(x, w, b, activation=activation, initial_state=S0,
                             return_state=True)
    assert y.dtype == dtype and S.dtype == dtype and y.shape == (2, T, 19)
    _close(y, want_y, dtype)
    _close(S, want_S, dtype, ulps=1.0)  # the state holds inputs: one rounding at most


@pytest.mark.parametrize("impl", ["auto", "portable"])
def test_layouts_are_read_as_they_are(impl):
    """A (B, D, T) projection transposed (as the layers hold it), token and batch strides, a
    transposed weight: the same outputs as contiguous copies."""
    x, w, b, S0 = _inputs(B=3, T=20, D=24, dtype=torch.float32)
    want = ref.causal_conv1d(x, w, b, activation="silu", initial_state=S0)[0]
    channel_major = x.transpose(1, 2).contiguous().transpose(1, 2)  # channel stride T
    wide = torch.randn(3, 40, 30)
    wide[:, ::2, 3:27] = x  # token stride 2·30, batch stride 40·30
    views = [channel_major, wide[:, ::2, 3:27]]
    w_t = w.t().contiguous().t()
    S0_t = S0.transpose(1, 2).contiguous().transpose(1, 2)
    with dispatch.use(impl=impl):
        for v in views:
            y = causal_conv1d(v, w_t, b, activation="silu", initial_state=S0_t)
            assert y.is_contiguous()
            _close(y, want, torch.float32)


@pytest.mark.parametrize("impl", ["auto", "portable"])
@pytest.mark.parametrize("with_states", [False, True])
def test_packed_sequences_match_separate_calls(impl, with_states):
    lengths = [5, 0, 1, 17, 3]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    T = int(cu[-1])
    x, w, b, _ = _inputs(B=1, T=T, D=11, W=4, dtype=torch.float32)
    S0 = torch.randn(len(lengths), 11, 3) if with_states else None
    with dispatch.use(impl=impl):
        y, S = causal_conv1d(x, w, b, activation="silu", initial_state=S0, return_state=True,
                             cu_seqlens=cu)
    assert S.shape == (len(lengths), 11, 3)
    for n in range(len(lengths)):
        a, e = int(cu[n]), int(cu[n + 1])
        want_y, want_S = ref.causal_conv1d(x[:, a:e], w, b, activation="silu",
                                           initial_state=None if S0 is None else S0[n:n + 1])
        _close(y[:, a:e], want_y, torch.float32)
        _close(S[n:n + 1], want_S, torch.float32, ulps=1.0)
    whole = ref.causal_conv1d(x, w, b, activation="silu", initial_state=S0,
                              cu_seqlens=cu)
    _close(y, whole[0], torch.float32)


@pytest.mark.parametrize("impl", ["auto", "portable"])
def test_prefill_in_parts_equals_whole(impl):
    x, w, b, S0 = _inputs(B=2, T=30, D=9, W=4, dtype=torch.float32)
    with dispatch.use(impl=impl):
        whole, S_whole = causal_conv1d(x, w, b, activation="silu", initial_state=S0,
                                       return_state=True)
        parts, S = [], S0
        for t0, t1 in ((0, 2), (2, 2), (2, 3), (3, 29), (29, 30)):
            y, S = causal_conv1d(x[:, t0:t1], w, b, activation="silu", initial_state=S,
                                 return_state=True)
            parts.append(y)
    torch.testing.assert_close(torch.cat(parts, 1), whole, rtol=0, atol=1e-6)
    torch.testing.assert_close(S, S_whole, rtol=0, atol=0)


def test_empty_sequence_returns_a_new_state():
    x, w, b, S0 = _inputs(B=2, T=0, D=5, W=3, dtype=torch.float32)
    y, S = causal_conv1d(x, w, b, initial_state=S0, return_state=True)
    assert y.shape == (2, 0, 5)
    assert S.data_ptr() != S0.data_ptr()
    torch.testing.assert_close(S, S0, rtol=0, atol=0)
    _, Z = causal_conv1d(x, w, return_state=True)
    assert (Z == 0).all() and Z.shape == (2, 5, 2)


# ------------------------------------------------------------------------------ the step
@pytest.mark.parametrize("impl", ["auto", "portable"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, F64])
@pytest.mark.parametrize("W, extra", [(4, 0), (4, 1), (3, 2), (2, 0), (1, 0), (1, 2)])
def test_steps_equal_prefill(impl, dtype, W, extra):
    """Token by token from a state of W − 1 + extra columns (transformers' caches keep W): the
    prefill's outputs, and the state's last W − 1 columns are the prefill's final state; the
    state passed in is not modified (inplace=False)."""
    x, w, b, _ = _inputs(B=3, T=9, D=21, W=W, dtype=dtype)
    state = torch.randn(3, 21, W - 1 + extra, dtype=F64).to(dtype)
    S0 = state[..., extra:]
    want, want_S = ref.causal_conv1d(x, w, b, activation="silu", initial_state=S0)
    outs = []
    with dispatch.use(impl=impl):
        for t in range(9):
            before = state.clone()
            y, new = causal_conv1d_step(x[:, t], state, w, b, activation="silu")
            torch.testing.assert_close(state, before, rtol=0, atol=0)
            assert new.shape == state.shape and new.dtype == dtype and y.dtype == dtype
            outs.append(y)
            state = new
    _close(torch.stack(outs, 1), want, dtype)
    _close(state[..., extra:], want_S, dtype, ulps=0.0)


@pytest.mark.parametrize("impl", ["auto", "portable"])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_step_inplace_writes_the_state(impl, state_dtype):
    x, w, b, _ = _inputs(B=2, T=1, D=33, W=4, dtype=torch.float32)
    state = torch.randn(2, 33, 4).to(state_dtype)
    want_y, want_S = causal_conv1d_step(x[:, 0], state, w, b, activation="silu")
    with dispatch.use(impl=impl):
        y, S = causal_conv1d_step(x[:, 0], state, w, b, activation="silu", inplace=True)
    assert S is state
    torch.testing.assert_close(S, want_S, rtol=0, atol=0)
    torch.testing.assert_close(y, want_y, rtol=0, atol=1e-6)


@pytest.mark.parametrize("impl", ["auto", "portable"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_step_inplace_refuses_a_state_whose_rows_share_memory(impl, dtype):
    # issue 51 probe: float32 wrote both rows of an expanded state (both ended with x_t[1]);
    # float64 raised torch's overlap error
    torch.manual_seed(0)
    xt, w = torch.randn(2, 4, dtype=dtype), torch.randn(4, 3, dtype=dtype)
    base = torch.randn(1, 4, 2, dtype=dtype)
    state = base.expand(2, 4, 2)
    with dispatch.use(impl=impl), pytest.raises(ValueError, match="^state: .*share memory"):
        causal_conv1d_step(xt, state, w, inplace=True)
    assert torch.equal(state, base.expand(2, 4, 2))  # nothing written
    y, S = causal_conv1d_step(xt, state, w)  # not in place: a new state, fine
    assert S.shape == (2, 4, 2) and torch.equal(S[:, :, -1], xt)


def test_step_without_state_columns_keeps_an_empty_state():
    x, w, b, _ = _inputs(B=2, T=1, D=4, W=1)
    y, S = causal_conv1d_step(x[:, 0], x.new_zeros(2, 4, 0), w, b)
    torch.testing.assert_close(y, x[:, 0] * w[:, 0] + b)
    assert S.shape == (2, 4, 0)


# ------------------------------------------------------------------------------ gradients
def test_gradients_of_the_portable_path():
    x, w, b, S0 = _inputs(B=2, T=6, D=3, W=3)
    cu = torch.tensor([0, 2, 6])
    args = [t.detach().requires_grad_() for t in (x, w, b, S0)]
    with dispatch.use(impl="portable"):
        torch.autograd.gradcheck(
            lambda x, w, b, s: causal_conv1d(x, w, b, activation="silu", initial_state=s,
                                             return_state=True), args)
        x1 = x[:1].detach().requires_grad_()
        torch.autograd.gradcheck(
            lambda x, w, b, s: causal_conv1d(x, w, b, activation="silu", initial_state=s,
                                             return_state=True, cu_seqlens=cu),
            [x1, args[1], args[2], args[3]])
        state = torch.randn(2, 3, 3, dtype=F64, requires_grad=True)
        torch.autograd.gradcheck(
            lambda x, s, w, b: causal_conv1d_step(x, s, w, b, activation="silu"),
            [args[0][:, 0].detach().requires_grad_(), state, args[1], args[2]])


def test_gradients_take_the_portable_path_by_default():
    """A call that wants gradients runs the differentiable form whatever the policy picks."""
    x, w, b, S0 = _inputs(B=1, T=8, D=16, dtype=torch.float32)
    x.requires_grad_()
    y = causal_conv1d(x, w, b, activation="silu", initial_state=S0)
    y.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


# ------------------------------------------------------------------------------ errors
def _one_line(exc, name):
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(f"{name}:"), msg


@pytest.mark.parametrize("call, kind, name", [
    (lambda x, w: causal_conv1d(x.numpy(), w), TypeError, "x"),
    (lambda x, w: causal_conv1d(x[0], w), ValueError, "x"),
    (lambda x, w: causal_conv1d(x.long(), w), TypeError, "x"),
    (lambda x, w: causal_conv1d(x, w[:3]), ValueError, "weight"),
    (lambda x, w: causal_conv1d(x, w[:, :0]), ValueError, "weight"),
    (lambda x, w: causal_conv1d(x, w[:, 0]), ValueError, "weight"),
    (lambda x, w: causal_conv1d(x, w, torch.zeros(3)), ValueError, "bias"),
    (lambda x, w: causal_conv1d(x, w, activation="relu"), ValueError, "activation"),
    (lambda x, w: causal_conv1d(x, w, activation=True), TypeError, "activation"),
    (lambda x, w: causal_conv1d(x, w, initial_state=torch.zeros(2, 7, 2)), ValueError,
     "initial_state"),
    (lambda x, w: causal_conv1d(x, w, return_state="yes"), TypeError, "return_state"),
    (lambda x, w: causal_conv1d(x, w, cu_seqlens=torch.tensor([0, 13])), ValueError,
     "cu_seqlens"),
    (lambda x, w: causal_conv1d_step(x[:, 0], torch.zeros(2, 7, 2), w), ValueError, "state"),
    (lambda x, w: causal_conv1d_step(x[:, 0], None, w), TypeError, "state"),
    (lambda x, w: causal_conv1d_step(x[:, 0], torch.zeros(2, 7, 3), w, inplace=1), TypeError,
     "inplace"),
    (lambda x, w: causal_conv1d_step(x, torch.zeros(2, 7, 3), w), ValueError, "x_t"),
])
def test_errors_name_the_argument(call, kind, name):
    x, w, _, _ = _inputs(dtype=torch.float32)
    with pytest.raises(kind) as exc:
        call(x, w)
    _one_line(exc, name)


def test_public_names():
    assert linattn.causal_conv1d is causal_conv1d
    assert linattn.reference.causal_conv1d is ref.causal_conv1d


# ------------------------------------------------------------------------- torch.compile
_CXX = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
BACKEND = "inductor" if _CXX else "aot_eager"


@pytest.mark.parametrize("setting", ["1", "0"])
def test_compile_fullgraph_equals_eager(setting, monkeypatch):
    """The compiled kernels (LINATTN_NATIVE=1: ``linattn::conv_forward`` / ``conv_step`` in the
    graph) or the torch form (0), traced whole, equal to eager."""
    monkeypatch.setenv("LINATTN_NATIVE", setting)
    torch._dynamo.reset()
    dispatch._memo.clear()
    x, w, b, S0 = _inputs(B=2, T=10, D=24, dtype=torch.float32)

    def f(x, w, b, S0):
        y, S = causal_conv1d(x, w, b, activation="silu", initial_state=S0, return_state=True)
        y_t, S1 = causal_conv1d_step(y[:, -1] * 0.5, S, w, b, activation="silu")
        return y, y_t, S1

    graphs = []

    def backend(gm, inputs):
        graphs.append(str(gm.graph))
        return lookup_backend(BACKEND)(gm, inputs)

    try:
        want = f(x, w, b, S0)
        got = torch.compile(f, fullgraph=True, backend=backend)(x, w, b, S0)
    finally:
        torch._dynamo.reset()
        dispatch._memo.clear()
    for a, e in zip(got, want, strict=True):
        torch.testing.assert_close(a, e, rtol=0, atol=1e-5)
    kernels = setting == "1" and conv_native.kernels() is not None
    assert ("linattn.conv_forward" in graphs[0]) == kernels, graphs[0]
    assert ("linattn.conv_step" in graphs[0]) == kernels


def test_meta_inputs_give_meta_outputs():
    # issue 51 probe: meta cu_seqlens raised NotImplementedError; a meta cu_seqlens with CPU
    # inputs (nothing to read) is one ValueError naming it
    m = {"device": "meta"}
    x, w = torch.empty(1, 8, 4, **m), torch.empty(4, 3, **m)
    cu = torch.tensor([0, 3, 8])
    y, S = causal_conv1d(x, w, cu_seqlens=cu.to("meta"), return_state=True)
    assert y.is_meta and y.shape == (1, 8, 4) and S.is_meta and S.shape == (2, 4, 2)
    y, S = causal_conv1d_step(x[:, 0], torch.empty(1, 4, 2, **m), w, inplace=True)
    assert y.is_meta and S.is_meta
    with pytest.raises(ValueError, match="^cu_seqlens: .*meta"):
        causal_conv1d(torch.randn(1, 8, 4), torch.randn(4, 3), cu_seqlens=cu.to("meta"))
