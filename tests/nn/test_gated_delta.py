"""Gated DeltaNet attention (linattn.nn.gated_delta) and the LM built on it; DeltaNet, the same
module ungated."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from linattn.nn import LinearTransformerLM, LMState
from linattn.nn.gated_delta import DeltaRuleState, GatedDeltaAttention
from linattn.nn.mixers import build_mixer
from linattn.ops import reference

V = 37


def _lm(seed=0, attention="gated_delta", **kw):
    torch.manual_seed(seed)
    return LinearTransformerLM(V, 32, 2, 4, attention=attention, chunk_size=8, **kw).eval()


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


# -------------------- DeltaNet
# DeltaNet (attention="deltanet"): GatedDeltaAttention with gated=False, the plain delta rule.


def test_module_is_the_plain_delta_rule_of_its_projections():
    """The output recomputed from the module's own projections with the float64 reference and
    no decay (g = None)."""
    torch.manual_seed(0)
    m = GatedDeltaAttention(16, 2, gated=False).double()
    x = torch.randn(2, 11, 16, dtype=torch.float64)
    out, state = m(x)
    q, k, v = m.project(x)
    beta, g = m.gates(x)
    assert g is None
    o, S = reference.delta_rule(F.silu(q), F.silu(k), v, beta, qk_l2norm=True)
    gate = F.silu(m._heads(m.gate_proj(x)))
    torch.testing.assert_close(out, m.merge(m.norm(o) * gate))
    torch.testing.assert_close(state.S, S)


def test_the_kind_builds_the_ungated_module_without_decay_parameters():
    m = build_mixer("deltanet", 32, 4, chunk_size=8)
    gated = build_mixer("gated_delta", 32, 4, chunk_size=8)
    assert type(m) is GatedDeltaAttention and not m.gated and gated.gated
    names = {n for n, _ in m.named_parameters()}
    assert not names & {"A_log", "dt_bias", "decay_proj.weight"}
    # the decay projection (E·H) and A_h, b_h (H each) are all that the gated module adds
    extra = sum(p.numel() for p in gated.parameters()) - sum(p.numel() for p in m.parameters())
    assert extra == 32 * 4 + 2 * 4
    assert "attention='deltanet'" in repr(m) and "attention='gated_delta'" in repr(gated)
    with pytest.raises(TypeError, match="^gated: expected a bool"):
        GatedDeltaAttention(32, 4, gated=1)


def test_mixer_decodes_token_by_token_as_the_chunked_form(decode_three_ways):
    torch.manual_seed(0)
    m = build_mixer("deltanet", 16, 2, chunk_size=4).eval()
    r = decode_three_ways(m, torch.randn(2, 19, 16))
    full, want, state, st = r["full"], r["want"], r["state"], r["st"]
    torch.testing.assert_close(r["steps"], full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state.S, want.S, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(r["pieces"], full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(st.S, want.S, rtol=1e-5, atol=1e-5)


def test_state_round_trips_with_and_without_the_kind():
    """DeltaNet and Gated DeltaNet share DeltaRuleState: a saved state is restored as it, with
    or without attention=, and continues identically."""
    m = _lm(attention="deltanet")
    ids = _ids(T=20)
    with torch.no_grad():
        sizes = [m(_ids(T=T), return_state=True)[1].nbytes() for T in (1, 10, 100)]
        _, st = m(ids[:, :12], return_state=True)
        saved = {k: v.clone() for k, v in st.to_dict().items()}
        a = m(ids[:, 12:], st, return_state=True)[0]
        for back in (LMState.from_dict(saved), LMState.from_dict(saved, attention="deltanet")):
            assert isinstance(back.layers[0], DeltaRuleState) and back.position == 12
            assert torch.equal(m(ids[:, 12:], back, return_state=True)[0], a)
    assert sizes[0] == sizes[1] == sizes[2] == 2 * 2 * 4 * 8 * 8 * 4  # L·B·H·d·d·fp32


def test_deltanet_generates_and_trains(generates_and_trains):
    m = generates_and_trains(_lm(attention="deltanet"), _ids(T=4), _ids())
    assert m.blocks[0].attn.beta_proj.weight.grad.abs().sum() > 0


def test_deltanet_bad_arguments():
    with pytest.raises(ValueError, match="^decay: not used with attention='deltanet'"):
        LinearTransformerLM(V, 32, 1, 4, attention="deltanet", decay=[0.9] * 4)
    m = _lm(attention="deltanet")
    with torch.no_grad():
        _, kv = LinearTransformerLM(V, 32, 2, 4, attention="softmax")(_ids(T=3), return_state=True)
    with pytest.raises(TypeError, match="^state: expected a DeltaRuleState"):
        m(_ids(T=1), kv, return_state=True)
