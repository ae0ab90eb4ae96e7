"""linattn.fla_models on checkpoints written by fla itself (flash-linear-attention 0.6.0).

Optional: runs where ``fla.models`` imports (fla, fla-core, einops and Triton installed: on a CPU
fla's package imports and builds its models, only their forward needs a GPU), else skips;
``.ci/extras.sh fla_models`` installs them into a temporary folder. For each family (and fla's
hybrid configs): fla's own classes build a tiny model with random weights and ``save_pretrained``
it; linattn loads the folder with no missing, unexpected or resized weights and the same config;
its forward is compared with the float64 references (``reference_ops``), with the same layers on
fla's own ``naive.py`` recurrences and with fla's own model code run on the CPU (its Triton pieces
swapped for torch ones), and its cached decode with its full forward.

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
                "triton: see .ci/extras.sh)", allow_module_level=True)

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


# ----------------------------------------------------------------------------- fla's own code
# fla's layers and models run on the CPU once their Triton pieces are swapped for torch ones
# (below) and their recurrences for linattn.fla's (tested against fla's naive.py by
# tests/test_fla_oracle.py): fla's own glue — projections, head layouts, gates, feature maps,
# norms' placement, residuals, rotary positions — against linattn.fla_models'.


def _rms(x, weight, bias, eps):
    y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.float()
    if bias is not None:
        y = y + bias.float()
    return y


def _rms_forward(self, x, residual=None, prenorm=False, residual_in_fp32=False):
    if residual is not None:
        x = x + residual
    y = _rms(x, self.weight, self.bias, self.eps).to(x.dtype)
    return (y, x) if prenorm else y


def _gated_forward(self, x, g, residual=None, prenorm=False, residual_in_fp32=False):
    act = torch.sigmoid(g.float()) if self.activation == "sigmoid" else \
        torch.nn.functional.silu(g.float())
    return (_rms(x, self.weight, self.bias, self.eps) * act).to(x.dtype)


def _conv(x, weight, bias=None, activation=None, **kwargs):
    """fla's causal_conv1d without a cache: x (B, T, D), weight (D, W)."""
    T, W = x.shape[1], weight.shape[-1]
    y = torch.nn.functional.conv1d(x.transpose(1, 2), weight[:, None], bias, padding=W - 1,
                                   groups=x.shape[-1])[..., :T].transpose(1, 2)
    return (torch.nn.functional.silu(y) if activation in ("silu", "swish") else y), None


def _short_conv_forward(self, x, residual=None, mask=None, cache=None,
                        output_final_state=False, cu_seqlens=None, **kwargs):
    assert cache is None and cu_seqlens is None and mask is None
    return _conv(x, self.weight[:, 0], self.bias, self.activation)


def _mlp_forward(self, x, **kwargs):
    return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


def _rotary_forward(self, q, k, seqlen_offset=0, cu_seqlens=None, max_seqlen=None, **kwargs):
    assert cu_seqlens is None and isinstance(seqlen_offset, int)
    pos = torch.arange(seqlen_offset, seqlen_offset + q.shape[1], dtype=torch.float32)
    inv = 1.0 / self.base ** (torch.arange(0, self.dim, 2, dtype=torch.float32) / self.dim)
    angles = pos[:, None] * inv
    cos = torch.cat([angles.cos()] * 2, -1)[:, None].to(q.dtype)
    sin = torch.cat([angles.sin()] * 2, -1)[:, None].to(q.dtype)

    def rotate(x):
        x1, x2 = x.chunk(2, -1)
        return x * cos + torch.cat([-x2, x1], -1) * sin
    return rotate(q), rotate(k)


def _flash_attn(q, k, v, causal=True, window_size=(-1, -1), **kwargs):
    T, S = q.shape[1], k.shape[1]
    i = torch.arange(S - T, S)[:, None]
    j = torch.arange(S)[None]
    mask = j <= i
    if window_size[0] >= 0:
        mask &= i - j <= window_size[0]
    G = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(G, 2), v.repeat_interleave(G, 2)
    o = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
    return o.transpose(1, 2)


@pytest.fixture
def fla_on_cpu(fla_classes):
    import fla.layers.attn as fla_attn
    import fla.layers.gated_deltanet
    import fla.layers.hgrn2
    import fla.modules as modules

    from linattn import fla as lf

    def rms_norm_linear(x, norm_weight, norm_bias, linear_weight, linear_bias, eps=1e-5,
                        **kwargs):
        return torch.nn.functional.linear(_rms(x, norm_weight, norm_bias, eps).to(x.dtype),
                                          linear_weight, linear_bias)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(modules.RMSNorm, "forward", _rms_forward)
        mp.setattr(modules.FusedRMSNormGated, "forward", _gated_forward)
        mp.setattr(modules.ShortConvolution, "forward", _short_conv_forward)
        mp.setattr(modules.GatedMLP, "forward", _mlp_forward)
        mp.setattr(modules.RotaryEmbedding, "forward", _rotary_forward)
        mp.setattr(fla.layers.gated_deltanet, "causal_conv1d", _conv)
        mp.setattr(fla.layers.hgrn2, "rms_norm_linear", rms_norm_linear)
        mp.setattr(fla.layers.hgrn2, "swish", torch.nn.functional.silu)
        mp.setattr(fla_attn, "flash_attn_func", _flash_attn)
        for layer in ("gla", "gated_deltanet", "delta_net", "kda", "multiscale_retention",
                      "linear_attn", "hgrn2"):
            module = importlib.import_module(f"fla.layers.{layer}")
            for name in dir(module):
                if name.startswith(("chunk_", "fused_", "parallel_")) and hasattr(lf, name):
                    mp.setattr(module, name, getattr(lf, name))
        yield


@pytest.mark.parametrize("case", sorted(CASES))
def test_fla_s_own_forward(case, saved, fla_classes, fla_on_cpu):
    model_type = CASES[case][0]
    theirs = fla_classes[model_type][1].from_pretrained(saved[case]).eval()
    ours, _ = load(case, saved[case])
    ids = torch.randint(3, 128, (2, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expect = theirs(ids, use_cache=False).logits
        got = ours(ids, use_cache=False).logits
    ERRORS.setdefault(case, {})["fla's own model code"] = rel(got, expect)
    assert rel(got, expect) < TOL32


def test_print_errors():
    for case, errors in sorted(ERRORS.items()):
        print(f"{case}: " + ", ".join(f"{k} {v:.1e}" for k, v in errors.items()))
