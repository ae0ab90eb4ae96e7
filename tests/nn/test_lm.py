"""LinearTransformerLM: step/parallel parity, prefill + continue, generation, state, bad ids."""

from __future__ import annotations

import pytest
import torch

from linattn.feature_maps import FavorPlus, Hedgehog
from linattn.nn import LinearTransformerLM, LMState
from linattn.nn.lm import LMConfig, TokenShift, default_decays
from linattn.nn.mixers import MIXERS

V = 37


def _model(attention="linear", seed=0, **kw):
    torch.manual_seed(seed)
    kw = {"chunk_size": 8, **kw}
    m = LinearTransformerLM(V, 32, 2, 4, attention=attention, **kw).eval()
    with torch.no_grad():  # perturb the LayerNorms so parity is not helped by identity affines
        for p in m.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return m


def _ids(B=2, T=29, seed=1):
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def _parallel_and_stepwise(m, ids):
    """The logits of ids (B, T) in one call, and one token at a time through the state."""
    state, steps = None, []
    for t in range(ids.shape[1]):
        logits, state = m(ids[:, t : t + 1], state, return_state=True)
        steps.append(logits)
    return m(ids), torch.cat(steps, 1)


@pytest.mark.parametrize("attention", ["linear", "softmax", "gated_delta", "gla",
                                       "deltanet", "cosformer", "flowformer"])
def test_step_by_step_equals_parallel(attention):
    m, ids = _model(attention), _ids()
    full, stepped = _parallel_and_stepwise(m, ids)
    assert full.shape == (2, 29, V) and full.dtype == torch.float32
    torch.testing.assert_close(stepped, full, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("attention", ["linear", "softmax", "gated_delta", "gla",
                                       "deltanet", "cosformer", "flowformer"])
@pytest.mark.parametrize("split", [1, 8, 13])
def test_prefill_then_continue_equals_whole(attention, split):
    m, ids = _model(attention), _ids()
    with torch.no_grad():
        full = m(ids)
        a, st = m(ids[:, :split], return_state=True)
        b, st2 = m(ids[:, split:], st, return_state=True)
    torch.testing.assert_close(torch.cat([a, b], 1), full, rtol=1e-4, atol=1e-4)
    assert st2.position == ids.shape[1]


def test_linear_state_is_constant_size_and_kv_cache_grows():
    lin, soft = _model("linear"), _model("softmax")
    with torch.no_grad():
        sizes = [lin(_ids(T=T), return_state=True)[1].nbytes() for T in (1, 10, 100)]
        kv = [soft(_ids(T=T), return_state=True)[1].nbytes() for T in (1, 10, 100)]
    assert sizes[0] == sizes[1] == sizes[2] == 2 * 2 * 4 * 8 * 9 * 4  # L·B·H·ℓ·(d+1)·fp32
    assert kv == [2 * 2 * 2 * 4 * T * 8 * 4 for T in (1, 10, 100)]


def test_same_parameter_count_for_both_attentions():
    assert _model("linear").num_parameters() == _model("softmax").num_parameters()


def test_generate_is_deterministic_for_a_seed():
    m, prompt = _model(), _ids(T=5)
    outs = [m.generate(prompt, 20, temperature=1.0, top_k=10,
                       generator=torch.Generator().manual_seed(s)) for s in (3, 3, 4)]
    assert outs[0].shape == (2, 25)
    assert torch.equal(outs[0][:, :5], prompt)
    assert torch.equal(outs[0], outs[1])
    assert not torch.equal(outs[0], outs[2])
    assert int(outs[0].max()) < V


def test_greedy_generate_matches_argmax_of_parallel_forward():
    m, prompt = _model(), _ids(T=4)
    out = m.generate(prompt, 6, temperature=0)
    with torch.no_grad():
        logits = m(out[:, :-1])
    torch.testing.assert_close(logits[:, 3:].argmax(-1), out[:, 4:])


def test_state_save_restore_continues_identically():
    m, ids = _model(), _ids(T=20)
    with torch.no_grad():
        _, st = m(ids[:, :12], return_state=True)
        saved = LMState.from_dict({k: v.clone() for k, v in st.to_dict().items()})
        a = m(ids[:, 12:], st, return_state=True)[0]
        b = m(ids[:, 12:], saved, return_state=True)[0]
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="missing"):
        LMState.from_dict({"layers.0.S": torch.zeros(1)})


@pytest.mark.parametrize("bad", [
    torch.tensor([[0, V]]),                  # out of vocabulary
    torch.tensor([[-1, 2]]),
    torch.tensor([[0.0, 1.0]]),              # float dtype
    torch.tensor([[True, False]]),           # bool dtype
    torch.tensor([1, 2]),                    # wrong rank
    torch.zeros(1, 0, dtype=torch.long),     # empty
])
def test_bad_ids_raise_value_error(bad):
    with pytest.raises(ValueError, match="ids"):
        _model()(bad)


def test_bad_arguments_raise():
    m = _model()
    with pytest.raises(ValueError, match="state"):
        m(_ids(), LMState([], 0))
    with pytest.raises(ValueError, match="attention"):
        LinearTransformerLM(V, 32, 1, 4, attention="nope")
    with pytest.raises(ValueError, match="decay"):
        LinearTransformerLM(V, 32, 1, 4, decay=[0.5, 1.5, 0.9, 0.9])


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_meta_and_nested_ids_are_named():
    """Issue 51: meta ids reached ``.item()`` in the range check, nested ones torch's internal
    error."""
    m = _model()
    with pytest.raises(ValueError, match=r"^ids: expected a tensor on cpu \(the model's "
                                         r"device\), got meta$"):
        m(_ids().to("meta"))
    with pytest.raises(TypeError, match=r"^ids: expected a dense \(strided\) tensor"):
        m(torch.nested.nested_tensor([_ids()[0], _ids()[1, :5]]))


@pytest.mark.parametrize("attention", sorted(MIXERS))
def test_a_state_of_another_batch_size_is_named(attention):
    """A state from a batch of 1 continued with a batch of 2: cosFormer and Flowformer
    broadcast it silently, softmax raised a cat error (issue 51); now a ValueError."""
    m = _model(attention, **({"window": 4} if attention == "hybrid" else {}))
    with torch.no_grad():
        _, state = m(_ids(B=1, T=5), return_state=True)
        with pytest.raises(ValueError, match=r"^state: holds a batch of 1, ids a batch of 2$"):
            m(_ids(B=2, T=3), state)
        m(_ids(B=1, T=3), state)  # its own batch size continues


@pytest.mark.parametrize("kw, match", [
    ({"max_new_tokens": True}, r"^max_new_tokens: expected an integer >= 0, got True$"),
    ({"max_new_tokens": 2.0}, r"^max_new_tokens: expected an integer >= 0, got 2\.0$"),
    ({"max_new_tokens": 1, "top_k": 2.5}, r"^top_k: expected a positive integer, got 2\.5$"),
    ({"max_new_tokens": 1, "temperature": "1"}, r"^temperature: expected a number >= 0, got '1'$"),
])
def test_generate_arguments_are_named(kw, match):
    with pytest.raises((ValueError, TypeError), match=match):
        _model().generate(_ids(T=3), **kw)


@pytest.mark.parametrize("kw, option", [({"vocab_size": 10**12}, "vocab_size"),
                                        ({"short_conv": 10**9}, "short_conv")])
def test_a_model_too_large_for_memory_is_named_before_allocating(kw, option):
    """Issue 51: the allocator's RuntimeError ("can't allocate memory") from the constructor."""
    args = {"vocab_size": V, "d_model": 16, "num_layers": 1, "num_heads": 2, **kw}
    with pytest.raises(ValueError, match=rf"^{option}: this model needs about .* of memory, more "
                                         r"than the .* available$"):
        LinearTransformerLM(**args)


def test_default_decays_spread():
    g = default_decays(4)
    assert g[0] == 0.75 and abs(g[-1] - (1 - 2**-9)) < 1e-7 and (g.diff() > 0).all()


def test_gradients_flow_through_training_forward():
    m = _model().train()
    ids = _ids()
    loss = torch.nn.functional.cross_entropy(m(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters())


@pytest.mark.parametrize("attention", ["linear", "softmax"])
def test_decay_weights_recent_tokens_more(attention):
    """Against an explicit computation: weights ∝ γ^(i−j)·k(q_i, k_j), so a tiny γ attends to
    the current token only and γ = 1 is undecayed attention."""
    from linattn.nn.lm import DecayedMultiheadAttention

    torch.manual_seed(0)
    x = torch.randn(2, 9, 16)
    m = DecayedMultiheadAttention(16, 2, attention=attention, decay=[1e-6, 1.0])
    with torch.no_grad():
        out, _ = m(x)
        q, k, v = (m._heads(p(x)) for p in (m.q_proj, m.k_proj, m.v_proj))
        if attention == "softmax":
            s = (q @ k.transpose(-1, -2) / 8**0.5).exp()
        else:
            fq, fk = 1 + torch.nn.functional.elu(q), 1 + torch.nn.functional.elu(k)
            s = fq @ fk.transpose(-1, -2)
        lag = torch.arange(9)[:, None] - torch.arange(9)[None, :]
        gamma = torch.tensor([1e-6, 1.0])[:, None, None]
        w = s * torch.where(lag >= 0, gamma ** lag.clamp(min=0), torch.zeros(()))
        o = (w / w.sum(-1, keepdim=True)) @ v
        torch.testing.assert_close(o[:, 0], v[:, 0], rtol=1e-4, atol=1e-4)  # γ≈0: itself
        want = m.out_proj(o.transpose(1, 2).reshape(2, 9, 16))
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", ["hedgehog", "favor"])
def test_each_layer_owns_its_feature_map(kind):
    """A FeatureMap instance is a template: each layer gets its own copy (learnable weights
    trained apart, random features drawn apart), saved in the state_dict."""
    torch.manual_seed(0)
    template = Hedgehog(8) if kind == "hedgehog" else FavorPlus(8, 16)
    m = LinearTransformerLM(V, 32, 2, 4, feature_map=template, chunk_size=8)
    maps = [block.attn.feature_map for block in m.blocks]
    assert maps[0] is not maps[1] and all(type(f) is type(template) for f in maps)
    name = "proj.weight" if kind == "hedgehog" else "W"
    t0, t1 = (f.get_parameter(name) if kind == "hedgehog" else f.get_buffer(name) for f in maps)
    assert t0.data_ptr() != t1.data_ptr()
    for i, t in enumerate((t0, t1)):
        torch.testing.assert_close(m.state_dict()[f"blocks.{i}.attn.feature_map.{name}"], t)
    if kind == "favor":
        assert not torch.equal(t0, t1)
        return
    before = t1.detach().clone()
    ids = _ids()
    torch.nn.functional.cross_entropy(m(ids).flatten(0, 1), ids.flatten()).backward()
    torch.optim.SGD(maps[0].parameters(), lr=1.0).step()
    assert not torch.equal(t0, before)
    torch.testing.assert_close(t1, before, rtol=0, atol=0)


def test_shared_bases_leave_each_forward_contract_to_its_class():
    """The attention modules and the blocks share parts through bases that define no forward,
    so no class overrides another's forward with a different signature or return type."""
    import inspect

    from linattn.nn import EncoderBlock, MultiheadLinearAttention
    from linattn.nn.attention import MultiheadAttentionBase
    from linattn.nn.encoder import PreNormBlock
    from linattn.nn.lm import DecayedMultiheadAttention, DecoderBlock

    assert "forward" not in vars(MultiheadAttentionBase) and "forward" not in vars(PreNormBlock)
    assert not issubclass(DecayedMultiheadAttention, MultiheadLinearAttention)
    assert not issubclass(DecoderBlock, EncoderBlock)
    params = {cls: list(inspect.signature(cls.forward).parameters)[1:] for cls in (
        MultiheadLinearAttention, EncoderBlock, DecayedMultiheadAttention, DecoderBlock)}
    assert params[MultiheadLinearAttention] == params[EncoderBlock] == ["x", "key_padding_mask"]
    assert params[DecayedMultiheadAttention] == params[DecoderBlock] == ["x", "state", "position"]


def test_decoder_block_builds_only_its_own_attention(monkeypatch):
    from linattn.nn.attention import MultiheadAttentionBase
    from linattn.nn.lm import DecayedMultiheadAttention, DecoderBlock

    built = []
    init = MultiheadAttentionBase.__init__

    def counting_init(self, *args, **kwargs):
        built.append(type(self))
        init(self, *args, **kwargs)

    monkeypatch.setattr(MultiheadAttentionBase, "__init__", counting_init)
    DecoderBlock(16, 2)
    assert built == [DecayedMultiheadAttention]


def test_decayed_attention_bad_arguments():
    from linattn.nn.lm import DecayedMultiheadAttention

    with pytest.raises(ValueError, match="x: expected shape"):
        DecayedMultiheadAttention(16, 2)(torch.randn(1, 4, 15))
    with pytest.raises(ValueError, match="num_heads"):
        DecayedMultiheadAttention(16, 3)


# --- LMConfig: the configuration, checked in one place ---


def test_config_is_the_constructors_keywords_and_saves_as_before():
    from dataclasses import FrozenInstanceError

    from linattn.nn import LMConfig

    m = _model(decay=torch.tensor([0.5, 0.6, 0.7, 0.8]))
    c = m.config
    assert isinstance(c, LMConfig) and c.decay == (0.5, 0.6000000238418579, 0.699999988079071,
                                                   0.800000011920929)
    # the dict earlier versions stored as model.config (window only for the hybrid)
    assert list(c.to_dict()) == ["vocab_size", "d_model", "num_layers", "num_heads",
                                 "feature_map", "dropout", "mlp_dim", "attention", "decay",
                                 "chunk_size"]
    assert LMConfig.from_dict(c.to_dict()) == c
    with pytest.raises(FrozenInstanceError):
        c.d_model = 8
    torch.manual_seed(0)
    a = LinearTransformerLM.from_config(c)
    torch.manual_seed(0)
    b = LinearTransformerLM(**c.kwargs())
    assert a.config == c and list(a.state_dict()) == list(m.state_dict())
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k]), k
    assert LinearTransformerLM.from_config(c.to_dict()).config == c


def test_config_reads_the_dicts_of_earlier_checkpoints():
    from linattn.nn import LMConfig
    from linattn.ops.dispatch import DEFAULT_CHUNK_SIZE

    cli = {"vocab_size": 256, "d_model": 16, "num_layers": 1, "num_heads": 2,
           "feature_map": "elu", "dropout": 0.0, "attention": "linear", "chunk_size": None}
    c = LMConfig.from_dict(cli)  # the command's subset; an unset chunk_size
    assert (c.chunk_size, c.mlp_dim, c.decay) == (DEFAULT_CHUNK_SIZE, None, None)
    with pytest.warns(DeprecationWarning, match="'layers' is deprecated"):
        old = LMConfig.from_dict({**{k: v for k, v in cli.items() if k != "num_layers"},
                                  "layers": 1})
    assert old == c
    # a feature map saved with a kind that ignores it (it had no effect) is dropped
    soft = LMConfig.from_dict({**cli, "attention": "softmax", "feature_map": "relu"})
    assert soft.feature_map == "elu"
    for bad, match in (({**cli, "nope": 1}, "unknown keys"), ({"d_model": 4}, "missing keys"),
                       ([1], "expected a dict"),
                       ({**cli, "attention": "hybrid", "window": 0}, "window: expected")):
        with pytest.raises(ValueError, match=f"^model config: .*{match}"):
            LMConfig.from_dict(bad)
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="both 'heads'"):
        LMConfig.from_dict({**cli, "heads": 4})


@pytest.mark.parametrize("bad, match", [
    ({"vocab_size": 0}, "^vocab_size: expected a positive integer"),
    ({"num_heads": True}, "^num_heads: expected a positive integer"),
    ({"dropout": 1.0}, r"^dropout: expected a number in \[0, 1\)"),
    ({"mlp_dim": -1}, "^mlp_dim"),  # 0 is no MLP
    ({"chunk_size": 0}, "^chunk_size"),
    ({"feature_map": "nope"}, "^feature_map: unknown name 'nope'"),
    ({"decay": [0.5] * 3}, r"^decay: expected 4 values in \(0, 1\]"),
    ({"decay": [0.5, 0.5, 0.5, 0.0]}, "^decay"),
    ({"attention": "nope"},
     "^attention: expected one of linear, softmax, hybrid, gated_delta, gla, deltanet, "
     "cosformer, flowformer, got 'nope'"),
    ({"attention": "softmax", "feature_map": "relu"},
     "^feature_map: not used with attention='softmax' \\(only with 'linear' or 'hybrid'\\)"),
])
def test_config_errors_name_the_field(bad, match):
    from linattn.nn import LMConfig

    with pytest.raises(ValueError, match=match):
        LMConfig(**{"vocab_size": V, "d_model": 32, "num_layers": 1, "num_heads": 4, **bad})


# --- attention="hybrid": sliding-window softmax + linear attention (linattn.ops.window) ---


def _hybrid(window=5, **kw):
    return _model("hybrid", window=window, **kw)


@pytest.mark.parametrize("window", [1, 5, 40])
def test_hybrid_step_by_step_equals_parallel(window):
    m, ids = _hybrid(window), _ids()
    full, stepped = _parallel_and_stepwise(m, ids)
    torch.testing.assert_close(stepped, full, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("split", [1, 8, 13])
def test_hybrid_prefill_then_continue_equals_whole(split):
    m, ids = _hybrid(), _ids()
    with torch.no_grad():
        full = m(ids)
        a, st = m(ids[:, :split], return_state=True)
        b, st2 = m(ids[:, split:], st, return_state=True)
    torch.testing.assert_close(torch.cat([a, b], 1), full, rtol=1e-4, atol=1e-4)
    assert st2.position == ids.shape[1] == st2.layers[0].count


def test_hybrid_state_is_constant_size_and_round_trips():
    m = _hybrid(window=5)
    with torch.no_grad():
        sizes = [m(_ids(T=T), return_state=True)[1].nbytes() for T in (1, 10, 100)]
        ids = _ids(T=20)
        _, st = m(ids[:, :12], return_state=True)
        saved = LMState.from_dict({k: v.clone() for k, v in st.to_dict().items()})
        a = m(ids[:, 12:], st, return_state=True)[0]
        b = m(ids[:, 12:], saved, return_state=True)[0]
    # L·B·H·(ℓ·(d+1) + w·2d)·fp32: linear state plus the ring buffer of 5 keys and values
    assert sizes[0] == sizes[1] == sizes[2] == 2 * 2 * 4 * (8 * 9 + 5 * 2 * 8) * 4
    assert saved.layers[0].count == 12
    assert torch.equal(a, b)


def test_hybrid_has_the_linear_models_parameters_and_keys():
    lin, hyb = _model("linear"), _hybrid()
    assert lin.num_parameters() == hyb.num_parameters()
    assert list(lin.state_dict()) == list(hyb.state_dict())
    assert hyb.config.window == 5 and lin.config.window is None
    assert hyb.config.to_dict()["window"] == 5 and "window" not in lin.config.to_dict()
    assert "window=5" in repr(hyb.blocks[0].attn)


def test_hybrid_with_a_window_over_everything_is_the_softmax_model():
    """window ≥ T: exact softmax everywhere; with decays 1 the softmax model has no bias, so
    the two kinds compute the same function from the same weights."""
    ones = [1.0] * 4
    soft = _model("softmax", decay=ones)
    hyb = _model("hybrid", decay=ones, window=64)
    hyb.load_state_dict(soft.state_dict())
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(hyb(ids), soft(ids), rtol=1e-4, atol=1e-4)


def test_hybrid_generates_and_trains():
    m = _hybrid()
    out = m.generate(_ids(T=4), 6, temperature=0)
    assert out.shape == (2, 10)
    with torch.no_grad():
        torch.testing.assert_close(m(out[:, :-1])[:, 3:].argmax(-1), out[:, 4:])
    m.train()
    ids = _ids()
    torch.nn.functional.cross_entropy(m(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten()).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters())


def test_hybrid_bad_arguments():
    from linattn.nn.lm import DEFAULT_WINDOW, DecayedMultiheadAttention

    assert DecayedMultiheadAttention(16, 2, attention="hybrid").window == DEFAULT_WINDOW
    with pytest.raises(ValueError, match="^window: not used with attention='linear' "
                                         r"\(only with 'hybrid'\), got 8"):
        LinearTransformerLM(V, 32, 1, 4, window=8)
    with pytest.raises(ValueError, match="^window: only used with attention='hybrid'"):
        DecayedMultiheadAttention(16, 2, window=8)  # the module's own check
    for bad in (0, -3, 2.5):
        with pytest.raises(ValueError, match=r"^window: expected an integer in "
                                             r"\[1, 2147483647\]"):
            LinearTransformerLM(V, 32, 1, 4, attention="hybrid", window=bad)
    m = _hybrid()
    with torch.no_grad():
        _, lin_state = _model("linear")(_ids(T=3), return_state=True)
    with pytest.raises(TypeError, match="^state: expected a WindowLinearAttentionState"):
        m(_ids(T=1), lin_state, return_state=True)


# --- tracing: torch.compile(fullgraph=True) and torch.export (issue 23 §2) ---
#
# The model's own code traces for every kind (the ids' range an assertion node there).
# Every attention kind traces: the ops' value checks become assertion nodes of the graph
# (linattn.ops._common.check_values). The "aot_eager" backend runs Dynamo (the fullgraph
# capture) and AOTAutograd (the backward graph) without compiling C++ (inductor: the slow
# test below).

KINDS = ["linear", "softmax", "hybrid", "gated_delta", "gla", "deltanet", "cosformer",
         "flowformer"]
TOL = {"rtol": 64 * torch.finfo(torch.float32).eps, "atol": 64 * torch.finfo(torch.float32).eps}


def _tiny(attention):
    """One layer, d_model 16, T ≤ 32: traces in about a second a graph."""
    torch.manual_seed(0)
    kw = {"window": 4} if attention == "hybrid" else {}
    return LinearTransformerLM(V, 16, 1, 2, attention=attention, chunk_size=8, **kw).eval()


def _assert_states_close(got, want):
    got, want = got.to_dict(), want.to_dict()
    assert list(got) == list(want)
    for k in want:
        torch.testing.assert_close(got[k], want[k], **TOL, msg=k)


@pytest.mark.parametrize("attention", KINDS)
def test_compile_fullgraph_forward_and_backward_equal_eager(attention):
    torch._dynamo.reset()
    m, ids = _tiny(attention), _ids(T=20)
    compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(ids), m(ids), **TOL)
    m.train()
    grads = []
    for f in (m, compiled):
        m.zero_grad()
        f(ids).logsumexp(-1).mean().backward()
        grads.append([p.grad.clone() for p in m.parameters()])
    for g_compiled, g_eager in zip(*grads[::-1], strict=True):
        torch.testing.assert_close(g_compiled, g_eager, **TOL)


@pytest.mark.parametrize("attention", KINDS)
def test_compile_fullgraph_with_a_state_equals_eager(attention):
    """Prefill, a continuing chunk and a one-token step, each through the compiled model."""
    torch._dynamo.reset()
    m, ids = _tiny(attention), _ids(T=24)
    step = torch.compile(lambda x, st: m(x, st, return_state=True), fullgraph=True,
                         backend="aot_eager")
    with torch.no_grad():
        _, st = m(ids[:, :9], return_state=True)
        for chunk in (ids[:, 9:23], ids[:, 23:]):
            got, got_st = step(chunk, st)
            want, st = m(chunk, st, return_state=True)
            torch.testing.assert_close(got, want, **TOL)
            _assert_states_close(got_st, st)
    assert got_st.position == 24


@pytest.mark.parametrize("attention", KINDS)
def test_export_equals_eager(attention):
    m, ids = _tiny(attention), _ids(T=16)
    ep = torch.export.export(m, (ids,))
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(ids), m(ids), **TOL)


@pytest.mark.parametrize("attention", KINDS)
def test_export_with_a_dynamic_batch_equals_eager(attention):
    """What docs/design.md promises of torch.export's dynamic shapes: the batch dimension may
    be dynamic for every kind (the sequence length is static: each op picks its chunks and
    blocks from T while tracing)."""
    from torch.export import Dim

    m = _tiny(attention)
    ep = torch.export.export(m, (_ids(B=3, T=16),),
                             dynamic_shapes={"ids": {0: Dim("B", min=1, max=64)}})
    with torch.no_grad():
        for B in (1, 5, 64):
            ids = _ids(B=B, T=16, seed=B)
            torch.testing.assert_close(ep.module()(ids), m(ids), **TOL)


@pytest.mark.parametrize("attention", KINDS)
def test_export_with_a_state_equals_eager(attention):
    """The states are pytrees (their tensors the leaves), so an exported step takes and
    returns an LMState."""

    class Continue(torch.nn.Module):
        def __init__(self, lm):
            super().__init__()
            self.lm = lm

        def forward(self, ids, state):
            return self.lm(ids, state, return_state=True)

    m, ids = _tiny(attention), _ids(T=20)
    with torch.no_grad():
        _, st = m(ids[:, :12], return_state=True)
        want, want_st = m(ids[:, 12:], st, return_state=True)
    ep = torch.export.export(Continue(m), (ids[:, 12:], st))
    with torch.no_grad():
        got, got_st = ep.module()(ids[:, 12:], st)
    torch.testing.assert_close(got, want, **TOL)
    _assert_states_close(got_st, want_st)


def test_traced_forward_keeps_the_dtype_and_shape_checks():
    """Under tracing only the value range goes unchecked (it is data); a bad dtype or shape
    still fails, as a ValueError under export and inside Dynamo's error under compile."""
    m = _tiny("hybrid")
    with pytest.raises(ValueError, match="ids: expected an integer tensor"):
        torch.export.export(m, (torch.zeros(1, 4),))
    with pytest.raises(ValueError, match="ids: expected shape"):
        torch.export.export(m, (torch.zeros(4, dtype=torch.long),))
    torch._dynamo.reset()
    compiled = torch.compile(m, fullgraph=True, backend="eager")
    with pytest.raises(Exception, match="ids: expected an integer tensor"):
        compiled(torch.zeros(1, 4))
    with pytest.raises(ValueError, match="ids: values must lie in"):
        m(torch.tensor([[0, V]]))  # eager: checked


@pytest.mark.slow
@pytest.mark.parametrize("attention", KINDS)
def test_inductor_compiles_the_forward(attention):
    torch._dynamo.reset()
    m, ids = _tiny(attention), _ids(T=16)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(m, fullgraph=True)(ids), m(ids), rtol=1e-5,
                                   atol=1e-5)


def test_fake_ids_skip_the_value_check():
    """Fake tensors (what export and make_fx trace with) carry no values either: the range
    check stays out of them, the shapes come through."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    m = _tiny("hybrid")
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        logits = m(mode.from_tensor(_ids(T=8)))
    assert logits.shape == (2, 8, V)


@pytest.mark.parametrize("native", ["1", "0"])
def test_gated_delta_traces_on_the_compiled_and_the_torch_path(monkeypatch, native):
    """Gated DeltaNet with a head dimension the compiled kernels take (16): inference traced with
    the compiled path (linattn::gdr_forward for the prefill, linattn::gdr_step for a decoding
    step in the graph) or the torch path (no linattn op), equal to eager."""
    from linattn.ops import dispatch
    from linattn.ops.delta import native as delta_native

    if native == "1" and delta_native.kernels() is None:
        pytest.skip(f"compiled path: {delta_native.unavailable()}")
    monkeypatch.setenv("LINATTN_NATIVE", native)
    dispatch._memo.clear()
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = LinearTransformerLM(V, 32, 1, 2, attention="gated_delta", chunk_size=8).eval()

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
        torch.testing.assert_close(prefill.module()(ids[:, :11]), want, **TOL)
        got, got_st = step.module()(ids[:, 11:], st)
        torch.testing.assert_close(got, want_step, **TOL)
        _assert_states_close(got_st, want_st)
        compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
        torch.testing.assert_close(compiled(ids[:, :11]), want, **TOL)
    for ep, op in ((prefill, "linattn.gdr_forward"), (step, "linattn.gdr_step")):
        targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
        assert any(t.startswith(op) for t in targets) == (native == "1"), targets
    dispatch._memo.clear()


@pytest.mark.parametrize("attention", ["gated_delta", "gla", "deltanet"])
def test_compiled_training_step_on_the_compiled_kernels(attention):
    """Head dimension 16, so that training takes the compiled forward and backward
    (linattn::gdr_forward_train / gdr_backward, linattn::gla_forward / gla_backward): a
    compiled forward + backward equals eager. Was: the backward ops' fake implementations gave
    the gradients the strides of the (transposed) inputs, the kernels return them contiguous,
    and the compiled graph failed with "view size is not compatible"."""
    from linattn.ops.delta import native as delta_native

    if delta_native.kernels() is None:
        pytest.skip(f"compiled path: {delta_native.unavailable()}")
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = LinearTransformerLM(V, 32, 1, 2, attention=attention, chunk_size=8)
    ids = _ids(T=20)
    compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
    grads = []
    for f in (m, compiled):
        m.zero_grad()
        f(ids).logsumexp(-1).mean().backward()
        grads.append([p.grad.clone() for p in m.parameters()])
    for g_compiled, g_eager in zip(*grads[::-1], strict=True):
        torch.testing.assert_close(g_compiled, g_eager, **TOL)


def test_no_mlp_when_mlp_dim_is_zero():
    """mlp_dim=0: attention is each layer's only sublayer (Zoology's recall models)."""
    m = LinearTransformerLM(40, 16, 2, 2, mlp_dim=0)
    assert all(b.mlp is None and b.norm2 is None for b in m.blocks)
    assert not any("mlp" in name or "norm2" in name for name, _ in m.named_parameters())
    ids = torch.randint(0, 40, (2, 6))
    h, _ = m.embed_tokens(ids)
    a, _ = m.blocks[0].attn(m.blocks[0].norm1(h), None, 0)
    out, _ = m.blocks[0](h)
    torch.testing.assert_close(out, h + a)  # x + attention, nothing after
    m(ids).sum().backward()
    with pytest.raises(ValueError, match="mlp_dim"):
        LinearTransformerLM(40, 16, 2, 2, mlp_dim=-1)


def test_ids_out_of_range_inside_a_graph_are_an_assertion():
    """Traced, the ids' range is an assertion node of the graph (as the ops' gate checks are):
    the exported program and a compiled model raise a RuntimeError naming the range. It was
    checked in eager only, and a graph compiled by Inductor then aborted the process (SIGABRT)
    in its own bounds check of the embedding gather (test below)."""
    m = LinearTransformerLM(V, 16, 1, 2).eval()
    ids = torch.randint(0, V, (2, 8), generator=torch.Generator().manual_seed(0))
    ep = torch.export.export(m, (ids,))
    asserts = [n for n in ep.graph.nodes if "assert" in str(n.target)
               and any(f"ids: values must lie in [0, {V})" in str(a) for a in n.args)]
    assert asserts, ep.graph
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(ids), m(ids), rtol=0, atol=0)
        for bad in (torch.full((2, 8), V), torch.full((2, 8), -1)):
            with pytest.raises(RuntimeError, match=rf"ids: values must lie in \[0, {V}\)"):
                ep.module()(bad)
        compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
        torch.testing.assert_close(compiled(ids), m(ids), rtol=0, atol=0)
        with pytest.raises(RuntimeError, match=rf"ids: values must lie in \[0, {V}\)"):
            compiled(torch.full((2, 8), V + 33))


@pytest.mark.slow
@pytest.mark.skipif(not any(map(__import__("shutil").which, ("c++", "g++", "clang++"))),
                    reason="Inductor needs a C++ compiler")
def test_an_inductor_compiled_model_raises_on_bad_ids_in_a_serving_process():
    """The issue's case in a process of its own (the failure was SIGABRT): Inductor, dynamic
    T, a batch large enough for a parallel loop. About three minutes of compiling."""
    import subprocess
    import sys

    code = """
import torch
from linattn.nn import LinearTransformerLM
torch.manual_seed(0)
m = LinearTransformerLM(64, 16, 1, 2).eval()
cm = torch.compile(m, fullgraph=True, dynamic=True)
with torch.no_grad():
    cm(torch.randint(0, 64, (2, 8)))
    try:
        cm(torch.full((512, 200), 70))
    except RuntimeError as err:
        print("RuntimeError:", err)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=1200)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "RuntimeError: ids: values must lie in [0, 64)" in done.stdout, done.stdout


@pytest.mark.parametrize("attention", ["linear", "softmax", "hybrid", "gated_delta", "gla",
                                       "deltanet", "cosformer", "flowformer"])
def test_a_tiny_temperature_is_greedy_for_every_kind(attention):
    """logits / 1e-300 overflowed to inf, and multinomial raised 'probability tensor contains
    either inf, nan or element < 0'; the logits are now shifted by their maximum first, so
    any temperature > 0 is a distribution (at 1e-300: all on the arg-max)."""
    from linattn.nn.mixers import MIXERS

    assert attention in MIXERS
    m = _model(attention)
    ids = _ids(B=2, T=5)
    greedy = m.generate(ids, 6, temperature=0.0)
    for t in (1e-300, 5e-324):
        g = torch.Generator().manual_seed(0)
        assert torch.equal(m.generate(ids, 6, temperature=t, generator=g), greedy)
        assert torch.equal(m.generate(ids, 6, temperature=t, top_k=3, generator=g), greedy)


def test_every_kind_is_in_the_tiny_temperature_test():
    from linattn.nn.mixers import MIXERS

    tested = {"linear", "softmax", "hybrid", "gated_delta", "gla", "deltanet", "cosformer",
              "flowformer"}
    assert set(MIXERS) == tested


@pytest.mark.parametrize("attention", ["linear", "softmax", "hybrid", "gated_delta", "gla",
                                       "deltanet", "cosformer", "flowformer"])
def test_an_empty_batch_gives_empty_logits_for_every_kind(attention):
    """No sequence (B = 0): empty logits and a state, no error (the linear and hybrid mixers
    failed in a reshape of their ops)."""
    m = _model(attention, **({"window": 4} if attention == "hybrid" else {}))
    ids = torch.zeros(0, 5, dtype=torch.long)
    with torch.no_grad():
        logits, state = m(ids, return_state=True)
        assert logits.shape == (0, 5, V)
        step, _ = m(ids[:, :1], state, return_state=True)
    assert step.shape == (0, 1, V)


# -------------------- token shift (short_conv)
# The language model's token shift (``short_conv=k``): a depthwise causal convolution of the
# embeddings, started at the identity, continued across calls through ``LMState.conv``.


SHIFT_TOL = dict(rtol=1e-4, atol=20 * torch.finfo(torch.float32).eps)


def _shifted(attention: str, k: int = 4, seed: int = 0) -> LinearTransformerLM:
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
    torch.testing.assert_close(y, want, **SHIFT_TOL)
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
    torch.testing.assert_close(shifted(ids), plain(ids), **SHIFT_TOL)


@pytest.mark.parametrize("attention", list(MIXERS))
@pytest.mark.parametrize("k", [1, 2, 4])
def test_token_by_token_equals_the_whole_sequence(attention, k):
    m = _shifted(attention, k)
    ids = torch.randint(0, 40, (2, 10))
    with torch.no_grad():
        whole = m(ids)
        logits, state = m(ids[:, :3], return_state=True)
        steps = [logits]
        for t in range(3, 10):
            logits, state = m(ids[:, t:t + 1], state, return_state=True)
            steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, 1), whole, **SHIFT_TOL)
    assert state.conv.shape == (2, k - 1, 16)


def test_state_round_trips_and_counts_the_shift():
    m = _shifted("gated_delta")
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
    m = _shifted("linear")
    m.train()
    m(torch.randint(0, 40, (2, 8))).sum().backward()
    assert m.shift.weight.grad is not None and m.shift.weight.grad[:, 1:].abs().sum() > 0


def test_bad_states_and_configurations_are_named():
    m = _shifted("linear")
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
    m = _shifted("linear")
    ids = torch.randint(0, 40, (2, 5))
    with torch.no_grad():
        _, state = m(ids, return_state=True)
    args = (ids, state, True) if with_state else (ids,)
    want = m(*args)
    got = torch.export.export(m, args).module()(*args)
    compiled = torch.compile(m, fullgraph=True, backend="aot_eager")(*args)
    for out in (got, compiled):
        if with_state:
            torch.testing.assert_close(out[0], want[0], **SHIFT_TOL)
            torch.testing.assert_close(out[1].conv, want[1].conv)
        else:
            torch.testing.assert_close(out, want, **SHIFT_TOL)


@pytest.mark.parametrize("attention", sorted(MIXERS))
def test_ids_made_in_inference_mode_train_like_any_ids(attention):
    """ids made under torch.inference_mode (a data pipeline run there) into a model being
    trained: the parameters' gradients of the same ids as a normal tensor (issue 51: the
    embedding's torch error "Inference tensors cannot be saved for backward")."""
    m = _model(attention, **({"window": 4} if attention == "hybrid" else {}))
    ids = _ids()
    with torch.inference_mode():
        made = ids.clone()
    grads = []
    for x in (made, ids):
        m.zero_grad(set_to_none=True)
        m(x).double().pow(2).mean().backward()
        grads.append([p.grad for p in m.parameters() if p.grad is not None])
    assert len(grads[0]) == len(grads[1]) > 0
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=16 * torch.finfo(a.dtype).eps, atol=1e-30)
