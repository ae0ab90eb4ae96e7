"""The language model's token shift (``short_conv=k``): a depthwise causal convolution of the
embeddings, started at the identity, continued across calls through ``LMState.conv``."""

import pytest
import torch

from linattn.nn.lm import LinearTransformerLM, LMConfig, LMState, TokenShift
from linattn.nn.mixers import MIXERS

TOL = dict(rtol=1e-4, atol=20 * torch.finfo(torch.float32).eps)


def _model(attention: str, k: int = 4, seed: int = 0) -> LinearTransformerLM:
    torch.manual_seed(seed)
    m = LinearTransformerLM(40, 16, 2, 2, attention=attention, short_conv=k).eval()
    with torch.no_grad():  # not the identity, so that the shift matters in every check
        m.shift.weight.normal_()
    return m


def test_shift_is_the_causal_convolution_it_claims():
    torch.manual_seed(1)
    shift = TokenShift(3, 3)
    with torch.no_grad():
        shift.weight.normal_()
    x = torch.randn(2, 7, 3)
    y, tail = shift(x)
    w = shift.weight  # (E, k): w[:, j] multiplies x_{t−j}
    want = torch.zeros_like(x)
    for t in range(7):
        for j in range(3):
            if t - j >= 0:
                want[:, t] += w[:, j] * x[:, t - j]
    torch.testing.assert_close(y, want, **TOL)
    torch.testing.assert_close(tail, x[:, -2:])


def test_a_fresh_shift_keeps_the_token_and_opens_the_earlier_taps():
    shift = TokenShift(256, 4)
    w = shift.weight.detach()
    assert torch.equal(w[:, 0], torch.ones(256))
    # 768 draws of N(0, 0.5²): their spread within 20 % of 0.5 (a 5σ band is ±13 %)
    assert abs(w[:, 1:].std().item() - TokenShift.INIT_STD) < 0.2 * TokenShift.INIT_STD


def test_a_shift_at_the_identity_is_the_model_without_it():
    torch.manual_seed(0)
    plain = LinearTransformerLM(40, 16, 2, 2)
    shifted = LinearTransformerLM(40, 16, 2, 2, short_conv=4)
    missing = shifted.load_state_dict(plain.state_dict(), strict=False).missing_keys
    assert missing == ["shift.weight"]
    with torch.no_grad():
        shifted.shift.weight.zero_()
        shifted.shift.weight[:, 0] = 1
    ids = torch.randint(0, 40, (2, 9))
    torch.testing.assert_close(shifted(ids), plain(ids), **TOL)


@pytest.mark.parametrize("attention", list(MIXERS))
@pytest.mark.parametrize("k", [1, 2, 4])
def test_token_by_token_equals_the_whole_sequence(attention, k):
    m = _model(attention, k)
    ids = torch.randint(0, 40, (2, 10))
    with torch.no_grad():
        whole = m(ids)
        logits, state = m(ids[:, :3], return_state=True)
        steps = [logits]
        for t in range(3, 10):
            logits, state = m(ids[:, t:t + 1], state, return_state=True)
            steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, 1), whole, **TOL)
    assert state.conv.shape == (2, k - 1, 16)


def test_state_round_trips_and_counts_the_shift():
    m = _model("gated_delta")
    ids = torch.randint(0, 40, (1, 6))
    with torch.no_grad():
        _, state = m(ids, return_state=True)
        d = state.to_dict()
        again = LMState.from_dict(d, attention="gated_delta")
        nxt = torch.randint(0, 40, (1, 1))
        torch.testing.assert_close(m(nxt, again), m(nxt, state))
    assert torch.equal(d["conv"], state.conv)
    no_shift = LinearTransformerLM(40, 16, 2, 2, attention="gated_delta")
    _, plain = no_shift(ids, return_state=True)
    assert "conv" not in plain.to_dict()
    assert state.nbytes() - plain.nbytes() == 3 * 16 * 4  # k − 1 float32 embeddings


def test_shift_gets_gradients_and_learns_the_previous_token():
    m = _model("linear")
    m.train()
    m(torch.randint(0, 40, (2, 8))).sum().backward()
    assert m.shift.weight.grad is not None and m.shift.weight.grad[:, 1:].abs().sum() > 0


def test_bad_states_and_configurations_are_named():
    m = _model("linear")
    ids = torch.randint(0, 40, (2, 4))
    _, state = m(ids, return_state=True)
    with pytest.raises(ValueError, match="state.conv: expected shape"):
        m(ids, LMState(state.layers, state.position, state.conv[:1]))
    plain = LinearTransformerLM(40, 16, 2, 2)
    _, st = plain(ids, return_state=True)
    with pytest.raises(ValueError, match="no token shift"):
        plain(ids, LMState(st.layers, st.position, state.conv))
    for bad in (-1, 2.5, True):
        with pytest.raises((ValueError, TypeError), match="short_conv"):
            LMConfig(vocab_size=40, d_model=16, num_layers=1, num_heads=2, short_conv=bad)


def test_config_saves_the_shift_only_when_there_is_one():
    base = dict(vocab_size=40, d_model=16, num_layers=1, num_heads=2)
    assert "short_conv" not in LMConfig(**base).to_dict()
    c = LMConfig(**base, short_conv=3)
    assert c.to_dict()["short_conv"] == 3
    assert LMConfig.from_dict(c.to_dict()) == c


@pytest.mark.parametrize("with_state", [False, True])
def test_export_and_compile_carry_the_shift(with_state):
    m = _model("linear")
    ids = torch.randint(0, 40, (2, 5))
    with torch.no_grad():
        _, state = m(ids, return_state=True)
    args = (ids, state, True) if with_state else (ids,)
    want = m(*args)
    got = torch.export.export(m, args).module()(*args)
    compiled = torch.compile(m, fullgraph=True, backend="aot_eager")(*args)
    for out in (got, compiled):
        if with_state:
            torch.testing.assert_close(out[0], want[0], **TOL)
            torch.testing.assert_close(out[1].conv, want[1].conv)
        else:
            torch.testing.assert_close(out, want, **TOL)
