"""Causal Flowformer (linattn.nn.flowformer, attention="flowformer") and the LM built on it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from linattn import flowformer_attention
from linattn.nn import LinearTransformerLM, LMState
from linattn.nn.flowformer import FlowformerAttention, FlowState
from linattn.nn.mixers import build_mixer
from linattn.ops import reference

V = 37
TOL = {"rtol": 1e-5, "atol": 1e-5}


def _lm(seed=0):
    torch.manual_seed(seed)
    return LinearTransformerLM(V, 32, 2, 4, attention="flowformer", chunk_size=8).eval()


def _ids(B=2, T=29, seed=1):
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


def _assert_states_close(got: FlowState, want: FlowState) -> None:
    for f in dataclasses.fields(FlowState):
        torch.testing.assert_close(getattr(got, f.name), getattr(want, f.name), **TOL,
                                   msg=f.name)


@pytest.mark.parametrize("chunk_size", [4, 16])
def test_module_is_the_causal_op_on_its_projections(chunk_size):
    """From an empty state the module's output is the op's (and the quadratic reference's)
    causal Flow-Attention of its own projections, sigmoid features."""
    torch.manual_seed(0)
    m = FlowformerAttention(16, 2, chunk_size=chunk_size).double()
    x = torch.randn(2, 13, 16, dtype=torch.float64)
    out, state = m(x)
    q, k, v = m.project(x)
    torch.testing.assert_close(out, m.merge(reference.flowformer_attention(q, k, v,
                                                                          is_causal=True)))
    torch.testing.assert_close(out, m.merge(flowformer_attention(q, k, v, is_causal=True)))
    fq, fk = torch.sigmoid(q), torch.sigmoid(k)
    torch.testing.assert_close(state.k_sum, fk.sum(-2))
    torch.testing.assert_close(state.q_sum, fq.sum(-2))
    assert state.e_sum.shape == (2, 2) and state.kv.shape == (2, 2, 8, 8)


def test_mixer_decodes_token_by_token_as_the_chunked_form(decode_three_ways):
    torch.manual_seed(0)
    m = build_mixer("flowformer", 16, 2, chunk_size=4).eval()
    r = decode_three_ways(m, torch.randn(2, 19, 16))
    full, want, state, st = r["full"], r["want"], r["state"], r["st"]
    torch.testing.assert_close(r["steps"], full, **TOL)
    torch.testing.assert_close(r["pieces"], full, **TOL)
    _assert_states_close(state, want)
    _assert_states_close(st, want)


def test_state_is_constant_size_and_round_trips():
    m = _lm()
    ids = _ids(T=20)
    with torch.no_grad():
        sizes = [m(_ids(T=T), return_state=True)[1].nbytes() for T in (1, 10, 100)]
        _, st = m(ids[:, :12], return_state=True)
        saved = LMState.from_dict({k: v.clone() for k, v in st.to_dict().items()})
        a = m(ids[:, 12:], st, return_state=True)[0]
        b = m(ids[:, 12:], saved, return_state=True)[0]
    assert isinstance(saved.layers[0], FlowState) and saved.position == 12
    assert torch.equal(a, b)
    # L·B·H·(4 sums of d + the exp sum + d·d)·fp32
    assert sizes[0] == sizes[1] == sizes[2] == 2 * 2 * 4 * (4 * 8 + 1 + 8 * 8) * 4


def test_generates_and_trains(generates_and_trains):
    m = generates_and_trains(_lm(), _ids(T=4), _ids())
    assert m.blocks[0].attn.k_proj.weight.grad.abs().sum() > 0


def test_bad_arguments():
    with pytest.raises(ValueError, match="^feature_map: not used with attention='flowformer'"):
        LinearTransformerLM(V, 32, 1, 4, attention="flowformer", feature_map="relu")
    m = _lm()
    with torch.no_grad():
        _, kv = LinearTransformerLM(V, 32, 2, 4, attention="softmax")(_ids(T=3), return_state=True)
    with pytest.raises(TypeError, match="^state: expected a FlowState"):
        m(_ids(T=1), kv, return_state=True)
