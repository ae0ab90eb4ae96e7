"""linattn.fla_models on checkpoints written by fla itself (flash-linear-attention 0.6.0).

Optional: runs where ``fla.models`` imports (fla, fla-core, einops and Triton installed: on a
CPU fla's package imports and builds its models, only their forward needs a GPU), else skips;
``.ci/fla_models.sh`` installs them into a temporary folder. For each family (and fla's hybrid
configs): fla's own classes build a tiny model with random weights and ``save_pretrained`` it;
linattn loads the folder with no missing, unexpected or resized weights and the same config;
its forward is compared with the float64 references (``reference_ops``) and with the same layers
on fla's own ``naive.py`` recurrences, and its cached decode with its full forward.

Registration: with fla imported, transformers' Auto classes give fla's classes (fla stays in
charge); ``linattn.fla_models.register(override=True)`` gives linattn's.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util

import pytest
import torch

transformers = pytest.importorskip("transformers", minversion="5.23")
if importlib.util.find_spec("fla") is None:
    pytest.skip("fla is not installed (flash-linear-attention==0.6.0 fla-core==0.6.0 einops "
                "triton: see .ci/fla_models.sh)", allow_module_level=True)

import linattn.fla_models as fm  # noqa: E402
from linattn.fla_models import MODELS, reference_ops  # noqa: E402
from linattn.fla_models._kernels import Reference, ops  # noqa: E402

pytestmark = pytest.mark.usefixtures("single_thread")

BASE = dict(hidden_size=64, vocab_size=128, num_hidden_layers=2)
HYBRID = dict(num_hidden_layers=3, attn={"layers": [1], "num_heads": 4, "num_kv_heads": 2,
                                         "window_size": 8, "qkv_bias": True})
CASES = {
    "gla": ("gla", dict(expand_k=0.5, num_heads=2, use_short_conv=True, num_kv_heads=1)),
    "gla-hybrid": ("gla", dict(expand_k=0.5, num_heads=2, **HYBRID)),
    "gated_deltanet": ("gated_deltanet", dict(head_dim=16, num_heads=2, num_v_heads=4,
                                              expand_v=1.0)),
    "gated_deltanet-hybrid": ("gated_deltanet", dict(head_dim=16, num_heads=2, expand_v=2.0,
                                                     **HYBRID)),
    "delta_net": ("delta_net", dict(num_heads=4, use_gate=True)),
    "kda": ("kda", dict(head_dim=16, num_heads=2, num_v_heads=4)),
    "retnet": ("retnet", dict(num_heads=2)),
    # tie_feature_map_qk=True: fla 0.6.0 cannot save_pretrained it (shared tensors)
    "linear_attn": ("linear_attn", dict(num_heads=4)),
    "hgrn2": ("hgrn2", dict(expand_ratio=16, use_short_conv=True)),
}
TOL32 = torch.finfo(torch.float32).eps * 512
#: the largest relative errors seen, printed at the end (``pytest -s``)
ERRORS: dict[str, dict[str, float]] = {}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


@pytest.fixture(scope="module")
def fla_classes():
    """transformers' Auto classes as fla's import left them (fla in charge); fla's softmax
    layer refuses to build without flash-attention, which building and saving never call."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:  # imported here, not at collection: fla takes the Auto classes over when imported
        import fla.layers.attn as fla_attn
        import fla.models  # noqa: F401
    except Exception as e:  # noqa: BLE001 - Triton missing, an old transformers, ...
        pytest.skip(f"fla's model classes do not import here ({type(e).__name__}: {e})")
    if fla_attn.flash_attn_func is None:
        fla_attn.flash_attn_func = fla_attn.flash_attn_varlen_func = lambda *a, **k: None
    classes = {}
    for model_type in MODELS:
        config_cls = type(AutoConfig.for_model(model_type))
        classes[model_type] = (config_cls, AutoModelForCausalLM._model_mapping[config_cls])
    yield classes
    for model_type, (config_cls, causal_cls) in classes.items():  # leave fla in charge
        AutoConfig.register(model_type, config_cls, exist_ok=True)
        AutoModelForCausalLM.register(config_cls, causal_cls, exist_ok=True)


@pytest.fixture(scope="module")
def saved(fla_classes, tmp_path_factory):
    """case -> the folder fla's model of the case was saved to."""
    folders = {}
    for case, (model_type, kwargs) in CASES.items():
        config_cls, causal_cls = fla_classes[model_type]
        torch.manual_seed(0)
        model = causal_cls(config_cls(**{**BASE, **kwargs}))
        with torch.no_grad():  # away from fla's neutral initial values
            for name, p in model.named_parameters():
                if name.endswith(("norm.weight", "bias", "lower_bounds")):
                    p.add_(0.3 * torch.randn_like(p))
                elif name.endswith("A_log"):
                    p.copy_(torch.empty_like(p).uniform_(-1, 1))
        folders[case] = tmp_path_factory.mktemp(case)
        model.save_pretrained(folders[case])
    return folders


def load(case: str, folder):
    model, info = MODELS[CASES[case][0]][2].from_pretrained(folder, output_loading_info=True)
    return model.eval(), info


def test_fla_s_classes_stay_in_charge(fla_classes):
    for model_type, (config_cls, causal_cls) in fla_classes.items():
        assert config_cls.__module__.startswith("fla."), (model_type, config_cls)
        assert causal_cls.__module__.startswith("fla.")
    assert fm.register() == []  # fla registered these model types: left alone


def test_override_puts_linattn_in_charge(fla_classes, saved):
    assert set(fm.register(override=True)) == set(MODELS)
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(saved["kda"])
        assert type(model) is MODELS["kda"][2]
    finally:
        for model_type, (config_cls, causal_cls) in fla_classes.items():
            transformers.AutoConfig.register(model_type, config_cls, exist_ok=True)
            transformers.AutoModelForCausalLM.register(config_cls, causal_cls, exist_ok=True)


@pytest.mark.parametrize("case", sorted(CASES))
def test_checkpoint_loads_with_every_weight(case, saved):
    model, info = load(case, saved[case])
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert not info["mismatched_keys"]
    ours = model.config.to_dict()
    theirs = transformers.AutoConfig.from_pretrained(saved[case]).to_dict()
    for key, value in theirs.items():
        if key in ("architectures", "transformers_version", "dtype"):
            continue
        assert ours.get(key) == value, (key, ours.get(key), value)
    from safetensors.torch import load_file

    weights = load_file(str(saved[case] / "model.safetensors"))
    state = model.state_dict()
    for name, tensor in weights.items():
        assert torch.equal(state[name], tensor), name


class FlaNaive(Reference):
    """The layers' recurrences on fla's own naive.py functions (float32, token by token)."""

    def __init__(self, naive) -> None:
        self.naive = naive

    def gla(self, q, k, v, *, g=None, gk=None, scale=None, initial_state=None,
            cu_seqlens=None):
        if gk is not None:
            return self.naive("gla").naive_recurrent_gla(q, k, v, gk, initial_state=initial_state,
                                                         output_final_state=True)
        if g is None:
            g = torch.zeros(q.shape[:3], dtype=torch.float32)
        return self.naive("simple_gla").naive_recurrent_simple_gla(
            q, k, v, g, scale=scale, initial_state=initial_state, output_final_state=True)

    def delta(self, q, k, v, beta, *, g=None, gk=None, l2norm, initial_state=None,
              cu_seqlens=None):
        if l2norm:  # fla's in-kernel normalisation
            q, k = (x / (x.float().pow(2).sum(-1, keepdim=True) + 1e-6).sqrt() for x in (q, k))
        if gk is not None:
            return self.naive("kda").naive_recurrent_kda(q, k, v, gk, beta,
                                                         initial_state=initial_state,
                                                         output_final_state=True)
        G = v.shape[2] // q.shape[2]
        q, k = q.repeat_interleave(G, dim=2), k.repeat_interleave(G, dim=2)
        if g is not None:
            return self.naive("gated_delta_rule").naive_recurrent_gated_delta_rule(
                q, k, v, beta, g, initial_state=initial_state, output_final_state=True)
        o, S = self.naive("delta_rule").delta_rule_recurrence(
            *(x.transpose(1, 2) for x in (q, k, v, beta)), initial_state=initial_state)
        return o.transpose(1, 2), S

    def linear(self, q, k, v, *, normalize, initial_state=None, cu_seqlens=None):
        return self.naive("linear_attn").naive_recurrent_linear_attn(
            q, k, v, initial_state=initial_state, output_final_state=True, normalize=normalize)


@pytest.fixture(scope="module")
def naive():
    cache = {}

    def load_naive(name: str):
        if name not in cache:
            cache[name] = importlib.import_module(f"fla.ops.{name}.naive")
        return cache[name]
    return load_naive


@pytest.mark.parametrize("case", sorted(CASES))
def test_forward_against_references(case, saved, naive):
    model, _ = load(case, saved[case])
    ids = torch.randint(3, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model(ids, use_cache=False).logits
        ref = copy.deepcopy(model).double()
        with reference_ops():
            expect = ref(ids, use_cache=False).logits
        previous, ops.impl = ops.impl, FlaNaive(naive)
        try:
            fla_naive = model(ids, use_cache=False).logits
        finally:
            ops.impl = previous
        out = model(ids[:, :9], use_cache=True)
        cache, steps = out.past_key_values, [out.logits]
        for t in range(9, 16):
            out = model(ids[:, t:t + 1], past_key_values=cache)
            steps.append(out.logits)
    ERRORS[case] = {"float64 reference": rel(logits, expect),
                    "fla naive.py": rel(logits, fla_naive),
                    "cached decode": rel(torch.cat(steps, 1), logits)}
    assert all(e < TOL32 for e in ERRORS[case].values()), ERRORS[case]


def test_print_errors():
    for case, errors in sorted(ERRORS.items()):
        print(f"{case}: " + ", ".join(f"{k} {v:.1e}" for k, v in errors.items()))
