"""The compiled GLA (ops/gated/native.py; ``la_gla_forward`` / ``la_gla_backward`` /
``la_gla_step`` in ops/gated/kernels.c) against the float64 sequential reference
(:func:`linattn.reference.gated_linear_attention`), forward, every gradient and the step; as
PyTorch custom ops (opcheck, ``torch.compile``, ``torch.export``); and the dispatcher's routing.

The compiled path is forced (``dispatch.use(impl="native")``) and each test checks that it was
really taken. The kernels compute in float32: tolerances are float32 machine epsilons times the
size of the largest reference value (the ``assert_close`` fixture), with room for sums of a
few hundred terms. Gradients are compared with the reference's float64 autograd gradients,
which a float64 ``gradcheck`` (central differences) holds to the reference's forward: a
gradcheck of the float32 kernel itself would measure float32 rounding, not the formula."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F

import linattn
from linattn.ops import dispatch
from linattn.ops import reference as ref
from linattn.ops.gated import native as gated_native
from linattn.ops.gated.op import gated_linear_attention, gated_linear_attention_step

pytestmark = pytest.mark.skipif(
    gated_native.unavailable() is not None,
    reason=f"compiled GLA: {gated_native.unavailable()}",
)

#: Float32 epsilons allowed against the float64 reference, relative to the largest value (at
#: least 1): outputs and states are sums of up to T·K products (T ≤ 150 here) accumulated in
#: float32 in the recurrence's order, whose rounding errors mostly cancel (≤ 8 epsilons seen
#: on a Zen 4 at these shapes); gradients are one more such sum deep. A wrong term is off by
#: far more than this (the values are of order one).
ULPS_FWD, ULPS_GRAD = 64, 128
GATES = ["none", "scalar", "per-key", "both"]
_CXX = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
#: Inductor generates C++; without a compiler Dynamo and AOTAutograd still run ("aot_eager").
BACKEND = "inductor" if _CXX else "aot_eager"


@pytest.fixture
def native_calls(monkeypatch):
    """Force the compiled path; count the prefill and step calls that really took it (the
    step: its kernel call, step_into, which the lean path and the custom op both make)."""
    calls = {"prefill": 0, "step": 0}
    real_prefill, real_step = gated_native.gla_prefill, gated_native.step_into

    def prefill(*a, **kw):
        calls["prefill"] += 1
        return real_prefill(*a, **kw)

    def step(*a, **kw):
        calls["step"] += 1
        return real_step(*a, **kw)

    monkeypatch.setattr(gated_native, "gla_prefill", prefill)
    monkeypatch.setattr(gated_native, "step_into", step)
    with dispatch.use(impl="native"):
        yield calls


def _inputs(*batch, T, K, V, which="both", seed=0, dtype=torch.float32):
    """q, k, v and the gates ``which`` asks for (logsigmoid of normals, as GLA's layer makes:
    values in about (−4, 0)); q and k scaled by K^-½ so that states stay of order one."""
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(*batch, T, K, generator=gen) / K ** 0.5 for _ in range(2))
    v = torch.randn(*batch, T, V, generator=gen)
    g = F.logsigmoid(torch.randn(*batch, T, generator=gen))
    gk = F.logsigmoid(torch.randn(*batch, T, K, generator=gen))
    g, gk = {"none": (None, None), "scalar": (g, None), "per-key": (None, gk),
             "both": (g, gk)}[which]
    cast = lambda x: None if x is None else x.to(dtype)  # noqa: E731
    return cast(q), cast(k), cast(v), g, gk


def _state(*shape, seed=5):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 0.3


def _d(x):
    return None if x is None else x.detach().double().requires_grad_(x.requires_grad)


def _leaves(*xs):
    return [None if x is None else x.detach().clone().requires_grad_(True) for x in xs]


def _grads(xs):
    return [None if x is None else x.grad for x in xs]


def _loss(o, S, seed=9):
    """A loss that gives every output and every state element its own weight."""
    gen = torch.Generator().manual_seed(seed)
    wo = torch.randn(o.shape, generator=gen, dtype=torch.float64)
    wS = torch.randn(S.shape, generator=gen, dtype=torch.float64)
    return (o.double() * wo).sum() + (S.double() * wS).sum()


@pytest.mark.parametrize("which", GATES)
@pytest.mark.parametrize(
    "batch, T, K, V",
    [((2, 3), 37, 16, 32),  # T < C (C = 64 at K = 16): one partial chunk
     ((1, 2), 130, 64, 64),  # C = 32 at K = 64: four full chunks and a partial one
     ((3,), 70, 20, 48),  # K not a multiple of any vector width, V three blocks of 16
     ((1, 1), 1, 8, 16)],  # one token
)
def test_forward_matches_reference(native_calls, assert_close, which, batch, T, K, V):
    q, k, v, g, gk = _inputs(*batch, T=T, K=K, V=V, which=which)
    S0 = _state(*batch, K, V)
    o, S = gated_linear_attention(q, k, v, g, gk, initial_state=S0, return_state=True)
    want_o, want_S = ref.gated_linear_attention(*map(_d, (q, k, v, g, gk)), initial_state=S0)
    assert native_calls["prefill"] == 1
    assert o.dtype == S.dtype == torch.float32
    assert_close(o, want_o, ulps=ULPS_FWD)
    assert_close(S, want_S, ulps=ULPS_FWD)


@pytest.mark.parametrize("which", GATES)
@pytest.mark.parametrize("batch, T, K, V", [((2, 2), 45, 16, 32), ((1, 3), 70, 20, 48),
                                           ((1, 2), 130, 64, 64)])
def test_gradients_match_reference(native_calls, assert_close, which, batch, T, K, V):
    """Every input's gradient (q, k, v, g, gk, the initial state), from a loss on the output
    and on the final state, against the float64 reference's autograd."""
    xs = _inputs(*batch, T=T, K=K, V=V, which=which)
    S0 = _state(*batch, K, V)
    leaves = _leaves(*xs, S0)
    o, S = gated_linear_attention(*leaves[:5], initial_state=leaves[5], return_state=True)
    _loss(o, S).backward()
    assert native_calls["prefill"] == 1
    wants = _leaves(*(None if x is None else x.double() for x in (*xs, S0)))
    _loss(*ref.gated_linear_attention(*wants[:5], initial_state=wants[5])).backward()
    for name, got, want in zip("q k v g gk S0".split(), _grads(leaves), _grads(wants),
                               strict=True):
        assert (got is None) == (want is None), name
        if got is not None:
            assert got.dtype == torch.float32, name
            assert_close(got, want, ulps=ULPS_GRAD)


def test_gate_gradients_stay_accurate_over_long_sequences(native_calls, assert_close):
    """The gates' gradients are a sum over tokens from the sequence's end (q dq - k dk, plus
    <dS, S> at a chunk's end: docs/theory.md section 10). Carried over all 8,192 tokens, with
    strong per-key decays, its rounding reached 24 epsilons of dg's largest value (Intel Xeon);
    restarted at each chunk's end, 5. The reference: the same loss through the torch chunked
    form in float64."""
    gen = torch.Generator().manual_seed(3)
    T, K = 8192, 16
    q, k = (torch.randn(1, T, K, generator=gen) / K ** 0.5 for _ in range(2))
    v = torch.randn(1, T, K, generator=gen)
    g = F.logsigmoid(torch.randn(1, T, generator=gen))
    gk = -10.0 * torch.rand(1, T, K, generator=gen)
    S0 = _state(1, K, K)
    leaves = _leaves(q, k, v, g, gk, S0)
    _loss(*gated_linear_attention(*leaves[:5], initial_state=leaves[5],
                                  return_state=True)).backward()
    assert native_calls["prefill"] == 1
    wants = _leaves(*(x.double() for x in (q, k, v, g, gk, S0)))
    with dispatch.use(impl="portable"):
        _loss(*gated_linear_attention(*wants[:5], initial_state=wants[5],
                                      return_state=True)).backward()
    for name, got, want in zip(("g", "gk"), _grads(leaves[3:5]), _grads(wants[3:5]),
                               strict=True):
        assert_close(got, want, ulps=16), name


@pytest.mark.parametrize("which", ["scalar", "per-key", "both"])
def test_reference_gradients_pass_gradcheck(which):
    """The ground truth of the gradient tests: the reference's autograd gradients agree with
    central differences of its forward (float64, small shapes)."""
    xs = _inputs(1, 2, T=6, K=3, V=4, which=which, dtype=torch.float64)
    xs = [None if x is None else x.double().requires_grad_(True) for x in xs]
    S0 = _state(1, 2, 3, 4).double().requires_grad_(True)

    def f(q, k, v, g, gk, S0):
        return ref.gated_linear_attention(q, k, v, g, gk, initial_state=S0)

    assert torch.autograd.gradcheck(f, (*xs, S0))


def test_hard_resets_and_flushed_decays(native_calls, assert_close):
    """Log-gates of −inf (a reset: nothing before it survives) in g and in single rows of gk,
    and gates near −90 (decays below float32's normal range, flushed to 0): outputs and
    gradients finite and equal to the reference's."""
    q, k, v, g, gk = _inputs(1, 2, T=50, K=16, V=16, which="both")
    g[..., 10] = -torch.inf
    g[..., 33] = -90.0
    gk[..., 20, 3] = -torch.inf
    gk[..., 40, :] = -95.0
    S0 = _state(1, 2, 16, 16)
    leaves = _leaves(q, k, v, g, gk, S0)
    o, S = gated_linear_attention(*leaves[:5], initial_state=leaves[5], return_state=True)
    _loss(o, S).backward()
    wants = _leaves(*(x.double() for x in (q, k, v, g, gk, S0)))
    want_o, want_S = ref.gated_linear_attention(*wants[:5], initial_state=wants[5])
    _loss(want_o, want_S).backward()
    assert_close(o, want_o, ulps=ULPS_FWD)
    assert_close(S, want_S, ulps=ULPS_FWD)
    for got, want in zip(_grads(leaves), _grads(wants), strict=True):
        assert_close(got, want, ulps=ULPS_GRAD)  # also asserts finite
    assert native_calls["prefill"] == 1


@pytest.mark.parametrize("which", ["scalar", "per-key"])
def test_packed_sequences(native_calls, assert_close, which):
    """cu_seqlens (an empty sequence included, lengths across chunk boundaries): each sequence
    from its own initial state, outputs, final states and every gradient as the reference run
    on each sequence alone."""
    cu = torch.tensor([0, 10, 10, 47, 81])
    xs = _inputs(1, 2, T=81, K=16, V=32, which=which)
    S0 = _state(4, 2, 16, 32)
    leaves = _leaves(*xs, S0)
    o, S = gated_linear_attention(*leaves[:5], initial_state=leaves[5], cu_seqlens=cu,
                                  return_state=True)
    assert S.shape == (4, 2, 16, 32) and native_calls["prefill"] == 1
    _loss(o, S).backward()
    wants = _leaves(*(None if x is None else x.double() for x in (*xs, S0)))
    outs, states = [], []
    for i, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)):
        part = [None if x is None else x[:, :, a:b] for x in wants[:5]]
        o_i, S_i = ref.gated_linear_attention(*part, initial_state=wants[5][i:i + 1])
        outs.append(o_i)
        states.append(S_i)
    want_o, want_S = torch.cat(outs, -2), torch.cat(states, 0)
    _loss(want_o, want_S).backward()
    assert_close(o, want_o, ulps=ULPS_FWD)
    assert_close(S, want_S, ulps=ULPS_FWD)
    for got, want in zip(_grads(leaves), _grads(wants), strict=True):
        if want is not None:
            assert_close(got, want, ulps=ULPS_GRAD)


def test_empty_sequence_and_empty_batch(native_calls):
    """T = 0: the state comes back equal to the initial one, a new tensor; its gradient is the
    final state's, the others are zero. An empty batch gives an empty output."""
    q, k, v, g, gk = _inputs(1, 2, T=0, K=16, V=16)
    S0 = _state(1, 2, 16, 16)
    o, S = gated_linear_attention(q, k, v, g, gk, initial_state=S0, return_state=True)
    assert o.shape == (1, 2, 0, 16)
    torch.testing.assert_close(S, S0, rtol=0, atol=0)
    assert S.data_ptr() != S0.data_ptr()
    leaves = _leaves(q, k, v, g, gk, S0)
    o, S = gated_linear_attention(*leaves[:5], initial_state=leaves[5], return_state=True)
    w = torch.randn(S.shape)
    (S * w).sum().backward()
    torch.testing.assert_close(leaves[5].grad, w, rtol=0, atol=0)
    for x in leaves[:5]:
        assert x.grad is None or x.grad.numel() == 0 or not x.grad.any()
    q, k, v, g, gk = _inputs(0, 2, T=5, K=16, V=16)
    assert gated_linear_attention(q, k, v, g, gk).shape == (0, 2, 5, 16)
    assert native_calls["prefill"] == 3


def test_strided_inputs_and_half_precision(native_calls, assert_close):
    """q, k, v, gk as transposed views of (B, T, H, ·) tensors, forward and gradients;
    bfloat16 and float16 inputs widened (the output in the input's dtype, the state float32)."""
    gen = torch.Generator().manual_seed(4)
    q, k = (torch.randn(2, 50, 3, 16, generator=gen).div(4).transpose(1, 2) for _ in range(2))
    v = torch.randn(2, 50, 3, 32, generator=gen).transpose(1, 2)
    g = F.logsigmoid(torch.randn(2, 50, 3, generator=gen)).transpose(1, 2)
    gk = F.logsigmoid(torch.randn(2, 50, 3, 16, generator=gen)).transpose(1, 2)
    assert not q.is_contiguous()
    leaves = [x.detach().requires_grad_(True) for x in (q, k, v, g, gk)]  # views stay views
    o, S = gated_linear_attention(*leaves, return_state=True)
    _loss(o, S).backward()
    wants = _leaves(*(x.double() for x in (q, k, v, g, gk)))
    want_o, want_S = ref.gated_linear_attention(*wants)
    _loss(want_o, want_S).backward()
    assert_close(o, want_o, ulps=ULPS_FWD)
    for got, want in zip(_grads(leaves), _grads(wants), strict=True):
        assert_close(got, want, ulps=ULPS_GRAD)
    for dtype in (torch.bfloat16, torch.float16):
        xs = [x.to(dtype) for x in (q, k, v)]
        o, S = gated_linear_attention(*xs, g, gk, return_state=True)
        assert o.dtype == dtype and S.dtype == torch.float32
        want_o, want_S = ref.gated_linear_attention(*xs, g.double(), gk.double())
        # the inputs are the same rounded values: only the output's rounding differs
        assert_close(o, want_o, ulps=4)
        assert_close(S, want_S.float(), ulps=ULPS_FWD)
    assert native_calls["prefill"] == 3


@pytest.mark.parametrize("gates", [None, 1.0, 4.0])
@pytest.mark.parametrize("T, K, V, chunk, layout", [(64, 64, 64, None, "heads"),
                                                    (150, 64, 64, None, "fla"),
                                                    (100, 32, 96, 32, "heads"),
                                                    (70, 48, 32, None, "heads"),
                                                    (100, 64, 64, None, "odd")])
def test_bfloat16_prefill_within_its_bound(native_calls, amx, bfloat16_rows, gates, T, K, V,
                                           chunk, layout):
    """bfloat16 prefills from a state with a scalar gate or none. On AMX tiles each whole chunk
    (of 64 tokens, or 32) runs the chunked form on bfloat16 products (chunk_dp in
    ops/native/tiles.h; K, V multiples of 32, no per-key gates, q's and k's rows 32-bit
    aligned: it reads them in place) and the tokens after the last whole chunk the widened
    recurrence; without tiles, at K = 48 and on rows an odd number of elements apart (layout
    "odd") every token runs the widened recurrence. Against float64 on the same rounded inputs:
    within 6u of the largest output and state magnitude (u = 2⁻⁸), more than the roundings
    along the chunked form's longest path: g o q~ and S into O (2), the scores (from q and k's
    exact products) into O (1), the decayed keys into S (1), and the output itself (1).
    Log-gates in (-gates, 0]: at 1 a chunk decays by e^-64 at most (decays taken as ratios), at
    4 below 2^-100 (exponentials)."""
    gen = torch.Generator().manual_seed(8)
    q, k = (torch.randn(1, 2, T, K, generator=gen) / K ** 0.5 for _ in range(2))
    v = torch.randn(1, 2, T, V, generator=gen)
    g = -gates * torch.rand(1, 2, T, generator=gen) if gates else None
    S0 = 0.3 * torch.randn(1, 2, K, V, generator=gen)
    qb, kb, vb = bfloat16_rows(layout, q, k, v)
    o, S = gated_linear_attention(qb, kb, vb, g, initial_state=S0, return_state=True,
                                  chunk_size=chunk)
    assert o.dtype == torch.bfloat16 and S.dtype == torch.float32 and native_calls["prefill"]
    want_o, want_S = ref.gated_linear_attention(qb.double(), kb.double(), vb.double(),
                                                None if g is None else g.double(),
                                                initial_state=S0.double())
    u = 2.0 ** -8
    for got, want in ((o, want_o), (S, want_S)):
        err = (got.double() - want).abs().max().item() / want.abs().max().item()
        assert err <= 6 * u, f"relative error {err:.2e} > 6u"


def test_prefill_then_continue_equals_whole(native_calls, assert_close):
    q, k, v, g, gk = _inputs(1, 3, T=150, K=32, V=32)
    whole, S_whole = gated_linear_attention(q, k, v, g, gk, return_state=True)
    parts, S = [], None
    for t0, t1 in ((0, 1), (1, 67), (67, 131), (131, 150)):
        o, S = gated_linear_attention(q[..., t0:t1, :], k[..., t0:t1, :], v[..., t0:t1, :],
                                      g[..., t0:t1], gk[..., t0:t1, :], initial_state=S,
                                      return_state=True)
        parts.append(o)
    assert_close(torch.cat(parts, -2), whole, ulps=16)
    assert_close(S, S_whole, ulps=16)
    assert native_calls["prefill"] == 5


@pytest.mark.parametrize("which", GATES)
def test_steps_equal_prefill_and_reference(native_calls, assert_close, which):
    """Token by token through the step from an initial state: the prefill's outputs and state
    and the reference's; the state passed in is never modified."""
    q, k, v, g, gk = _inputs(2, 3, T=20, K=16, V=32, which=which)
    S0 = _state(2, 3, 16, 32)
    o_all, S_all = gated_linear_attention(q, k, v, g, gk, initial_state=S0, return_state=True)
    S, outs = S0, []
    for t in range(20):
        before = S.clone()
        o, S_new = gated_linear_attention_step(
            q[..., t, :], k[..., t, :], v[..., t, :], S,
            g_t=None if g is None else g[..., t], gk_t=None if gk is None else gk[..., t, :])
        torch.testing.assert_close(S, before, rtol=0, atol=0)
        assert S_new.data_ptr() != S.data_ptr()
        outs.append(o)
        S = S_new
    assert_close(torch.stack(outs, -2), o_all, ulps=16)
    assert_close(S, S_all, ulps=16)
    want_o, want_S = ref.gated_linear_attention(*map(_d, (q, k, v, g, gk)), initial_state=S0)
    assert_close(torch.stack(outs, -2), want_o, ulps=ULPS_FWD)
    assert_close(S, want_S, ulps=ULPS_FWD)
    assert native_calls == {"prefill": 1, "step": 20}


def test_step_from_no_state_strided_and_half(native_calls, assert_close):
    """state=None (zeros); q_t, k_t, v_t slices of (B, T, H, D) tensors; bfloat16 inputs
    widened and the output rounded back."""
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 7, 4, 16, generator=gen) for _ in range(3))
    gk = F.logsigmoid(torch.randn(2, 7, 4, 16, generator=gen))
    x = [q[:, 3], k[:, 3], v[:, 3]]
    o, S = gated_linear_attention_step(*x, gk_t=gk[:, 3])
    want_o, want_S = ref.gated_linear_attention(*(t.double().unsqueeze(-2) for t in x),
                                                gk=gk[:, 3, :, None].double())
    assert_close(o, want_o.squeeze(-2), ulps=ULPS_FWD)
    assert_close(S, want_S, ulps=ULPS_FWD)
    ob, Sb = gated_linear_attention_step(*(t.bfloat16() for t in x), gk_t=gk[:, 3])
    assert ob.dtype == torch.bfloat16 and Sb.dtype == torch.float32
    want_b = ref.gated_linear_attention(*(t.bfloat16().unsqueeze(-2) for t in x),
                                        gk=gk[:, 3, :, None].double())[0].squeeze(-2)
    assert_close(ob, want_b, ulps=4)
    assert native_calls["step"] == 2


@pytest.mark.parametrize("heads, threads", [(1, 4), (3, 2), (5, 4)])
def test_threads_split_heads_and_columns(monkeypatch, native_calls, assert_close, heads,
                                         threads):
    """Groups of heads in parallel, or (fewer heads than threads) a head's columns in blocks
    of 16 in the forward: the same function as on one thread, forward, backward and step."""
    monkeypatch.setattr(gated_native, "PARALLEL_MIN", 0)
    xs = _inputs(1, heads, T=70, K=16, V=64)
    results = []
    for n in (1, threads):
        monkeypatch.setattr(torch, "get_num_threads", lambda n=n: n)
        leaves = _leaves(*xs)
        o, S = gated_linear_attention(*leaves, return_state=True)
        _loss(o, S).backward()
        o_t, S_t = gated_linear_attention_step(*(x[..., 0, :] for x in xs[:3]), S.detach(),
                                               g_t=xs[3][..., 0], gk_t=xs[4][..., 0, :])
        results.append([o, S, o_t, S_t, *_grads(leaves)])
    for a, b in zip(*results, strict=True):
        assert_close(b, a, ulps=4)
    assert native_calls == {"prefill": 2, "step": 2}


def test_second_order_gradients(native_calls, assert_close):
    """create_graph=True differentiates a torch recomputation: a gradient penalty's gradient
    as the reference's."""
    xs = _inputs(1, 2, T=20, K=16, V=16, which="both")
    leaves = _leaves(*xs)
    o = gated_linear_attention(*leaves)
    (gq,) = torch.autograd.grad(o.square().sum(), leaves[0], create_graph=True)
    gq.square().sum().backward()
    wants = _leaves(*(x.double() for x in xs))
    ow = ref.gated_linear_attention(*wants)[0]
    (gw,) = torch.autograd.grad(ow.square().sum(), wants[0], create_graph=True)
    gw.square().sum().backward()
    for got, want in zip(_grads(leaves), _grads(wants), strict=True):
        assert_close(got, want, ulps=ULPS_GRAD)
    assert native_calls["prefill"] == 1


@pytest.mark.parametrize("K", [16, 20])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_gradients_are_the_float32_passes_rounded(native_calls, monkeypatch, dtype, K):
    """16-bit inputs with gradients: the compiled forward (with its checkpoints) and backward
    read the 16-bit rows a chunk at a time and write o, dq, dk, dv in the input dtype, with no
    widened copy made (no cast in Python): the output and the gradients (of q, k, v, both
    gates and the initial state, from those of the output and the final state) are those of
    float32 inputs of the same values, rounded once to the input dtype (within one rounding of
    it). T = 70: a whole chunk and a part; K = 20: rows that are no whole number of vectors."""
    q, k, v, g, gk = _inputs(2, 3, T=70, K=K, V=32, dtype=dtype)
    S0 = torch.randn(2, 3, K, 32, generator=torch.Generator().manual_seed(4)) / 4
    leaves = [x.requires_grad_() for x in (q, k, v)]
    wide = [x.detach().float().requires_grad_() for x in (q, k, v)]
    rest = [[x.clone().requires_grad_() for x in (g, gk, S0)] for _ in range(2)]
    gen = torch.Generator().manual_seed(3)
    g_out, g_S = torch.randn(2, 3, 70, 32, generator=gen), torch.randn(2, 3, K, 32, generator=gen)
    casts = []
    real_cast = gated_native.recycled_cast
    monkeypatch.setattr(gated_native, "recycled_cast",
                        lambda *a: casts.append(1) or real_cast(*a))
    o, S = gated_linear_attention(*leaves, rest[0][0], rest[0][1], initial_state=rest[0][2],
                                  return_state=True)
    torch.autograd.backward([o, S], [g_out.to(dtype), g_S])
    assert casts == [1]  # o's own cast: a no-op for an output already in its dtype
    want, want_S = gated_linear_attention(*wide, rest[1][0], rest[1][1],
                                          initial_state=rest[1][2], return_state=True)
    torch.autograd.backward([want, want_S], [g_out.to(dtype).float(), g_S])
    eps = torch.finfo(dtype).eps
    assert o.dtype == dtype and native_calls["prefill"] == 2
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
    decoding step, per-value gates) ``auto`` runs torch even with LINATTN_NATIVE=1, and
    impl="native" says why; a bfloat16 prefill with gradients takes it (its rows read by the
    kernels);
    impl="torch" and LINATTN_NATIVE=0 never take it."""
    calls = []
    real = gated_native.gla_prefill
    monkeypatch.setattr(gated_native, "gla_prefill", lambda *a: calls.append(1) or real(*a))
    q, k, v, g, gk = _inputs(1, 2, T=9, K=16, V=16)
    leaf = q.clone().requires_grad_(True)
    step = (q[..., 0, :], k[..., 0, :], v[..., 0, :])
    gv = F.logsigmoid(torch.randn(1, 2, 16))
    monkeypatch.setenv("LINATTN_NATIVE", "1")
    gated_linear_attention(q, k, v, g, gk)
    gated_linear_attention(leaf, k, v, g, gk).sum().backward()
    assert calls == [1, 1] and leaf.grad is not None
    leaf_b = q.bfloat16().requires_grad_(True)
    gated_linear_attention(leaf_b, k.bfloat16(), v.bfloat16(), g).float().sum().backward()
    assert calls == [1, 1, 1] and leaf_b.grad.dtype == torch.bfloat16
    gated_linear_attention(q.double(), k.double(), v.double(), g.double())
    gated_linear_attention(q, k, v[..., :8], g)
    assert calls == [1, 1, 1]
    with dispatch.use(impl="native"):
        for bad, why in (
                (lambda: gated_linear_attention(q, k, v[..., :8], g), "multiple of 16"),
                (lambda: gated_linear_attention_step(*step, gv_t=gv), "per-value gates"),
                (lambda: gated_linear_attention_step(leaf[..., 0, :], *step[1:]),
                 "no gradient for the decoding step")):
            with pytest.raises(ValueError, match=why):
                bad()
        with pytest.raises(ValueError, match="gk_t"):  # the kernel's own gate check
            gated_linear_attention_step(*step, gk_t=torch.ones(1, 2, 16))
        with pytest.raises(ValueError, match="g_t"):
            gated_linear_attention_step(*step, g_t=torch.full((1, 2), float("nan")))
    with dispatch.use(impl="torch"):
        gated_linear_attention(q, k, v, g)
        gated_linear_attention(leaf, k, v, g)
    monkeypatch.setenv("LINATTN_NATIVE", "0")
    gated_linear_attention(q, k, v, g)
    assert calls == [1, 1, 1]


@pytest.mark.parametrize("form", ["prefill", "prefill fwd+bwd", "step"])
def test_calibration_problems_run_every_candidate(form):
    from linattn.ops.dispatch import Choice

    run = dispatch._PROBLEMS["gated_linear_attention"][form]()
    for choice in (Choice("native", "native"), Choice("portable")):
        run(choice)()


# ------------------------------------------------------------------- inside PyTorch
def _op_args(which, grad):
    q, k, v, g, gk = _inputs(1, 2, T=19, K=16, V=16, which=which)
    xs = [None if x is None else x.requires_grad_(grad) for x in (q, k, v, g, gk)]
    S0 = _state(1, 2, 16, 16).requires_grad_(grad)
    return (*xs, S0, None, 0.25, 8, grad, "native")


@pytest.mark.parametrize("which", GATES)
def test_opcheck(which):
    """Schema, fake implementation, autograd registration and AOT dispatch of the three ops."""
    torch.library.opcheck(torch.ops.linattn.gla_forward.default, _op_args(which, True))
    args = _op_args(which, False)
    o, S, ckpt = torch.ops.linattn.gla_forward.default(*args[:9], True, "native")
    g_out = torch.randn(o.shape)
    torch.library.opcheck(torch.ops.linattn.gla_backward.default,
                          (*args[:6], ckpt, None, g_out, torch.randn(S.shape), 0.25, 8,
                           "native"))
    q, k, v, g, gk, S0 = args[:6]
    torch.library.opcheck(torch.ops.linattn.gla_step.default,
                          (q[:, :, 0], k[:, :, 0], v[:, :, 0],
                           None if g is None else g[:, :, 0],
                           None if gk is None else gk[:, :, 0], S0, 0.25, "native"))


def test_packed_opcheck():
    q, k, v, g, gk = _inputs(1, 2, T=30, K=16, V=16, which="both")
    cu = torch.tensor([0, 7, 30])
    S0 = _state(2, 2, 16, 16)
    xs = [x.requires_grad_(True) for x in (q, k, v, g, gk, S0)]
    torch.library.opcheck(torch.ops.linattn.gla_forward.default,
                          (*xs, cu, 0.25, 8, True, "native"))


class _Layer(torch.nn.Module):
    """A GLA call with per-key and scalar gates from the input, as a model layer makes them."""

    def forward(self, x: torch.Tensor, S0: torch.Tensor):
        gk = F.logsigmoid(x) / 4
        g = F.logsigmoid(x.sum(-1)) / 4
        o, S = linattn.gated_linear_attention(x, x.flip(-1), torch.cat([x, x], -1), g, gk,
                                              initial_state=S0, return_state=True)
        return o, S


def test_compile_and_export_keep_the_ops_in_the_graph(assert_close):
    """torch.compile(fullgraph=True) forward and backward and torch.export, with the compiled
    path forced: the same values as eager, and ``linattn::gla_forward`` a node of the graph."""
    x = torch.randn(1, 2, 24, 16, generator=torch.Generator().manual_seed(3)) / 4
    S0 = _state(1, 2, 16, 32)
    layer = _Layer()
    with dispatch.use(impl="native"):
        torch._dynamo.reset()
        want = layer(x, S0)
        xe = x.clone().requires_grad_(True)
        _loss(*layer(xe, S0)).backward()
        compiled = torch.compile(layer, fullgraph=True, backend=BACKEND)
        got = compiled(x, S0)
        xc = x.clone().requires_grad_(True)
        _loss(*compiled(xc, S0)).backward()
        ep = torch.export.export(layer, (x, S0))
        exported = ep.module()(x, S0)
    torch._dynamo.reset()
    for a, b in zip((*got, *exported), (*want, *want), strict=True):
        assert_close(a, b, ulps=ULPS_FWD)
    assert_close(xc.grad, xe.grad, ulps=ULPS_FWD)
    names = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert any("linattn.gla_forward" in t for t in names), names


def test_step_compiles_and_exports(assert_close):
    gen = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(1, 2, 16, generator=gen) for _ in range(3))
    gk = F.logsigmoid(torch.randn(1, 2, 16, generator=gen))
    S = _state(1, 2, 16, 16)

    def step(q, k, v, gk, S):
        return linattn.gated_linear_attention_step(q, k, v, S, gk_t=gk)

    class Step(torch.nn.Module):
        def forward(self, q, k, v, gk, S):
            return step(q, k, v, gk, S)

    with dispatch.use(impl="native"):
        torch._dynamo.reset()
        want = step(q, k, v, gk, S)
        got = torch.compile(step, fullgraph=True, backend=BACKEND)(q, k, v, gk, S)
        ep = torch.export.export(Step(), (q, k, v, gk, S))
    torch._dynamo.reset()
    for a, b in zip((*got, *ep.module()(q, k, v, gk, S)), (*want, *want), strict=True):
        assert_close(a, b, ulps=ULPS_FWD)
    names = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert any("linattn.gla_step" in t for t in names), names


def test_the_ops_compute_the_same_function_without_kernels(monkeypatch, assert_close):
    """An exported program names the ops; where no compiled library loads they compute the
    same function in torch operations, gradients and the step included."""
    args = _op_args("both", True)
    want = gated_native._FORWARD(*args)
    _loss(want[0], want[1]).backward()
    want_grads = [x.grad.clone() for x in args[:6]]
    for x in args[:6]:
        x.grad = None
    q, k, v, g, gk, S0 = (x.detach() for x in args[:6])
    step = (q[:, :, 0], k[:, :, 0], v[:, :, 0], g[:, :, 0], gk[:, :, 0], S0, 0.25, "native")
    want_step = gated_native.gla_step(*step)
    monkeypatch.setattr(gated_native, "kernels", lambda isa="native": None)
    got = gated_native._FORWARD(*args)
    for a, b in zip(got[:2], want[:2], strict=True):
        assert_close(a, b, ulps=ULPS_FWD)
    _loss(got[0], got[1]).backward()
    for x, w in zip(args[:6], want_grads, strict=True):
        assert_close(x.grad, w, ulps=ULPS_GRAD)
    for a, b in zip(gated_native.gla_step(*step), want_step, strict=True):
        assert_close(a, b, ulps=ULPS_FWD)


def test_opcheck_strided_inputs():
    """Transposed (B, T, H, ·) views: the fake implementations give the kernels' contiguous
    results, not the inputs' strides (a compiled training step views them otherwise)."""
    gen = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 19, 2, 16, generator=gen).div(4).transpose(1, 2)
               for _ in range(3))
    gk = F.logsigmoid(torch.randn(1, 19, 2, 16, generator=gen)).transpose(1, 2)
    S0 = _state(1, 2, 16, 16).transpose(-1, -2)
    xs = [x.requires_grad_(True) for x in (q, k, v, gk, S0)]
    torch.library.opcheck(torch.ops.linattn.gla_forward.default,
                          (*xs[:3], None, xs[3], xs[4], None, 0.25, 8, True, "native"))
    o, S, ckpt = torch.ops.linattn.gla_forward.default(*(x.detach() for x in xs[:3]), None,
                                                      gk.detach(), S0.detach(), None, 0.25, 8,
                                                      True, "native")
    torch.library.opcheck(torch.ops.linattn.gla_backward.default,
                          (*(x.detach() for x in xs[:3]), None, gk.detach(), S0.detach(), ckpt,
                           None, torch.randn(o.shape).transpose(-1, -2).contiguous()
                           .transpose(-1, -2), None, 0.25, 8, "native"))
    torch.library.opcheck(torch.ops.linattn.gla_step.default,
                          (q[:, :, 0].detach(), k[:, :, 0].detach(), v[:, :, 0].detach(), None,
                           gk[:, :, 0].detach(), S0.detach(), 0.25, "native"))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("which", GATES)
def test_a_16_bit_step_is_the_float32_step_on_its_values(native_calls, dtype, which,
                                                         monkeypatch):
    """q, k, v and the gates in bfloat16 / float16 (the state float32): the kernel reads them
    as float32 (exact) and rounds o once, so the step equals the float32 step on the same
    values with its o rounded to the dtype (within one rounding of it; never bit for bit), and
    it goes straight to the kernel (no widened copies, no general checks)."""
    q, k, v, g, gk = (None if x is None else x[..., 0, :] if x.dim() > 3 else x[..., 0]
                      for x in _inputs(2, 5, T=1, K=32, V=48, which=which, seed=4))
    S = torch.randn(2, 5, 32, 48, generator=torch.Generator().manual_seed(5)) * 0.1
    low = [None if x is None else x.to(dtype) for x in (q, k, v, g, gk)]
    with monkeypatch.context() as m:
        m.setattr(gated_native, "gla_step", None)
        o, S_new = gated_linear_attention_step(*low[:3], S, g_t=low[3], gk_t=low[4])
    assert native_calls["step"] == 1
    wide = [None if x is None else x.float() for x in low]
    o32, S32 = gated_linear_attention_step(*wide[:3], S, g_t=wide[3], gk_t=wide[4])
    assert o.dtype == dtype and S_new.dtype == torch.float32
    eps32, eps = torch.finfo(torch.float32).eps, torch.finfo(dtype).eps
    torch.testing.assert_close(S_new, S32, rtol=8 * eps32, atol=8 * eps32)
    torch.testing.assert_close(o.float(), o32, rtol=eps, atol=eps * o32.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("which", GATES)
def test_a_16_bit_prefill_reads_its_rows_itself(native_calls, dtype, which, monkeypatch):
    """Without gradients, 16-bit q, k, v go to the forward kernel as they are (read a chunk at
    a time as float32: no widened copy of the whole input), and give the float32 forward on the
    same values with o rounded once (within one rounding of the dtype)."""
    q, k, v, g, gk = _inputs(2, 3, T=150, K=32, V=48, which=which, seed=6, dtype=dtype)
    S0 = _state(2, 3, 32, 48)
    widened = []
    real_rows = gated_native.float32_rows
    monkeypatch.setattr(gated_native, "float32_rows",
                        lambda x, n: widened.append(x.dtype) or real_rows(x, n))
    with torch.no_grad():
        o, S = gated_linear_attention(q, k, v, g=g, gk=gk, initial_state=S0, return_state=True)
    assert native_calls["prefill"] == 1 and dtype not in widened
    o32, S32 = gated_linear_attention(q.float(), k.float(), v.float(), g=g, gk=gk,
                                      initial_state=S0, return_state=True)
    assert o.dtype == dtype
    eps32, eps = torch.finfo(torch.float32).eps, torch.finfo(dtype).eps
    torch.testing.assert_close(S, S32, rtol=16 * eps32, atol=16 * eps32 * S32.abs().max().item())
    torch.testing.assert_close(o.float(), o32, rtol=eps + 16 * eps32,
                               atol=(eps + 16 * eps32) * o32.abs().max().item())
