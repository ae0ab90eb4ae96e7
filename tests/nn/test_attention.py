"""MultiheadLinearAttention: shapes, parameter count, relative vectors, padding, causality."""

from __future__ import annotations

import pytest
import torch

import linattn
from linattn.feature_maps import ReluPlusOne
from linattn.nn import MultiheadLinearAttention


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


def test_feature_map_instance_is_a_submodule():
    fmap = ReluPlusOne()
    m = MultiheadLinearAttention(8, 2, feature_map=fmap)
    assert m.feature_map is fmap and any(mod is fmap for mod in m.modules())


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
