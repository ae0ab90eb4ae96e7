"""The compiled short convolution (ops/conv/native.py, ``la_conv_forward`` / ``la_conv_step`` in
ops/conv/kernels.c) against the float64 reference and the torch form: every width path (the
register-blocked 2-4, the generic wider one, the history of the first tokens), channels not a
multiple of any vector width, the three dtypes and mixed ones, strided layouts, packed
sequences, the step's dense and strided state layouts, threads, the custom ops."""

from __future__ import annotations

import pytest
import torch

from linattn import causal_conv1d, causal_conv1d_step, fla
from linattn.ops import dispatch
from linattn.ops import reference as ref
from linattn.ops.conv import native as conv_native
from linattn.ops.conv import op as conv_op

pytestmark = [
    pytest.mark.usefixtures("single_thread"),
    pytest.mark.skipif(conv_native.unavailable() is not None,
                       reason=f"compiled convolution: {conv_native.unavailable()}"),
]

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16


@pytest.fixture
def native_calls(monkeypatch):
    """Force the compiled backend; count the prefill calls that really ran the kernel."""
    calls = []
    real = conv_native._forward
    monkeypatch.setattr(conv_native, "_forward", lambda *a: calls.append(1) or real(*a))
    with dispatch.use(impl="native"):
        yield calls


def _inputs(B, T, D, W, dtype=F32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, D, generator=gen).to(dtype)
    w = (torch.randn(D, W, generator=gen) * 0.6).to(dtype)
    b = torch.randn(D, generator=gen).to(dtype)
    S0 = torch.randn(B, D, W - 1, generator=gen).to(dtype)
    return x, w, b, S0


def _close(got, want, dtype, ulps=4.0):
    """Within ``ulps`` unit roundoffs of dtype at the size of the largest value: float32 sums of
    a few products, one rounding to dtype."""
    want = want.double()
    scale = max(want.abs().max().item(), 1.0) if want.numel() else 1.0
    assert got.shape == want.shape and got.dtype == dtype
    tol = ulps * torch.finfo(dtype).eps * scale
    torch.testing.assert_close(got.double(), want, rtol=0, atol=tol)


@pytest.mark.parametrize("W", [1, 2, 3, 4, 5, 9])
@pytest.mark.parametrize("T", [0, 1, 2, 3, 8, 9, 17, 70])
@pytest.mark.parametrize("D", [1, 37, 64])
@pytest.mark.parametrize("act", [None, "silu"])
def test_matches_reference(native_calls, W, T, D, act):
    x, w, b, S0 = _inputs(2, T, D, W)
    bias = b if (T + D) % 2 else None
    want, want_S = ref.causal_conv1d(x, w, bias, activation=act, initial_state=S0)
    y, S = causal_conv1d(x, w, bias, activation=act, initial_state=S0, return_state=True)
    assert native_calls
    _close(y, want, F32)
    torch.testing.assert_close(S, want_S.float(), rtol=0, atol=0)
    y0, S0z = causal_conv1d(x, w, bias, activation=act, return_state=True)
    want0, want0_S = ref.causal_conv1d(x, w, bias, activation=act)
    _close(y0, want0, F32)
    torch.testing.assert_close(S0z, want0_S.float(), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [BF16, F16])
@pytest.mark.parametrize("W", [3, 4, 6])
def test_half_dtypes_round_once(native_calls, dtype, W):
    """bfloat16 / float16 read and written by the kernel: sums in float32, one rounding."""
    x, w, b, S0 = _inputs(3, 21, 45, W, dtype)
    want, want_S = ref.causal_conv1d(x, w, b, activation="silu", initial_state=S0)
    y, S = causal_conv1d(x, w, b, activation="silu", initial_state=S0, return_state=True)
    _close(y, want, dtype, ulps=1.0)
    assert S.dtype == dtype and torch.equal(S, want_S.to(dtype))
    with dispatch.use(impl="portable"):
        y_t = causal_conv1d(x, w, b, activation="silu", initial_state=S0)
    _close(y, y_t.double(), dtype, ulps=1.0)


def test_mixed_dtypes(native_calls):
    """Weights, bias and states in their own dtypes (float32 weights of a bfloat16 model, a
    float64 bias, a bfloat16 state of a float32 model): read as they are."""
    x, w, b, S0 = _inputs(2, 19, 40, 4, BF16)
    w32, b64, S32 = w.float() * 1.001, b.double(), S0.float() * 0.9
    want = ref.causal_conv1d(x, w32, b64, activation="silu", initial_state=S32)[0]
    y = causal_conv1d(x, w32, b64, activation="silu", initial_state=S32)
    _close(y, want, BF16, ulps=1.0)
    xf = x.float()
    want = ref.causal_conv1d(xf, w, b, initial_state=S0)[0]
    _close(causal_conv1d(xf, w, b, initial_state=S0), want, F32)


def test_a_transposed_projection_reaches_the_kernel_without_a_copy(monkeypatch):
    """x (B, T, D) as ``h.transpose(1, 2)`` of the (B, D, T) view of a contiguous (B, T, D)
    projection: the kernel reads the projection's own memory."""
    seen = []
    real = conv_native._forward
    monkeypatch.setattr(conv_native, "_forward",
                        lambda fns, x, *a: seen.append(x.data_ptr()) or real(fns, x, *a))
    proj = torch.randn(2, 30, 48)
    mixed = proj.transpose(1, 2)  # (B, D, T), as the layers hold it
    w = torch.randn(48, 4)
    with dispatch.use(impl="native"):
        causal_conv1d(mixed.transpose(1, 2), w, activation="silu")
        fla.causal_conv1d_fn(mixed, w, activation="silu")
    assert seen == [proj.data_ptr(), proj.data_ptr()]


def test_strided_layouts(native_calls):
    x, w, b, S0 = _inputs(3, 33, 50, 4)
    want = ref.causal_conv1d(x, w, b, activation="silu", initial_state=S0)[0]
    big = torch.zeros(4, 67, 60)
    big[1:, 1::2, 5:55] = x
    w_t = torch.zeros(4, 60)
    w_t[:, 3:53] = w.t()
    state = torch.zeros(3, 2, 50, 5)
    state[:, 1, :, 1:4] = S0
    for xv in (big[1:, 1::2, 5:55], x.transpose(1, 2).contiguous().transpose(1, 2)):
        y = causal_conv1d(xv, w_t[:, 3:53].t(), b, activation="silu",
                          initial_state=state[:, 1, :, 1:4])
        _close(y, want, F32)


@pytest.mark.parametrize("with_states", [False, True])
def test_packed_sequences(native_calls, with_states):
    lengths = [0, 7, 1, 2, 30, 0, 5]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    x, w, b, _ = _inputs(1, int(cu[-1]), 41, 4)
    S0 = torch.randn(len(lengths), 41, 3) if with_states else None
    y, S = causal_conv1d(x, w, b, activation="silu", initial_state=S0, return_state=True,
                         cu_seqlens=cu)
    want, want_S = ref.causal_conv1d(x, w, b, activation="silu", initial_state=S0,
                                     cu_seqlens=cu)
    _close(y, want, F32)
    torch.testing.assert_close(S, want_S.float(), rtol=0, atol=0)


@pytest.mark.parametrize("packed", [False, True])
def test_parts_on_threads_equal_one_call(native_calls, monkeypatch, packed):
    """Channel blocks and rows (or segments) in parallel parts: the same bits as one call."""
    B = 1 if packed else 5
    x, w, b, S0 = _inputs(B, 40, 200, 4)
    cu = torch.tensor([0, 3, 3, 20, 33, 40]) if packed else None
    if packed:
        S0 = torch.randn(5, 200, 3)
    one = causal_conv1d(x, w, b, activation="silu", initial_state=S0, return_state=True,
                        cu_seqlens=cu)
    monkeypatch.setattr(conv_native, "threads_for", lambda work, parts, m: min(parts, 3))
    many = causal_conv1d(x, w, b, activation="silu", initial_state=S0, return_state=True,
                         cu_seqlens=cu)
    for a, e in zip(many, one, strict=True):
        assert torch.equal(a, e)
    jobs = conv_native._jobs(200, 5, 3)
    covered = sorted((c0, c1, r0, r1) for c0, c1, r0, r1 in jobs)
    assert sum((c1 - c0) * (r1 - r0) for c0, c1, r0, r1 in covered) == 200 * 5


# ------------------------------------------------------------------------------ the step
@pytest.mark.parametrize("dtype", [F32, BF16, F16])
@pytest.mark.parametrize("W, S", [(4, 4), (4, 3), (4, 6), (3, 2), (2, 2), (5, 5), (1, 0)])
@pytest.mark.parametrize("dense", [True, False])
def test_step_matches_reference(dtype, W, S, dense):
    """The dense layout (contiguous state rows and weights, one dtype) and any other: strided
    states and weights go through the general loop."""
    D = 45
    x, w, b, _ = _inputs(3, 6, D, W, dtype)
    state0 = torch.randn(3, D, S).to(dtype)
    if dense:
        state, wv = state0.clone(), w
    else:
        state = torch.zeros(3, D, S + 2, dtype=dtype)[..., 1:S + 1]
        state.copy_(state0)
        wv = w.t().contiguous().t()
    with dispatch.use(impl="native"):
        outs = []
        for t in range(6):
            y, new = causal_conv1d_step(x[:, t], state, wv, b, activation="silu",
                                        inplace=bool(t % 2))
            outs.append(y)
            state = new
    want, want_S = ref.causal_conv1d(x, w, b, activation="silu",
                                     initial_state=state0[..., S - (W - 1):])
    _close(torch.stack(outs, 1), want, dtype, ulps=1.0 if dtype != F32 else 4.0)
    assert torch.equal(state[..., S - (W - 1):], want_S.to(dtype))
    if S > W - 1:  # the older columns: the inputs before them, shifted along
        full = torch.cat([state0, x.transpose(1, 2)], -1)[..., -S:]
        assert torch.equal(state, full)


def test_lean_step_takes_the_kernel(monkeypatch):
    """The decoding step of a model goes straight to the kernel (no custom op, no general
    checks), in place or not."""
    x, w, b, _ = _inputs(1, 1, 64, 4)
    state = torch.randn(1, 64, 4)
    with dispatch.use(impl="native"):
        out = conv_op.lean_step(x[:, 0], state, w, b, "silu", True)
        assert out is not None and out[1] is state
        assert conv_op.lean_step(x[:, 0], state, w, b, "silu", False)[1] is not state
        monkeypatch.setattr(conv_native, "conv_step_native",
                            lambda *a: pytest.fail("the lean path was not taken"))
        causal_conv1d_step(x[:, 0], state, w, b, activation="silu", inplace=True)
        fla.causal_conv1d_update(x[:, 0], state, w, b, "silu")


def test_step_batch_on_threads(monkeypatch):
    x, w, b, _ = _inputs(7, 1, 33, 4)
    state = torch.randn(7, 33, 4)
    with dispatch.use(impl="native"):
        want = causal_conv1d_step(x[:, 0], state, w, b, activation="silu")
        monkeypatch.setattr(conv_native, "threads_for", lambda work, parts, m: min(parts, 3))
        monkeypatch.setattr(conv_op, "threads_for", lambda work, parts, m: min(parts, 3))
        got = causal_conv1d_step(x[:, 0], state, w, b, activation="silu")
    for a, e in zip(got, want, strict=True):
        assert torch.equal(a, e)


# ------------------------------------------------------------------------ the custom ops
def test_opcheck():
    x, w, b, S0 = _inputs(2, 11, 24, 4)
    torch.library.opcheck(torch.ops.linattn.conv_forward.default,
                          (x, w, b, S0, None, True, "native"))
    segs = conv_op.segments(torch.tensor([0, 4, 11]))
    torch.library.opcheck(torch.ops.linattn.conv_forward.default,
                          (x[:1], w, None, None, segs, False, "native"))
    torch.library.opcheck(torch.ops.linattn.conv_step.default,
                          (x[:, 0], torch.randn(2, 24, 4), w, b, True, "native"))


def test_the_ops_compute_the_same_function_without_kernels(monkeypatch):
    """Where no compiled library loads (an exported program on a machine without a compiler)
    the ops compute the same function with torch."""
    x, w, b, S0 = _inputs(2, 11, 24, 4)
    state = torch.randn(2, 24, 4)
    want = conv_native.conv_prefill_native(x, w, b, S0, None, True, "native")
    want_step = conv_native.conv_step_native(x[:, 0], state, w, b, True, "native")
    monkeypatch.setattr(conv_native, "kernels", lambda isa="native": None)
    got = conv_native.conv_prefill_native(x, w, b, S0, None, True, "native")
    got_step = conv_native.conv_step_native(x[:, 0], state, w, b, True, "native")
    for a, e in zip([*got, *got_step], [*want, *want_step], strict=True):
        torch.testing.assert_close(a, e, rtol=0, atol=1e-5)
