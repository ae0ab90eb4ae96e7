"""MultiheadLinearAttention: shapes, parameter count, relative vectors, padding, causality."""

from __future__ import annotations

import pytest
import torch

import linattn
from linattn.feature_maps import FavorPlus, FeatureMap, Hedgehog, ReluPlusOne
from linattn.nn import MultiheadLinearAttention
from linattn.nn.lm import DecayedMultiheadAttention


def test_parameter_count_matches_formula():
    m = MultiheadLinearAttention(32, 4, head_dim=8, max_len=50)
    assert sum(p.numel() for p in m.parameters()) == 4 * 32 * 4 * 8 + (2 * 50 - 1) * 4 * 8 == 7264
    plain = MultiheadLinearAttention(32, 4)
    assert sum(p.numel() for p in plain.parameters()) == 4 * 32 * 32
    biased = MultiheadLinearAttention(32, 4, bias=True)
    assert sum(p.numel() for p in biased.parameters()) == 4 * 32 * 32 + 3 * 32 + 32


@pytest.mark.parametrize("max_len", [None, 16])
@pytest.mark.parametrize("is_causal", [False, True])
def test_shapes_and_gradients(max_len, is_causal):
    torch.manual_seed(0)
    m = MultiheadLinearAttention(24, 3, head_dim=5, max_len=max_len, is_causal=is_causal)
    x = torch.randn(2, 11, 24, requires_grad=True)
    y = m(x)
    assert y.shape == (2, 11, 24)
    y.square().sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    if max_len is not None:
        assert m.rel.grad is not None
        # only the central 2T - 1 vectors were used
        used = m.rel.grad.abs().sum((0, 2)) > 0
        assert not used[: 16 - 11].any() and not used[16 + 11 - 1 :].any()


def test_matches_the_op_with_the_central_relative_vectors():
    torch.manual_seed(1)
    m = MultiheadLinearAttention(16, 2, max_len=10).double()
    x = torch.randn(3, 6, 16, dtype=torch.float64)
    B, T, H, d = 3, 6, 2, 8
    q, k, v = (p(x).view(B, T, H, d).transpose(1, 2) for p in (m.q_proj, m.k_proj, m.v_proj))
    r = m.rel[:, 10 - 6 : 10 + 6 - 1]
    o = linattn.reference.relative_linear_attention(q, k, v, r)
    want = m.out_proj(o.transpose(1, 2).reshape(B, T, H * d))
    torch.testing.assert_close(m(x), want, rtol=1e-10, atol=1e-10)


def test_init_score_terms_have_comparable_variance():
    """τ² = σ²: at init the content score φ(q)·φ(k) and the position score φ(q)·φ(r) vary
    about equally, so neither dominates."""
    torch.manual_seed(0)
    ratios = []
    for _ in range(5):
        m = MultiheadLinearAttention(64, 4, max_len=50)
        x = torch.nn.functional.layer_norm(torch.randn(8, 50, 64), (64,))
        with torch.no_grad():
            heads = (p(x).view(8, 50, 4, 16).transpose(1, 2) for p in (m.q_proj, m.k_proj))
            fq, fk = (m.feature_map(t) for t in heads)
            fr = m.feature_map(m.relative_vectors(50))  # (H, 99, d)
            content = (fq @ fk.transpose(-1, -2)).var()
            position = (fq @ fr.transpose(-1, -2)).var()
        ratios.append((content / position).item())
    assert 0.5 < sum(ratios) / len(ratios) < 2.0, ratios
    assert abs(m.rel.std().item() - m.key_std()) < 0.05 * m.key_std()


@pytest.mark.parametrize("max_len", [None, 12])
def test_padding_hides_padded_tokens(max_len):
    torch.manual_seed(2)
    m = MultiheadLinearAttention(16, 2, max_len=max_len).double()
    x = torch.randn(2, 12, 16, dtype=torch.float64)
    mask = torch.zeros(2, 12, dtype=torch.bool)
    mask[0, 8:] = True
    y = m(x, key_padding_mask=mask)
    x2 = x.clone()
    x2[0, 8:] = 1e3 * torch.randn(4, 16, dtype=torch.float64)
    y2 = m(x2, key_padding_mask=mask)
    torch.testing.assert_close(y2[0, :8], y[0, :8], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(y2[1], y[1], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("max_len", [None, 12])
def test_causal_module_ignores_the_future(max_len):
    torch.manual_seed(3)
    m = MultiheadLinearAttention(16, 2, is_causal=True, max_len=max_len).double()
    x = torch.randn(1, 12, 16, dtype=torch.float64)
    x2 = x.clone()
    x2[0, 7:] = torch.randn(5, 16, dtype=torch.float64)
    torch.testing.assert_close(m(x2)[0, :7], m(x)[0, :7], rtol=1e-10, atol=1e-10)


def test_feature_map_instance_is_copied_into_a_submodule():
    """An instance is a template: the module owns a copy (a submodule), so a second module
    built from the same instance shares nothing with the first."""
    fmap = Hedgehog(4)
    with torch.no_grad():
        fmap.proj.weight.add_(0.1)  # as if distilled: the copies start from these values
    a = MultiheadLinearAttention(8, 2, feature_map=fmap)
    b = MultiheadLinearAttention(8, 2, feature_map=fmap)
    assert isinstance(a.feature_map, Hedgehog) and any(mod is a.feature_map for mod in a.modules())
    assert a.feature_map is not fmap and b.feature_map is not fmap
    assert a.feature_map is not b.feature_map
    pa, pb = a.feature_map.proj.weight, b.feature_map.proj.weight
    assert len({pa.data_ptr(), pb.data_ptr(), fmap.proj.weight.data_ptr()}) == 3
    torch.testing.assert_close(pa, fmap.proj.weight, rtol=0, atol=0)
    a(torch.randn(1, 5, 8)).sum().backward()
    torch.optim.SGD(a.parameters(), lr=1.0).step()
    assert not torch.equal(pa, fmap.proj.weight)
    torch.testing.assert_close(pb, fmap.proj.weight, rtol=0, atol=0)


def test_random_feature_map_instance_gets_one_draw_per_module():
    fmap = FavorPlus(4, 16)
    a, b = (MultiheadLinearAttention(8, 2, feature_map=fmap) for _ in range(2))
    assert isinstance(a.feature_map, FavorPlus) and a.feature_map.config() == fmap.config()
    assert not torch.equal(a.feature_map.W, b.feature_map.W)
    assert not torch.equal(a.feature_map.W, fmap.W)
    assert "feature_map.W" in a.state_dict()


class _Scaled(FeatureMap):
    """A user's map whose config() cannot rebuild it (a required argument, no config)."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(scale))

    def num_features(self, head_dim: int) -> int:
        return head_dim

    def forward_features(self, x):
        return torch.nn.functional.elu(x * self.scale) + 1.0


def test_feature_map_template_without_config_is_deep_copied():
    template = _Scaled(2.0)
    a, b = (MultiheadLinearAttention(8, 2, feature_map=template) for _ in range(2))
    assert isinstance(a.feature_map, _Scaled) and a.feature_map is not template
    assert a.feature_map.scale.data_ptr() != b.feature_map.scale.data_ptr()
    assert a.feature_map.scale.item() == 2.0


def test_feature_map_template_follows_its_dtype():
    a = MultiheadLinearAttention(8, 2, feature_map=Hedgehog(4).double())
    assert a.feature_map.proj.weight.dtype == torch.float64


def test_feature_map_factory_is_called_once_per_module():
    seeds = iter(range(10))
    a, b = (MultiheadLinearAttention(8, 2, feature_map=lambda: FavorPlus(4, 16, seed=next(seeds)))
            for _ in range(2))
    torch.testing.assert_close(a.feature_map.W, FavorPlus(4, 16, seed=0).W, rtol=0, atol=0)
    torch.testing.assert_close(b.feature_map.W, FavorPlus(4, 16, seed=1).W, rtol=0, atol=0)
    assert isinstance(MultiheadLinearAttention(8, 2, feature_map=ReluPlusOne).feature_map,
                      ReluPlusOne)
    with pytest.raises(TypeError, match="feature_map: the factory returned int"):
        MultiheadLinearAttention(8, 2, feature_map=lambda: 3)
    with pytest.raises(TypeError, match="feature_map"):
        MultiheadLinearAttention(8, 2, feature_map=3)


@pytest.mark.parametrize("cls", [MultiheadLinearAttention, DecayedMultiheadAttention])
def test_embed_dim_is_a_deprecated_alias_of_d_model(cls):
    torch.manual_seed(0)
    want = cls(d_model=8, num_heads=2)
    torch.manual_seed(0)
    with pytest.warns(DeprecationWarning, match="embed_dim"):
        old = cls(embed_dim=8, num_heads=2)
    assert old.d_model == 8
    torch.testing.assert_close(old.state_dict(), want.state_dict(), rtol=0, atol=0)
    with pytest.warns(DeprecationWarning), pytest.raises(TypeError, match="embed_dim"):
        MultiheadLinearAttention(8, 2, embed_dim=16)
    with pytest.warns(DeprecationWarning), pytest.raises(TypeError, match="different values"):
        MultiheadLinearAttention(d_model=8, num_heads=2, embed_dim=16)
    with pytest.warns(DeprecationWarning):  # the same value twice is only redundant
        assert MultiheadLinearAttention(8, 2, embed_dim=8).d_model == 8


def test_errors():
    with pytest.raises(ValueError, match="num_heads"):
        MultiheadLinearAttention(10, 3)
    with pytest.raises(ValueError, match="max_len"):
        MultiheadLinearAttention(8, 2, max_len=0)
    m = MultiheadLinearAttention(8, 2, max_len=4)
    with pytest.raises(ValueError, match="max_len=4"):
        m(torch.randn(1, 5, 8))
    with pytest.raises(ValueError, match="x: expected shape"):
        m(torch.randn(1, 3, 7))
    with pytest.raises(ValueError, match="feature_map"):
        MultiheadLinearAttention(8, 2, feature_map="nope")
    with pytest.raises(ValueError, match="relative_vectors"):
        MultiheadLinearAttention(8, 2).relative_vectors(3)


@pytest.mark.parametrize("is_causal", [False, True])
def test_flow_attention_is_selectable_and_matches_the_op(is_causal):
    torch.manual_seed(4)
    m = MultiheadLinearAttention(16, 2, attention="flow", feature_map="sigmoid",
                                 is_causal=is_causal).double()
    assert isinstance(m.feature_map, linattn.ops.flowformer.SigmoidFeatures)
    x = torch.randn(3, 7, 16, dtype=torch.float64, requires_grad=True)
    B, T, H, d = 3, 7, 2, 8
    q, k, v = (p(x).view(B, T, H, d).transpose(1, 2) for p in (m.q_proj, m.k_proj, m.v_proj))
    o = linattn.reference.flowformer_attention(q, k, v, is_causal=is_causal)
    want = m.out_proj(o.transpose(1, 2).reshape(B, T, H * d))
    y = m(x)
    torch.testing.assert_close(y, want, rtol=1e-10, atol=1e-10)
    y.square().sum().backward()
    assert torch.isfinite(x.grad).all()
    assert "attention='flow'" in repr(m)
    assert "attention" not in repr(MultiheadLinearAttention(16, 2))


@pytest.mark.parametrize("is_causal", [False, True])
def test_flow_attention_padding_hides_padded_tokens(is_causal):
    """Padded tokens are neither sources nor sinks: the real rows equal the unpadded run."""
    torch.manual_seed(5)
    m = MultiheadLinearAttention(16, 2, attention="flow", is_causal=is_causal).double()
    x = torch.randn(2, 12, 16, dtype=torch.float64)
    mask = torch.zeros(2, 12, dtype=torch.bool)
    mask[0, 8:] = True
    x2 = x.clone()
    x2[0, 8:] = 1e3 * torch.randn(4, 16, dtype=torch.float64)
    y2 = m(x2, key_padding_mask=mask)
    torch.testing.assert_close(y2[0, :8], m(x[:1, :8])[0], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(y2[1], m(x[1:])[0], rtol=1e-10, atol=1e-10)


def test_flow_attention_errors():
    with pytest.raises(ValueError, match="^attention: expected 'linear' or 'flow', got 'soft'"):
        MultiheadLinearAttention(8, 2, attention="soft")
    with pytest.raises(ValueError, match="^attention: 'flow' takes neither max_len"):
        MultiheadLinearAttention(8, 2, attention="flow", max_len=4)


@pytest.mark.parametrize("flag", ["yes", 1, None])
def test_is_causal_is_a_flag_checked_at_construction(flag):
    """Constructed fine and failed only at the first forward."""
    with pytest.raises(TypeError, match=r"^is_causal: expected a bool, got "):
        MultiheadLinearAttention(16, 2, is_causal=flag)


# issue 51, second probe: sizes and dropout were not checked at construction: num_heads=0 a
# ZeroDivisionError, d_model=-8 torch's RuntimeError, d_model=0, head_dim=0, dropout=nan and
# bias="no" constructed a module
@pytest.mark.parametrize("kwargs, match", [
    ({"d_model": 0}, "d_model"), ({"d_model": -8}, "d_model"), ({"d_model": 8.0}, "d_model"),
    ({"num_heads": 0}, "num_heads"), ({"num_heads": True}, "num_heads"),
    ({"head_dim": 0}, "head_dim"), ({"dropout": float("nan")}, "dropout"),
    ({"dropout": 2.0}, "dropout"), ({"bias": "no"}, "bias"), ({"max_len": 2.5}, "max_len"),
])
def test_bad_sizes_are_named_at_construction(kwargs, match):
    args = {"d_model": 8, "num_heads": 2, **kwargs}
    with pytest.raises((ValueError, TypeError), match=f"^{match}: "):
        MultiheadLinearAttention(**args)


@pytest.mark.parametrize("x, match", [
    (torch.randn(2, 7, 16, dtype=torch.float64), r"^x: expected torch\.float32 \(the module's "
                                                 r"parameters' dtype\), got torch\.float64$"),
    (torch.ones(2, 7, 16, dtype=torch.long), r"^x: expected torch\.float32 .*got torch\.int64$"),
    (torch.randn(2, 7, 16).to_sparse(), r"^x: expected a dense \(strided\) tensor"),
])
def test_input_of_another_dtype_or_layout_is_named(x, match):
    """Issue 51: F.linear's "expected m1 and m2 to have the same dtype" / a sparse reshape."""
    with pytest.raises(TypeError, match=match):
        MultiheadLinearAttention(16, 2)(x)


def test_autocast_inputs_of_another_dtype_still_run():
    m = MultiheadLinearAttention(16, 2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert m(torch.randn(2, 7, 16, dtype=torch.bfloat16)).shape == (2, 7, 16)


@pytest.mark.parametrize("module", [
    lambda: MultiheadLinearAttention(16, 2),
    lambda: MultiheadLinearAttention(16, 2, is_causal=True),
    lambda: MultiheadLinearAttention(16, 2, attention="flow"),
    lambda: DecayedMultiheadAttention(16, 2),
], ids=["linear", "causal", "flow", "decayed"])
def test_an_input_made_in_inference_mode_trains_like_any_input(module):
    """x made under torch.inference_mode into a module being trained: the parameters'
    gradients of the same x as a normal tensor (issue 51: the projections' torch error
    "Inference tensors cannot be saved for backward")."""
    torch.manual_seed(0)
    m = module()
    x = torch.randn(2, 7, 16)
    with torch.inference_mode():
        made = x.clone()
    grads = []
    for inp in (made, x):
        m.zero_grad(set_to_none=True)
        out = m(inp)
        (out[0] if isinstance(out, tuple) else out).double().pow(2).mean().backward()
        grads.append([p.grad for p in m.parameters() if p.grad is not None])
    assert len(grads[0]) == len(grads[1]) > 0
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=16 * torch.finfo(a.dtype).eps, atol=1e-30)
