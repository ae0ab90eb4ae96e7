"""Grouped value attention (GVA: q, k with H heads, v, β, the gates and the state with
HV = G·H) and per-key gates (KDA) in the delta rule: the compiled forward and step
(ops/delta/native.py, ``la_gdr_forward`` / ``la_gdr_step``), the portable torch forms and the
float64 reference agree; the compiled path reads q and k in place (never repeated); gradients
with GVA on both training paths; errors name the argument. Per-key and per-value gates: the
chunked per-key form and the token loop against the float64 reference, forward and gradients.

The compiled tests skip where no compiled library can be had (no C compiler); the portable
and reference ones run everywhere. Tolerances come from float32's epsilon, scaled by the
largest magnitude of the expected values."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from linattn.ops import dispatch
from linattn.ops import reference as ref
from linattn.ops.delta import native as delta_native
from linattn.ops.delta.kda import KDA_CHUNK, per_key_segsum
from linattn.ops.delta.op import delta_rule, delta_rule_step, l2_normalised

F32_EPS = torch.finfo(torch.float32).eps
#: float32 rounding through a recurrence of up to a few hundred tokens, K up to 128
TOL = 512 * F32_EPS  # ~6e-5 of the largest magnitude

needs_native = pytest.mark.skipif(
    delta_native.unavailable() is not None,
    reason=f"compiled delta rule: {delta_native.unavailable()}",
)


@pytest.fixture
def calls(monkeypatch):
    """Counts of the calls that really took the compiled prefill, its training forward and the
    compiled step (its kernel call, step_into, which the lean path and the custom op both
    make)."""
    seen = {"prefill": 0, "train": 0, "step": 0}
    for name, key in (("delta_rule_native", "prefill"), ("delta_rule_native_train", "train"),
                      ("step_into", "step")):
        real = getattr(delta_native, name)

        def counted(*a, _real=real, _key=key, **kw):
            seen[_key] += 1
            return _real(*a, **kw)

        monkeypatch.setattr(delta_native, name, counted)
    return seen


def _inputs(B, H, G, T, K, V, *, l2norm=True, g=False, gk=False, seed=0, dtype=torch.float32):
    """q, k (B, H, T, K); v (B, HV, T, V); beta, g (B, HV, T); gk (B, HV, T, K); S0
    (B, HV, K, V). Without qk_l2norm the keys get norms near 1 (a contraction for beta in
    (0, 1)), so that long sequences stay bounded."""
    gen = torch.Generator().manual_seed(seed)
    HV = G * H
    q = torch.randn(B, H, T, K, generator=gen, dtype=dtype)
    k = torch.randn(B, H, T, K, generator=gen, dtype=dtype)
    if not l2norm:
        q, k = q / math.sqrt(K), k / math.sqrt(K)
    v = torch.randn(B, HV, T, V, generator=gen, dtype=dtype)
    beta = torch.rand(B, HV, T, generator=gen, dtype=dtype)
    gate = -0.5 * torch.rand(B, HV, T, generator=gen, dtype=dtype) if g else None
    gkey = -0.5 * torch.rand(B, HV, T, K, generator=gen, dtype=dtype) if gk else None
    S0 = 0.3 * torch.randn(B, HV, K, V, generator=gen, dtype=dtype)
    return q, k, v, beta, gate, gkey, S0


def _reference(q, k, v, beta, g, gk, S0, *, l2norm, scale=None):
    d = lambda x: None if x is None else x.double()  # noqa: E731
    return ref.delta_rule(d(q), d(k), d(v), d(beta), d(g), d(gk), scale=scale,
                          initial_state=d(S0), qk_l2norm=l2norm)


def _close(got, want, tol=TOL):
    """|got − want| within ``tol`` times want's largest magnitude (at least 1e-3)."""
    want = want.double()
    scale = max(want.abs().max().item(), 1e-3) if want.numel() else 1.0
    torch.testing.assert_close(got.double(), want, rtol=0, atol=tol * scale)


GATES = {"none": (False, False), "g": (True, False), "gk": (False, True), "g+gk": (True, True)}
SIZES = [(16, 16), (64, 64), (128, 128), (16, 64), (64, 128), (128, 16), (16, 128),
         (64, 16), (128, 64)]


def _cases():
    """G × T × gates, each with one (K, V) of SIZES and qk_l2norm on or off in turn: every value
    of every factor meets every G."""
    out = []
    for i, (G, T, gates) in enumerate((G, T, gates) for G in (1, 2, 4) for T in (0, 1, 17, 200)
                                      for gates in GATES):
        K, V = SIZES[(i * 5) % len(SIZES)]
        if T == 200 and K * V > 64 * 64:
            K, V = (64, 128) if i % 2 else (128, 64)  # the largest heads, and still quick
        out.append((G, T, gates, K, V, (i + i // 4) % 2 == 0))
    return out


@pytest.mark.parametrize("G, T, gates, K, V, l2norm", _cases())
def test_compiled_portable_and_reference_agree(calls, G, T, gates, K, V, l2norm):
    g_on, gk_on = GATES[gates]
    q, k, v, beta, g, gk, S0 = _inputs(2, 2, G, T, K, V, l2norm=l2norm, g=g_on, gk=gk_on,
                                       seed=G * 1000 + T)
    want_o, want_S = _reference(q, k, v, beta, g, gk, S0, l2norm=l2norm)
    impls = ["portable"] + ([] if delta_native.unavailable() else ["native"])
    for impl in impls:
        with dispatch.use(impl=impl):
            o, S = delta_rule(q, k, v, beta, g, gk, initial_state=S0, return_state=True,
                              qk_l2norm=l2norm)
        assert o.shape == (2, 2 * G, T, V) and S.shape == (2, 2 * G, K, V)
        assert o.dtype == S.dtype == torch.float32
        _close(o, want_o)
        _close(S, want_S)
    assert calls["prefill"] == (len(impls) - 1)  # the compiled one, when there


@needs_native
@pytest.mark.parametrize("G", [1, 2, 4])
@pytest.mark.parametrize("gates", ["g", "gk", "g+gk"])
def test_steps_equal_prefill_and_reference(calls, G, gates):
    """Token by token through delta_rule_step (the lean path: contiguous float32 tensors and a
    given state; also in place) and the general one (bfloat16 inputs), GVA and per-key gates:
    the prefill's and the reference's outputs and state."""
    g_on, gk_on = GATES[gates]
    T, K, V = 9, 32, 48
    q, k, v, beta, g, gk, S0 = _inputs(2, 3, G, T, K, V, g=g_on, gk=gk_on, seed=G)
    want_o, want_S = _reference(q, k, v, beta, g, gk, S0, l2norm=True)
    with dispatch.use(impl="native"):
        o_all, S_all = delta_rule(q, k, v, beta, g, gk, initial_state=S0, return_state=True,
                                  qk_l2norm=True)
        S, S_in_place, outs, outs_in_place = S0, S0.clone(), [], []
        for t in range(T):
            at = dict(g_t=None if g is None else g[..., t].contiguous(),
                      gk_t=None if gk is None else gk[..., t, :].contiguous())
            x = [q[..., t, :].contiguous(), k[..., t, :].contiguous(),
                 v[..., t, :].contiguous(), beta[..., t].contiguous()]
            before = S.clone()
            o, S_new = delta_rule_step(*x, S, qk_l2norm=True, **at)
            torch.testing.assert_close(S, before, rtol=0, atol=0)  # the state passed in is kept
            outs.append(o)
            S = S_new
            o2, S2 = delta_rule_step(*x, S_in_place, qk_l2norm=True, inplace=True, **at)
            assert S2 is S_in_place
            outs_in_place.append(o2)
    for got_o, got_S in ((torch.stack(outs, -2), S),
                         (torch.stack(outs_in_place, -2), S_in_place)):
        _close(got_o, o_all, 16 * F32_EPS)
        _close(got_S, S_all, 16 * F32_EPS)
        _close(got_o, want_o)
        _close(got_S, want_S)
    assert calls["step"] == 2 * T and calls["prefill"] == 1
    # the general path: bfloat16 q, k, v widened, from no state
    t = 0
    at = dict(g_t=None if g is None else g[..., t], gk_t=None if gk is None else gk[..., t, :])
    xb = [x[..., t, :].bfloat16() for x in (q, k, v)]
    with dispatch.use(impl="native"):
        ob, Sb = delta_rule_step(*xb, beta[..., t], qk_l2norm=True, **at)
    assert ob.dtype == torch.bfloat16 and Sb.dtype == torch.float32 and ob.shape == (2, 3 * G, V)
    wo, wS = _reference(*(x.unsqueeze(-2) for x in xb), beta[..., t, None],
                        None if g is None else g[..., t, None],
                        None if gk is None else gk[..., t, None, :], None, l2norm=True)
    _close(ob, wo.squeeze(-2), 1e-2)
    _close(Sb, wS)
    assert calls["step"] == 2 * T + 1


@pytest.mark.parametrize("G", [1, 2, 4])
def test_portable_step_with_gva_and_per_key_gates(G):
    """The torch step (any dtype; here float64) with GVA and both gates against the reference."""
    T, K, V = 6, 5, 4
    q, k, v, beta, g, gk, S0 = _inputs(1, 2, G, T, K, V, g=True, gk=True, seed=3,
                                       dtype=torch.float64)
    want_o, want_S = _reference(q, k, v, beta, g, gk, S0, l2norm=True)
    S, outs = S0, []
    with dispatch.use(impl="portable"):
        for t in range(T):
            o, S = delta_rule_step(q[..., t, :], k[..., t, :], v[..., t, :], beta[..., t], S,
                                   g_t=g[..., t], gk_t=gk[..., t, :], qk_l2norm=True)
            outs.append(o)
    torch.testing.assert_close(torch.stack(outs, -2), want_o)
    torch.testing.assert_close(S, want_S)


@pytest.mark.parametrize("gates", ["g", "g+gk"])
def test_packed_sequences_with_gva(calls, gates):
    """cu_seqlens with GVA (and per-key gates): each sequence from its own state, as separate
    reference calls compute it (an empty sequence included); compiled and portable."""
    g_on, gk_on = GATES[gates]
    q, k, v, beta, g, gk, _ = _inputs(1, 2, 2, 41, 16, 32, g=g_on, gk=gk_on, seed=7)
    cu = torch.tensor([0, 10, 10, 33, 41])
    S0 = 0.3 * torch.randn(4, 4, 16, 32, generator=torch.Generator().manual_seed(8))
    impls = ["portable"] + ([] if delta_native.unavailable() else ["native"])
    for impl in impls:
        with dispatch.use(impl=impl):
            o, S = delta_rule(q, k, v, beta, g, gk, initial_state=S0, cu_seqlens=cu,
                              return_state=True, qk_l2norm=True, chunk_size=8)
        assert o.shape == (1, 4, 41, 32) and S.shape == (4, 4, 16, 32)
        for n, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)):
            part = (slice(None), slice(None), slice(a, b))
            ro, rS = _reference(q[part], k[part], v[part], beta[part],
                                None if g is None else g[part],
                                None if gk is None else gk[part], S0[n:n + 1], l2norm=True)
            _close(o[part], ro)
            _close(S[n:n + 1], rS)
    assert calls["prefill"] == len(impls) - 1


@needs_native
def test_the_compiled_path_reads_q_and_k_in_place(monkeypatch, calls):
    """No repeated q or k on the compiled GVA path, forward (plain and packed) and step (lean
    and general): torch.repeat_interleave raises if called, and the kernel's q and k are the
    caller's memory."""
    def refuse(*a, **kw):
        raise AssertionError("repeat_interleave called on the compiled GVA path")

    monkeypatch.setattr(torch, "repeat_interleave", refuse)
    monkeypatch.setattr(torch.Tensor, "repeat_interleave", refuse)
    seen = []
    real_forward = delta_native._forward

    def forward(fns, q, k, *a, **kw):
        seen.append((q.data_ptr(), k.data_ptr(), q.shape[0]))
        return real_forward(fns, q, k, *a, **kw)

    monkeypatch.setattr(delta_native, "_forward", forward)
    q, k, v, beta, g, gk, S0 = _inputs(2, 2, 4, 20, 16, 16, g=True, gk=True)
    with dispatch.use(impl="native"):
        o = delta_rule(q, k, v, beta, g, gk, initial_state=S0, qk_l2norm=True)
        assert seen == [(q.data_ptr(), k.data_ptr(), 4)]  # 2 x 2 q/k heads for 2 x 8 value heads
        cu = torch.tensor([0, 7, 20])
        delta_rule(q[:1], k[:1], v[:1], beta[:1], g[:1], gk[:1], cu_seqlens=cu)
        step = [x[..., 0, :].contiguous() for x in (q, k, v)]
        o1, S1 = delta_rule_step(*step, beta[..., 0].contiguous(), S0,
                                 g_t=g[..., 0].contiguous(), gk_t=gk[..., 0, :].contiguous())
        o2, S2 = delta_rule_step(*step, beta[..., 0].contiguous(), None, g_t=g[..., 0],
                                 gk_t=gk[..., 0, :])
    assert o.shape == (2, 8, 20, 16) and o1.shape == o2.shape == (2, 8, 16)
    assert calls["prefill"] == 2 and calls["step"] == 2
    monkeypatch.undo()
    _close(o, _reference(q, k, v, beta, g, gk, S0, l2norm=True)[0])


@needs_native
@pytest.mark.parametrize("HV, H, threads", [(12, 6, 2), (6, 3, 4), (2, 1, 4), (16, 4, 3)])
def test_threads_split_inside_groups(monkeypatch, calls, HV, H, threads):
    """Parts of a call that start inside a group of value heads read the right q/k heads: the
    same numbers as one thread, bit for bit, prefill and step (its threaded form too). 12
    value heads on 2 threads are 8 parts, (1, 3) among them: heads 1 and 2 of G = 2 read q/k
    heads 0 and 1; 6 on 4: one head per part; 2 on 4: a head's column blocks."""
    monkeypatch.setattr(delta_native, "PARALLEL_MIN", 0)
    q, k, v, beta, g, gk, S0 = _inputs(1, H, HV // H, 70, 16, 64, g=True, gk=True)
    results = []
    with dispatch.use(impl="native"):
        for n in (1, threads):
            monkeypatch.setattr(torch, "get_num_threads", lambda n=n: n)
            results.append(delta_rule(q, k, v, beta, g, gk, initial_state=S0, return_state=True,
                                      qk_l2norm=True))
            results.append(delta_rule_step(
                q[..., 0, :].contiguous(), k[..., 0, :].contiguous(), v[..., 0, :].contiguous(),
                beta[..., 0].contiguous(), results[-1][1], g_t=g[..., 0].contiguous(),
                gk_t=gk[..., 0, :].contiguous(), qk_l2norm=True))
    for a, b in zip(results[:2], results[2:], strict=True):
        for x, y in zip(a, b, strict=True):
            torch.testing.assert_close(x, y, rtol=0, atol=0)
    _close(results[0][0], _reference(q, k, v, beta, g, gk, S0, l2norm=True)[0])
    assert calls["prefill"] == 2 and calls["step"] == 2


@needs_native
def test_step_value_checks_with_per_key_gates():
    """The kernel checks gk_t's values itself: a positive or nan per-key gate raises naming
    gk_t (on the lean path and the general one), nothing is written; −∞ (a reset) is taken."""
    q, k, v, beta, g, gk, S0 = _inputs(1, 2, 2, 1, 16, 16, g=True, gk=True)
    step = [x[..., 0, :].contiguous() for x in (q, k, v)] + [beta[..., 0].contiguous()]
    gk_t = gk[..., 0, :].contiguous()
    with dispatch.use(impl="native"):
        for bad in (0.5, float("nan")):
            wrong = gk_t.clone()
            wrong[0, 3, 5] = bad
            keep = S0.clone()
            with pytest.raises(ValueError, match="gk_t"):
                delta_rule_step(*step, S0, gk_t=wrong, inplace=True)
            torch.testing.assert_close(S0, keep, rtol=0, atol=0)
            with pytest.raises(ValueError, match="gk_t"):
                delta_rule_step(*step, None, gk_t=wrong)
        reset = gk_t.clone()
        reset[0, 1] = float("-inf")
        o, S = delta_rule_step(*step, S0, gk_t=reset)
    wo, wS = _reference(*(x.unsqueeze(-2) for x in step[:3]), step[3][..., None], None,
                        reset.unsqueeze(-2), S0, l2norm=False)
    _close(o, wo.squeeze(-2))
    _close(S, wS)


# ---------------------------------------------------------------------------- gradients
def test_portable_gradients_with_gva_gradcheck():
    """float64, the torch chunked form with GVA (G = 2): gradcheck against finite differences,
    through the repeat of q and k (autograd sums the group)."""
    q, k, v, beta, g, _, S0 = _inputs(1, 2, 2, 7, 3, 2, g=True, dtype=torch.float64)
    args = [x.clone().requires_grad_() for x in (q, k, v, beta, g, S0)]

    def f(q, k, v, beta, g, S0):
        with dispatch.use(impl="portable"):
            return delta_rule(q, k, v, beta, g, initial_state=S0, chunk_size=4,
                              return_state=True, qk_l2norm=True)

    assert torch.autograd.gradcheck(f, args)


@pytest.mark.parametrize("gates", ["g", "gk", "g+gk"])
def test_portable_gradients_with_gva_match_the_reference(gates):
    g_on, gk_on = GATES[gates]
    q, k, v, beta, g, gk, S0 = _inputs(2, 2, 2, 21, 5, 4, g=g_on, gk=gk_on, seed=4,
                                       dtype=torch.float64)
    xs = [q, k, v, beta, g, gk, S0]
    a = [None if x is None else x.clone().requires_grad_() for x in xs]
    b = [None if x is None else x.clone().requires_grad_() for x in xs]
    wo = torch.randn(2, 4, 21, 4, dtype=torch.float64)
    wS = torch.randn(2, 4, 5, 4, dtype=torch.float64)
    with dispatch.use(impl="portable"):
        o, S = delta_rule(*a[:6], initial_state=a[6], return_state=True, chunk_size=8,
                          qk_l2norm=True)
    ((o * wo).sum() + (S * wS).sum()).backward()
    ro, rS = ref.delta_rule(*b[:6], initial_state=b[6], qk_l2norm=True)
    ((ro * wo).sum() + (rS * wS).sum()).backward()
    tol = 300 * torch.finfo(torch.float64).eps
    for x, y in zip(a, b, strict=True):
        if x is not None:
            torch.testing.assert_close(x.grad, y.grad, rtol=tol, atol=tol)


@needs_native
@pytest.mark.parametrize("G", [2, 4])
@pytest.mark.parametrize("gated", [False, True])
def test_compiled_training_path_gradients_with_gva(calls, G, gated):
    """float32, the compiled forward and backward with GVA (q, k repeated for the kernels;
    autograd sums each group): the gradients of q, k, v, β, g and the initial state against
    autograd through the float64 reference."""
    T, K, V = 70, 16, 32
    q, k, v, beta, g, _, S0 = _inputs(2, 2, G, T, K, V, g=gated, seed=5)
    xs = [q, k, v, beta, g, S0]
    a = [None if x is None else x.clone().requires_grad_() for x in xs]
    b = [None if x is None else x.double().requires_grad_() for x in xs]
    gen = torch.Generator().manual_seed(6)
    wo = torch.randn(2, 2 * G, T, V, generator=gen)
    wS = torch.randn(2, 2 * G, K, V, generator=gen)
    with dispatch.use(impl="native"):
        o, S = delta_rule(*a[:5], initial_state=a[5], return_state=True, qk_l2norm=True)
    ((o * wo).sum() + (S * wS).sum()).backward()
    assert calls["train"] == 1
    ro, rS = ref.delta_rule(*b[:5], initial_state=b[5], qk_l2norm=True)
    ((ro * wo.double()).sum() + (rS * wS.double()).sum()).backward()
    for x, y in zip(a, b, strict=True):
        if x is not None:
            assert x.grad.shape == x.shape
            _close(x.grad, y.grad, 2e-4)


# ------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("step", [False, True])
def test_wrong_head_counts_name_the_argument(step):
    """HV not a multiple of H (or fewer value heads than q/k heads), q and k disagreeing, v's
    other dimensions off, or β, a gate or the state with q's heads rather than v's: a
    ValueError naming the argument."""
    q, k, v, beta, g, gk, S0 = _inputs(2, 2, 2, 5, 16, 16, g=True, gk=True)
    if step:  # one token: q_t, k_t (B, H, K), v_t (B, HV, V), beta_t, g_t (B, HV), gk_t (B, HV, K)
        q, k, v, gk = (x[..., 0, :] for x in (q, k, v, gk))
        beta, g = beta[..., 0], g[..., 0]
        names = dict(q="q_t", k="k_t", v="v_t", beta="beta_t", g="g_t", gk="gk_t", S0="state")
        heads = dict(q=-2, beta=-1, g=-1, gk=-2, S0=-3)

        def call(q=q, k=k, v=v, beta=beta, g=g, gk=gk, S0=S0):
            return delta_rule_step(q, k, v, beta, S0, g_t=g, gk_t=gk)
    else:
        names = dict(q="q", k="k", v="v", beta="beta", g="g", gk="gk", S0="initial_state")
        heads = dict(q=-3, beta=-2, g=-2, gk=-3, S0=-3)

        def call(q=q, k=k, v=v, beta=beta, g=g, gk=gk, S0=S0):
            return delta_rule(q, k, v, beta, g, gk, initial_state=S0)

    call()  # the right shapes pass
    h = heads["q"]
    with pytest.raises(ValueError, match=rf"^{names['v']}: expected a number of value heads"):
        call(v=v.narrow(h, 0, 3))  # HV = 3 for H = 2
    with pytest.raises(ValueError, match=rf"^{names['v']}: expected a number of value heads"):
        call(q=torch.cat([q, q, q], h), k=torch.cat([k, k, k], h))  # H = 6 > HV = 4
    with pytest.raises(ValueError, match=rf"^{names['k']}: "):
        call(k=torch.cat([k, k], h))  # k with 4 heads, q with 2
    with pytest.raises(ValueError, match=rf"^{names['v']}: shape .* apart from the heads"):
        call(v=torch.cat([v, v], 0))  # another batch size
    for arg in ("beta", "g", "gk", "S0"):  # q's 2 heads, not v's 4
        x = {"beta": beta, "g": g, "gk": gk, "S0": S0}[arg]
        with pytest.raises(ValueError, match=rf"^{names[arg]}: expected shape"):
            call(**{arg: x.narrow(heads[arg], 0, 2)})


def test_reference_refuses_wrong_heads():
    q, k, v, beta, *_ = _inputs(1, 2, 1, 3, 4, 4)
    v3 = torch.randn(1, 3, 3, 4)
    with pytest.raises(ValueError, match="v: expected a multiple"):
        ref.delta_rule(q, k, v3, torch.rand(1, 3, 3))


@needs_native
@pytest.mark.parametrize("G", [1, 2])
def test_opcheck_with_gva_and_per_key_gates(G):
    """The custom ops with their new arguments (per-key gates, GVA shapes): schema, fake
    implementation (output shapes from v), autograd registration, AOT dispatch."""
    q, k, v, beta, g, gk, S0 = _inputs(1, 2, G, 9, 16, 16, g=True, gk=True)
    torch.library.opcheck(torch.ops.linattn.gdr_forward.default,
                          (q, k, v, beta, g, S0, None, 0.25, True, "native", gk))
    step = (q[:, :, 0], k[:, :, 0], v[:, :, 0], beta[:, :, 0], g[:, :, 0], S0, 0.25, True,
            "native", gk[:, :, 0])
    torch.library.opcheck(torch.ops.linattn.gdr_step.default, step)


@needs_native
def test_compiled_graph_with_gva_and_per_key_gates(calls):
    """torch.compile keeps the compiled forward and step in the graph with GVA and gk: the
    same numbers as eager."""
    q, k, v, beta, g, gk, S0 = _inputs(1, 2, 2, 12, 16, 16, g=True, gk=True)

    def f(q, k, v, beta, g, gk, S0):
        o, S = delta_rule(q, k, v, beta, g, gk, initial_state=S0, return_state=True,
                          qk_l2norm=True)
        o_t, S = delta_rule_step(q[..., 0, :], k[..., 0, :], v[..., 0, :], beta[..., 0], S,
                                 g_t=g[..., 0], gk_t=gk[..., 0, :], qk_l2norm=True)
        return o, o_t, S

    with dispatch.use(impl="native"):
        want = f(q, k, v, beta, g, gk, S0)
        got = torch.compile(f, backend="aot_eager", fullgraph=True)(q, k, v, beta, g, gk, S0)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=16 * F32_EPS)


# -------------------- per-key and per-value gates: the chunked per-key form and the token loop
# Per-key (KDA) and per-value gates in the delta rule: the chunked per-key form and the token
# loop against the sequential float64 reference, forward and gradients.


F64 = torch.float64


def _kda_inputs(B=2, H=3, T=23, K=5, V=4, seed=0, dtype=F64):
    """q, k (unit rows), v, β ∈ (0, 1), a scalar log-gate g (B, H, T), per-key gk (B, H, T, K)
    and per-value gv (B, H, T, V) log-gates, an initial state (B, H, K, V)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, K, generator=gen, dtype=dtype)
    k = l2_normalised(torch.randn(B, H, T, K, generator=gen, dtype=dtype))
    v = torch.randn(B, H, T, V, generator=gen, dtype=dtype)
    beta = torch.rand(B, H, T, generator=gen, dtype=dtype)
    g = F.logsigmoid(torch.randn(B, H, T, generator=gen, dtype=dtype))
    gk = F.logsigmoid(torch.randn(B, H, T, K, generator=gen, dtype=dtype))
    gv = F.logsigmoid(torch.randn(B, H, T, V, generator=gen, dtype=dtype))
    S0 = torch.randn(B, H, K, V, generator=gen, dtype=dtype)
    return q, k, v, beta, g, gk, gv, S0


def _tol(dtype: torch.dtype) -> float:
    """A few hundred units of the dtype's rounding: sums of a few dozen terms of size ~1."""
    return 300 * torch.finfo(dtype).eps


KDA_GATES = {"gk": (False, True, False), "g+gk": (True, True, False), "gv": (False, False, True),
         "g+gk+gv": (True, True, True)}


@pytest.mark.parametrize("chunk", [1, 3, 7, 16, 64])
@pytest.mark.parametrize("gates", list(KDA_GATES))
@pytest.mark.parametrize("l2", [False, True])
def test_matches_the_reference(chunk, gates, l2):
    q, k, v, beta, g, gk, gv, S0 = _kda_inputs()
    k = k * 1.7  # not unit: the normalisation must do its part when asked
    args = [x if use else None for x, use in zip((g, gk, gv), KDA_GATES[gates], strict=True)]
    o, S = delta_rule(q, k, v, beta, *args, initial_state=S0, return_state=True,
                      chunk_size=chunk, qk_l2norm=l2, scale=0.7)
    ro, rS = ref.delta_rule(q, k, v, beta, *args, initial_state=S0, qk_l2norm=l2,
                                  scale=0.7)
    tol = _tol(F64)
    torch.testing.assert_close(o, ro, rtol=tol, atol=tol)
    torch.testing.assert_close(S, rS, rtol=tol, atol=tol)


def test_per_key_segment_sums_are_the_sums_of_their_terms():
    x = -torch.rand(2, 6, 3, dtype=F64)
    seg = per_key_segsum(x)
    for i in range(6):
        for j in range(6):
            want = x[:, j + 1:i + 1].sum(1) if j < i else torch.zeros(2, 3, dtype=F64)
            torch.testing.assert_close(seg[:, i, j], want)


@pytest.mark.parametrize("gates", ["gk", "g+gk+gv"])
def test_gradients_match_the_reference(gates):
    """Gradients of q, k, v, β, every gate and the initial state, through the chunked per-key
    form (several chunks) and the token loop, against autograd through the reference."""
    q, k, v, beta, g, gk, gv, S0 = _kda_inputs(T=37)
    xs = [q, k, v, beta, g, gk, gv, S0]
    use = (True, True, True, True, *KDA_GATES[gates], True)
    a = [x.clone().requires_grad_() if u else None for x, u in zip(xs, use, strict=True)]
    b = [x.clone().requires_grad_() if u else None for x, u in zip(xs, use, strict=True)]
    wo = torch.randn(2, 3, 37, 4, dtype=F64)
    wS = torch.randn(2, 3, 5, 4, dtype=F64)
    o, S = delta_rule(*a[:7], initial_state=a[7], return_state=True, chunk_size=8,
                      qk_l2norm=True)
    ((o * wo).sum() + (S * wS).sum()).backward()
    ro, rS = ref.delta_rule(*b[:7], initial_state=b[7], qk_l2norm=True)
    ((ro * wo).sum() + (rS * wS).sum()).backward()
    tol = _tol(F64)
    for x, y in zip(a, b, strict=True):
        if x is not None:
            torch.testing.assert_close(x.grad, y.grad, rtol=tol, atol=tol)


@pytest.mark.parametrize("gates", ["gk", "gv"])
def test_gradcheck(gates):
    q, k, v, beta, g, gk, gv, S0 = _kda_inputs(B=1, H=2, T=9, K=3, V=2)
    gate = gk if gates == "gk" else gv
    args = [x.clone().requires_grad_() for x in (q, k, v, beta, gate, S0)]

    def f(q, k, v, beta, gate, S0):
        gk, gv = (gate, None) if gates == "gk" else (None, gate)
        return delta_rule(q, k, v, beta, None, gk, gv, initial_state=S0, chunk_size=4,
                          return_state=True, qk_l2norm=True)

    assert torch.autograd.gradcheck(f, args)


def test_a_hard_reset_gives_zero_weight_not_nan():
    """gk = −∞ forgets the state's rows (all or some keys) exactly; outputs and gradients
    finite, equal to the reference (which multiplies by e^{−∞} = 0)."""
    q, k, v, beta, _, gk, _, S0 = _kda_inputs(T=20)
    gk = gk.clone()
    gk[..., 5, :] = float("-inf")  # a full reset inside the first chunk
    gk[..., 13, 1] = float("-inf")  # one key dimension, in another chunk
    xs = [x.clone().requires_grad_() for x in (q, k, v, beta, gk, S0)]
    o, S = delta_rule(*xs[:4], None, xs[4], initial_state=xs[5], return_state=True,
                      chunk_size=8)
    ro, rS = ref.delta_rule(q, k, v, beta, None, gk, initial_state=S0)
    tol = _tol(F64)
    torch.testing.assert_close(o, ro, rtol=tol, atol=tol)
    torch.testing.assert_close(S, rS, rtol=tol, atol=tol)
    (o.sum() + S.sum()).backward(retain_graph=True)
    for x in xs:
        assert x.grad.isfinite().all()
    # nothing before the full reset reaches anything after it
    for x in xs:
        x.grad = None
    (o[..., 5:, :].sum() + S.sum()).backward()
    assert (xs[5].grad == 0).all()
    assert (xs[2].grad[..., :5, :] == 0).all()
    assert (xs[2].grad[..., 5:, :] != 0).any()


def test_packed_sequences_equal_separate_calls():
    q, k, v, beta, g, gk, _, _ = _kda_inputs(B=1, H=2, T=30)
    cu = torch.tensor([0, 7, 7, 30])
    S0 = torch.randn(3, 2, 5, 4, dtype=F64)
    o, S = delta_rule(q, k, v, beta, g, gk, initial_state=S0, return_state=True, cu_seqlens=cu,
                      chunk_size=4, qk_l2norm=True)
    for n, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)):
        part = (slice(None), slice(None), slice(a, b))
        ro, rS = ref.delta_rule(q[part], k[part], v[part], beta[part], g[part], gk[part],
                                      initial_state=S0[n:n + 1], qk_l2norm=True)
        torch.testing.assert_close(o[part], ro, rtol=_tol(F64), atol=_tol(F64))
        torch.testing.assert_close(S[n:n + 1], rS, rtol=_tol(F64), atol=_tol(F64))


def test_long_float32_sequence_stays_close_to_the_reference():
    q, k, v, beta, _, gk, _, _ = _kda_inputs(B=1, H=2, T=300, K=16, V=8, dtype=torch.float32)
    gk = gk * 0.1  # slow decays: the state keeps hundreds of tokens
    o, S = delta_rule(q, k, v, beta, None, gk, return_state=True)
    ro, rS = ref.delta_rule(q, k, v, beta, None, gk)
    tol = 1e3 * torch.finfo(torch.float32).eps  # ~1e-4: float32 rounding over a long state
    torch.testing.assert_close(o, ro.float(), rtol=tol, atol=tol)
    torch.testing.assert_close(S, rS.float(), rtol=tol, atol=tol)
    assert KDA_CHUNK < 300  # several chunks were crossed


def test_prefill_then_continue_equals_whole():
    q, k, v, beta, _, gk, _, _ = _kda_inputs(T=21)
    whole = delta_rule(q, k, v, beta, None, gk)
    a, st = delta_rule(q[..., :9, :], k[..., :9, :], v[..., :9, :], beta[..., :9], None,
                       gk[..., :9, :], return_state=True)
    b = delta_rule(q[..., 9:, :], k[..., 9:, :], v[..., 9:, :], beta[..., 9:], None,
                   gk[..., 9:, :], initial_state=st)
    torch.testing.assert_close(torch.cat([a, b], -2), whole, rtol=_tol(F64), atol=_tol(F64))


def test_empty_sequence_returns_a_new_state():
    q, k, v, beta, _, gk, gv, S0 = _kda_inputs(T=0)
    for gates in ((gk, None), (None, gv)):
        o, S = delta_rule(q, k, v, beta, None, *gates, initial_state=S0, return_state=True)
        assert o.shape == (2, 3, 0, 4) and S is not S0
        torch.testing.assert_close(S, S0)


@pytest.mark.parametrize("name, value, match", [
    ("gk", torch.zeros(2, 3, 23, 4, dtype=F64), "gk: expected shape"),
    ("gk", torch.full((2, 3, 23, 5), 0.5, dtype=F64), "gk: expected log-gates <= 0"),
    ("gv", torch.full((2, 3, 23, 4), float("nan"), dtype=F64), "gv: expected log-gates <= 0"),
    ("gk", torch.zeros(2, 3, 23, 5, dtype=torch.long), "gk: expected a floating-point"),
])
def test_bad_gates_are_named(name, value, match):
    q, k, v, beta, *_ = _kda_inputs()
    with pytest.raises((ValueError, TypeError), match=match):
        delta_rule(q, k, v, beta, **{name: value})


def test_the_compiled_backend_takes_per_key_gates_without_gradients():
    """The compiled forward takes per-key gates (tests/ops/delta/test_gva_kda.py checks its
    numbers); a call that wants gradients with them, or with per-value gates, it refuses: forced,
    a ValueError saying so; by default the torch forms, equal to the reference."""
    from linattn.ops.delta import native as delta_native

    q, k, v, beta, _, gk, gv, _ = _kda_inputs(V=16, dtype=torch.float32)
    leaf = q.clone().requires_grad_(True)
    tol = 100 * torch.finfo(torch.float32).eps
    if delta_native.unavailable() is None:
        with dispatch.use(impl="native"):
            o = delta_rule(q, k, v, beta, None, gk)
            with pytest.raises(ValueError, match="no gradient with per-key gates"):
                delta_rule(leaf, k, v, beta, None, gk)
            with pytest.raises(ValueError, match="no per-value gates"):
                delta_rule(q, k, v, beta, None, None, gv)
        ro, _ = ref.delta_rule(q, k, v, beta, None, gk)
        torch.testing.assert_close(o, ro.float(), rtol=tol, atol=tol)
    for gates in ((gk, None), (None, gv)):
        o = delta_rule(leaf, k, v, beta, None, *gates)
        o.sum().backward()
        ro, _ = ref.delta_rule(q, k, v, beta, None, *gates)
        torch.testing.assert_close(o, ro.float(), rtol=tol, atol=tol)
