"""Gated DeltaNet attention (linattn.nn.gated_delta) and the LM built on it."""

from __future__ import annotations

import pytest
import torch

from linattn.nn import LinearTransformerLM, LMState
from linattn.nn.gated_delta import DeltaRuleState, GatedDeltaAttention
from linattn.ops import reference

V = 37


def _lm(seed=0, **kw):
    torch.manual_seed(seed)
    return LinearTransformerLM(V, 32, 2, 4, attention="gated_delta", chunk_size=8, **kw).eval()


def _ids(B=2, T=29, seed=1):
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


def test_module_is_the_delta_rule_of_its_projections():
    """The module's output, recomputed from its own projections with the float64 reference."""
    torch.manual_seed(0)
    m = GatedDeltaAttention(16, 2).double()
    x = torch.randn(2, 11, 16, dtype=torch.float64)
    out, state = m(x)
    q, k, v = m.project(x)
    beta, g = m.gates(x)
    o, S = reference.delta_rule(torch.nn.functional.silu(q), torch.nn.functional.silu(k), v,
                                beta, g, qk_l2norm=True)
    gate = torch.nn.functional.silu(m._heads(m.gate_proj(x)))
    torch.testing.assert_close(out, m.merge(m.norm(o) * gate))
    torch.testing.assert_close(state.S, S)


def test_gates_are_in_range_and_decays_span_short_and_long_memories():
    m = GatedDeltaAttention(32, 8)
    beta, g = m.gates(torch.zeros(1, 1, 32))
    assert ((beta > 0) & (beta < 1)).all() and (g <= 0).all()
    per_token = g.exp().flatten()
    assert per_token.min() < 0.5 and per_token.max() > 0.99


def test_state_is_constant_size_and_round_trips():
    m = _lm()
    with torch.no_grad():
        sizes = [m(_ids(T=T), return_state=True)[1].nbytes() for T in (1, 10, 100)]
        ids = _ids(T=20)
        _, st = m(ids[:, :12], return_state=True)
        saved = LMState.from_dict({k: v.clone() for k, v in st.to_dict().items()})
        a = m(ids[:, 12:], st, return_state=True)[0]
        b = m(ids[:, 12:], saved, return_state=True)[0]
    assert sizes[0] == sizes[1] == sizes[2] == 2 * 2 * 4 * 8 * 8 * 4  # L·B·H·d·d·fp32
    assert isinstance(saved.layers[0], DeltaRuleState)
    assert torch.equal(a, b)


def test_generates_and_trains(generates_and_trains):
    m = generates_and_trains(_lm(), _ids(T=4), _ids())
    assert m.blocks[0].attn.decay_proj.weight.grad.abs().sum() > 0


def test_bad_arguments():
    with pytest.raises(ValueError, match="^decay: not used with attention='gated_delta'"):
        LinearTransformerLM(V, 32, 1, 4, attention="gated_delta", decay=[0.9] * 4)
    with pytest.raises(ValueError, match="^window: not used with attention='gated_delta'"):
        LinearTransformerLM(V, 32, 1, 4, attention="gated_delta", window=8)
    m = _lm()
    with torch.no_grad():
        _, kv = LinearTransformerLM(V, 32, 2, 4, attention="softmax")(_ids(T=3), return_state=True)
    with pytest.raises(TypeError, match="^state: expected a DeltaRuleState"):
        m(_ids(T=1), kv, return_state=True)
