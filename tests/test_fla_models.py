"""linattn.fla_models: fla's model classes on linattn's kernels, per family.

Optional: runs where transformers is installed (the ``hf`` extra), else skips. Every model is a
tiny random one built from linattn's copies of fla's config classes; each is compared with the
same weights in float64 on linattn's sequential references (``reference_ops``): the full
forward, a cached decode (prefill, then token by token), greedy generation with and without
the cache, a left-padded batch, bfloat16 weights. ``tests/test_fla_models_files.py`` does the
same on checkpoints written by fla itself.
"""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers", minversion="5.23")

import linattn.fla_models as fm  # noqa: E402
from linattn.fla_models import MODELS, reference_ops  # noqa: E402

pytestmark = pytest.mark.usefixtures("single_thread")

BASE = dict(hidden_size=64, vocab_size=128, num_hidden_layers=2)
HYBRID = dict(num_hidden_layers=3, attn={"layers": [1], "num_heads": 4, "num_kv_heads": 2,
                                         "window_size": 8, "qkv_bias": True})

#: case -> (model_type, tiny configuration): every family, some with fla's options
CASES = {
    "gla": ("gla", dict(expand_k=0.5, num_heads=2, use_short_conv=True)),
    "gla-gqa-hybrid": ("gla", dict(expand_k=0.5, num_heads=2, num_kv_heads=1, **HYBRID)),
    "gla-unfused-gate": ("gla", dict(expand_k=0.5, num_heads=2, fuse_norm=False,
                                     clamp_min=-3.0, feature_map="relu")),
    "gated_deltanet": ("gated_deltanet", dict(head_dim=16, num_heads=2, num_v_heads=4,
                                              expand_v=1.0)),
    "gated_deltanet-hybrid": ("gated_deltanet", dict(head_dim=16, num_heads=2, expand_v=2.0,
                                                     allow_neg_eigval=True, **HYBRID)),
    "delta_net": ("delta_net", dict(num_heads=4)),
    "delta_net-gate-sum": ("delta_net", dict(num_heads=4, use_gate=True, qk_norm="sum",
                                             qk_activation="relu")),
    "kda": ("kda", dict(head_dim=16, num_heads=2, num_v_heads=4)),
    "kda-safe-gate": ("kda", dict(head_dim=16, num_heads=2, safe_gate=True, lower_bound=-5.0)),
    "retnet": ("retnet", dict(num_heads=2)),
    "linear_attn": ("linear_attn", dict(num_heads=4)),
    "linear_attn-hedgehog-norm": ("linear_attn", dict(num_heads=4, feature_map="hedgehog",
                                                      tie_feature_map_qk=True,
                                                      norm_feature_map=True)),
    "hgrn2": ("hgrn2", dict(expand_ratio=16, use_short_conv=True)),
}

# float32 logits against the float64 forward, relative to the largest logit: float32's epsilon
# times a margin for a few layers' accumulations (measured: below 1e-6)
TOL32 = torch.finfo(torch.float32).eps * 512
TOLBF16 = torch.finfo(torch.bfloat16).eps * 8


def build(case: str, seed: int = 0):
    """The case's model with random weights: fla's initialisation perturbed (norm weights,
    biases and decays away from their neutral starting values, so that loading any of them
    in the wrong place would show)."""
    model_type, kwargs = CASES[case]
    config_cls, _, causal_cls = MODELS[model_type]
    torch.manual_seed(seed)
    model = causal_cls(config_cls(**{**BASE, **kwargs})).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", "bias", "lower_bounds")):
                p.add_(0.3 * torch.randn_like(p))
            elif name.endswith("A_log"):
                p.copy_(torch.empty_like(p).uniform_(-1, 1))
    return model


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


def reference_logits(model, ids: torch.Tensor, **kwargs) -> torch.Tensor:
    ref = copy.deepcopy(model).double()
    with torch.no_grad(), reference_ops():
        return ref(ids, use_cache=False, **kwargs).logits


@pytest.fixture(scope="module")
def ids():
    return torch.randint(3, 128, (2, 16), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("case", sorted(CASES))
def test_forward_matches_the_float64_reference(case, ids):
    model = build(case)
    with torch.no_grad():
        logits = model(ids, use_cache=False).logits
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()
    assert rel(logits, reference_logits(model, ids)) < TOL32


@pytest.mark.parametrize("case", sorted(CASES))
def test_cached_decode_matches_the_full_forward(case, ids):
    """Prefill 10 tokens, then one at a time: each step's logits are the full forward's."""
    model = build(case)
    with torch.no_grad():
        full = model(ids, use_cache=False).logits
        out = model(ids[:, :10], use_cache=True)
        cache, steps = out.past_key_values, [out.logits]
        for t in range(10, ids.shape[1]):
            out = model(ids[:, t:t + 1], past_key_values=cache, use_cache=True)
            steps.append(out.logits)
    assert isinstance(cache, fm.FLACache)
    assert cache.get_seq_length() == ids.shape[1]
    assert rel(torch.cat(steps, 1), full) < TOL32


@pytest.mark.parametrize("case", sorted(CASES))
def test_greedy_generation_with_and_without_the_cache(case, ids):
    model = build(case)
    prompt = ids[:1, :6]
    with torch.no_grad():
        greedy = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0)
        cached = model.generate(prompt, **greedy)
        plain = model.generate(prompt, use_cache=False, **greedy)
    assert cached.shape == (1, 14)
    assert torch.equal(cached, plain)


@pytest.mark.parametrize("case", ["gla-gqa-hybrid", "gated_deltanet", "retnet"])
def test_beam_search_reorders_the_cache(case, ids):
    """Beam search (the cache reordered and repeated per beam) as without the cache."""
    model = build(case)
    beams = dict(max_new_tokens=5, min_new_tokens=5, num_beams=3, do_sample=False,
                 pad_token_id=0)
    with torch.no_grad():
        cached = model.generate(ids[:, :6], **beams)
        plain = model.generate(ids[:, :6], use_cache=False, **beams)
    assert torch.equal(cached, plain)


@pytest.mark.parametrize("case", sorted(CASES))
def test_left_padded_batch_is_each_sequence_alone(case, ids):
    """As fla: padded tokens are dropped (the sequences packed), their outputs zero; the
    cached decode of the padded batch continues each sequence as if alone."""
    model = build(case)
    prompt = ids[:, :10].clone()
    mask = torch.ones_like(prompt)
    mask[1, :3] = 0
    with torch.no_grad():
        out = model(prompt, attention_mask=mask, use_cache=True)
        alone = model(prompt[1:, 3:], use_cache=True)
        assert rel(out.logits[1, 3:], alone.logits[0]) < TOL32
        assert rel(out.logits[0], model(prompt[:1], use_cache=False).logits[0]) < TOL32
        cache, cache1 = out.past_key_values, alone.past_key_values
        for t in range(10, 13):
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
            step = model(ids[:, t:t + 1], attention_mask=mask, past_key_values=cache)
            step1 = model(ids[1:, t:t + 1], past_key_values=cache1)
            assert rel(step.logits[1], step1.logits[0]) < TOL32


@pytest.mark.parametrize("case", sorted(CASES))
def test_bfloat16_weights(case, ids):
    model = build(case)
    with torch.no_grad():
        full = model(ids, use_cache=False).logits
        model = model.to(torch.bfloat16)
        logits = model(ids, use_cache=False).logits
        gen = model.generate(ids[:1, :6], max_new_tokens=4, min_new_tokens=4, do_sample=False,
                             pad_token_id=0)
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits).all()
    assert rel(logits, full) < TOLBF16
    assert gen.shape == (1, 10)


def test_cache_keeps_fla_layouts(ids):
    """fla's cache entries: v-first states where fla's layer passes state_v_first (GLA, Gated
    DeltaNet, KDA, HGRN2), (N, H, K, V) otherwise; convolution caches of the last W inputs;
    a sliding window's keys cut to the window."""
    model = build("gated_deltanet-hybrid")
    with torch.no_grad():
        cache = model(ids, use_cache=True).past_key_values
    layer0 = cache[0]
    S = layer0["recurrent_state"]
    assert S.shape == (2, 2, 32, 16)  # (N, HV, V, K): state_v_first
    q_conv = layer0["conv_state"][0]
    assert q_conv.shape == (2, 32, 4)  # (N, key_dim, conv_size)
    q_in = model.model.layers[0].attn.q_proj(
        model.model.layers[0].attn_norm(model.model.embeddings(ids)))
    assert torch.allclose(q_conv, q_in[:, -4:].transpose(1, 2))
    keys, values = cache[1]["attn_state"]
    assert keys.shape == (2, 8, 2 * 16) and values.shape == keys.shape
    model = build("delta_net")
    with torch.no_grad():
        cache = model(ids, use_cache=True).past_key_values
    assert cache[0]["recurrent_state"].shape == (2, 4, 16, 16)


def test_save_and_load_through_the_auto_classes(tmp_path, ids):
    model = build("kda")
    model.save_pretrained(tmp_path)
    assert transformers.AutoConfig.from_pretrained(tmp_path).model_type == "kda"
    loaded, info = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, output_loading_info=True)
    assert type(loaded) is MODELS["kda"][2]
    assert not info["missing_keys"] and not info["unexpected_keys"]
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_registration_leaves_known_model_types_alone():
    assert set(fm.registered()) == set(MODELS)
    assert fm.register() == []  # already registered: nothing to do
    with pytest.raises(TypeError, match="override"):
        fm.register(override=1)


def test_config_defaults_are_fla_s():
    c = MODELS["gated_deltanet"][0]()
    assert (c.hidden_size, c.num_heads, c.head_dim, c.expand_v, c.num_hidden_layers) == \
        (2048, 6, 256, 2.0, 21)
    assert c.to_dict()["model_type"] == "gated_deltanet" and c.pad_token_id is None
    assert MODELS["hgrn2"][0](hidden_size=256, expand_ratio=64).num_heads == 4
    gla = MODELS["gla"][0](hidden_size=1024, num_heads=4)
    assert gla.expand_k == 0.5 and gla.attn is None
    mlp = MODELS["gla"][2](MODELS["gla"][0](hidden_size=64, vocab_size=8,
                                           num_hidden_layers=1)).model.layers[0].mlp
    assert mlp.intermediate_size == 256  # 2/3 · 4 · 64 rounded up to 256


@pytest.mark.parametrize("bad, match", [
    ({"attn": {"layers": [5], "num_heads": 2}}, "attn"),
    ({"attn": {"num_heads": 2}}, "attn"),
    ({"attn": {"layers": [0], "num_heads": 2, "window_size": 0}}, "window_size"),
    ({"attnres_block_size": 2}, "attnres_block_size"),
])
def test_config_errors_name_the_field(bad, match):
    with pytest.raises(ValueError, match=match):
        MODELS["gla"][0](num_hidden_layers=2, **bad)


def test_user_errors(ids):
    model = build("gla")
    with pytest.raises(ValueError, match="safe_gate|lower_bound"):
        MODELS["kda"][0](safe_gate=True)
    with pytest.raises(ValueError, match="attn_mode"):
        MODELS["gla"][2](MODELS["gla"][0](hidden_size=64, num_hidden_layers=1,
                                          attn_mode="parallel"))
    with torch.no_grad():
        cache = model(ids[:, :4], use_cache=True).past_key_values
        mask = torch.ones(2, 5, dtype=torch.long)
        mask[1, -1] = 0
        with pytest.raises(ValueError, match="attention_mask"):
            model(ids[:, 4:5], attention_mask=mask, past_key_values=cache)
        with pytest.raises(ValueError, match="attention_mask"):
            model(ids, attention_mask=torch.ones(2, 1, 16, 16))
        with pytest.raises(ValueError, match="attention_mask"):
            model(ids, attention_mask=torch.full((2, 16), 2))
        with pytest.raises(TypeError, match="past_key_values"):
            model(ids, past_key_values=transformers.DynamicCache())
        with pytest.raises(ValueError, match="input_ids"):
            model()


def test_loss_is_fla_s_shifted_cross_entropy(ids):
    model = build("retnet")
    with torch.no_grad():
        out = model(ids, labels=ids, use_cache=False)
    expect = torch.nn.functional.cross_entropy(out.logits[:, :-1].flatten(0, 1),
                                               ids[:, 1:].flatten())
    assert torch.allclose(out.loss, expect, rtol=1e-5)
