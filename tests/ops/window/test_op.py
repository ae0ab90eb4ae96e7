"""Sliding-window + linear hybrid: chunked form, recurrent step and quadratic reference agree."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import linattn
from linattn import (
    WindowLinearAttentionState,
    window_linear_attention,
    window_linear_attention_step,
)
from linattn.ops.reference import window_linear_attention as reference

F64 = torch.float64


def _qkv(B=2, H=3, T=19, D=4, Dv=3, seed=0, dtype=F64, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return tuple((torch.randn(B, H, T, d, generator=g, dtype=F64) * s).to(dtype)
                 for d, s in ((D, scale), (D, scale), (Dv, 1.0)))


def _naive(q, k, v, w, is_causal, keep=None, phi=lambda x: 1 + F.elu(x)):
    """The issue's formula as written, unstabilised: exp(s) in the window, φ(q)·φ(k) out."""
    T = q.shape[-2]
    s = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).exp()
    kern = phi(q) @ phi(k).transpose(-1, -2)
    i = torch.arange(T)
    lag = i[:, None] - i[None, :]
    near = (lag >= 0) & (lag < w) if is_causal else lag.abs() < w
    far = lag >= w if is_causal else lag.abs() >= w
    W = torch.where(near, s, torch.where(far, kern, 0.0))
    if keep is not None:
        W = W * keep
    return W @ v / W.sum(-1, keepdim=True)


def _steps(q, k, v, state, w, **kw):
    outs = []
    for t in range(q.shape[-2]):
        o, state = window_linear_attention_step(q[..., t, :], k[..., t, :], v[..., t, :], state,
                                                window=w, **kw)
        outs.append(o)
    return torch.stack(outs, -2), state


@pytest.mark.parametrize("is_causal", [True, False])
@pytest.mark.parametrize("w", [1, 3, 8, 30])
@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_chunked_matches_reference(is_causal, w, chunk):
    q, k, v = _qkv()
    for fmap in ("elu", "relu", "taylor"):
        want = reference(q, k, v, window=w, feature_map=fmap, is_causal=is_causal)
        got = window_linear_attention(q, k, v, window=w, feature_map=fmap, is_causal=is_causal,
                                      chunk_size=chunk)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("is_causal", [True, False])
@pytest.mark.parametrize("w", [1, 4, 19])
def test_reference_is_the_issue_formula(is_causal, w):
    """The stabilised reference equals the formula without any max subtracted."""
    q, k, v = _qkv(T=13)
    torch.testing.assert_close(reference(q, k, v, window=w, is_causal=is_causal),
                               _naive(q, k, v, w, is_causal), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("is_causal", [True, False])
def test_window_covering_everything_is_softmax_attention(is_causal):
    q, k, v = _qkv(T=11)
    sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    for w in (11, 50):
        got = window_linear_attention(q, k, v, window=w, is_causal=is_causal, chunk_size=4)
        torch.testing.assert_close(got, sdpa, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("is_causal", [True, False])
def test_key_padding_mask(is_causal):
    """Padded keys are absent from every sum, whatever they hold (nan, inf); their gradient is
    0; a row whose keys are all padded (causal row 0 with key 0 padded) gives zeros."""
    q, k, v = _qkv(B=2, T=17)
    mask = torch.rand(2, 17, generator=torch.Generator().manual_seed(5)) < 0.3
    mask[0, 0] = True
    keep = ~mask[:, None, None, :]
    want = reference(q, k, v, window=4, is_causal=is_causal, key_padding_mask=mask)
    torch.testing.assert_close(want, _naive(q, k, v, 4, is_causal, keep).nan_to_num(0.0),
                               rtol=1e-12, atol=1e-12)
    k2, v2 = k.clone(), v.clone()
    pad = mask[:, None, :, None].expand_as(k2)
    k2[pad], v2[mask[:, None, :, None].expand_as(v2)] = float("nan"), float("inf")
    k2.requires_grad_(True)
    got = window_linear_attention(q, k2, v2, window=4, is_causal=is_causal,
                                  key_padding_mask=mask, chunk_size=5)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    if is_causal:
        assert (got[0, :, 0] == 0).all()
    got.sum().backward()
    assert (k2.grad[pad] == 0).all() and torch.isfinite(k2.grad).all()


@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("is_causal", [True, False])
def test_extreme_scores(sign, dtype, is_causal):
    """Scores of ±1e4: the naive formula overflows or underflows, the op does neither and
    agrees with the float64 reference on the same (rounded) inputs. The limits: +1e4 is the
    softmax of the window; −1e4 is linear attention over the far keys where a row has some,
    the window softmax where it has none (the first w tokens). The 1+relu map keeps the far
    kernel O(1) for keys of −70 (1+elu would round it to 0)."""
    w = 3
    phi = lambda x: 1 + F.relu(x)  # noqa: E731
    q, k, v = _qkv(B=1, H=2, T=12, D=4, seed=7, dtype=dtype)
    u = q.new_ones(q.shape) * math.sqrt(5e3)  # q·k/√D ≈ 10⁴·sign for every pair, ± hundreds
    q, k = u + q, sign * u + k
    kw = dict(window=w, is_causal=is_causal, feature_map="relu")
    out = window_linear_attention(q, k, v, chunk_size=5, **kw)
    want = reference(q.double(), k.double(), v.double(), **kw)
    assert out.dtype == dtype and torch.isfinite(out).all() and torch.isfinite(want).all()
    tol = 1e-9 if dtype == F64 else 1e-4
    torch.testing.assert_close(out.double(), want, rtol=tol, atol=tol)
    naive = _naive(q.double(), k.double(), v.double(), w, is_causal, phi=phi)
    if sign > 0 or is_causal:  # exp overflows, or a row's only terms underflow to 0/0
        assert not torch.isfinite(naive).all()
    qd, kd, vd = q.double(), k.double(), v.double()
    i = torch.arange(12)
    lag = i[:, None] - i[None, :]
    near = (lag >= 0) & (lag < w) if is_causal else lag.abs() < w
    far = lag >= w if is_causal else lag.abs() >= w
    window_softmax = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=near)
    if sign > 0:
        torch.testing.assert_close(want, window_softmax, rtol=1e-12, atol=1e-12)
    else:
        kern = (phi(qd) @ phi(kd).transpose(-1, -2)) * far
        has_far = far.any(-1)[:, None]
        lin = (kern @ vd) / kern.sum(-1, keepdim=True).clamp(min=1e-300)
        assert (kern.sum(-1)[..., has_far[:, 0]] > 1).all()  # the far part is not negligible
        torch.testing.assert_close(want, torch.where(has_far, lin, window_softmax),
                                   rtol=1e-12, atol=1e-12)


def test_very_negative_window_scores_without_far_keys_are_the_window_softmax():
    """A first token whose only score is −200: e^−200 underflows in float32, yet the row is
    v_0 (a max clamped at 0 would give a zero row)."""
    q = torch.full((1, 2, 4), 10.0)
    k = torch.full((1, 2, 4), -10.0)
    v = torch.randn(1, 2, 3)
    out = window_linear_attention(q, k, v, window=4)
    torch.testing.assert_close(out[:, 0], v[:, 0])
    o, _ = window_linear_attention_step(q[:, 0], k[:, 0], v[:, 0],
                                        WindowLinearAttentionState.zeros((1,), 4, 4, 3, 4),
                                        window=4)
    torch.testing.assert_close(o, v[:, 0])


@pytest.mark.parametrize("w", [1, 3, 8, 40])
def test_prefill_then_steps_equal_whole(w):
    q, k, v = _qkv(T=23)
    whole, final = window_linear_attention(q, k, v, window=w, chunk_size=4, return_state=True)
    for split in (0, 1, 7, 16):
        a, st = window_linear_attention(q[..., :split, :], k[..., :split, :],
                                        v[..., :split, :], window=w, chunk_size=4,
                                        return_state=True)
        b, st = _steps(q[..., split:, :], k[..., split:, :], v[..., split:, :], st, w)
        torch.testing.assert_close(torch.cat([a, b], -2), whole, rtol=1e-12, atol=1e-12)
        for part in ("S", "z", "k", "v"):
            torch.testing.assert_close(getattr(st, part), getattr(final, part),
                                       rtol=1e-12, atol=1e-12)
        assert st.count == final.count == 23


@pytest.mark.parametrize("w", [1, 4, 9, 40])
def test_prefill_then_prefill_equals_whole(w):
    q, k, v = _qkv(T=21)
    whole = window_linear_attention(q, k, v, window=w, chunk_size=3)
    st = None
    outs = []
    for t0, t1 in ((0, 2), (2, 9), (9, 10), (10, 21)):
        o, st = window_linear_attention(q[..., t0:t1, :], k[..., t0:t1, :], v[..., t0:t1, :],
                                        window=w, chunk_size=3, initial_state=st,
                                        return_state=True)
        outs.append(o)
    torch.testing.assert_close(torch.cat(outs, -2), whole, rtol=1e-12, atol=1e-12)


def test_steps_from_the_empty_state_equal_whole():
    q, k, v = _qkv(T=15)
    st = WindowLinearAttentionState.zeros((2, 3), 4, 4, 3, 5, dtype=F64)
    got, st = _steps(q, k, v, st, 5, feature_map="relu")
    torch.testing.assert_close(got, reference(q, k, v, window=5, feature_map="relu"),
                               rtol=1e-12, atol=1e-12)
    assert st.count == 15


def test_state_is_constant_size():
    sizes = set()
    for T in (1, 5, 50):
        q, k, v = _qkv(T=T)
        _, st = window_linear_attention(q, k, v, window=6, return_state=True)
        sizes.add(tuple(tuple(getattr(st, p).shape) for p in ("S", "z", "k", "v")))
    assert sizes == {((2, 3, 4, 3), (2, 3, 4), (2, 3, 6, 4), (2, 3, 6, 3))}


def test_old_state_is_untouched_by_a_step():
    q, k, v = _qkv(T=9)
    _, st = window_linear_attention(q, k, v, window=4, return_state=True)
    copies = [getattr(st, p).clone() for p in ("S", "z", "k", "v")]
    window_linear_attention_step(q[..., 0, :], k[..., 0, :], v[..., 0, :], st, window=4)
    for p, c in zip(("S", "z", "k", "v"), copies, strict=True):
        assert torch.equal(getattr(st, p), c)
    assert st.count == 9


@pytest.mark.parametrize("is_causal", [True, False])
@pytest.mark.parametrize("w", [1, 3, 30])
def test_gradients_match_reference(is_causal, w):
    q, k, v = _qkv(T=17)
    g = torch.randn(2, 3, 17, 3, generator=torch.Generator().manual_seed(1), dtype=F64)

    def grads(fn):
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
        return torch.autograd.grad(fn(*leaves), leaves, g)

    got = grads(lambda *a: window_linear_attention(*a, window=w, is_causal=is_causal,
                                                   chunk_size=4))
    want = grads(lambda *a: reference(*a, window=w, is_causal=is_causal))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("is_causal", [True, False])
def test_gradcheck(is_causal):
    q, k, v = (x.requires_grad_(True) for x in _qkv(B=1, H=2, T=6, D=2, Dv=2, seed=3))
    mask = torch.tensor([[False, False, True, False, False, False]])
    for m in (None, mask):
        assert torch.autograd.gradcheck(
            lambda *a, m=m: window_linear_attention(*a, window=2, is_causal=is_causal,
                                                    key_padding_mask=m, chunk_size=4),
            (q, k, v))


def test_gradcheck_through_the_state_and_the_step():
    q, k, v = (x.requires_grad_(True) for x in _qkv(B=1, H=2, T=7, D=2, Dv=2, seed=4))

    def f(q, k, v):
        a, st = window_linear_attention(q[..., :4, :], k[..., :4, :], v[..., :4, :], window=3,
                                        chunk_size=2, return_state=True)
        b, st = _steps(q[..., 4:, :], k[..., 4:, :], v[..., 4:, :], st, 3)
        return torch.cat([a, b], -2), st.S, st.k

    assert torch.autograd.gradcheck(f, (q, k, v))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_low_precision_inputs(dtype):
    q, k, v = (x.to(dtype) for x in _qkv(B=1, T=40, D=8, scale=3.0))
    out, st = window_linear_attention(q, k, v, window=5, chunk_size=16, return_state=True)
    want = reference(q.double(), k.double(), v.double(), window=5)
    assert out.dtype == dtype and torch.isfinite(out).all()
    assert st.S.dtype == torch.float32 and st.k.dtype == dtype
    tol = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 3e-2}[dtype]
    torch.testing.assert_close(out.double(), want, rtol=tol, atol=tol)


def test_unbatched_inputs():
    q, k, v = (x[0, 0] for x in _qkv(T=10))
    mask = torch.zeros(10, dtype=torch.bool)
    mask[3] = True
    for causal in (True, False):
        torch.testing.assert_close(
            window_linear_attention(q, k, v, window=3, is_causal=causal, key_padding_mask=mask),
            reference(q, k, v, window=3, is_causal=causal, key_padding_mask=mask),
            rtol=1e-10, atol=1e-10)


def test_empty_sequence():
    q, k, v = _qkv(T=0)
    out, st = window_linear_attention(q, k, v, window=3, return_state=True)
    assert out.shape == (2, 3, 0, 3) and st.count == 0 and (st.S == 0).all()
    assert reference(q, k, v, window=3).shape == (2, 3, 0, 3)
    assert window_linear_attention(q, k, v, window=3, is_causal=False).shape == (2, 3, 0, 3)
    q1, k1, v1 = _qkv(T=5)
    _, st = window_linear_attention(q1, k1, v1, window=3, return_state=True)
    out, st2 = window_linear_attention(q, k, v, window=3, initial_state=st, return_state=True)
    assert out.shape == (2, 3, 0, 3) and st2.count == st.count
    for part in ("S", "z", "k", "v"):  # the same values in new tensors (issue 24)
        a, b = getattr(st2, part), getattr(st, part)
        assert torch.equal(a, b)
        assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()


@pytest.mark.parametrize("call", [
    lambda q, k, v: window_linear_attention(q, k, v, window=3),
    lambda q, k, v: window_linear_attention(q, k, v, window=3, is_causal=False),
    lambda q, k, v: window_linear_attention(q, k, v, window=3, return_state=True)[0],
    lambda q, k, v: reference(q, k, v, window=3),
], ids=["causal", "non-causal", "return_state", "reference"])
def test_empty_sequence_output_is_on_the_graph(call):
    """T = 0 with inputs that require grad: the empty output does too, as the other ops' do
    (issue 51: it was a detached tensor, so ``out.sum().backward()`` raised)."""
    q, k, v = (x.requires_grad_(True) for x in _qkv(T=0))
    out = call(q, k, v)
    assert out.shape == (2, 3, 0, 3) and out.requires_grad
    out.sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape


@pytest.mark.parametrize("window", [0, -1, 1.5, True, "4", None])
def test_bad_window_raises(window):
    q, k, v = _qkv()
    calls = [
        lambda: window_linear_attention(q, k, v, window=window),
        lambda: reference(q, k, v, window=window),
        lambda: window_linear_attention_step(
            q[..., 0, :], k[..., 0, :], v[..., 0, :],
            WindowLinearAttentionState.zeros((2, 3), 4, 4, 3, 2, dtype=F64), window=window),
    ]
    for call in calls:
        with pytest.raises(ValueError, match="^window: expected a positive integer"):
            call()


def test_bad_arguments_raise():
    q, k, v = _qkv()
    st = WindowLinearAttentionState.zeros((2, 3), 4, 4, 3, 5, dtype=F64)
    with pytest.raises(ValueError, match="^initial_state/return_state: only defined"):
        window_linear_attention(q, k, v, window=2, is_causal=False, return_state=True)
    with pytest.raises(ValueError, match="^key_padding_mask: not supported"):
        window_linear_attention(q, k, v, window=2, return_state=True,
                                key_padding_mask=torch.zeros(2, 19, dtype=torch.bool))
    with pytest.raises(ValueError, match="^initial_state: expected shapes"):
        window_linear_attention(q, k, v, window=2, initial_state=st)  # window 5 in the state
    with pytest.raises(TypeError, match="^state: expected a WindowLinearAttentionState"):
        window_linear_attention_step(q[..., 0, :], k[..., 0, :], v[..., 0, :],
                                     linattn.LinearAttentionState.zeros((2, 3), 4, 3), window=5)
    with pytest.raises(TypeError, match="^state: expected count"):
        window_linear_attention_step(q[..., 0, :], k[..., 0, :], v[..., 0, :],
                                     WindowLinearAttentionState(st.S, st.z, st.k, st.v, -1),
                                     window=5)
    with pytest.raises(ValueError, match="^k: window attention needs as many keys"):
        window_linear_attention(q, k[..., :5, :], v[..., :5, :], window=2, is_causal=False)
    with pytest.raises(ValueError, match="^chunk_size: expected a positive integer"):
        window_linear_attention(q, k, v, window=2, chunk_size=0)
    meta = WindowLinearAttentionState(*(torch.zeros_like(t, device="meta")
                                        for t in (st.S, st.z, st.k, st.v)), 0)
    with pytest.raises(ValueError, match="^state: expected S on the inputs' device"):
        window_linear_attention_step(q[..., 0, :], k[..., 0, :], v[..., 0, :], meta, window=5)


@pytest.mark.parametrize("eps", [float("nan"), float("inf"), -1e-6])
def test_bad_eps_raises_everywhere(eps):
    q, k, v = _qkv()
    st = WindowLinearAttentionState.zeros((2, 3), 4, 4, 3, 2, dtype=F64)
    for call in (
        lambda: window_linear_attention(q, k, v, window=2, eps=eps),
        lambda: reference(q, k, v, window=2, eps=eps),
        lambda: window_linear_attention_step(q[..., 0, :], k[..., 0, :], v[..., 0, :], st,
                                             window=2, eps=eps),
    ):
        with pytest.raises(ValueError, match="^eps: expected a finite number >= 0"):
            call()


def test_eps_enters_the_normaliser_unscaled():
    """ε is part of the function: o = N / (D + ε), whatever the stabilising max was."""
    q, k, v = _qkv(T=9, scale=4.0)
    for causal in (True, False):
        got = window_linear_attention(q, k, v, window=2, is_causal=causal, eps=0.5)
        torch.testing.assert_close(got, reference(q, k, v, window=2, is_causal=causal, eps=0.5),
                                   rtol=1e-10, atol=1e-10)
        s = (q @ k.transpose(-1, -2) / 2).exp()
        kern = (1 + F.elu(q)) @ (1 + F.elu(k)).transpose(-1, -2)
        i = torch.arange(9)
        lag = i[:, None] - i[None, :]
        near = (lag >= 0) & (lag < 2) if causal else lag.abs() < 2
        far = lag >= 2 if causal else lag.abs() >= 2
        W = torch.where(near, s, torch.where(far, kern, 0.0))
        torch.testing.assert_close(got, W @ v / (W.sum(-1, keepdim=True) + 0.5),
                                   rtol=1e-10, atol=1e-10)


def test_keyword_only_and_shared_defaults():
    q, k, v = _qkv()
    st = WindowLinearAttentionState.zeros((2, 3), 4, 4, 3, 2, dtype=F64)
    with pytest.raises(TypeError):
        window_linear_attention(q, k, v, 2)
    with pytest.raises(TypeError):
        reference(q, k, v, 2)
    with pytest.raises(TypeError):
        window_linear_attention_step(q[..., 0, :], k[..., 0, :], v[..., 0, :], st, 2)
    op, ref = inspect.signature(window_linear_attention), inspect.signature(reference)
    for name, p in ref.parameters.items():
        assert op.parameters[name].default == p.default, name
        assert op.parameters[name].kind == p.kind, name


@pytest.mark.parametrize("is_causal", [True, False])
def test_window_longer_than_any_sequence(is_causal):
    """A window of 10**30 is softmax attention, as any w >= T is (it overflowed a tensor
    comparison): the op and the reference take any positive integer."""
    q, k, v = _qkv(T=7)
    want = window_linear_attention(q, k, v, window=7, is_causal=is_causal)
    for w in (8, 2 ** 63, 10 ** 30):
        torch.testing.assert_close(window_linear_attention(q, k, v, window=w, is_causal=is_causal),
                                   want, rtol=0, atol=0)
        torch.testing.assert_close(reference(q, k, v, window=w, is_causal=is_causal), want)


def test_state_window_has_a_stated_bound():
    """A state keeps a ring buffer of ``window`` keys: windows above the stated bound are a
    ValueError naming ``window``, not an overflow inside torch."""
    from linattn.ops.window.op import MAX_STATE_WINDOW

    q, k, v = _qkv(T=3)
    huge = 10 ** 30
    match = rf"^window: a state keeps the last `window` keys: expected at most " \
            rf"{MAX_STATE_WINDOW}, got {huge}$"
    st = WindowLinearAttentionState.zeros((2, 3), 4, 4, 3, 2, dtype=F64)
    calls = [
        lambda: WindowLinearAttentionState.zeros((2, 3), 4, 4, 3, huge),
        lambda: window_linear_attention(q, k, v, window=huge, return_state=True),
        lambda: window_linear_attention(q[..., :0, :], k[..., :0, :], v[..., :0, :],
                                        window=huge, return_state=True),
        lambda: window_linear_attention(q, k, v, window=huge, initial_state=st),
        lambda: window_linear_attention_step(q[..., 0, :], k[..., 0, :], v[..., 0, :], st,
                                             window=huge),
    ]
    for call in calls:
        with pytest.raises(ValueError, match=match):
            call()


@pytest.mark.parametrize("window", [np.int64(3), np.int32(3)])
def test_numpy_window(window):
    q, k, v = _qkv(T=6)
    torch.testing.assert_close(window_linear_attention(q, k, v, window=window),
                               window_linear_attention(q, k, v, window=3), rtol=0, atol=0)
