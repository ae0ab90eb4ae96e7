"""Decayed causal linear attention: chunked form, recurrent step and quadratic reference agree."""

from __future__ import annotations

import pytest
import torch

import linattn
from linattn.ops import LinearAttentionState
from linattn.ops.decay import (
    decay_linear_attention,
    decay_linear_attention_step,
    reference_decay_linear_attention,
)

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
