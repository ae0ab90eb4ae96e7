"""FordATransformer: the reference size, padding to whole patches, windows and spectra (zero
padded or circular), config validation, deprecated names and removed options; metrics."""

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
                                dict(window=9, spectral=True),
                                dict(window=9, spectral=True, circular=True),
                                dict(window=9, spectral=True, global_spectrum=True)])
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


def small(**kw) -> FordATransformer:
    torch.manual_seed(0)
    return FordATransformer(ModelConfig(**{**dict(length=60, patch=6, d_model=8, num_layers=2,
                                                  num_heads=2, head_dim=4, mlp_dim=8), **kw}))


def tie_lags_circularly(m: FordATransformer) -> None:
    """r_m = r_{m+T} for the negative lags: the relative term becomes a function of
    (j − i) mod T, so attention has no ends either."""
    T = m.config.tokens
    with torch.no_grad():
        for block in m.blocks:
            rel = block.attn.rel  # lag m at index T − 1 + m
            rel[:, : T - 1] = rel[:, T:]


@pytest.mark.parametrize("kw", [dict(window=10), dict(window=10, spectral=True),
                                dict(window=6, spectral=True), dict(window=17)])
def test_circular_windows_roll_with_the_series(kw):
    m = small(circular=True, **kw).eval()
    x = torch.randn(3, 60)
    for shift in (6, 18, -24):  # multiples of the patch
        rolled = torch.roll(x, shift, -1)
        # the features are the same samples, moved: exactly equal
        assert torch.equal(m.token_features(rolled),
                           torch.roll(m.token_features(x), shift // 6, 1))
        torch.testing.assert_close(m.tokens(rolled), torch.roll(m.tokens(x), shift // 6, 1),
                                   rtol=0, atol=1e-6)
    # with lags that wrap too, the whole model (mean pooling) is invariant up to rounding;
    # zero-padded windows mark the ends, and the same model is not
    tie_lags_circularly(m)
    zero = small(circular=False, **kw).eval()
    zero.load_state_dict(m.state_dict())
    rolled = torch.roll(x, 18, -1)
    torch.testing.assert_close(m(rolled), m(x), rtol=0, atol=1e-5)
    assert (zero(rolled) - zero(x)).abs().max() > 1e-3


def test_circular_windows_wrap_around_the_ends():
    x = torch.randn(2, 60)
    # window 10 around patch 6: token t sees [6t − 2, 6t + 8)
    circ, zero = small(window=10, circular=True), small(window=10)
    first, last = circ.token_features(x)[:, 0], circ.token_features(x)[:, -1]
    torch.testing.assert_close(first, torch.cat([x[:, -2:], x[:, :8]], 1), rtol=0, atol=0)
    torch.testing.assert_close(last, torch.cat([x[:, -8:], x[:, :2]], 1), rtol=0, atol=0)
    first0, last0 = zero.token_features(x)[:, 0], zero.token_features(x)[:, -1]
    assert torch.equal(first0[:, :2], torch.zeros(2, 2)) and torch.equal(first0[:, 2:], x[:, :8])
    assert torch.equal(last0[:, 8:], torch.zeros(2, 2))
    # the inner tokens are the same either way
    assert torch.equal(circ.token_features(x)[:, 1:-1], zero.token_features(x)[:, 1:-1])
    # spectra: token 0's 12 samples are [x[-3:], x[:9]] when circular, [0, 0, 0, x[:9]] if not
    sc, sz = small(spectral=True, circular=True), small(spectral=True)
    hann = torch.hann_window(12, periodic=False)
    for model, frame in ((sc, torch.cat([x[:, -3:], x[:, :9]], 1)),
                         (sz, torch.cat([torch.zeros(2, 3), x[:, :9]], 1))):
        spec = torch.fft.rfft(frame * hann)
        expected = 0.5 * torch.log(spec.real.square() + spec.imag.square() + 1e-4)
        torch.testing.assert_close(model.spectral(x)[:, 0], expected)
    assert not torch.allclose(sc.spectral(x)[:, 0], sz.spectral(x)[:, 0])
    torch.testing.assert_close(sc.spectral(x)[:, 1:-1], sz.spectral(x)[:, 1:-1], rtol=0, atol=0)


def test_circular_windows_longer_than_the_series_and_partial_patches():
    # a window longer than the series wraps more than once: the series continued periodically
    m = small(length=10, patch=5, window=25, circular=True)
    x = torch.randn(1, 10)
    idx = (torch.arange(25)[None] + torch.tensor([[-10], [-5]])) % 10
    assert torch.equal(m.token_features(x)[0], x[0, idx])
    # a final partial patch: the loop is the series zero padded to whole patches (23 -> 25)
    m = small(length=23, patch=5, window=9, circular=True)
    x = torch.randn(1, 23)
    first = m.token_features(x)[0, 0]
    assert torch.equal(first, torch.cat([torch.zeros(2), x[0, :7]]))
    last = m.token_features(x)[0, -1]
    assert torch.equal(last, torch.cat([x[0, 18:], torch.zeros(2), x[0, :2]]))


def test_configs_saved_without_circular_load_zero_padded():
    saved = ModelConfig(patch=20, window=40, spectral=True).to_dict()
    del saved["circular"]
    assert ModelConfig.from_dict(saved).circular is False
    assert ModelConfig.from_dict({**saved, "circular": True}).circular is True


def test_global_spectrum_adds_one_vector_to_every_token():
    """The series spectrum enters every token alike (no position), from a Hann-tapered FFT of the
    whole series, and configurations saved before the option load without it."""
    torch.manual_seed(0)
    cfg = dict(length=60, patch=6, window=12, spectral=True, d_model=8, num_layers=1,
               num_heads=2, head_dim=4, mlp_dim=8)
    m = FordATransformer(ModelConfig(**cfg, global_spectrum=True)).eval()
    x = torch.randn(3, 60)
    diff = m.tokens(x) - m.embed(m.token_features(x))  # (B, T, d): the same row for every token
    torch.testing.assert_close(diff, diff[:, :1].expand_as(diff))
    spec = torch.fft.rfft(x.double() * torch.hann_window(60, periodic=False, dtype=torch.float64))
    want = m.global_embed(0.5 * torch.log(spec.abs().square() + 1e-4).float())
    torch.testing.assert_close(diff[:, 0], want)
    n_plain = sum(p.numel() for p in FordATransformer(ModelConfig(**cfg)).parameters())
    assert sum(p.numel() for p in m.parameters()) == n_plain + 31 * 8 + 8
    saved = ModelConfig(**cfg).to_dict()
    del saved["global_spectrum"]
    assert ModelConfig.from_dict(saved).global_spectrum is False


@pytest.mark.parametrize("kw, match", [
    (dict(global_spectrum=1), "global_spectrum must be a bool"),
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
    (dict(circular="yes"), "circular must be a bool"),
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
