"""Gated linear attention: chunked form, recurrent step and float64 sequential reference agree."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from linattn import gated_linear_attention, gated_linear_attention_step
from linattn.ops import reference
from linattn.ops.gated.chunk import segsum

F64 = torch.float64


def _inputs(B=2, H=3, T=23, K=5, V=4, seed=0, dtype=F64):
    """q, k, v, a per-token gate g (B, H, T) and a per-key gate gk (B, H, T, K), logsigmoid
    of normals (the gates of GLA): values in about (−4, 0)."""
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, H, T, K, generator=gen, dtype=dtype) for _ in range(2))
    v = torch.randn(B, H, T, V, generator=gen, dtype=dtype)
    g = F.logsigmoid(torch.randn(B, H, T, generator=gen, dtype=dtype))
    gk = F.logsigmoid(torch.randn(B, H, T, K, generator=gen, dtype=dtype))
    return q, k, v, g, gk


GATES = ["none", "scalar", "per-key", "both"]


def _pick(which, g, gk):
    choices = {"none": (None, None), "scalar": (g, None), "per-key": (None, gk), "both": (g, gk)}
    return choices[which]


def test_segsum_is_the_sum_over_the_segment():
    x = torch.tensor([0.5, -1.0, 2.0, -3.0], dtype=F64)
    s = segsum(x)
    for i in range(4):
        for j in range(4):
            want = x[j + 1:i + 1].sum() if j <= i else -torch.inf
            assert s[i, j] == want, (i, j)


def test_segsum_of_minus_infinity_is_not_nan():
    s = segsum(torch.tensor([-1.0, -torch.inf, -2.0]))
    assert not s.isnan().any()
    assert s[2, 0] == -torch.inf and s[2, 1] == -2.0 and s[1, 1] == 0.0


@pytest.mark.parametrize("chunk", [1, 4, 7, 23, 64])
@pytest.mark.parametrize("which", GATES)
def test_chunked_matches_reference(chunk, which):
    q, k, v, g, gk = _inputs()
    g, gk = _pick(which, g, gk)
    S0 = torch.randn(2, 3, 5, 4, dtype=F64, generator=torch.Generator().manual_seed(1))
    o, S = gated_linear_attention(q, k, v, g, gk, initial_state=S0, return_state=True,
                                  chunk_size=chunk)
    ro, rS = reference.gated_linear_attention(q, k, v, g, gk, initial_state=S0)
    torch.testing.assert_close(o, ro, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(S, rS, rtol=1e-10, atol=1e-10)


def test_reference_is_the_explicit_sum():
    """o_i = Σ_{j≤i} exp(Σ_{j<t≤i} g_t) (s·q_i·k_j) v_j, written out independently."""
    q, k, v, g, _ = _inputs(B=1, H=1, T=6)
    ro, _ = reference.gated_linear_attention(q, k, v, g, scale=0.7)
    for i in range(6):
        want = sum(torch.exp(g[0, 0, j + 1:i + 1].sum()) * 0.7 * (q[0, 0, i] @ k[0, 0, j])
                   * v[0, 0, j] for j in range(i + 1))
        torch.testing.assert_close(ro[0, 0, i], want)


@pytest.mark.parametrize("which", GATES)
def test_steps_match_chunked(which):
    q, k, v, g, gk = _inputs(T=17)
    g, gk = _pick(which, g, gk)
    o, S = gated_linear_attention(q, k, v, g, gk, return_state=True, chunk_size=4)
    state, steps = None, []
    for t in range(17):
        o_t, state = gated_linear_attention_step(
            q[..., t, :], k[..., t, :], v[..., t, :], state,
            g_t=None if g is None else g[..., t], gk_t=None if gk is None else gk[..., t, :])
        steps.append(o_t)
    torch.testing.assert_close(torch.stack(steps, -2), o)
    torch.testing.assert_close(state, S)


def test_step_per_value_gate_matches_reference():
    q, k, v, g, gk = _inputs(T=9)
    gv = F.logsigmoid(torch.randn(2, 3, 9, 4, dtype=F64))
    state, steps = None, []
    for t in range(9):
        o_t, state = gated_linear_attention_step(q[..., t, :], k[..., t, :], v[..., t, :], state,
                                                 g_t=g[..., t], gk_t=gk[..., t, :],
                                                 gv_t=gv[..., t, :], scale=0.3)
        steps.append(o_t)
    ro, rS = reference.gated_linear_attention(q, k, v, g, gk, gv, scale=0.3)
    torch.testing.assert_close(torch.stack(steps, -2), ro)
    torch.testing.assert_close(state, rS)


@pytest.mark.parametrize("split", [1, 5, 16])
@pytest.mark.parametrize("which", ["scalar", "per-key"])
def test_prefill_then_continue_equals_whole(split, which):
    q, k, v, g, gk = _inputs(T=21)
    g, gk = _pick(which, g, gk)

    def part(x, a, b):
        return None if x is None else x[..., a:b] if x.dim() == 3 else x[..., a:b, :]

    whole = gated_linear_attention(q, k, v, g, gk, chunk_size=4)
    a, st = gated_linear_attention(part(q, 0, split), part(k, 0, split), part(v, 0, split),
                                   part(g, 0, split), part(gk, 0, split), chunk_size=4,
                                   return_state=True)
    b = gated_linear_attention(part(q, split, 21), part(k, split, 21), part(v, split, 21),
                               part(g, split, 21), part(gk, split, 21), chunk_size=4,
                               initial_state=st)
    torch.testing.assert_close(torch.cat([a, b], -2), whole)


def test_zero_gates_are_ungated_and_minus_infinity_resets():
    q, k, v, g, _ = _inputs()
    torch.testing.assert_close(gated_linear_attention(q, k, v, torch.zeros_like(g)),
                               gated_linear_attention(q, k, v))
    reset = torch.full_like(g, -torch.inf)  # every token forgets the past: o_t = s (q_t·k_t) v_t
    o = gated_linear_attention(q, k, v, reset, chunk_size=8, scale=1.0)
    torch.testing.assert_close(o, (q * k).sum(-1, keepdim=True) * v)


def test_strong_gates_over_long_float32_sequences_stay_finite_and_close():
    q, k, v, g, gk = _inputs(B=1, H=2, T=600, dtype=torch.float32)
    g = g * 20  # down to about −80 per token: exp(b_i − b_j) would overflow as a ratio
    o, S = gated_linear_attention(q, k, v, g, gk, return_state=True)
    ro, rS = reference.gated_linear_attention(q, k, v, g, gk)
    assert torch.isfinite(o).all()
    torch.testing.assert_close(o, ro.float(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(S, rS.float(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_inputs_keep_float32_states(dtype):
    q, k, v, g, gk = _inputs(T=30, dtype=dtype)
    o, S = gated_linear_attention(q, k, v, g, gk, return_state=True)
    assert o.dtype == dtype and S.dtype == torch.float32
    ro, _ = reference.gated_linear_attention(q, k, v, g, gk)
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(o.double(), ro, rtol=tol, atol=tol * ro.abs().max().item())


def test_gradcheck():
    q, k, v, g, gk = _inputs(B=1, H=2, T=9, K=3, V=2)
    S0 = torch.randn(1, 2, 3, 2, dtype=F64)
    args = [x.clone().requires_grad_() for x in (q, k, v, g, gk, S0)]

    def f(q, k, v, g, gk, S0):
        return gated_linear_attention(q, k, v, g, gk, initial_state=S0, chunk_size=4,
                                      return_state=True)

    assert torch.autograd.gradcheck(f, args)


def test_gradients_match_the_reference():
    q, k, v, g, gk = _inputs(T=13)
    a = [x.clone().requires_grad_() for x in (q, k, v, g, gk)]
    b = [x.clone().requires_grad_() for x in (q, k, v, g, gk)]
    w = torch.randn(2, 3, 13, 4, dtype=F64)
    (gated_linear_attention(*a, chunk_size=4) * w).sum().backward()
    (reference.gated_linear_attention(*b)[0] * w).sum().backward()
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x.grad, y.grad)


def test_empty_sequence():
    q, k, v, g, _ = _inputs(T=0)
    S0 = torch.randn(2, 3, 5, 4, dtype=F64)
    o, S = gated_linear_attention(q, k, v, g, initial_state=S0, return_state=True)
    assert o.shape == (2, 3, 0, 4)
    torch.testing.assert_close(S, S0)


@pytest.mark.parametrize("kwargs, match", [
    ({"g": torch.zeros(2, 3, 22)}, "g: expected shape"),
    ({"g": torch.full((2, 3, 23), 0.1, dtype=F64)}, "g: expected log-gates <= 0"),
    ({"g": torch.full((2, 3, 23), torch.nan, dtype=F64)}, "g: expected log-gates"),
    ({"gk": torch.zeros(2, 3, 23)}, "gk: expected shape"),
    ({"g": torch.zeros(2, 3, 23, dtype=torch.long)}, "g: expected a floating-point"),
    ({"initial_state": torch.zeros(2, 3, 4, 4)}, "initial_state: expected shape"),
    ({"scale": float("nan")}, "scale"),
    ({"chunk_size": 0}, "chunk_size"),
])
def test_bad_arguments_are_named(kwargs, match):
    q, k, v, _, _ = _inputs()
    with pytest.raises((TypeError, ValueError), match=match):
        gated_linear_attention(q, k, v, **kwargs)


def test_bad_step_state_is_named():
    q, k, v, _, _ = _inputs(T=1)
    with pytest.raises(ValueError, match="state: expected shape"):
        gated_linear_attention_step(q[..., 0, :], k[..., 0, :], v[..., 0, :],
                                    torch.zeros(2, 3, 5, 5))
    with pytest.raises(ValueError, match="gk_t: expected shape"):
        gated_linear_attention_step(q[..., 0, :], k[..., 0, :], v[..., 0, :],
                                    gk_t=torch.zeros(2, 3, 4, dtype=F64))


# issue 51, second probe: a scale float32 holds (1e38) but s·q does not gave NaN and ±inf
# outputs whose true values fit in float32 (the op now runs with s's mantissa and multiplies
# the output by its power of two)
@pytest.mark.parametrize("impl", ["auto", "portable"])
@pytest.mark.parametrize("scale", [1e38, -3e38, 2.5e37])
def test_a_huge_scale_gives_the_outputs_float32_holds(impl, scale, held_at_scale):
    from linattn.ops import dispatch

    q, k, v, g, gk = _inputs(T=37, K=8, V=16)
    q, k, v, g, gk = (t.float() for t in (q, 3 * q.tanh(), v, g, gk))
    want, want_S = reference.gated_linear_attention(q.double(), k.double(), v.double(),
                                                    g.double(), gk.double(), scale=scale)
    with dispatch.use(impl=impl):
        o, S = gated_linear_attention(q, k, v, g, gk, scale=scale, return_state=True)
        o_t, _ = gated_linear_attention_step(q[..., 0, :], k[..., 0, :], v[..., 0, :],
                                             g_t=g[..., 0], gk_t=gk[..., 0, :], scale=scale)
    held_at_scale(o, want, scale)
    held_at_scale(o_t, want[..., 0, :], scale)
    torch.testing.assert_close(S.double(), want_S, rtol=1e-4, atol=1e-4)
