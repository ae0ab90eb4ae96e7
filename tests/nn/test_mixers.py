"""linattn.nn.mixers: the registry of the LM's token mixers, and a new mixer added with one
registry line (the model, its config checks, its state's save/restore, export and the command
line follow)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch import Tensor, nn

from linattn.nn import LinearTransformerLM, LMConfig, LMState
from linattn.nn.mixers import (
    MIXERS,
    OPTION_DEFAULTS,
    MixerSpec,
    build_mixer,
    mixer_options,
    state_from_dict,
    state_to_dict,
)

V = 37
SET = {"feature_map": "relu", "decay": [0.5, 0.9], "window": 4}  # a set value of each option


def test_the_kinds_and_their_options():
    assert list(MIXERS) == ["linear", "softmax", "hybrid", "gated_delta", "gla", "deltanet",
                            "cosformer", "flowformer"]
    for spec in MIXERS.values():
        assert set(spec.options) <= set(OPTION_DEFAULTS) and spec.summary
    assert MIXERS["hybrid"].options["window"] == 64
    for kind in ("gated_delta", "gla", "deltanet", "cosformer", "flowformer"):
        assert set(MIXERS[kind].options) == set(), kind
    assert MIXERS["deltanet"].kwargs == {"gated": False}


@pytest.mark.parametrize("attention", list(MIXERS))
def test_each_kind_builds_its_module_and_returns_its_state(attention):
    spec = MIXERS[attention]
    torch.manual_seed(0)
    mixer = build_mixer(attention, 16, 2, chunk_size=8)
    assert type(mixer) is spec.module_class()
    out, state = mixer(torch.randn(2, 5, 16))
    assert out.shape == (2, 5, 16) and type(state) is spec.state_class()
    saved = state_to_dict(state, "p.")
    assert all(k.startswith("p.") for k in saved)
    back = state_from_dict(spec.state_class(), saved, "p.")
    for k, v in state_to_dict(back, "p.").items():
        assert torch.equal(v, saved[k])
    model = LinearTransformerLM(V, 16, 1, 2, attention=attention)
    assert type(model.blocks[0].attn) is spec.module_class()


@pytest.mark.parametrize("attention", list(MIXERS))
def test_options_a_kind_does_not_take_are_errors(attention):
    taken = MIXERS[attention].options
    for name, value in SET.items():
        if name in taken:
            LMConfig(V, 16, 1, 2, attention=attention, **{name: value})  # accepted
            continue
        with pytest.raises(ValueError, match=f"^{name}: not used with attention='{attention}'"):
            LMConfig(V, 16, 1, 2, attention=attention, **{name: value})
        with pytest.raises(ValueError, match=f"^{name}: not used"):
            build_mixer(attention, 16, 2, chunk_size=8, **{name: value})
        # the unset value is fine with every kind
        LMConfig(V, 16, 1, 2, attention=attention, **{name: OPTION_DEFAULTS[name]})


def test_mixer_options_fill_the_kinds_defaults():
    assert mixer_options("hybrid", {"window": None, "decay": None}) == {
        "window": 64, "decay": None, "attention": "hybrid"}
    assert mixer_options("gated_delta", {"feature_map": "elu"}) == {}
    with pytest.raises(TypeError, match="^nope: not a mixer option"):
        mixer_options("linear", {"nope": 1})
    with pytest.raises(ValueError, match="^attention: expected one of linear, softmax, hybrid, "
                                         "gated_delta, gla, deltanet, cosformer, flowformer, "
                                         "got 'nope'"):
        mixer_options("nope", {})


# --- a new kind: a module, its state and one registry line ---


@dataclass(frozen=True)
class RunningMeanState:
    total: Tensor  # (B, E)
    count: int


class RunningMean(nn.Module):
    """A toy mixer: the running mean of the tokens so far, projected."""

    def __init__(self, d_model: int, num_heads: int, *, chunk_size: int, dropout: float = 0.0,
                 window: int = 3) -> None:
        super().__init__()
        self.proj = nn.Linear(d_model, d_model)
        self.window = window

    def forward(self, x, state=None, position=0):
        before = 0 if state is None else state.count
        prev = 0 if state is None else state.total[:, None]
        sums = prev + x.cumsum(1)
        counts = before + torch.arange(1, x.shape[1] + 1, dtype=x.dtype)
        return self.proj(sums / counts[:, None]), RunningMeanState(sums[:, -1], before + x.shape[1])


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(MIXERS, "toy", MixerSpec(RunningMean, RunningMeanState, {"window": 3},
                                                 "the running mean"))


def test_a_new_mixer_is_one_registry_line(toy):
    torch.manual_seed(0)
    m = LinearTransformerLM(V, 16, 2, 2, attention="toy").eval()
    assert isinstance(m.blocks[0].attn, RunningMean) and m.blocks[0].attn.window == 3
    assert LinearTransformerLM(V, 16, 1, 2, attention="toy", window=5).blocks[0].attn.window == 5
    with pytest.raises(ValueError, match="^decay: not used with attention='toy'"):
        LinearTransformerLM(V, 16, 1, 2, attention="toy", decay=[0.5, 0.5])
    ids = torch.randint(0, V, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = m(ids)
        a, st = m(ids[:, :4], return_state=True)
        saved = LMState.from_dict(st.to_dict())  # the kind is found from the entries
        b, _ = m(ids[:, 4:], saved, return_state=True)
        ep = torch.export.export(m, (ids[:, 4:], st, True))  # the state is a pytree
        c, _ = ep.module()(ids[:, 4:], st, True)
    assert isinstance(saved.layers[1], RunningMeanState) and saved.layers[1].count == 4
    torch.testing.assert_close(torch.cat([a, b], 1), full, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(c, b, rtol=1e-5, atol=1e-6)
    cfg = LMConfig.from_dict({**m.config.to_dict(), "window": 4})
    assert LinearTransformerLM.from_config(cfg).blocks[0].attn.window == 4


def test_a_new_mixer_is_a_choice_of_the_command(toy, tmp_path, capsys):
    from linattn.cli import main

    assert main(["lm", "train", "--out", str(tmp_path), "--attention", "toy", "--steps", "1",
                 "--d-model", "16", "--num-layers", "1", "--num-heads", "2", "--context", "16",
                 "--batch-size", "2", "--corpus-bytes", "100000", "--val-tokens", "64",
                 "--threads", "1", "--quiet"]) == 0
    assert '"attention": "toy"' in capsys.readouterr().out


def test_state_types_with_the_same_fields_need_the_kind(monkeypatch):
    @dataclass(frozen=True)
    class OtherS:
        S: Tensor

    monkeypatch.setitem(MIXERS, "other", MixerSpec(RunningMean, OtherS, {}, "same fields"))
    torch.manual_seed(0)
    m = LinearTransformerLM(V, 16, 1, 2, attention="gated_delta")
    with torch.no_grad():
        _, st = m(torch.zeros(1, 3, dtype=torch.long), return_state=True)
    with pytest.raises(ValueError, match="several state types: DeltaRuleState, OtherS; pass "
                                         "attention="):
        LMState.from_dict(st.to_dict())
    back = LMState.from_dict(st.to_dict(), attention="gated_delta")
    assert torch.equal(back.layers[0].S, st.layers[0].S) and back.position == 3
    with pytest.raises(ValueError, match="no state type of"):
        LMState.from_dict({"position": torch.tensor(0), "layers.0.q": torch.zeros(1)})


def test_positions_past_what_a_kind_holds_are_named():
    from linattn.nn.mixers import COSFORMER_HORIZON, check_positions

    check_positions("cosformer", COSFORMER_HORIZON, "context")
    check_positions("linear", 10**12, "context")  # no limit
    with pytest.raises(ValueError, match=r"^context: cosformer's weights hold for 1024 "
                                         r"positions, 1025 asked for$"):
        check_positions("cosformer", COSFORMER_HORIZON + 1, "context")


def test_a_window_a_state_cannot_keep_is_refused_by_the_config():
    """The hybrid's state keeps the last `window` keys, at most 2**31 − 1 (was a library
    error at the first forward)."""
    from linattn.nn.mixers import check_config

    base = {"vocab_size": 8, "d_model": 8, "num_layers": 1, "num_heads": 2,
            "attention": "hybrid"}
    check_config({**base, "window": 2**31 - 1})
    with pytest.raises(ValueError, match=r"^window: expected an integer in \[1, 2147483647\]"):
        check_config({**base, "window": 2**31})
