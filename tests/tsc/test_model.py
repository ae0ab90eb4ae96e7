"""FordATransformer: the reference size, padding to whole patches, variants; metrics."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from linattn.nn import MultiheadLinearAttention
from linattn.tsc import FordATransformer, ModelConfig
from linattn.tsc.metrics import confusion_matrix, macro_f1, roc_auc


def test_reference_recipe_size_and_structure():
    m = FordATransformer()
    n = sum(p.numel() for p in m.parameters())
    assert 110_000 <= n <= 130_000  # "about 120k parameters"
    attn = [mod for mod in m.modules() if isinstance(mod, MultiheadLinearAttention)]
    assert len(attn) == 3
    assert all(a.num_heads == 4 and a.head_dim == 16 and a.max_len == 50 for a in attn)
    # the only positional parameters are the relative vectors r_{j-i} inside attention
    pos = [k for k, _ in m.named_parameters() if "rel" in k or "pos" in k]
    assert pos == [f"blocks.{i}.attn.rel" for i in range(3)]
    out = m(torch.randn(5, 500))
    assert out.shape == (5, 2)
    assert m.relative_kernels().shape == (3, 4, 99)


@pytest.mark.parametrize("kw", [dict(), dict(stem="conv"), dict(spectral=True),
                                dict(stem="inception", stem_channels=8), dict(window=8),
                                dict(stem="inception", stem_channels=8, window=9),
                                dict(spectral=True, spectral_window=13)])
def test_padding_to_whole_patches(kw):
    torch.manual_seed(0)
    m = FordATransformer(ModelConfig(length=23, n_classes=3, patch=5, d_model=8, depth=1,
                                     heads=2, head_dim=4, mlp_dim=8, **kw)).eval()
    assert m.config.tokens == 5
    x = torch.randn(4, 23)
    padded = torch.cat([x, torch.zeros(4, 2)], 1)
    torch.testing.assert_close(m(x), m(padded))
    with pytest.raises(ValueError, match="exceeds"):
        m(torch.randn(2, 26))


def test_overlapping_window_sees_the_neighbouring_patches():
    torch.manual_seed(0)
    m = FordATransformer(ModelConfig(length=20, patch=5, d_model=8, depth=1, heads=2,
                                     head_dim=4, mlp_dim=8, window=9)).eval()
    x = torch.zeros(1, 20)
    # token t sees samples [5t - 2, 5t + 7): sample 11 is in the windows of tokens 1 and 2
    x[0, 11] = 1.0
    base = m.embed(torch.zeros(9))
    h = m.tokens(x)[0]
    changed = [t for t in range(4) if not torch.allclose(h[t], base)]
    assert changed == [1, 2]
    spec = FordATransformer(ModelConfig(length=20, patch=5, spectral=True, spectral_window=12))
    assert spec.tokens(torch.randn(2, 20)).shape == (2, 4, 64)
    assert spec.spectral.out_features == 7 and spec.embed.in_features == 5 + 7
    # window = patch is the disjoint-patch embedding
    assert FordATransformer(ModelConfig(window=10)).embed.in_features == 10


def test_config_validation():
    with pytest.raises(ValueError, match="stem"):
        ModelConfig(stem="lstm").validate()
    with pytest.raises(ValueError, match="window"):
        ModelConfig(patch=10, window=6).validate()
    with pytest.raises(ValueError, match="spectral_window"):
        ModelConfig(patch=10, spectral_window=4).validate()
    with pytest.raises(ValueError, match="divisible by 4"):
        ModelConfig(stem="inception", stem_channels=6).validate()
    with pytest.raises(ValueError, match="unknown keys"):
        ModelConfig.from_dict({"d_model": 8, "colour": 1})


def test_metrics_match_sklearn():
    sk = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 200)
    pred = np.where(rng.random(200) < 0.7, y, rng.integers(0, 3, 200))
    assert macro_f1(y, pred, 3) == pytest.approx(sk.f1_score(y, pred, average="macro"))
    np.testing.assert_array_equal(confusion_matrix(y, pred, 3), sk.confusion_matrix(y, pred))
    proba = rng.dirichlet(np.ones(3), 200)
    proba[np.arange(200), y] += 0.3
    proba = np.round(proba / proba.sum(1, keepdims=True), 2)  # with ties
    proba /= proba.sum(1, keepdims=True)
    assert roc_auc(y, proba) == pytest.approx(sk.roc_auc_score(y, proba, multi_class="ovr"))
    yb = (y > 0).astype(int)
    assert roc_auc(yb, proba[:, :2]) == pytest.approx(sk.roc_auc_score(yb, proba[:, 1]))
