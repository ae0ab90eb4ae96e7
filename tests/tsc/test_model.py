"""FordATransformer: the reference size, padding to whole patches, windows and spectra, config
validation, deprecated names and removed options; metrics."""

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


@pytest.mark.parametrize("kw", [dict(), dict(spectral=True), dict(window=8),
                                dict(window=9, spectral=True)])
def test_padding_to_whole_patches(kw):
    torch.manual_seed(0)
    m = FordATransformer(ModelConfig(length=23, n_classes=3, patch=5, d_model=8, num_layers=1,
                                     num_heads=2, head_dim=4, mlp_dim=8, **kw)).eval()
    assert m.config.tokens == 5
    x = torch.randn(4, 23)
    padded = torch.cat([x, torch.zeros(4, 2)], 1)
    torch.testing.assert_close(m(x), m(padded))
    with pytest.raises(ValueError, match="exceeds"):
        m(torch.randn(2, 26))


def test_overlapping_window_sees_the_neighbouring_patches():
    torch.manual_seed(0)
    m = FordATransformer(ModelConfig(length=20, patch=5, d_model=8, num_layers=1, num_heads=2,
                                     head_dim=4, mlp_dim=8, window=9)).eval()
    x = torch.zeros(1, 20)
    # token t sees samples [5t - 2, 5t + 7): sample 11 is in the windows of tokens 1 and 2
    x[0, 11] = 1.0
    base = m.embed(torch.zeros(9))
    h = m.tokens(x)[0]
    changed = [t for t in range(4) if not torch.allclose(h[t], base)]
    assert changed == [1, 2]
    # the spectrum of the 2·patch = 10 samples centred on each patch: 6 bins
    spec = FordATransformer(ModelConfig(length=20, patch=5, spectral=True))
    assert spec.tokens(torch.randn(2, 20)).shape == (2, 4, 64)
    assert spec.spectral.out_features == 6 and spec.embed.in_features == 5 + 6
    assert spec.config.embed_features == 11
    # window = patch is the disjoint-patch embedding
    assert FordATransformer(ModelConfig(window=10)).embed.in_features == 10


@pytest.mark.parametrize("kw, match", [
    (dict(patch=10, window=6), "window must be 0 or an integer >= patch"),
    (dict(window=-1), "window"),
    (dict(num_layers=0), "num_layers must be a positive integer"),
    (dict(num_layers=1.0), "num_layers must be an int, got 1.0"),
    (dict(num_heads=True), "num_heads must be an int, got True"),
    (dict(length=1e9), "length must be an int"),
    (dict(n_classes=1), "n_classes must be at least 2"),
    (dict(dropout=1.0), "dropout must be in"),
    (dict(dropout="0.1"), "dropout must be a float"),
    (dict(dropout=float("nan")), "dropout must be a float"),
    (dict(spectral=1), "spectral must be a bool"),
    (dict(feature_map="bogus"), "feature_map must be one of elu, polynomial, relu, taylor"),
    (dict(feature_map=3), "feature_map must be a str"),
])
def test_config_validation(kw, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig(**kw).validate()


def test_from_dict_checks_keys():
    with pytest.raises(ValueError, match="unknown keys"):
        ModelConfig.from_dict({"d_model": 8, "colour": 1})
    with pytest.raises(ValueError, match="saved: expected an object"):
        ModelConfig.from_dict([1, 2], "saved")
    with pytest.raises(ValueError, match="cfg: mlp_dim must be an int, got 2000000000.0"):
        ModelConfig.from_dict({"mlp_dim": 2e9}, "cfg")
    assert ModelConfig.from_dict({"num_layers": 2}) == ModelConfig(num_layers=2)


def test_deprecated_names_still_work():
    with pytest.warns(DeprecationWarning) as record:
        old = ModelConfig(depth=2, heads=2)
    assert old == ModelConfig(num_layers=2, num_heads=2)
    assert [str(w.message) for w in record] == [
        "ModelConfig: 'depth' is deprecated, use 'num_layers'",
        "ModelConfig: 'heads' is deprecated, use 'num_heads'"]
    assert all(w.filename == __file__ for w in record)  # points at the caller
    with pytest.warns(DeprecationWarning) as record:
        saved = ModelConfig.from_dict({"depth": 1, "heads": 1}, "cfg")
    assert saved == ModelConfig(num_layers=1, num_heads=1) and len(record) == 2
    with pytest.warns(DeprecationWarning), pytest.raises(TypeError, match="both 'depth'"):
        ModelConfig(depth=2, num_layers=3)
    with pytest.warns(DeprecationWarning):
        m = FordATransformer(ModelConfig(d_model=8, head_dim=4, mlp_dim=8), depth=1)
    assert len(m.blocks) == 1 and m.config.num_layers == 1


@pytest.mark.parametrize("saved", [
    dict(stem="linear", stem_channels=32, spectrum_tokens=0, spectral_window=0),
    dict(spectral=True, patch=20, spectral_window=40),
    dict(spectral=False, spectral_window=80),  # without spectra the option did nothing
])
def test_removed_options_at_neutral_values_load(saved):
    cfg = ModelConfig.from_dict(saved)
    for key in ("stem", "stem_channels", "spectrum_tokens", "spectral_window"):
        assert not hasattr(cfg, key)
    assert cfg.spectral == saved.get("spectral", False)


@pytest.mark.parametrize("saved, match", [
    (dict(stem="conv"), r"cfg: uses the removed convolutional stems \(stem='conv'\); load it "
                        r"with linattn <= 0.1"),
    (dict(stem="inception", stem_channels=8), "removed convolutional stems"),
    (dict(spectrum_tokens=5), r"removed global-spectrum tokens \(spectrum_tokens=5\)"),
    (dict(spectral=True, patch=20, spectral_window=80), "removed spectral windows other than"),
])
def test_removed_options_in_use_are_refused(saved, match):
    from linattn.tsc.training import CheckpointError

    with pytest.raises(CheckpointError, match=match):
        ModelConfig.from_dict(saved, "cfg")


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
