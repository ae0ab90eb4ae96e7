"""GLA attention (linattn.nn.gla), the LM built on it, and its configuration and command."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from linattn.nn import LinearTransformerLM, LMConfig, LMState
from linattn.nn.gla import GLAAttention, GLAState
from linattn.nn.mixers import state_from_dict, state_to_dict
from linattn.ops import reference

V = 37


def _tol(dtype: torch.dtype) -> dict[str, float]:
    """Chunked against sequential sums: a few hundred roundings of the dtype at these sizes."""
    eps = torch.finfo(dtype).eps
    return {"rtol": 256 * eps, "atol": 256 * eps}


def _lm(seed=0, dtype=torch.float32, **kw):
    torch.manual_seed(seed)
    m = LinearTransformerLM(V, 32, 2, 4, attention="gla", chunk_size=8, **kw).to(dtype).eval()
    with torch.no_grad():  # norms and gate biases off their initial values (not identities)
        for p in m.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return m


def _ids(B=2, T=29, seed=1):
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


def test_module_is_gated_linear_attention_of_its_projections():
    """The module's output, recomputed from its own projections with the float64 reference."""
    torch.manual_seed(0)
    m = GLAAttention(16, 2, chunk_size=4).double()
    x = torch.randn(2, 11, 16, dtype=torch.float64)
    out, state = m(x)
    q, k, v = m.project(x)
    gk = F.logsigmoid(m._heads(m.gk_proj(x))) / 16
    o, S = reference.gated_linear_attention(q, k, v, gk=gk)
    gate = F.silu(m._heads(m.gate_proj(x)))
    torch.testing.assert_close(out, m.merge(m.norm(o) * gate), **_tol(torch.float64))
    torch.testing.assert_close(state.kv, S, **_tol(torch.float64))
    assert out.shape == (2, 11, 16) and state.kv.shape == (2, 2, 8, 8)


def test_gates_are_per_key_log_decays_near_one_at_initialisation():
    m = GLAAttention(32, 4)
    gk = m.gates(torch.randn(3, 5, 32))
    assert gk.shape == (3, 4, 5, 8) and (gk <= 0).all()
    # logsigmoid(·)/16: near −log(2)/16 for small logits, so e^gk starts close to 1
    assert 0.8 < gk.exp().min() and gk.exp().max() < 1


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_chunked_forward_equals_token_by_token_decoding(dtype):
    m, ids = _lm(dtype=dtype), _ids()
    with torch.no_grad():
        full, st_full = m(ids, return_state=True)
        state, steps = None, []
        for t in range(ids.shape[1]):
            logits, state = m(ids[:, t : t + 1], state, return_state=True)
            steps.append(logits)
    assert full.dtype == dtype and state.layers[0].kv.dtype == dtype
    torch.testing.assert_close(torch.cat(steps, 1), full, **_tol(dtype))
    for a, b in zip(state.layers, st_full.layers, strict=True):
        torch.testing.assert_close(a.kv, b.kv, **_tol(dtype))


@pytest.mark.parametrize("split", [1, 8, 13])
def test_prefill_then_continue_equals_whole(split):
    m, ids = _lm(), _ids()
    with torch.no_grad():
        full = m(ids)
        a, st = m(ids[:, :split], return_state=True)
        b, st2 = m(ids[:, split:], st, return_state=True)
    torch.testing.assert_close(torch.cat([a, b], 1), full, **_tol(torch.float32))
    assert st2.position == ids.shape[1]


def test_state_is_constant_size_and_round_trips():
    m, ids = _lm(), _ids(T=20)
    with torch.no_grad():
        sizes = [m(_ids(T=T), return_state=True)[1].nbytes() for T in (1, 10, 100)]
        _, st = m(ids[:, :12], return_state=True)
        # one layer's state through the mixers' flat dicts, and the model's state without
        # naming the kind (its field tells it from Gated DeltaNet's lone S)
        layer = state_from_dict(GLAState, state_to_dict(st.layers[0], "p."), "p.")
        saved = LMState.from_dict({k: v.clone() for k, v in st.to_dict().items()})
        a = m(ids[:, 12:], st, return_state=True)[0]
        b = m(ids[:, 12:], saved, return_state=True)[0]
    assert sizes[0] == sizes[1] == sizes[2] == 2 * 2 * 4 * 8 * 8 * 4  # L·B·H·d·d·fp32
    assert isinstance(layer, GLAState) and torch.equal(layer.kv, st.layers[0].kv)
    assert isinstance(saved.layers[1], GLAState) and saved.position == 12
    assert torch.equal(a, b)
    assert list(GLAState(torch.zeros(1)).to_dict()) == ["kv"]


def test_generates_and_trains(generates_and_trains):
    m = generates_and_trains(_lm(), _ids(T=4), _ids())
    # every parameter is used (the feature map of the base class has none)
    assert all(p.grad.any() for p in m.parameters())


def test_parameters_are_those_of_the_linear_model_plus_the_gates():
    E, H, L = 128, 4, 4
    lin = LinearTransformerLM(256, E, L, H, attention="linear").num_parameters()
    gla = LinearTransformerLM(256, E, L, H, attention="gla").num_parameters()
    # per layer: output gate E·E, gate projection E·16 + 16·E + E, the norm's d = E/H weights
    assert gla - lin == L * (E * E + E * 16 + 16 * E + E + E // H)


def test_config_options():
    config = LMConfig(V, 32, 1, 4, attention="gla", chunk_size=16, dropout=0.1)
    assert LMConfig.from_dict(config.to_dict()) == config
    m = LinearTransformerLM.from_config(config)
    assert isinstance(m.blocks[0].attn, GLAAttention) and m.blocks[0].attn.chunk_size == 16
    for name, value in (("decay", [0.9] * 4), ("window", 8), ("feature_map", "relu")):
        with pytest.raises(ValueError, match=f"^{name}: not used with attention='gla'"):
            LMConfig(V, 32, 1, 4, attention="gla", **{name: value})
    with pytest.raises(ValueError, match="^num_heads: d_model 32 is not divisible by 3"):
        LMConfig(V, 32, 1, 3, attention="gla")


def test_bad_arguments():
    m = _lm()
    with torch.no_grad():
        _, other = LinearTransformerLM(V, 32, 2, 4, attention="gated_delta")(
            _ids(T=3), return_state=True)
    with pytest.raises(TypeError, match="^state: expected a GLAState, got DeltaRuleState"):
        m(_ids(T=1), other, return_state=True)
    GLAAttention(16, 2, gate_rank=np.int64(4), gate_normaliser=np.float32(8))  # NumPy scalars
    for bad in (0, 2.0, True):
        with pytest.raises(ValueError, match="^gate_rank: expected a positive integer"):
            GLAAttention(16, 2, gate_rank=bad)
    for bad in (0.0, -1.0, float("inf"), float("nan"), "16"):
        with pytest.raises(ValueError, match="^gate_normaliser: expected a finite number > 0"):
            GLAAttention(16, 2, gate_normaliser=bad)
    with pytest.raises(ValueError, match=r"^x: expected shape \(B, T, 16\)"):
        GLAAttention(16, 2)(torch.zeros(2, 3, 8))


def test_command_trains_and_generates(tmp_path, capsys):
    from linattn.cli import main
    from linattn.lm import load_model

    tiny = ["--d-model", "16", "--num-layers", "1", "--num-heads", "2", "--context", "32",
            "--batch-size", "4", "--corpus-bytes", "300000", "--val-tokens", "512",
            "--eval-every", "2", "--threads", "1", "--quiet", "--warmup", "2"]
    assert main(["lm", "train", "--out", str(tmp_path), "--steps", "2", "--attention", "gla",
                 *tiny]) == 0
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["steps"] == 2 and 0 < result["val_bpc"] < 9
    model, _ = load_model(tmp_path)
    assert model.config.attention == "gla" and isinstance(model.blocks[0].attn, GLAAttention)
    capsys.readouterr()
    assert main(["lm", "generate", "--model", str(tmp_path), "--prompt", "def ",
                 "--max-new-tokens", "5", "--seed", "0", "--threads", "1"]) == 0
    assert capsys.readouterr().out.startswith("def ")
    assert main(["lm", "train", "--out", str(tmp_path / "w"), "--steps", "1", "--attention",
                 "gla", "--window", "4", *tiny]) == 2
    assert "--window: not used with attention='gla'" in capsys.readouterr().err


@pytest.mark.parametrize("native", ["1", "0"])
def test_traces_on_the_compiled_and_the_torch_path(monkeypatch, native):
    """GLA with a head dimension the compiled kernels take (16): the prefill and a decoding step
    exported with the compiled path (linattn::gla_forward, linattn::gla_step in the graph) or
    the torch path (no linattn op), and a compiled training step (forward and backward), all
    equal to eager."""
    from linattn.ops import dispatch
    from linattn.ops.gated import native as gated_native

    if native == "1" and gated_native.kernels() is None:
        pytest.skip(f"compiled path: {gated_native.unavailable()}")
    monkeypatch.setenv("LINATTN_NATIVE", native)
    dispatch._memo.clear()
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = LinearTransformerLM(V, 32, 1, 2, attention="gla", chunk_size=8).eval()
    tol = _tol(torch.float32)

    class Step(torch.nn.Module):
        def __init__(self, lm):
            super().__init__()
            self.lm = lm

        def forward(self, ids, state):
            return self.lm(ids, state, return_state=True)

    ids = _ids(T=12)
    with torch.no_grad():
        want, st = m(ids[:, :11], return_state=True)
        want_step, want_st = m(ids[:, 11:], st, return_state=True)
        prefill = torch.export.export(m, (ids[:, :11],))
        step = torch.export.export(Step(m), (ids[:, 11:], st))
        torch.testing.assert_close(prefill.module()(ids[:, :11]), want, **tol)
        got, got_st = step.module()(ids[:, 11:], st)
    torch.testing.assert_close(got, want_step, **tol)
    torch.testing.assert_close(got_st.layers[0].kv, want_st.layers[0].kv, **tol)
    for ep, op in ((prefill, "linattn.gla_forward"), (step, "linattn.gla_step")):
        targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
        assert any(t.startswith(op) for t in targets) == (native == "1"), targets
    m.train()
    grads = []
    for f in (m, torch.compile(m, fullgraph=True, backend="aot_eager")):
        m.zero_grad()
        f(ids).logsumexp(-1).mean().backward()
        grads.append([p.grad.clone() for p in m.parameters()])
    for g_compiled, g_eager in zip(*grads[::-1], strict=True):
        torch.testing.assert_close(g_compiled, g_eager, **tol)
    dispatch._memo.clear()
    torch._dynamo.reset()
