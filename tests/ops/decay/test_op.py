"""Decayed causal linear attention: chunked form, recurrent step and quadratic reference agree."""

from __future__ import annotations

import pytest
import torch

import linattn
from linattn import decay_linear_attention, decay_linear_attention_step
from linattn.ops import LinearAttentionState, dispatch
from linattn.ops.decay import op as decay
from linattn.ops.reference import decay_linear_attention as reference_decay_linear_attention

GAMMA = torch.tensor([0.0, 0.5, 0.9, 1.0])  # one per head: the edge cases included


def _qkv(B=2, H=4, T=23, D=5, Dv=3, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, T, d, generator=g, dtype=dtype) for d in (D, D, Dv))


@pytest.mark.parametrize("chunk", [1, 4, 7, 23, 64])
@pytest.mark.parametrize("fmap", ["elu", "relu", "taylor"])
def test_chunked_matches_reference(chunk, fmap):
    q, k, v = _qkv()
    ref = reference_decay_linear_attention(q, k, v, GAMMA, feature_map=fmap)
    out = decay_linear_attention(q, k, v, GAMMA, feature_map=fmap, chunk_size=chunk)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)


def test_gamma_one_is_plain_causal_linear_attention():
    q, k, v = _qkv()
    plain = linattn.linear_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(decay_linear_attention(q, k, v, 1.0, chunk_size=5), plain)


def test_gamma_zero_attends_to_the_current_token_only():
    q, k, v = _qkv()
    torch.testing.assert_close(decay_linear_attention(q, k, v, 0.0, chunk_size=6), v)


@pytest.mark.parametrize("chunk", [3, 8])
def test_steps_and_state_match_chunked(chunk):
    q, k, v = _qkv(T=17)
    out, final = decay_linear_attention(q, k, v, GAMMA, chunk_size=chunk, return_state=True)
    state = LinearAttentionState.zeros((2, 4), 5, 3, dtype=torch.float64)
    steps = []
    for t in range(q.shape[-2]):
        o, state = decay_linear_attention_step(q[..., t, :], k[..., t, :], v[..., t, :], GAMMA,
                                               state)
        steps.append(o)
    torch.testing.assert_close(torch.stack(steps, -2), out)
    torch.testing.assert_close(state.S, final.S)
    torch.testing.assert_close(state.z, final.z)


@pytest.mark.parametrize("split", [1, 5, 16])
def test_prefill_then_continue_equals_whole(split):
    q, k, v = _qkv(T=21)
    whole = decay_linear_attention(q, k, v, GAMMA, chunk_size=4)
    a, st = decay_linear_attention(q[..., :split, :], k[..., :split, :], v[..., :split, :],
                                   GAMMA, chunk_size=4, return_state=True)
    b = decay_linear_attention(q[..., split:, :], k[..., split:, :], v[..., split:, :], GAMMA,
                               chunk_size=4, initial_state=st)
    torch.testing.assert_close(torch.cat([a, b], -2), whole)


def test_float32_inputs_and_long_chunks_stay_finite():
    # small γ and a long chunk: γ^(i−j) underflows to 0 but never overflows
    q, k, v = _qkv(B=1, H=4, T=300, dtype=torch.float32)
    out = decay_linear_attention(q, k, v, torch.tensor([0.01, 0.5, 0.99, 1.0]), chunk_size=300)
    ref = reference_decay_linear_attention(q.double(), k.double(), v.double(),
                                           torch.tensor([0.01, 0.5, 0.99, 1.0]))
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-5)


def test_bad_gamma_and_state_raise():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="gamma"):
        decay_linear_attention(q, k, v, 1.5)
    with pytest.raises(ValueError, match="gamma"):
        decay_linear_attention(q, k, v, torch.full((3,), 0.5))
    with pytest.raises(ValueError, match="initial_state"):
        decay_linear_attention(q, k, v, 0.5,
                               initial_state=LinearAttentionState.zeros((2, 4), 4, 3))
    with pytest.raises(TypeError, match="state"):
        decay_linear_attention_step(q[..., 0, :], k[..., 0, :], v[..., 0, :], 0.5, state=None)


def test_chunk_size_keeps_its_old_import_path():
    """The default chunk moved to ops/dispatch.py; the old name still imports, as the same
    object."""
    assert decay.DEFAULT_CHUNK_SIZE is dispatch.DEFAULT_CHUNK_SIZE


def _grads(fn, leaves, g):
    """(output, gradients of Σ output·g with respect to ``leaves``)."""
    out = fn(*leaves)
    return out, torch.autograd.grad(out, leaves, g)


@pytest.mark.parametrize("chunk", [1, 4, 7, 23, 64])  # 4, 7: a partial last chunk of T = 23
@pytest.mark.parametrize("with_state", [False, True])
def test_gradients_match_reference(chunk, with_state):
    """Gradients of the chunked form (with respect to q, k, v, γ and an initial state) equal
    those of the quadratic reference in float64. A state is a prefix: the reference sees the
    prefix tokens and its gradient is read on the continuation's rows only."""
    q, k, v = _qkv(T=23)
    gamma = torch.tensor([0.2, 0.5, 0.9, 1.0], dtype=torch.float64)
    g = torch.randn(2, 4, 23, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    P = 5 if with_state else 0
    pq, pk, pv = _qkv(T=P, seed=2) if with_state else (None, None, None)

    # the prefix's queries reach no output of the continuation: keys and values only
    def chunked(q, k, v, gamma, *prefix_kv):
        st = None
        if with_state:
            _, st = decay_linear_attention(pq, *prefix_kv, gamma, chunk_size=3,
                                           return_state=True)
        return decay_linear_attention(q, k, v, gamma, chunk_size=chunk, initial_state=st)

    def quadratic(q, k, v, gamma, *prefix_kv):
        if with_state:  # the prefix and the continuation as one sequence
            prefix = (pq, *prefix_kv)
            q, k, v = (torch.cat([a, b], -2) for a, b in zip(prefix, (q, k, v), strict=True))
        return reference_decay_linear_attention(q, k, v, gamma)[..., P:, :]

    def leaves():
        prefix_kv = [pk, pv] if with_state else []
        return [x.clone().requires_grad_(True) for x in (q, k, v, gamma, *prefix_kv)]

    got, got_g = _grads(chunked, leaves(), g)
    want, want_g = _grads(quadratic, leaves(), g)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    for a, b in zip(got_g, want_g, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("with_state", [False, True])
def test_gradcheck(with_state):
    q, k, v = (x.requires_grad_(True) for x in _qkv(B=1, H=2, T=5, D=2, Dv=2, seed=3))
    gamma = torch.tensor([0.3, 0.8], dtype=torch.float64, requires_grad=True)
    gen = torch.Generator().manual_seed(4)
    S = torch.rand(1, 2, 2, 2, generator=gen, dtype=torch.float64, requires_grad=True)
    z = (torch.rand(1, 2, 2, generator=gen, dtype=torch.float64) + 1).requires_grad_(True)

    def f(q, k, v, gamma, S, z):
        st = LinearAttentionState(S, z) if with_state else None
        return decay_linear_attention(q, k, v, gamma, chunk_size=2, initial_state=st)

    assert torch.autograd.gradcheck(f, (q, k, v, gamma, S, z))


def test_empty_sequence_gives_an_empty_output():
    q, k, v = _qkv(T=0)
    out, st = decay_linear_attention(q, k, v, GAMMA, return_state=True)
    assert out.shape == (2, 4, 0, 3) and (st.S == 0).all() and (st.z == 0).all()
    assert reference_decay_linear_attention(q, k, v, GAMMA).shape == (2, 4, 0, 3)


@pytest.mark.parametrize("chunk", [0, -1, 1.5, True, "4"])
def test_bad_chunk_size_raises(chunk):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="^chunk_size: expected a positive integer"):
        decay_linear_attention(q, k, v, 0.5, chunk_size=chunk)


@pytest.mark.parametrize("eps", [float("nan"), float("inf"), -1e-6])
def test_bad_eps_raises_everywhere(eps):
    q, k, v = _qkv()
    state = LinearAttentionState.zeros((2, 4), 5, 3, dtype=torch.float64)
    calls = {
        "chunked": lambda: decay_linear_attention(q, k, v, 0.5, eps=eps),
        "step": lambda: decay_linear_attention_step(q[..., 0, :], k[..., 0, :], v[..., 0, :],
                                                    0.5, state, eps=eps),
        "reference": lambda: reference_decay_linear_attention(q, k, v, 0.5, eps=eps),
    }
    for call in calls.values():
        with pytest.raises(ValueError, match="^eps: expected a finite number >= 0"):
            call()


def test_feature_map_and_eps_are_keyword_only():
    q, k, v = _qkv()
    state = LinearAttentionState.zeros((2, 4), 5, 3, dtype=torch.float64)
    with pytest.raises(TypeError):
        decay_linear_attention(q, k, v, 0.5, "relu")
    with pytest.raises(TypeError):
        decay_linear_attention_step(q[..., 0, :], k[..., 0, :], v[..., 0, :], 0.5, state, "relu")
    with pytest.raises(TypeError):
        reference_decay_linear_attention(q, k, v, 0.5, "relu")


def test_state_on_another_device_or_not_a_tensor_raises():
    q, k, v = _qkv()
    meta = LinearAttentionState(S=torch.zeros(2, 4, 5, 3, device="meta"),
                                z=torch.zeros(2, 4, 5, device="meta"))
    with pytest.raises(ValueError, match="^initial_state: expected S and z on the inputs' device"):
        decay_linear_attention(q, k, v, 0.5, initial_state=meta)
    with pytest.raises(ValueError, match="^state: expected S and z on the inputs' device"):
        decay_linear_attention_step(q[..., 0, :], k[..., 0, :], v[..., 0, :], 0.5, meta)
    with pytest.raises(TypeError, match="^state: expected S to be a torch.Tensor"):
        decay_linear_attention_step(q[..., 0, :], k[..., 0, :], v[..., 0, :], 0.5,
                                    LinearAttentionState(S=[0.0], z=torch.zeros(2, 4, 5)))
