"""The compiled forward of the (gated) delta rule (ops/delta/native.py, ``la_gdr_forward`` in
ops/delta/kernels.c) against the torch chunked path and the float64 sequential reference.

The compiled path is forced (``dispatch.use(impl="native")``) and each test checks that it was
really taken; the torch chunked path runs under ``impl="torch"``."""

from __future__ import annotations

import math
import threading
import warnings

import pytest
import torch

from linattn.ops import dispatch, native
from linattn.ops import reference as ref
from linattn.ops.delta import native as delta_native
from linattn.ops.delta.op import delta_rule, delta_rule_step

pytestmark = pytest.mark.skipif(
    delta_native.unavailable() is not None,
    reason=f"compiled delta rule: {delta_native.unavailable()}",
)


@pytest.fixture
def native_calls(monkeypatch):
    """Force the compiled path; count the prefill and step calls that really took it (the
    step: its kernel call, step_into, which the lean path and the custom op both make)."""
    calls = {"prefill": 0, "step": 0}
    real_prefill, real_step = delta_native.delta_rule_native, delta_native.step_into

    def prefill(*a, **kw):
        calls["prefill"] += 1
        return real_prefill(*a, **kw)

    def step(*a, **kw):
        calls["step"] += 1
        return real_step(*a, **kw)

    monkeypatch.setattr(delta_native, "delta_rule_native", prefill)
    monkeypatch.setattr(delta_native, "step_into", step)
    with dispatch.use(impl="native"):
        yield calls


def _inputs(*batch, T, K, V, gated=True, l2norm=True, seed=0):
    """q, k, v, beta, g. Without qk_l2norm the keys get norms near 1 (a contraction for
    beta in (0, 1), as the normalised models have), so that the reference stays bounded."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(*batch, T, K, generator=gen)
    k = torch.randn(*batch, T, K, generator=gen)
    if not l2norm:
        q, k = q / math.sqrt(K), k / math.sqrt(K)
    v = torch.randn(*batch, T, V, generator=gen)
    beta = torch.rand(*batch, T, generator=gen)
    g = -torch.rand(*batch, T, generator=gen) * 0.5 if gated else None
    return q, k, v, beta, g


def _close(got, want, tol=3e-5):
    """max |got - want| within ``tol`` of want's largest magnitude (float32 rounding)."""
    got, want = got.double(), want.double()
    scale = max(want.abs().max().item(), 1e-3) if want.numel() else 1.0
    err = (got - want).abs().max().item() / scale if want.numel() else 0.0
    if not err <= tol:
        pytest.fail(f"relative error {err:.2e} > {tol:.0e} (shape {tuple(want.shape)})")


def _reference(q, k, v, beta, g, S0=None, l2norm=True, scale=None):
    d = lambda x: None if x is None else x.double()  # noqa: E731
    return ref.delta_rule(d(q), d(k), d(v), d(beta), d(g), scale=scale, initial_state=d(S0),
                          qk_l2norm=l2norm)


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("l2norm", [False, True])
@pytest.mark.parametrize(
    "batch, T, K, V, C",
    [((2, 3), 37, 16, 32, 16),  # odd T, several chunks, a partial last one
     ((1, 2), 5, 32, 16, 64),  # T < C
     ((1, 16), 130, 64, 64, None),  # the benchmark's heads, B·H > threads, > 2 token chunks
     ((3,), 70, 20, 48, 8)],  # K not a multiple of any vector width, V = 3 blocks of 16
)
def test_matches_torch_and_reference(native_calls, gated, l2norm, batch, T, K, V, C):
    q, k, v, beta, g = _inputs(*batch, T=T, K=K, V=V, gated=gated, l2norm=l2norm)
    S0 = torch.randn(*batch, K, V, generator=torch.Generator().manual_seed(5)) * 0.3
    want_o, want_S = _reference(q, k, v, beta, g, S0, l2norm)
    o, S = delta_rule(q, k, v, beta, g, initial_state=S0, return_state=True, chunk_size=C,
                      qk_l2norm=l2norm)
    assert native_calls["prefill"] == 1
    with dispatch.use(impl="torch"):
        o_t, S_t = delta_rule(q, k, v, beta, g, initial_state=S0, return_state=True,
                              chunk_size=C, qk_l2norm=l2norm)
    assert native_calls["prefill"] == 1  # the torch path, not this one
    assert o.dtype == S.dtype == torch.float32 and o.shape == want_o.shape
    for got in (o, o_t):
        _close(got, want_o)
    for got in (S, S_t):
        _close(got, want_S)


@pytest.mark.parametrize("gated", [False, True])
def test_without_initial_state_and_custom_scale(native_calls, gated):
    q, k, v, beta, g = _inputs(2, 2, T=45, K=16, V=16, gated=gated)
    o, S = delta_rule(q, k, v, beta, g, scale=0.7, return_state=True, qk_l2norm=True)
    want_o, want_S = _reference(q, k, v, beta, g, scale=0.7)
    _close(o, want_o)
    _close(S, want_S)
    assert native_calls["prefill"] == 1


@pytest.mark.parametrize("gated", [False, True])
def test_prefill_then_continue_equals_whole(native_calls, gated):
    q, k, v, beta, g = _inputs(1, 3, T=150, K=32, V=32, gated=gated)
    whole, S_whole = delta_rule(q, k, v, beta, g, return_state=True, qk_l2norm=True)
    parts, S = [], None
    for t0, t1 in ((0, 1), (1, 67), (67, 64 + 67), (64 + 67, 150)):  # across token chunks
        o, S = delta_rule(q[..., t0:t1, :], k[..., t0:t1, :], v[..., t0:t1, :],
                          beta[..., t0:t1], None if g is None else g[..., t0:t1],
                          initial_state=S, return_state=True, qk_l2norm=True)
        parts.append(o)
    _close(torch.cat(parts, -2), whole, 1e-6)
    _close(S, S_whole, 1e-6)
    assert native_calls["prefill"] == 5


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("l2norm", [False, True])
def test_steps_equal_prefill(native_calls, gated, l2norm):
    """Token by token through delta_rule_step from an initial state: the prefill's outputs and
    state; the state passed in is never modified."""
    q, k, v, beta, g = _inputs(2, 3, T=20, K=16, V=32, gated=gated, l2norm=l2norm)
    S0 = torch.randn(2, 3, 16, 32, generator=torch.Generator().manual_seed(1)) * 0.3
    o_all, S_all = delta_rule(q, k, v, beta, g, initial_state=S0, return_state=True,
                              qk_l2norm=l2norm)
    S, outs = S0, []
    for t in range(20):
        before = S.clone()
        o, S_new = delta_rule_step(q[..., t, :], k[..., t, :], v[..., t, :], beta[..., t], S,
                                   g_t=None if g is None else g[..., t], qk_l2norm=l2norm)
        torch.testing.assert_close(S, before, rtol=0, atol=0)
        assert S_new.data_ptr() != S.data_ptr()
        outs.append(o)
        S = S_new
    _close(torch.stack(outs, -2), o_all, 1e-6)
    _close(S, S_all, 1e-6)
    want_o, want_S = _reference(q, k, v, beta, g, S0, l2norm)
    _close(S, want_S)
    _close(torch.stack(outs, -2), want_o)
    assert native_calls == {"prefill": 1, "step": 20}


def test_step_from_no_state_and_strided_inputs(native_calls):
    """state=None (zeros); q_t, k_t, v_t slices of (B, T, H, D) tensors (no contiguous rows
    between heads); bfloat16 inputs widened and the output rounded back."""
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 7, 4, 16, generator=gen) for _ in range(3))
    beta = torch.rand(2, 7, 4, generator=gen)
    g = -torch.rand(2, 7, 4, generator=gen)
    x = [q[:, 3], k[:, 3], v[:, 3]]  # (2, 4, 16) views with stride 64 between batches
    o, S = delta_rule_step(*x, beta[:, 3], g_t=g[:, 3], qk_l2norm=True)
    want_o, want_S = _reference(*(t.unsqueeze(-2) for t in x), beta[:, 3, :, None],
                                g[:, 3, :, None])
    _close(o, want_o.squeeze(-2))
    _close(S, want_S)
    ob, Sb = delta_rule_step(*(t.bfloat16() for t in x), beta[:, 3], g_t=g[:, 3],
                             qk_l2norm=True)
    assert ob.dtype == torch.bfloat16 and Sb.dtype == torch.float32
    want_b = _reference(*(t.bfloat16().unsqueeze(-2) for t in x), beta[:, 3, :, None],
                        g[:, 3, :, None])[0].squeeze(-2)
    _close(ob, want_b, 1e-2)
    assert native_calls["step"] == 2


@pytest.mark.parametrize("B, T", [(2, 50), (1, 50), (1, 150)])
def test_strided_prefill_inputs_and_bfloat16(native_calls, B, T):
    """q, k, v as transposed views of (B, T, H, D) tensors, beta and g of (B, T, H) ones (fla's
    layout; with B = 1 the kernel reads beta and g with a token stride of 3, in place), over one
    chunk and three; bfloat16 in, bfloat16 out."""
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(B, T, 3, 16, generator=gen).transpose(1, 2) for _ in range(3))
    beta = torch.rand(B, T, 3, generator=gen).transpose(1, 2)
    g = -torch.rand(B, T, 3, generator=gen).transpose(1, 2)
    o = delta_rule(q, k, v, beta, g, qk_l2norm=True)
    _close(o, _reference(q, k, v, beta, g)[0])
    ob = delta_rule(q.bfloat16(), k.bfloat16(), v.bfloat16(), beta, g, qk_l2norm=True)
    assert ob.dtype == torch.bfloat16
    _close(ob, _reference(q.bfloat16(), k.bfloat16(), v.bfloat16(), beta, g)[0], 1e-2)
    assert native_calls["prefill"] == 2


@pytest.mark.parametrize("gates", [None, 0.5, 4.0])
@pytest.mark.parametrize("l2norm", [False, True])
@pytest.mark.parametrize("T, K, V, G, layout", [(64, 64, 64, 1, "heads"), (150, 64, 64, 1, "fla"),
                                                (130, 32, 96, 2, "heads"), (70, 48, 32, 1, "heads"),
                                                (100, 64, 64, 1, "odd")])
def test_bfloat16_prefill_within_its_bound(native_calls, amx, bfloat16_rows, gates, l2norm, T,
                                           K, V, G, layout):
    """bfloat16 prefills from a state. On AMX tiles each whole 64 tokens run as two chunks of
    32 in the chunked form on bfloat16 products (chunk_dp in ops/native/tiles.h; K, V
    multiples of 32, no per-key gates, q's and k's rows 32-bit aligned: it reads them in place)
    and the tokens after the last whole 64 the widened recurrence; without tiles, at K = 48
    and on rows an odd number of elements apart (layout "odd") every token runs the widened
    recurrence. Against float64 on the same rounded inputs: within 8u of the largest output and
    state magnitude (u = 2⁻⁸, bfloat16's unit roundoff), the roundings along the chunked form's
    longest path: S into K~S (1; q and k enter their products as given, their scales in
    float32), the right-hand side and Tinv (2), U' (1), the output's operands (2) and the
    output itself (1). The widened recurrence rounds the output only. Log-gates in
    (-gates, 0]: at 0.5 a chunk decays by e^-16 at most (the decays taken as ratios of the
    chunk's cumulative ones), at 4 below 2^-100 (taken as exponentials of differences)."""
    gen = torch.Generator().manual_seed(7)
    H = 2
    q, k = (torch.randn(1, H, T, K, generator=gen) for _ in range(2))
    if not l2norm:
        q, k = q / math.sqrt(K), k / math.sqrt(K)
    v = torch.randn(1, G * H, T, V, generator=gen)
    beta, g = (torch.rand(1, T, G * H, generator=gen).transpose(1, 2) for _ in range(2))
    if layout != "fla":  # (fla's (B, T, H) gates are read in place)
        beta, g = beta.contiguous(), g.contiguous()
    g = -gates * g if gates else None
    S0 = 0.3 * torch.randn(1, G * H, K, V, generator=gen)
    qb, kb, vb = bfloat16_rows(layout, q, k, v)
    o, S = delta_rule(qb, kb, vb, beta, g, initial_state=S0, return_state=True,
                      qk_l2norm=l2norm)
    assert o.dtype == torch.bfloat16 and S.dtype == torch.float32 and native_calls["prefill"]
    want_o, want_S = _reference(qb, kb, vb, beta, g, S0, l2norm=l2norm)
    u = 2.0 ** -8
    _close(o, want_o, 8 * u)
    _close(S, want_S, 8 * u)


@pytest.mark.parametrize("heads, threads", [(1, 4), (3, 2), (5, 4), (2, 3)])
def test_threads_split_heads_and_columns(monkeypatch, native_calls, heads, threads):
    """Groups of heads in parallel, or (fewer heads than threads) a head's columns in blocks
    of 16: the same numbers as one thread, bit for bit."""
    monkeypatch.setattr(delta_native, "PARALLEL_MIN", 0)
    q, k, v, beta, g = _inputs(1, heads, T=70, K=16, V=64)
    results = []
    for n in (1, threads):
        monkeypatch.setattr(torch, "get_num_threads", lambda n=n: n)
        results.append(delta_rule(q, k, v, beta, g, return_state=True, qk_l2norm=True))
        results.append(delta_rule_step(q[..., 0, :], k[..., 0, :], v[..., 0, :],
                                       beta[..., 0], results[-1][1], g_t=g[..., 0]))
    for a, b in zip(results[:2], results[2:], strict=True):
        for x, y in zip(a, b, strict=True):
            torch.testing.assert_close(x, y, rtol=0, atol=0)
    assert native_calls == {"prefill": 2, "step": 2}


def test_packed_sequences(native_calls):
    """cu_seqlens: each sequence from its own initial state, as the torch path computes it
    (an empty sequence included)."""
    q, k, v, beta, g = _inputs(1, 2, T=41, K=16, V=16)
    cu = torch.tensor([0, 10, 10, 33, 41])
    S0 = torch.randn(4, 2, 16, 16, generator=torch.Generator().manual_seed(6)) * 0.3
    o, S = delta_rule(q, k, v, beta, g, initial_state=S0, cu_seqlens=cu, return_state=True,
                      qk_l2norm=True, chunk_size=8)
    with dispatch.use(impl="torch"):
        o_t, S_t = delta_rule(q, k, v, beta, g, initial_state=S0, cu_seqlens=cu,
                              return_state=True, qk_l2norm=True, chunk_size=8)
    _close(o, o_t)
    _close(S, S_t)
    assert S.shape == (4, 2, 16, 16) and native_calls["prefill"] == 1


def test_edge_sizes(native_calls):
    """T = 0 (the state comes back as it was, a new tensor), an empty batch, and subnormal
    decays (g near -90: flushed to 0, results as the reference's)."""
    q, k, v, beta, g = _inputs(1, 2, T=0, K=16, V=16)
    S0 = torch.randn(1, 2, 16, 16)
    o, S = delta_rule(q, k, v, beta, g, initial_state=S0, return_state=True)
    assert o.shape == (1, 2, 0, 16)
    torch.testing.assert_close(S, S0, rtol=0, atol=0)
    assert S.data_ptr() != S0.data_ptr()
    q, k, v, beta, g = _inputs(0, 2, T=5, K=16, V=16)
    assert delta_rule(q, k, v, beta, g).shape == (0, 2, 5, 16)
    q, k, v, beta, _ = _inputs(1, 2, T=30, K=16, V=16)
    g = torch.full((1, 2, 30), -90.0)
    o = delta_rule(q, k, v, beta, g, qk_l2norm=True)
    _close(o, _reference(q, k, v, beta, g)[0])
    assert native_calls["prefill"] == 3


def test_checks_still_guard_the_compiled_path(native_calls):
    """The argument checks run before the compiled path: nan and positive gates, a wrong
    state shape, a wrong scale raise as on the torch path."""
    q, k, v, beta, g = _inputs(1, 2, T=4, K=16, V=16)
    with pytest.raises(ValueError, match="g_t"):
        delta_rule_step(q[..., 0, :], k[..., 0, :], v[..., 0, :], beta[..., 0],
                        g_t=torch.full((1, 2), float("nan")))
    with pytest.raises(ValueError, match="g_t"):
        delta_rule_step(q[..., 0, :], k[..., 0, :], v[..., 0, :], beta[..., 0],
                        g_t=torch.ones(1, 2))
    with pytest.raises(TypeError, match="g_t"):
        delta_rule_step(q[..., 0, :], k[..., 0, :], v[..., 0, :], beta[..., 0], g_t=-1.0)
    with pytest.raises(ValueError, match="scale"):
        delta_rule_step(q[..., 0, :], k[..., 0, :], v[..., 0, :], beta[..., 0],
                        scale=float("nan"))
    with pytest.raises(ValueError, match="initial_state"):
        delta_rule(q, k, v, beta, g, initial_state=torch.zeros(1, 2, 16, 15))
    with pytest.raises(ValueError, match="beta"):
        delta_rule(q, k, v, beta * float("nan"), g)
    with pytest.raises(ValueError, match="cu_seqlens"):
        delta_rule(q, k, v, beta, g, cu_seqlens=torch.tensor([0, 3]))


@pytest.mark.parametrize("bad", [float("inf"), -float("inf"), float("nan")])
def test_a_step_on_threads_refuses_non_finite_beta(bad):
    """A batch of steps large enough to run on threads (where torch has several): the kernel
    checks β before it splits the heads, and refuses nan and ±inf alike."""
    big = 4096  # heads: past the threads' threshold on any core count
    q, k, v = (torch.randn(big, 16) for _ in range(3))
    beta = torch.rand(big)
    beta[7] = bad
    with pytest.raises(ValueError, match=r"^beta_t: expected finite values, got [^\n]+$"):
        delta_rule_step(q, k, v, beta, torch.zeros(big, 16, 16))


@pytest.mark.parametrize("K", [16, 20])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_gradients_are_the_float32_passes_rounded(monkeypatch, dtype, K):
    """16-bit q, k, v with gradients: the compiled forward and backward read the 16-bit rows
    a chunk at a time and write o, dq, dk, dv in the input dtype, with no widened copy made
    (no cast in Python): the output and the gradients (of q, k, v, β, g and the initial state,
    from those of the output and the final state) are those of float32 inputs of the same
    values, rounded once to the input dtype (within one rounding of it). T = 70: a whole
    chunk and a part; K = 20: rows that are no whole number of vectors."""
    q, k, v, beta, g = _inputs(2, 3, T=70, K=K, V=32)
    S0 = torch.randn(2, 3, K, 32, generator=torch.Generator().manual_seed(4)) / 4
    q, k, v = (x.to(dtype) for x in (q, k, v))
    leaves = [x.requires_grad_() for x in (q, k, v)]
    wide = [x.detach().float().requires_grad_() for x in (q, k, v)]
    rest = [[x.clone().requires_grad_() for x in (beta, g, S0)] for _ in range(2)]
    gen = torch.Generator().manual_seed(3)
    g_out, g_S = torch.randn(2, 3, 70, 32, generator=gen).to(dtype), torch.randn(2, 3, K, 32)
    calls, casts = [], []
    real, real_cast = delta_native.delta_rule_native_train, delta_native.recycled_cast
    monkeypatch.setattr(delta_native, "delta_rule_native_train",
                        lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(delta_native, "recycled_cast",
                        lambda *a: casts.append(1) or real_cast(*a))
    with dispatch.use(impl="native"):
        o, S = delta_rule(*leaves, rest[0][0], rest[0][1], qk_l2norm=True,
                          initial_state=rest[0][2], return_state=True)
        torch.autograd.backward([o, S], [g_out, g_S])
        cast = len(casts)
        want, want_S = delta_rule(*wide, rest[1][0], rest[1][1], qk_l2norm=True,
                                  initial_state=rest[1][2], return_state=True)
        torch.autograd.backward([want, want_S], [g_out.float(), g_S])
    eps = torch.finfo(dtype).eps
    assert o.dtype == dtype and calls == [1, 1] and cast == 0
    torch.testing.assert_close(o.float(), want, rtol=eps, atol=eps * want.abs().max().item())
    for got, w in zip(leaves, wide, strict=True):
        assert got.grad.dtype == dtype
        torch.testing.assert_close(got.grad.float(), w.grad, rtol=eps,
                                   atol=eps * w.grad.abs().max().item())
    f32 = torch.finfo(torch.float32).eps  # the same float32 passes: equal but for the order
    for got, w in zip(rest[0], rest[1], strict=True):  # of a few sums
        assert got.grad.dtype == torch.float32
        torch.testing.assert_close(got.grad, w.grad, rtol=64 * f32,
                                   atol=64 * f32 * w.grad.abs().max().item())


def test_routing(monkeypatch):
    """Where the compiled path does not apply (float64, V not a multiple of 16, gradients of a
    decoding step, per-value gates, gradients with per-key gates) ``auto`` runs torch even with
    LINATTN_NATIVE=1, and impl="native" says why; a float32 or bfloat16 (widened) prefill that
    wants gradients takes the compiled forward that saves what the compiled backward reads
    (bfloat16 rows read by the kernels themselves);
    per-key gates without gradients take the compiled forward and step; impl="torch" and
    LINATTN_NATIVE=0 never take either."""
    calls = []
    real, real_train = delta_native.delta_rule_native, delta_native.delta_rule_native_train
    monkeypatch.setattr(delta_native, "delta_rule_native",
                        lambda *a: calls.append("fwd") or real(*a))
    monkeypatch.setattr(delta_native, "delta_rule_native_train",
                        lambda *a: calls.append("train") or real_train(*a))
    q, k, v, beta, g = _inputs(1, 2, T=9, K=16, V=16)
    leaf = q.clone().requires_grad_(True)
    step = (q[..., 0, :], k[..., 0, :], v[..., 0, :], beta[..., 0])
    monkeypatch.setenv("LINATTN_NATIVE", "1")
    delta_rule(q, k, v, beta, g)
    assert calls == ["fwd"]
    delta_rule(leaf, k, v, beta, g).sum().backward()  # float32 with gradients: compiled
    assert calls == ["fwd", "train"] and leaf.grad is not None
    leaf_b = q.bfloat16().requires_grad_(True)
    kb, vb = k.bfloat16(), v.bfloat16()
    delta_rule(leaf_b, kb, vb, beta, g).float().sum().backward()  # bfloat16 rows: compiled
    assert calls == ["fwd", "train", "train"] and leaf_b.grad.dtype == torch.bfloat16
    delta_rule(q.double(), k.double(), v.double(), beta.double(), g.double())
    delta_rule(q, k, v[..., :8], beta, g)
    with torch.no_grad():
        delta_rule(leaf, k, v, beta, g)  # no gradient wanted: the plain forward
    assert calls == ["fwd", "train", "train", "fwd"]
    gk = -torch.rand(1, 2, 9, 16)
    delta_rule(q, k, v, beta, g, gk)  # per-key gates, no gradient: the compiled forward
    assert calls == ["fwd", "train", "train", "fwd", "fwd"]
    delta_rule(leaf, k, v, beta, g, gk).sum().backward()  # with gradients: the torch forms
    delta_rule(q, k, v, beta, g, gv=-torch.rand(1, 2, 9, 16))  # per-value gates: torch
    assert calls == ["fwd", "train", "train", "fwd", "fwd"]
    steps = []
    real_step = delta_native.step_into
    monkeypatch.setattr(delta_native, "step_into", lambda *a: steps.append(1) or real_step(*a))
    delta_rule_step(*step, gk_t=-torch.rand(1, 2, 16))  # per-key gates: compiled
    assert steps == [1]
    delta_rule_step(*step, gv_t=-torch.rand(1, 2, 16))
    delta_rule_step(leaf[..., 0, :], *step[1:])[0].sum().backward()
    assert steps == [1]
    with dispatch.use(impl="native"):
        for bad, why in ((lambda: delta_rule(q, k, v[..., :8], beta, g), "multiple of 16"),
                         (lambda: delta_rule_step(*step, gv_t=-torch.rand(1, 2, 16)),
                          "per-value"),
                         (lambda: delta_rule(q, k, v, beta, g, gv=-torch.rand(1, 2, 9, 16)),
                          "per-value"),
                         (lambda: delta_rule(leaf, k, v, beta, g, gk),
                          "no gradient with per-key gates"),
                         (lambda: delta_rule_step(leaf[..., 0, :], *step[1:]),
                          "no gradient for the decoding step")):
            with pytest.raises(ValueError, match=why):
                bad()
    with dispatch.use(impl="torch"):
        delta_rule(q, k, v, beta, g)
        delta_rule(leaf, k, v, beta, g)
    monkeypatch.setenv("LINATTN_NATIVE", "0")
    delta_rule(q, k, v, beta, g)
    delta_rule(leaf, k, v, beta, g)
    delta_rule(q, k, v, beta, g, gk)
    assert calls == ["fwd", "train", "train", "fwd", "fwd"]


@pytest.mark.parametrize("form", ["prefill", "prefill fwd+bwd", "step"])
def test_calibration_problems_run_every_candidate(form):
    """The calibration times the compiled builds and the torch path on its problems directly:
    each candidate runs (for the step: ten decoding steps; with gradients: forward and
    backward)."""
    from linattn.ops.dispatch import Choice

    run = dispatch._PROBLEMS["delta_rule"][form]()
    for choice in (Choice("native", "native"), Choice("portable")):
        run(choice)()


def test_parts_run_on_every_thread_and_errors_surface():
    """The parts of a call are taken one at a time by up to ``threads`` threads (the calling one
    included); every part runs, and an error in any of them reaches the caller."""
    done, threads_seen = [], set()

    def part(h0, h1, v0, v1):
        threads_seen.add(threading.get_ident())
        done.append(h0)
        if h0 == 5:
            raise RuntimeError("part 5")

    jobs = native.head_jobs(16, 64, 2)
    assert len(jobs) == 8 and sum(h1 - h0 for h0, h1, *_ in jobs) == 16
    native.run_jobs(lambda *j: done.append(j[0]), jobs, 2)
    assert sorted(done) == [h0 for h0, *_ in jobs]
    done.clear()
    with pytest.raises(RuntimeError, match="part 5"):
        native.run_jobs(part, [(h, h + 1, 0, 16) for h in range(12)], 3)
    assert sorted(done) == list(range(12))
    assert native.head_jobs(1, 64, 4) == [(0, 1, 0, 16), (0, 1, 16, 32), (0, 1, 32, 48),
                                          (0, 1, 48, 64)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("gates", ["g", "gk", "none"])
def test_a_16_bit_step_is_the_float32_step_on_its_values(native_calls, dtype, gates,
                                                         monkeypatch):
    """q, k, v, β and the gates in bfloat16 / float16 (the state float32, as fla keeps it): the
    kernel reads them as float32 (exact) and rounds o once, so the step equals the float32 step
    on the same values with its o rounded to the dtype, within one rounding of the dtype (never
    bit for bit: a different build may contract the multiply-adds differently)."""
    H, K, V = 6, 32, 48
    gen = torch.Generator().manual_seed(3)
    q, k = (torch.nn.functional.normalize(torch.randn(2, H, K, generator=gen), dim=-1)
            for _ in range(2))
    v = torch.randn(2, H, V, generator=gen)
    beta = torch.rand(2, H, generator=gen)
    g = -torch.rand(2, H, generator=gen) if gates == "g" else None
    gk = -torch.rand(2, H, K, generator=gen) if gates == "gk" else None
    S = torch.randn(2, H, K, V, generator=gen) * 0.1
    low = [None if x is None else x.to(dtype) for x in (q, k, v, beta, g, gk)]
    with monkeypatch.context() as m:  # the lean path: no widened copies, no general checks
        m.setattr(delta_native, "delta_rule_step_native", None)
        o, S_new = delta_rule_step(*low[:4], S, g_t=low[4], gk_t=low[5])
    assert native_calls["step"] == 1
    wide = [None if x is None else x.float() for x in low]
    o32, S32 = delta_rule_step(*wide[:4], S, g_t=wide[4], gk_t=wide[5])
    assert o.dtype == dtype and S_new.dtype == torch.float32
    eps32, eps = torch.finfo(torch.float32).eps, torch.finfo(dtype).eps
    torch.testing.assert_close(S_new, S32, rtol=8 * eps32, atol=8 * eps32)
    torch.testing.assert_close(o.float(), o32, rtol=eps, atol=eps * o32.abs().max().item())
    # and in place, as a decoder keeps its state
    S_kept = S.clone()
    o_in, S_in = delta_rule_step(*low[:4], S_kept, g_t=low[4], gk_t=low[5], inplace=True)
    assert S_in is S_kept
    torch.testing.assert_close(S_in, S32, rtol=8 * eps32, atol=8 * eps32)
    torch.testing.assert_close(o_in, o)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("gates", ["g", "gk", "none"])
def test_a_16_bit_prefill_reads_its_rows_itself(native_calls, dtype, gates, monkeypatch):
    """Without gradients, 16-bit q, k, v (here 2 value heads per q/k head) go to the forward
    kernel as they are (read a chunk at a time as float32: no widened copy of each whole
    input), and give the float32 forward on the same values with o rounded once (within one
    rounding of the dtype)."""
    gen = torch.Generator().manual_seed(8)
    q, k = (torch.randn(2, 3, 150, 32, generator=gen) for _ in range(2))
    v = torch.randn(2, 6, 150, 48, generator=gen)
    beta = torch.rand(2, 6, 150, generator=gen)
    g = -torch.rand(2, 6, 150, generator=gen) * 0.5 if gates == "g" else None
    gk = -torch.rand(2, 6, 150, 32, generator=gen) * 0.3 if gates == "gk" else None
    S0 = torch.randn(2, 6, 32, 48, generator=gen) * 0.1
    q, k, v = (x.to(dtype) for x in (q, k, v))
    widened = []
    real_rows = delta_native.float32_rows
    monkeypatch.setattr(delta_native, "float32_rows",
                        lambda x, n: widened.append(x.dtype) or real_rows(x, n))
    with torch.no_grad():
        o, S = delta_rule(q, k, v, beta, g, gk=gk, initial_state=S0, return_state=True,
                          qk_l2norm=True)
    assert native_calls["prefill"] == 1 and dtype not in widened
    o32, S32 = delta_rule(q.float(), k.float(), v.float(), beta, g, gk=gk, initial_state=S0,
                          return_state=True, qk_l2norm=True)
    assert o.dtype == dtype
    eps32, eps = torch.finfo(torch.float32).eps, torch.finfo(dtype).eps
    torch.testing.assert_close(S, S32, rtol=16 * eps32, atol=16 * eps32 * S32.abs().max().item())
    torch.testing.assert_close(o.float(), o32, rtol=eps + 16 * eps32,
                               atol=(eps + 16 * eps32) * o32.abs().max().item())


def test_gates_that_require_grad_check_quietly():
    """β and g computed by a model require grad: their value checks read them without a
    warning (a scalar read of a tensor in a graph warns in torch)."""
    q, k, v, beta, g = _inputs(1, 2, T=20, K=16, V=16)
    beta, g = beta.requires_grad_(), g.requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        delta_rule(q, k, v, beta, g, qk_l2norm=True).sum().backward()
    assert beta.grad is not None and g.grad is not None
