"""Per-key (KDA) and per-value gates in the delta rule: the chunked per-key form and the token
loop against the sequential float64 reference, forward and gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from linattn import delta_rule
from linattn.ops import dispatch, reference
from linattn.ops.delta.kda import KDA_CHUNK, per_key_segsum
from linattn.ops.delta.op import l2_normalised

F64 = torch.float64


def _inputs(B=2, H=3, T=23, K=5, V=4, seed=0, dtype=F64):
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


GATES = {"gk": (False, True, False), "g+gk": (True, True, False), "gv": (False, False, True),
         "g+gk+gv": (True, True, True)}


@pytest.mark.parametrize("chunk", [1, 3, 7, 16, 64])
@pytest.mark.parametrize("gates", list(GATES))
@pytest.mark.parametrize("l2", [False, True])
def test_matches_the_reference(chunk, gates, l2):
    q, k, v, beta, g, gk, gv, S0 = _inputs()
    k = k * 1.7  # not unit: the normalisation must do its part when asked
    args = [x if use else None for x, use in zip((g, gk, gv), GATES[gates], strict=True)]
    o, S = delta_rule(q, k, v, beta, *args, initial_state=S0, return_state=True,
                      chunk_size=chunk, qk_l2norm=l2, scale=0.7)
    ro, rS = reference.delta_rule(q, k, v, beta, *args, initial_state=S0, qk_l2norm=l2,
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
    q, k, v, beta, g, gk, gv, S0 = _inputs(T=37)
    xs = [q, k, v, beta, g, gk, gv, S0]
    use = (True, True, True, True, *GATES[gates], True)
    a = [x.clone().requires_grad_() if u else None for x, u in zip(xs, use, strict=True)]
    b = [x.clone().requires_grad_() if u else None for x, u in zip(xs, use, strict=True)]
    wo = torch.randn(2, 3, 37, 4, dtype=F64)
    wS = torch.randn(2, 3, 5, 4, dtype=F64)
    o, S = delta_rule(*a[:7], initial_state=a[7], return_state=True, chunk_size=8,
                      qk_l2norm=True)
    ((o * wo).sum() + (S * wS).sum()).backward()
    ro, rS = reference.delta_rule(*b[:7], initial_state=b[7], qk_l2norm=True)
    ((ro * wo).sum() + (rS * wS).sum()).backward()
    tol = _tol(F64)
    for x, y in zip(a, b, strict=True):
        if x is not None:
            torch.testing.assert_close(x.grad, y.grad, rtol=tol, atol=tol)


@pytest.mark.parametrize("gates", ["gk", "gv"])
def test_gradcheck(gates):
    q, k, v, beta, g, gk, gv, S0 = _inputs(B=1, H=2, T=9, K=3, V=2)
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
    q, k, v, beta, _, gk, _, S0 = _inputs(T=20)
    gk = gk.clone()
    gk[..., 5, :] = float("-inf")  # a full reset inside the first chunk
    gk[..., 13, 1] = float("-inf")  # one key dimension, in another chunk
    xs = [x.clone().requires_grad_() for x in (q, k, v, beta, gk, S0)]
    o, S = delta_rule(*xs[:4], None, xs[4], initial_state=xs[5], return_state=True,
                      chunk_size=8)
    ro, rS = reference.delta_rule(q, k, v, beta, None, gk, initial_state=S0)
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
    q, k, v, beta, g, gk, _, _ = _inputs(B=1, H=2, T=30)
    cu = torch.tensor([0, 7, 7, 30])
    S0 = torch.randn(3, 2, 5, 4, dtype=F64)
    o, S = delta_rule(q, k, v, beta, g, gk, initial_state=S0, return_state=True, cu_seqlens=cu,
                      chunk_size=4, qk_l2norm=True)
    for n, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)):
        part = (slice(None), slice(None), slice(a, b))
        ro, rS = reference.delta_rule(q[part], k[part], v[part], beta[part], g[part], gk[part],
                                      initial_state=S0[n:n + 1], qk_l2norm=True)
        torch.testing.assert_close(o[part], ro, rtol=_tol(F64), atol=_tol(F64))
        torch.testing.assert_close(S[n:n + 1], rS, rtol=_tol(F64), atol=_tol(F64))


def test_long_float32_sequence_stays_close_to_the_reference():
    q, k, v, beta, _, gk, _, _ = _inputs(B=1, H=2, T=300, K=16, V=8, dtype=torch.float32)
    gk = gk * 0.1  # slow decays: the state keeps hundreds of tokens
    o, S = delta_rule(q, k, v, beta, None, gk, return_state=True)
    ro, rS = reference.delta_rule(q, k, v, beta, None, gk)
    tol = 1e3 * torch.finfo(torch.float32).eps  # ~1e-4: float32 rounding over a long state
    torch.testing.assert_close(o, ro.float(), rtol=tol, atol=tol)
    torch.testing.assert_close(S, rS.float(), rtol=tol, atol=tol)
    assert KDA_CHUNK < 300  # several chunks were crossed


def test_prefill_then_continue_equals_whole():
    q, k, v, beta, _, gk, _, _ = _inputs(T=21)
    whole = delta_rule(q, k, v, beta, None, gk)
    a, st = delta_rule(q[..., :9, :], k[..., :9, :], v[..., :9, :], beta[..., :9], None,
                       gk[..., :9, :], return_state=True)
    b = delta_rule(q[..., 9:, :], k[..., 9:, :], v[..., 9:, :], beta[..., 9:], None,
                   gk[..., 9:, :], initial_state=st)
    torch.testing.assert_close(torch.cat([a, b], -2), whole, rtol=_tol(F64), atol=_tol(F64))


def test_empty_sequence_returns_a_new_state():
    q, k, v, beta, _, gk, gv, S0 = _inputs(T=0)
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
    q, k, v, beta, *_ = _inputs()
    with pytest.raises((ValueError, TypeError), match=match):
        delta_rule(q, k, v, beta, **{name: value})


def test_the_compiled_backend_takes_per_key_gates_without_gradients():
    """The compiled forward takes per-key gates (tests/ops/delta/test_gva_kda.py checks its
    numbers); a call that wants gradients with them, or with per-value gates, it refuses: forced,
    a ValueError saying so; by default the torch forms, equal to the reference."""
    from linattn.ops.delta import native as delta_native

    q, k, v, beta, _, gk, gv, _ = _inputs(V=16, dtype=torch.float32)
    leaf = q.clone().requires_grad_(True)
    tol = 100 * torch.finfo(torch.float32).eps
    if delta_native.unavailable() is None:
        with dispatch.use(impl="native"):
            o = delta_rule(q, k, v, beta, None, gk)
            with pytest.raises(ValueError, match="no gradient with per-key gates"):
                delta_rule(leaf, k, v, beta, None, gk)
            with pytest.raises(ValueError, match="no per-value gates"):
                delta_rule(q, k, v, beta, None, None, gv)
        ro, _ = reference.delta_rule(q, k, v, beta, None, gk)
        torch.testing.assert_close(o, ro.float(), rtol=tol, atol=tol)
    for gates in ((gk, None), (None, gv)):
        o = delta_rule(leaf, k, v, beta, None, *gates)
        o.sum().backward()
        ro, _ = reference.delta_rule(q, k, v, beta, None, *gates)
        torch.testing.assert_close(o, ro.float(), rtol=tol, atol=tol)
