"""The (gated) delta rule: chunked WY form, recurrent step and float64 reference agree."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from linattn import delta_rule, delta_rule_step
from linattn.ops import reference
from linattn.ops.delta.op import l2_normalised

F64 = torch.float64


def _inputs(B=2, H=3, T=23, K=5, V=4, seed=0, dtype=F64):
    """q, k, v, β ∈ (0, 1) and a log-gate g (B, H, T). k has unit rows, as in the published
    models, so ``I − β k kᵀ`` is a contraction and long sequences stay bounded."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, K, generator=gen, dtype=dtype)
    k = l2_normalised(torch.randn(B, H, T, K, generator=gen, dtype=dtype))
    v = torch.randn(B, H, T, V, generator=gen, dtype=dtype)
    beta = torch.rand(B, H, T, generator=gen, dtype=dtype)
    g = F.logsigmoid(torch.randn(B, H, T, generator=gen, dtype=dtype))
    return q, k, v, beta, g


@pytest.mark.parametrize("chunk", [1, 4, 7, 23, 64])
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("l2", [False, True])
def test_chunked_matches_reference(chunk, gated, l2):
    q, k, v, beta, g = _inputs()
    k = k * 1.7  # not unit: the normalisation must do its part when asked
    S0 = torch.randn(2, 3, 5, 4, dtype=F64, generator=torch.Generator().manual_seed(1))
    g = g if gated else None
    o, S = delta_rule(q, k, v, beta, g, initial_state=S0, return_state=True, chunk_size=chunk,
                      qk_l2norm=l2)
    ro, rS = reference.delta_rule(q, k, v, beta, g, initial_state=S0, qk_l2norm=l2)
    torch.testing.assert_close(o, ro, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(S, rS, rtol=1e-10, atol=1e-10)


def test_reference_follows_the_published_update():
    """S_t = α_t S_{t−1}(I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ in the papers' (V, K) layout."""
    q, k, v, beta, g = _inputs(B=1, H=1, T=7)
    _, rS = reference.delta_rule(q, k, v, beta, g)
    Sp = torch.zeros(4, 5, dtype=F64)  # (V, K)
    eye = torch.eye(5, dtype=F64)
    for t in range(7):
        kt = k[0, 0, t][:, None]
        Sp = g[0, 0, t].exp() * Sp @ (eye - beta[0, 0, t] * kt @ kt.T) \
            + beta[0, 0, t] * v[0, 0, t][:, None] @ kt.T
    torch.testing.assert_close(rS[0, 0], Sp.T)


def test_beta_zero_writes_nothing_and_beta_one_stores_the_value():
    q, k, v, beta, g = _inputs(T=8)
    S0 = torch.randn(2, 3, 5, 4, dtype=F64)
    _, S = delta_rule(q, k, v, torch.zeros_like(beta), initial_state=S0, return_state=True)
    torch.testing.assert_close(S, S0)
    # β = 1 with a unit key: afterwards the state maps k_t exactly to v_t
    k1 = k[..., :1, :] / k[..., :1, :].norm(dim=-1, keepdim=True)  # exactly unit (no 1e-6)
    _, S = delta_rule(q[..., :1, :], k1, v[..., :1, :], torch.ones_like(beta[..., :1]),
                      initial_state=S0, return_state=True)
    torch.testing.assert_close((k1[..., 0, :].unsqueeze(-2) @ S).squeeze(-2), v[..., 0, :])


@pytest.mark.parametrize("gated", [False, True])
def test_steps_match_chunked(gated):
    q, k, v, beta, g = _inputs(T=17)
    g = g if gated else None
    o, S = delta_rule(q, k, v, beta, g, return_state=True, chunk_size=4, qk_l2norm=True)
    state, steps = None, []
    for t in range(17):
        o_t, state = delta_rule_step(q[..., t, :], k[..., t, :], v[..., t, :], beta[..., t],
                                     state, g_t=None if g is None else g[..., t],
                                     qk_l2norm=True)
        steps.append(o_t)
    torch.testing.assert_close(torch.stack(steps, -2), o)
    torch.testing.assert_close(state, S)


def test_step_with_per_key_and_per_value_gates_matches_reference():
    q, k, v, beta, g = _inputs(T=9)
    gk = F.logsigmoid(torch.randn(2, 3, 9, 5, dtype=F64))
    gv = F.logsigmoid(torch.randn(2, 3, 9, 4, dtype=F64))
    state, steps = None, []
    for t in range(9):
        o_t, state = delta_rule_step(q[..., t, :], k[..., t, :], v[..., t, :], beta[..., t],
                                     state, g_t=g[..., t], gk_t=gk[..., t, :],
                                     gv_t=gv[..., t, :], scale=0.5)
        steps.append(o_t)
    ro, rS = reference.delta_rule(q, k, v, beta, g, gk, gv, scale=0.5)
    torch.testing.assert_close(torch.stack(steps, -2), ro)
    torch.testing.assert_close(state, rS)


@pytest.mark.parametrize("split", [1, 5, 16])
def test_prefill_then_continue_equals_whole(split):
    q, k, v, beta, g = _inputs(T=21)
    whole = delta_rule(q, k, v, beta, g, chunk_size=4)
    a, st = delta_rule(q[..., :split, :], k[..., :split, :], v[..., :split, :],
                       beta[..., :split], g[..., :split], chunk_size=4, return_state=True)
    b = delta_rule(q[..., split:, :], k[..., split:, :], v[..., split:, :], beta[..., split:],
                   g[..., split:], chunk_size=4, initial_state=st)
    torch.testing.assert_close(torch.cat([a, b], -2), whole)


def test_long_float32_sequence_stays_close_to_the_reference():
    q, k, v, beta, g = _inputs(B=1, H=2, T=700, K=16, V=8, dtype=torch.float32)
    o, S = delta_rule(q, k, v, beta, g, return_state=True)
    ro, rS = reference.delta_rule(q, k, v, beta, g)
    torch.testing.assert_close(o, ro.float(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(S, rS.float(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_inputs_keep_float32_states(dtype):
    q, k, v, beta, g = _inputs(T=30, dtype=dtype)
    o, S = delta_rule(q, k, v, beta, g, return_state=True)
    assert o.dtype == dtype and S.dtype == torch.float32
    ro, _ = reference.delta_rule(q, k, v, beta, g)
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(o.double(), ro, rtol=tol, atol=tol * ro.abs().max().item())


def test_gradcheck():
    q, k, v, beta, g = _inputs(B=1, H=2, T=9, K=3, V=2)
    S0 = torch.randn(1, 2, 3, 2, dtype=F64)
    args = [x.clone().requires_grad_() for x in (q, k, v, beta, g, S0)]

    def f(q, k, v, beta, g, S0):
        return delta_rule(q, k, v, beta, g, initial_state=S0, chunk_size=4, return_state=True,
                          qk_l2norm=True)

    assert torch.autograd.gradcheck(f, args)


def test_gradients_match_the_reference():
    q, k, v, beta, g = _inputs(T=13)
    a = [x.clone().requires_grad_() for x in (q, k, v, beta, g)]
    b = [x.clone().requires_grad_() for x in (q, k, v, beta, g)]
    w = torch.randn(2, 3, 13, 4, dtype=F64)
    (delta_rule(*a, chunk_size=4, qk_l2norm=True) * w).sum().backward()
    (reference.delta_rule(*b, qk_l2norm=True)[0] * w).sum().backward()
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x.grad, y.grad)


@pytest.mark.parametrize("kwargs, match", [
    ({"beta": torch.zeros(2, 3, 22, dtype=F64)}, "beta: expected shape"),
    ({"beta": torch.full((2, 3, 23), torch.nan, dtype=F64)},
     "beta: expected finite values, got nan"),
    ({"beta": [0.5]}, "beta: expected a torch.Tensor"),
    ({"g": torch.full((2, 3, 23), 1.0, dtype=F64)}, "g: expected log-gates <= 0"),
    ({"qk_l2norm": 1}, "qk_l2norm: expected a bool"),
    ({"initial_state": torch.zeros(2, 3, 5)}, "initial_state: expected shape"),
])
def test_bad_arguments_are_named(kwargs, match):
    q, k, v, beta, _ = _inputs()
    args = {"beta": beta, **kwargs}
    with pytest.raises((TypeError, ValueError), match=match):
        delta_rule(q, k, v, **args)


@pytest.mark.parametrize("bad", [float("inf"), -float("inf"), float("nan")])
def test_non_finite_beta_is_refused(bad):
    """β = ±inf made every output nan (only nan was refused). The prefill checks β on every
    path; the step on the torch path (the compiled step's kernel checks nan itself and leaves
    ±inf unchecked, see delta_rule_step's docstring)."""
    from linattn.ops import dispatch

    q, k, v, beta, g = _inputs()
    beta = beta.clone()
    beta[1, 2, 7] = bad
    with pytest.raises(ValueError, match=r"^beta: expected finite values, got [^\n]+$"):
        delta_rule(q, k, v, beta, g)
    with pytest.raises(ValueError, match=r"^beta: expected finite values"):
        delta_rule(q.float(), k.float(), v.float(), beta.float(), g.float())
    with dispatch.use(impl="portable"), \
            pytest.raises(ValueError, match=r"^beta_t: expected finite values, got [^\n]+$"):
        delta_rule_step(q[..., 7, :], k[..., 7, :], v[..., 7, :], beta[..., 7], g_t=g[..., 7])


@pytest.mark.parametrize("flag", ["no", "False", 0, 1, None])
def test_qk_l2norm_must_be_a_bool_in_the_step_as_in_the_prefill(flag):
    """issue 24: ``delta_rule_step(..., qk_l2norm="no")`` used to normalise (a truthy string)
    while ``delta_rule`` refused it; both refuse anything but a Python or NumPy bool."""
    import numpy as np

    q, k, v = (torch.randn(1, 2, 3, 8) for _ in range(3))
    beta = torch.rand(1, 2, 3)
    with pytest.raises(TypeError, match="^qk_l2norm: "):
        delta_rule_step(q[..., 0, :], k[..., 0, :], v[..., 0, :], beta[..., 0], qk_l2norm=flag)
    with pytest.raises(TypeError, match="^qk_l2norm: "):
        delta_rule(q, k, v, beta, qk_l2norm=flag)
    delta_rule_step(q[..., 0, :], k[..., 0, :], v[..., 0, :], beta[..., 0], qk_l2norm=np.True_)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("V", [4, 16])
def test_step_inplace_refuses_a_state_whose_rows_share_memory(dtype, V):
    # issue 51 probe: an expanded state written in place; one error naming it, nothing written
    torch.manual_seed(0)
    q, k = torch.randn(2, 3, 8, dtype=dtype), torch.randn(2, 3, 8, dtype=dtype)
    v, beta = torch.randn(2, 3, V, dtype=dtype), torch.rand(2, 3, dtype=dtype)
    base = torch.randn(1, 3, 8, V, dtype=dtype)
    state = base.expand(2, 3, 8, V)
    with pytest.raises(ValueError, match="^state: .*share memory"):
        delta_rule_step(q, k, v, beta, state, inplace=True)
    assert torch.equal(state, base.expand(2, 3, 8, V))
    o, S = delta_rule_step(q, k, v, beta, state)  # a new state: fine
    assert S.shape == (2, 3, 8, V)


# issue 51, second probe: a scale float32 holds (1e38) but s·q does not gave NaN outputs
# whose true values fit in float32 (see tests/ops/gated/test_op.py)
@pytest.mark.parametrize("impl", ["auto", "portable"])
@pytest.mark.parametrize("scale", [1e38, -3e38, 2.5e37])
@pytest.mark.parametrize("inplace", [False, True])
def test_a_huge_scale_gives_the_outputs_float32_holds(impl, scale, inplace, held_at_scale):
    from linattn.ops import dispatch

    q, k, v, beta, g = (t.float() for t in _inputs(T=37, K=8, V=16))
    want, _ = reference.delta_rule(q.double(), k.double(), v.double(), beta.double(),
                                   g.double(), scale=scale)
    state = torch.zeros(2, 3, 8, 16)
    with dispatch.use(impl=impl):
        o = delta_rule(q, k, v, beta, g, scale=scale)
        o_t, _ = delta_rule_step(q[..., 0, :], k[..., 0, :], v[..., 0, :], beta[..., 0], state,
                                 g_t=g[..., 0], scale=scale, inplace=inplace)
    held_at_scale(o, want, scale)
    held_at_scale(o_t, want[..., 0, :], scale)
