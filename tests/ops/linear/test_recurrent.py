"""The recurrent form: step by step equals the causal parallel form; prefill then continue."""

from __future__ import annotations

import pytest
import torch

import linattn
from linattn import LinearAttentionState, linear_attention_step

pytestmark = pytest.mark.usefixtures("single_thread")


def _run_steps(q, k, v, state, feature_map):
    outs = []
    for t in range(q.shape[-2]):
        o, state = linear_attention_step(
            q[..., t, :], k[..., t, :], v[..., t, :], state, feature_map=feature_map
        )
        outs.append(o)
    return torch.stack(outs, dim=-2), state


@pytest.mark.parametrize("batch", [(), (3,), (2, 3)])
def test_steps_equal_causal_parallel(linear_path, make_map, qkv, assert_close, batch):
    T, D, Dv = 11, 3, 4
    feature_map = make_map(D)
    q, k, v = qkv(*batch, T=T, D=D, Dv=Dv)
    state0 = LinearAttentionState.zeros(batch, feature_map.num_features(D), Dv, dtype=q.dtype)
    stepped, state = _run_steps(q, k, v, state0, feature_map)
    par, par_state = linattn.linear_attention(
        q, k, v, feature_map=feature_map, is_causal=True, chunk_size=4, return_state=True
    )
    assert stepped.shape == (*batch, T, Dv)
    assert_close(stepped, par)
    assert_close(state.S, par_state.S)
    assert_close(state.z, par_state.z)
    # the returned state is the plain sums Σ φ(k_t) v_tᵀ and Σ φ(k_t)
    fk = feature_map.forward_keys(k)
    assert_close(state.S, fk.transpose(-1, -2) @ v)
    assert_close(state.z, fk.sum(-2))
    # and the zero state was not modified in place
    assert (state0.S == 0).all() and (state0.z == 0).all()


@pytest.mark.parametrize("split", [1, 5, 12])
def test_prefill_then_continue_equals_whole(linear_path, make_map, qkv, assert_close, split):
    T, D, Dv = 13, 3, 2
    feature_map = make_map(D)
    q, k, v = qkv(2, 2, T=T, D=D, Dv=Dv)
    whole, whole_state = linattn.linear_attention(
        q, k, v, feature_map=feature_map, is_causal=True, return_state=True
    )
    head, state = linattn.linear_attention(
        q[..., :split, :],
        k[..., :split, :],
        v[..., :split, :],
        feature_map=feature_map,
        is_causal=True,
        return_state=True,
        chunk_size=4,
    )
    # continue in parallel from the state ...
    tail, tail_state = linattn.linear_attention(
        q[..., split:, :],
        k[..., split:, :],
        v[..., split:, :],
        feature_map=feature_map,
        is_causal=True,
        initial_state=state,
        return_state=True,
        chunk_size=3,
    )
    assert_close(torch.cat([head, tail], dim=-2), whole)
    assert_close(tail_state.S, whole_state.S)
    assert_close(tail_state.z, whole_state.z)
    # ... and token by token from the same state
    stepped, step_state = _run_steps(
        q[..., split:, :], k[..., split:, :], v[..., split:, :], state, feature_map
    )
    assert_close(stepped, whole[..., split:, :])
    assert_close(step_state.S, whole_state.S)


def test_zero_initial_state_is_no_initial_state(qkv):
    q, k, v = qkv(2, T=6, D=3, Dv=2)
    zero = LinearAttentionState.zeros((2,), 3, 2, dtype=torch.float64)
    a = linattn.linear_attention(q, k, v, is_causal=True, initial_state=zero)
    b = linattn.linear_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_step_dtypes(qkv, assert_close, dtype):
    q, k, v = qkv(2, T=1, D=4, Dv=3, dtype=dtype)
    state = LinearAttentionState.zeros((2,), 4, 3, dtype=dtype)
    assert state.S.dtype == torch.float32  # accumulation dtype for half inputs
    o, new = linear_attention_step(q[:, 0], k[:, 0], v[:, 0], state)
    assert o.dtype == dtype and o.shape == (2, 3)
    assert new.S.dtype == torch.float32 and new.z.dtype == torch.float32
    # One token: the output is that token's value, φ(q)·φ(k) v / φ(q)·φ(k) in float32 (a few
    # float32 roundings), then rounded once to ``dtype``: a few ulp of ``dtype`` at v's scale
    # (float32 ~1e-6, bfloat16 ~1e-2, float16 ~2e-3).
    assert_close(o, v[:, 0], ulps=4)


def test_zeros_float64_and_shapes():
    s = LinearAttentionState.zeros((2, 3), 5, 4, dtype=torch.float64)
    assert s.S.shape == (2, 3, 5, 4) and s.z.shape == (2, 3, 5)
    assert s.S.dtype == torch.float64


def test_gradcheck_step(make_map, qkv):
    feature_map = make_map(2)
    q, k, v = (t.requires_grad_() for t in qkv(2, T=1, D=2, Dv=2))
    L = feature_map.num_features(2)
    g = torch.Generator().manual_seed(3)
    S = torch.rand(2, L, 2, generator=g, dtype=torch.float64).requires_grad_()
    z = (torch.rand(2, L, generator=g, dtype=torch.float64) + 1.0).requires_grad_()

    def f(q, k, v, S, z):
        o, new = linear_attention_step(
            q[:, 0], k[:, 0], v[:, 0], LinearAttentionState(S, z), feature_map=feature_map
        )
        return o, new.S, new.z

    assert torch.autograd.gradcheck(f, (q, k, v, S, z))


def test_step_bad_arguments(qkv):
    q, k, v = qkv(2, T=1, D=4, Dv=3)
    q, k, v = q[:, 0], k[:, 0], v[:, 0]
    good = LinearAttentionState.zeros((2,), 4, 3, dtype=torch.float64)
    with pytest.raises(TypeError, match="^state: expected a LinearAttentionState"):
        linear_attention_step(q, k, v, (good.S, good.z))
    with pytest.raises(ValueError, match="^state: expected S"):
        linear_attention_step(q, k, v, LinearAttentionState.zeros((2,), 5, 3))
    with pytest.raises(ValueError, match="^state: expected S"):
        linear_attention_step(q, k, v, LinearAttentionState.zeros((3,), 4, 3))
    with pytest.raises(ValueError, match="^k: last dimension"):
        linear_attention_step(q, k[:, :3], v, good)
    with pytest.raises(TypeError, match="^q: expected a floating-point"):
        linear_attention_step(q.long(), k, v, good)
    with pytest.raises(ValueError, match="^feature_map: unknown name"):
        linear_attention_step(q, k, v, good, feature_map="exp")


def test_step_state_of_another_dtype_is_cast(qkv):
    """A float64 state with float32 inputs (and the reverse) continues in the inputs'
    accumulation dtype, as ``initial_state`` does in linear_attention, rather than failing
    inside a matmul."""
    q, k, v = (x[:, 0] for x in qkv(2, T=1, D=4, Dv=3, dtype=torch.float32))
    st64 = LinearAttentionState.zeros((2,), 4, 3, dtype=torch.float64)
    o, new = linear_attention_step(q, k, v, st64)
    want, _ = linear_attention_step(q, k, v, LinearAttentionState.zeros((2,), 4, 3))
    assert new.S.dtype == torch.float32 and new.z.dtype == torch.float32
    torch.testing.assert_close(o, want, rtol=0, atol=0)
    o64, new64 = linear_attention_step(q.double(), k.double(), v.double(),
                                       LinearAttentionState.zeros((2,), 4, 3))
    assert new64.S.dtype == torch.float64 and o64.dtype == torch.float64


def test_step_rejects_bad_inputs_with_one_line_errors(qkv):
    q, k, v = (x[:, 0] for x in qkv(2, T=1, D=4, Dv=3))
    good = LinearAttentionState.zeros((2,), 4, 3, dtype=torch.float64)
    with pytest.raises(TypeError, match="^q_t: expected a torch.Tensor, got list"):
        linear_attention_step(q.tolist(), k, v, good)
    with pytest.raises(TypeError, match="^v_t: expected a torch.Tensor, got list"):
        linear_attention_step(q, k, v.tolist(), good)
    with pytest.raises(TypeError, match="^state: expected S to be a torch.Tensor, got list"):
        linear_attention_step(q, k, v, LinearAttentionState(good.S.tolist(), good.z))
    with pytest.raises(TypeError, match="^state: expected a floating-point z, got torch.int64"):
        linear_attention_step(q, k, v, LinearAttentionState(good.S, good.z.long()))
    meta = LinearAttentionState(good.S.to("meta"), good.z.to("meta"))
    with pytest.raises(ValueError, match="^state: expected S and z on the inputs' device cpu"):
        linear_attention_step(q, k, v, meta)
    for eps in (float("nan"), float("inf"), -1.0):
        with pytest.raises(ValueError, match="^eps: expected a finite number >= 0"):
            linear_attention_step(q, k, v, good, eps=eps)
    with pytest.raises(TypeError, match="^eps: expected a real number, got str"):
        linear_attention_step(q, k, v, good, eps="1e-6")


def test_step_feature_map_and_eps_are_keyword_only(qkv):
    q, k, v = (x[:, 0] for x in qkv(2, T=1, D=4, Dv=3))
    good = LinearAttentionState.zeros((2,), 4, 3, dtype=torch.float64)
    with pytest.raises(TypeError):
        linear_attention_step(q, k, v, good, "relu")
    with pytest.raises(TypeError):
        linear_attention_step(q, k, v, good, "relu", 1e-6)
