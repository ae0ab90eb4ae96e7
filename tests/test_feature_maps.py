"""Feature maps: the kernel identities each map promises, shapes, the name registry."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from linattn.feature_maps import (
    FEATURE_MAPS,
    EluPlusOne,
    FeatureMap,
    Polynomial,
    ReluPlusOne,
    Taylor,
    get_feature_map,
)

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.mark.parametrize("d", [1, 2, 5, 16])
def test_num_features_matches_output(make_map, d):
    x = torch.randn(2, 3, 7, d, dtype=torch.float64)
    feature_map = make_map(d)
    ell = feature_map.num_features(d)
    assert feature_map.forward_queries(x).shape == (2, 3, 7, ell)
    assert feature_map.forward_keys(x).shape == (2, 3, 7, ell)
    assert feature_map(x).shape == (2, 3, 7, ell)


def test_num_features_formulas():
    assert EluPlusOne().num_features(64) == 64
    assert ReluPlusOne().num_features(64) == 64
    assert Taylor().num_features(64) == 1 + 64 + 64 * 65 // 2
    assert Polynomial(degree=2).num_features(8) == math.comb(10, 2)
    assert Polynomial(degree=3).num_features(4) == math.comb(7, 3)


def test_taylor_identity_explicit():
    d = 6
    q = torch.randn(50, d, dtype=torch.float64) * 2
    k = torch.randn(50, d, dtype=torch.float64) * 2
    fmap = Taylor()
    s = (q * k).sum(-1) / math.sqrt(d)
    got = (fmap.forward_queries(q) * fmap.forward_keys(k)).sum(-1)
    torch.testing.assert_close(got, 1 + s + s**2 / 2, rtol=1e-12, atol=1e-12)


def _vectors(d_max=8, bound=5.0):
    elem = st.floats(-bound, bound, allow_nan=False, allow_infinity=False)
    def pair(d):
        vec = st.lists(elem, min_size=d, max_size=d)
        return st.tuples(vec, vec)

    return st.integers(1, d_max).flatmap(pair)


@settings(max_examples=100, deadline=None)
@given(_vectors())
def test_taylor_identity_property(pair):
    q = torch.tensor(pair[0], dtype=torch.float64)
    k = torch.tensor(pair[1], dtype=torch.float64)
    fmap = Taylor()
    s = (q @ k).item() / math.sqrt(q.numel())
    got = (fmap.forward_queries(q) @ fmap.forward_keys(k)).item()
    assert got == pytest.approx(1 + s + s * s / 2, rel=1e-10, abs=1e-10)


@settings(max_examples=100, deadline=None)
@given(_vectors(d_max=6, bound=3.0), st.integers(1, 3), st.sampled_from([0.0, 0.5, 1.0, 2.0]))
def test_polynomial_identity_property(pair, p, c):
    x = torch.tensor(pair[0], dtype=torch.float64)
    y = torch.tensor(pair[1], dtype=torch.float64)
    fmap = Polynomial(degree=p, c=c)
    want = ((x @ y).item() + c) ** p
    got = (fmap.forward_queries(x) @ fmap.forward_keys(y)).item()
    assert got == pytest.approx(want, rel=1e-10, abs=1e-10)


@pytest.mark.parametrize("p", [1, 2, 3])
@pytest.mark.parametrize("c", [0.0, 1.0, 3.0])
def test_polynomial_identity_batched(p, c):
    x = torch.randn(4, 9, 5, dtype=torch.float64)
    y = torch.randn(4, 11, 5, dtype=torch.float64)
    fmap = Polynomial(degree=p, c=c)
    want = (x @ y.transpose(-1, -2) + c) ** p
    got = fmap.forward_queries(x) @ fmap.forward_keys(y).transpose(-1, -2)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_elu_and_relu_values():
    x = torch.tensor([-3.0, -0.5, 0.0, 0.5, 3.0], dtype=torch.float64)
    torch.testing.assert_close(EluPlusOne()(x), torch.where(x > 0, x + 1, torch.exp(x)))
    torch.testing.assert_close(ReluPlusOne()(x), x.clamp(min=0) + 1)


@pytest.mark.parametrize("name", ["elu", "relu", "taylor"])
def test_positive_kernels(name):
    fmap = get_feature_map(name)
    x = torch.randn(200, 4, dtype=torch.float64) * 5
    y = torch.randn(300, 4, dtype=torch.float64) * 5
    kern = fmap.forward_queries(x) @ fmap.forward_keys(y).T
    assert (kern > 0).all()
    if name == "taylor":  # 1 + s + s²/2 = ((1 + s)² + 1) / 2 >= 1/2
        assert kern.min() >= 0.5 - 1e-12


def test_registry_and_get_feature_map():
    assert set(FEATURE_MAPS) >= {"elu", "relu", "taylor", "polynomial"}
    for name, cls in FEATURE_MAPS.items():
        assert isinstance(get_feature_map(name), cls)
        assert isinstance(get_feature_map(name.upper()), cls)
    fmap = Polynomial(degree=3)
    assert get_feature_map(fmap) is fmap


def test_get_feature_map_errors():
    with pytest.raises(ValueError, match="feature_map.*'nope'"):
        get_feature_map("nope")
    with pytest.raises(TypeError, match="feature_map"):
        get_feature_map(3)


def test_polynomial_bad_arguments():
    with pytest.raises(ValueError, match="degree"):
        Polynomial(degree=0)
    with pytest.raises(ValueError, match="degree"):
        Polynomial(degree=2.0)
    with pytest.raises(ValueError, match="c:"):
        Polynomial(c=-1.0)


def test_config_rebuilds_and_redraw_is_noop(make_map):
    """Deterministic maps: a rebuild from config gives the same features and redraw() changes
    nothing. Seeded random maps: a rebuild draws the same W (same seed), redraw() draws a new
    one. Every map (the trained Hedgehog included): the saved tensors restore its features."""
    feature_map = make_map(5)
    fresh = feature_map.new_feature_map()
    assert type(fresh) is type(feature_map)
    assert fresh.config() == feature_map.config()
    x = torch.randn(3, 5, dtype=torch.float64)
    before = feature_map.forward_queries(x), feature_map.forward_keys(x)
    seeded = feature_map.config().get("seed") is not None
    trained = bool(list(feature_map.parameters()))  # conftest randomises Hedgehog's weights
    if not trained:  # the config alone (with its seed) determines the features
        for got, want in zip((fresh.forward_queries(x), fresh.forward_keys(x)), before,
                             strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    feature_map.redraw()
    after = feature_map.forward_queries(x), feature_map.forward_keys(x)
    for got, want in zip(after, before, strict=True):
        if seeded:  # a new draw of W
            assert not torch.equal(got, want)
        else:
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    # the saved parameters and buffers restore exactly the current features
    restored = fresh.to(torch.float64)
    restored.load_state_dict(feature_map.state_dict())
    for got, want in zip((restored.forward_queries(x), restored.forward_keys(x)), after,
                         strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_interface_defaults():
    base = FeatureMap()
    with pytest.raises(NotImplementedError):
        base.num_features(4)
    with pytest.raises(NotImplementedError):
        base(torch.zeros(1, 4))
    assert "degree=3" in repr(Polynomial(degree=3))
