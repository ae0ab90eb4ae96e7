"""Causal cosFormer (linattn.nn.cosformer, attention="cosformer") and the LM built on it."""

from __future__ import annotations

import math

import pytest
import torch

from linattn import cosformer_attention
from linattn.nn import LinearTransformerLM, LMState
from linattn.nn.cosformer import (
    DEFAULT_HORIZON,
    CosFormerAttention,
    CosFormerState,
    cosformer_features,
)
from linattn.nn.mixers import build_mixer
from linattn.ops import reference

V = 37
TOL = {"rtol": 1e-5, "atol": 1e-5}


def _lm(seed=0):
    torch.manual_seed(seed)
    return LinearTransformerLM(V, 32, 2, 4, attention="cosformer", chunk_size=8).eval()


def _ids(B=2, T=29, seed=1):
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


def test_features_weigh_by_the_cosine_of_the_lag():
    x = torch.randn(6, 4).abs()  # positive: relu keeps every coordinate
    f = cosformer_features(x, 100, 16)
    assert f.shape == (6, 8)
    i, j = torch.arange(6)[:, None], torch.arange(6)[None, :]
    want = (x @ x.T) * torch.cos(math.pi / 2 * (i - j) / 16)
    torch.testing.assert_close(f @ f.T, want)


@pytest.mark.parametrize("chunk_size", [4, 16])
def test_module_with_the_sequence_as_horizon_is_the_op_on_its_projections(chunk_size):
    """M = T at position 0 is the op's re-weighting: the module's output is the op's (and the
    quadratic reference's) causal cosFormer of its own projections."""
    torch.manual_seed(0)
    T = 11
    m = CosFormerAttention(16, 2, chunk_size=chunk_size, horizon=T).double()
    x = torch.randn(2, T, 16, dtype=torch.float64)
    out, state = m(x)
    q, k, v = m.project(x)
    torch.testing.assert_close(out, m.merge(reference.cosformer_attention(q, k, v,
                                                                         is_causal=True)))
    torch.testing.assert_close(out, m.merge(cosformer_attention(q, k, v, is_causal=True)))
    fk = cosformer_features(k, 0, T)
    torch.testing.assert_close(state.kv, fk.transpose(-1, -2) @ v)
    torch.testing.assert_close(state.k_sum, fk.sum(-2))


def test_mixer_decodes_token_by_token_as_the_chunked_form(decode_three_ways):
    torch.manual_seed(0)
    m = build_mixer("cosformer", 16, 2, chunk_size=4).eval()
    assert m.horizon == DEFAULT_HORIZON
    r = decode_three_ways(m, torch.randn(2, 19, 16))
    full, want, state, st = r["full"], r["want"], r["state"], r["st"]
    torch.testing.assert_close(r["steps"], full, **TOL)
    torch.testing.assert_close(r["pieces"], full, **TOL)
    for got in (state, st):
        torch.testing.assert_close(got.kv, want.kv, **TOL)
        torch.testing.assert_close(got.k_sum, want.k_sum, **TOL)


def test_weights_depend_on_lags_only():
    """A sequence that starts at position p with nothing before it gives the same output as at
    position 0: the weights are cosines of lags (the state's angles are absolute, but cancel)."""
    torch.manual_seed(0)
    m = CosFormerAttention(16, 2, chunk_size=4, horizon=64).double()
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    torch.testing.assert_close(m(x, None, 30)[0], m(x)[0])


def test_positions_past_the_horizon_are_refused():
    m = CosFormerAttention(16, 2, horizon=8)
    x = torch.randn(1, 8, 16)
    _, st = m(x)  # positions 0 … 7: the whole horizon
    with pytest.raises(ValueError, match="^position: cosFormer's weights hold for 8 positions"):
        m(x[:, :1], st, 8)
    with pytest.raises(ValueError, match="^position"):
        m(torch.randn(1, 9, 16))
    for bad in (0, -1, 2.5):
        with pytest.raises(ValueError, match="^horizon"):
            CosFormerAttention(16, 2, horizon=bad)


def test_state_is_constant_size_and_round_trips():
    m = _lm()
    ids = _ids(T=20)
    with torch.no_grad():
        sizes = [m(_ids(T=T), return_state=True)[1].nbytes() for T in (1, 10, 100)]
        _, st = m(ids[:, :12], return_state=True)
        saved = LMState.from_dict({k: v.clone() for k, v in st.to_dict().items()})
        a = m(ids[:, 12:], st, return_state=True)[0]
        b = m(ids[:, 12:], saved, return_state=True)[0]
    assert isinstance(saved.layers[0], CosFormerState) and saved.position == 12
    assert torch.equal(a, b)
    assert sizes[0] == sizes[1] == sizes[2] == 2 * 2 * 4 * 16 * 9 * 4  # L·B·H·2d·(d+1)·fp32


def test_generates_and_trains(generates_and_trains):
    m = generates_and_trains(_lm(), _ids(T=4), _ids())
    assert m.blocks[0].attn.q_proj.weight.grad.abs().sum() > 0


def test_bad_arguments():
    with pytest.raises(ValueError, match="^feature_map: not used with attention='cosformer'"):
        LinearTransformerLM(V, 32, 1, 4, attention="cosformer", feature_map="relu")
    m = _lm()
    with torch.no_grad():
        _, kv = LinearTransformerLM(V, 32, 2, 4, attention="softmax")(_ids(T=3), return_state=True)
    with pytest.raises(TypeError, match="^state: expected a CosFormerState"):
        m(_ids(T=1), kv, return_state=True)
