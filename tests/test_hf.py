"""linattn.hf: transformers' linear-attention families on CPU through linattn, per family.

Optional: runs where transformers (>= 5.23) is installed, else skips (``.ci/extras.sh hf_models``
installs it beside the venv for CI). Every model is a tiny random one built from transformers'
own config class (no download). Each is compared with transformers' own torch path in the same
process: logits, cached greedy generation, a padded batch, bfloat16 weights.
"""

from __future__ import annotations

import functools

import pytest
import torch

transformers = pytest.importorskip("transformers", minversion="5.23")

import linattn.hf as lh  # noqa: E402
from linattn import fla  # noqa: E402

pytestmark = pytest.mark.usefixtures("single_thread")

COMMON = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=2, pad_token_id=0, bos_token_id=1,
              eos_token_id=2)
# grouped value heads (4 value heads on 2 key heads), as Qwen3.5 and Qwen3-Next ship them
GDN = dict(head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
           linear_value_head_dim=16)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
           shared_expert_intermediate_size=32)
# multi-head latent attention: as many key-value heads as query heads (as Kimi ships it)
MLA = dict(num_key_value_heads=4, num_local_experts=4, num_experts_per_tok=2,
           moe_intermediate_size=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
           v_head_dim=16)

#: family -> (model_type of the config class, the tiny configuration)
CONFIGS = {
    "qwen3_5": ("qwen3_5_text", {**COMMON, **GDN}),
    "qwen3_5_moe": ("qwen3_5_moe_text", {**COMMON, **GDN, **MOE}),
    "qwen3_next": ("qwen3_next", {**COMMON, **GDN, **MOE}),
    "olmo_hybrid": ("olmo_hybrid", {**COMMON, **{k: v for k, v in GDN.items()
                                                 if k != "head_dim"}}),
    "qwen4_exp": ("qwen4_exp_text", {**COMMON, **GDN, **MOE, "indexer_n_heads": 2,
                                     "indexer_kv_heads": 1, "indexer_head_dim": 16,
                                     "indexer_budget": 8, "indexer_compress_ratio": 4}),
    "kimi_linear": ("kimi_linear", {**COMMON, **MLA, "linear_head_dim": 16,
                                    "linear_num_heads": 4,
                                    "layer_types": ["linear_attention", "linear_attention",
                                                    "full_attention", "linear_attention"]}),
    "bailing_hybrid": ("bailing_hybrid", {**COMMON, **MLA, "head_dim": 16, "n_group": 1,
                                          "topk_group": 1, "first_k_dense_replace": 1,
                                          "layer_group_size": 2}),
    "lfm2": ("lfm2", {**COMMON, "layer_types": ["conv", "conv", "full_attention", "conv"]}),
}
FAMILIES = sorted(CONFIGS)


def test_every_family_has_a_test_configuration():
    assert set(CONFIGS) == set(lh.FAMILIES)


def build(family: str, dtype: torch.dtype = torch.float32, seed: int = 0):
    model_type, cfg = CONFIGS[family]
    config = transformers.AutoConfig.for_model(model_type, **cfg)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # random gates: decays that matter (init leaves many at 0 or 1)
        for name, p in model.named_parameters():
            if name.endswith(("A_log", "dt_bias")):
                p.normal_(0.0, 0.5)
    return model.to(dtype)


@pytest.fixture(autouse=True)
def transformers_path_first(monkeypatch):
    """Every test starts and ends on transformers' own path (undone before a test's own
    monkeypatches are)."""
    lh.revert_linattn()
    yield
    lh.revert_linattn()


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want.double()).abs().max() / want.double().abs().max()).item()


def ids_for(batch: int, T: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, 128, (batch, T), generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------- the routing


@pytest.mark.parametrize("family", FAMILIES)
def test_apply_replaces_every_part_and_revert_restores_it(family):
    module = __import__(lh.FAMILIES[family].module, fromlist=["_"])
    before = {name: getattr(module, name) for name in lh.FAMILIES[family].functions}
    norms = {name: getattr(module, name).forward for name in lh.FAMILIES[family].norms}
    done = lh.apply_linattn(family)
    assert len(done) == len(before) + len(norms)
    assert lh.patched(family)
    assert all(getattr(module, name) is not fn for name, fn in before.items())
    assert lh.apply_linattn(family) == done  # again: nothing wrapped twice
    assert all(getattr(module, name)._linattn_original is fn for name, fn in before.items())
    lh.revert_linattn(family)
    assert not lh.patched(family)
    assert all(getattr(module, name) is fn for name, fn in before.items())
    assert all(getattr(module, name).forward is fn for name, fn in norms.items())


def test_apply_by_model_and_errors():
    model = build("qwen3_5")
    assert lh.apply_linattn(model, conv=False, norm=False) == [
        "qwen3_5.torch_chunk_gated_delta_rule", "qwen3_5.torch_recurrent_gated_delta_rule"]
    with pytest.raises(ValueError, match=r"^model: linattn.hf has no patch for model_type "
                                         r"llama; it covers "):
        lh.apply_linattn(transformers.LlamaConfig())
    assert lh.apply_linattn_to_kimi_linear.__name__ == "apply_linattn_to_kimi_linear"


@pytest.mark.parametrize("family", ["qwen3_5", "kimi_linear"])
def test_fla_installed_is_never_reached_on_cpu(family, monkeypatch):
    """With fla installed, transformers' module-level functions *are* fla's Triton functions,
    which crash on a CPU ("0 active drivers"): once patched, CPU calls never reach them."""
    module = __import__(lh.FAMILIES[family].module, fromlist=["_"])
    ref = build(family)(ids_for(1, 9)).logits

    def triton_for(wrapped):
        @functools.wraps(wrapped)  # as transformers' hub wrapper holds fla's function
        def triton(*args, **kwargs):
            raise RuntimeError("0 active drivers ([]). There should only be one.")
        return triton

    for name in lh.FAMILIES[family].functions:
        monkeypatch.setattr(module, name, triton_for(getattr(module, name)))
    lh.apply_linattn(family)
    with torch.no_grad():
        got = build(family)(ids_for(1, 9)).logits
    assert relative_error(got, ref) < 1e-4


def test_export_and_other_devices_take_the_original(monkeypatch):
    """Calls traced by torch.export (or torch.compile), and tensors off the CPU, go to what was
    there before the patch."""
    module = __import__(lh.FAMILIES["qwen3_5"].module, fromlist=["_"])
    seen = []

    def original(query, key, value, g, beta, **kwargs):
        seen.append(query.device.type)
        return "original"

    monkeypatch.setattr(module, "torch_chunk_gated_delta_rule", original)
    lh.apply_linattn("qwen3_5", conv=False, norm=False)
    fn = module.torch_chunk_gated_delta_rule
    meta = torch.empty(1, 2, 1, 4, device="meta")
    assert fn(meta, meta, meta, g=meta[..., 0], beta=meta[..., 0]) == "original"
    monkeypatch.setattr(torch.compiler, "is_exporting", lambda: True)
    x = torch.randn(1, 2, 1, 4)
    assert fn(x, x, x, g=-x[..., 0].abs(), beta=x[..., 0].sigmoid()) == "original"
    assert seen == ["meta", "cpu"]


# ----------------------------------------------------------------------------- per family


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_transformers(family):
    """float32 logits within 1e-4 (relative to the largest) of transformers' torch path, for a
    prefill and for cached decoding after it."""
    model = build(family)
    ids = ids_for(2, 33)
    with torch.no_grad():
        want = model(ids).logits
        lh.apply_linattn(model)
        got = model(ids).logits
        assert relative_error(got, want) < 1e-4
        # cached: a prefill of 20 tokens, then one token at a time
        out = model(ids[:, :20], use_cache=True)
        steps, cache = [out.logits], out.past_key_values
        for t in range(20, 33):
            out = model(ids[:, t:t + 1], past_key_values=cache, use_cache=True)
            steps.append(out.logits)
            cache = out.past_key_values
    assert relative_error(torch.cat(steps, 1), want) < 1e-4


def greedy(model, ids, attention_mask=None, n=64):
    with torch.no_grad():
        out = model.generate(ids, attention_mask=attention_mask, max_new_tokens=n,
                             do_sample=False, min_new_tokens=n, output_scores=True,
                             return_dict_in_generate=True, pad_token_id=0)
    return out.sequences, torch.stack(out.scores, 1)


def assert_same_tokens(got, want, want_scores, scale):
    """The same greedy tokens, or a first difference where transformers' own top two scores
    were a tie within float32 rounding of the logits (random tiny models have near-ties;
    after a tie the two continuations rightly differ)."""
    same = (got == want).all(0)
    if bool(same.all()):
        return
    p = int((~same).nonzero()[0])
    steps = want_scores.shape[1]
    t = p - (want.shape[1] - steps)  # the generation step of that position
    scores = want_scores[:, t]
    gap = (scores.gather(1, want[:, p:p + 1]) - scores.gather(1, got[:, p:p + 1])).abs().max()
    assert gap <= 1e-5 * scale, f"tokens differ at {p} with a score gap of {gap.item():.3g}"


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_generation_with_the_cache(family):
    """64 greedy tokens with the cache: the same tokens as transformers' own path."""
    model = build(family)
    ids = ids_for(1, 12)
    want, scores = greedy(model, ids)
    lh.apply_linattn(model)
    got, got_scores = greedy(model, ids)
    assert got.shape == want.shape == (1, 12 + 64)
    assert_same_tokens(got, want, scores, scores.abs().max())


@pytest.mark.parametrize("family", FAMILIES)
def test_padded_batch(family):
    """A left-padded batch of two prompts of different lengths: logits and 16 greedy tokens as
    transformers' own path computes them on the same batch."""
    model = build(family)
    ids = ids_for(2, 15)
    mask = torch.ones_like(ids)
    ids[1, :6], mask[1, :6] = 0, 0
    with torch.no_grad():
        want = model(ids, attention_mask=mask).logits
    want_tokens, scores = greedy(model, ids, mask, n=16)
    lh.apply_linattn(model)
    with torch.no_grad():
        got = model(ids, attention_mask=mask).logits
    real = mask.bool()
    assert relative_error(got[real], want[real]) < 1e-4
    got_tokens, _ = greedy(model, ids, mask, n=16)
    assert_same_tokens(got_tokens, want_tokens, scores, scores.abs().max())


@pytest.mark.parametrize("family", FAMILIES)
def test_bfloat16_weights(family):
    """bfloat16 weights: linattn's logits are as close to the float32 model's as transformers'
    own bfloat16 path is (within a factor 2 of its error, plus a bfloat16 rounding)."""
    ids = ids_for(2, 24)
    with torch.no_grad():
        exact = build(family)(ids).logits
        model = build(family, torch.bfloat16)
        theirs = model(ids).logits.float()
        lh.apply_linattn(model)
        ours = model(ids).logits
    assert ours.dtype == torch.bfloat16 and torch.isfinite(ours).all()
    eps = torch.finfo(torch.bfloat16).eps
    assert relative_error(ours, exact) <= 2 * relative_error(theirs, exact) + eps


def test_the_fla_front_door_takes_transformers_keywords():
    """transformers passes its own keyword arguments through (use_cache, position_ids, ...):
    linattn.fla ignores them, as fla does."""
    q = k = torch.nn.functional.normalize(torch.randn(1, 5, 2, 8), dim=-1)
    v, g, beta = torch.randn(1, 5, 2, 16), -torch.rand(1, 5, 2), torch.rand(1, 5, 2)
    a = fla.chunk_gated_delta_rule(q, k, v, g, beta, use_cache=True, position_ids=None,
                                   output_attentions=False)
    torch.testing.assert_close(a[0], fla.chunk_gated_delta_rule(q, k, v, g, beta)[0],
                               rtol=0, atol=0)


def test_a_first_argument_by_keyword_is_routed_too(monkeypatch):
    module = __import__(lh.FAMILIES["qwen3_5"].module, fromlist=["_"])
    calls = []
    real = fla.causal_conv1d_fn

    def spy(*args, **kwargs):
        calls.append(kwargs["x"].device.type)
        return real(*args, **kwargs)

    monkeypatch.setattr(fla, "causal_conv1d_fn", spy)
    lh.apply_linattn("qwen3_5")
    x = torch.randn(1, 8, 5)
    w = torch.randn(8, 4)
    got = module.causal_conv1d_fn(hidden_states=x, weight=w, activation="silu")
    want = module.causal_conv1d_fn._linattn_original(x, w, None, "silu")
    torch.testing.assert_close(got, want)
    assert calls == ["cpu"]
