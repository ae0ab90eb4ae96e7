"""Feature maps: the kernel identities each map promises, shapes, the name registry."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import linattn
from linattn.feature_maps import (
    FEATURE_MAPS,
    EluPlusOne,
    FavorPlus,
    FeatureMap,
    Hedgehog,
    Polynomial,
    RandomReLU,
    ReluPlusOne,
    Taylor,
    fit_hedgehog,
    get_feature_map,
    linear_attention_weights,
    softmax_attention_weights,
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


def test_elu_features_of_very_negative_float32_inputs_are_exp_not_zero():
    """1 + elu(x) = exp(x) for x <= 0: in float32, elu(x) + 1 cancelled to 0 below x ≈ -17, so
    the portable path's normaliser vanished where the compiled kernels' (exp(x)) did not: a
    (1, 1, T, 1) linear attention with keys of scale 30 was off by ~1 (issue 51)."""
    x = torch.tensor([-80.0, -30.0, -17.0, -1e-8, 0.0, 1e-8, 5.0])
    want = torch.where(x.double() > 0, x.double() + 1, torch.exp(x.double()))
    torch.testing.assert_close(EluPlusOne()(x).double(), want, rtol=1e-6, atol=0)
    x = torch.tensor([-30.0, -1.0, 0.0, 2.0], requires_grad=True)
    EluPlusOne()(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.tensor([math.exp(-30.0), math.exp(-1.0), 1.0, 1.0]))


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


# -------------------- random-feature maps
# Random and learnable feature maps: FAVOR+, random ReLU, Hedgehog (feature_maps.py).


def _favor_unstabilised(f: FavorPlus, x: torch.Tensor) -> torch.Tensor:
    """exp(W x' − |x'|²/2)/√m with no stabiliser: the textbook estimator."""
    x = x * f.head_dim**-0.25
    return torch.exp(x @ f.W.T - 0.5 * x.square().sum(-1, keepdim=True)) / math.sqrt(f.m)


def test_favor_is_unbiased_for_the_softmax_kernel():
    torch.manual_seed(0)
    d = 8
    q = torch.randn(4, d, dtype=torch.float64) * 0.4
    k = torch.randn(5, d, dtype=torch.float64) * 0.4
    f = FavorPlus(d, 64, seed=0).double()
    total = torch.zeros(4, 5, dtype=torch.float64)
    draws = 400
    for _ in range(draws):
        f.redraw()
        total += _favor_unstabilised(f, q) @ _favor_unstabilised(f, k).T
    want = torch.exp(q @ k.T / math.sqrt(d))
    torch.testing.assert_close(total / draws, want, rtol=0.01, atol=0)


def test_favor_stabilisers_cancel_in_the_output():
    torch.manual_seed(1)
    f = FavorPlus(8, 32, seed=3).double()
    q, k, v = (torch.randn(2, 10, 8, dtype=torch.float64) for _ in range(3))
    fq, fk = _favor_unstabilised(f, q), _favor_unstabilised(f, k)
    sim = fq @ fk.transpose(-1, -2)
    for causal in (False, True):
        s = sim.tril() if causal else sim
        want = (s @ v) / s.sum(-1, keepdim=True)
        got = linattn.linear_attention(q, k, v, feature_map=f, is_causal=causal)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_favor_features_positive_bounded_and_orthogonal():
    f = FavorPlus(16, 40, seed=0)
    x = torch.randn(3, 50, 16) * 3
    fk = f.forward_keys(x)
    assert (fk > 0).all() and (fk <= 1 / math.sqrt(40) + 1e-7).all()
    assert (f.forward_queries(x) > 0).all()
    block = f.W[:16].double()
    gram = block @ block.T
    off = gram - torch.diag(torch.diag(gram))
    assert off.abs().max() < 1e-4 * gram.diag().max()


def test_favor_key_features_use_no_other_token():
    """Causal safety: a key's features depend on that key alone (no data-dependent shift)."""
    f = FavorPlus(8, 16, seed=0)
    k = torch.randn(1, 20, 8)
    torch.testing.assert_close(f.forward_keys(k)[:, :7], f.forward_keys(k[:, :7]))


def test_favor_error_falls_as_features_grow():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 64, 16, dtype=torch.float64) * 0.5 for _ in range(3))
    exact = torch.nn.functional.scaled_dot_product_attention(q, k, v)

    def err(m):
        errs = []
        for seed in range(6):
            f = FavorPlus(16, m, seed=seed).double()
            o = linattn.linear_attention(q, k, v, feature_map=f)
            errs.append(((o - exact).pow(2).mean().sqrt() / v.std()).item())
        return sum(errs) / len(errs)

    small, large = err(16), err(1024)
    assert large < 0.35 * small, (small, large)


def test_redraw_changes_W_and_state_dict_restores_it(tmp_path):
    f = FavorPlus(8, 16, seed=0)
    before = f.W.clone()
    f.redraw()
    assert not torch.equal(before, f.W)
    path = tmp_path / "fmap.pt"
    torch.save(f.state_dict(), path)
    g = FavorPlus(8, 16, seed=123)
    assert not torch.equal(g.W, f.W)
    g.load_state_dict(torch.load(path))
    assert torch.equal(g.W, f.W)
    m = linattn.nn.MultiheadLinearAttention(16, 2, feature_map=FavorPlus(8, 16, seed=1))
    assert any(key.endswith("feature_map.W") for key in m.state_dict())


def test_random_relu_features_and_guard():
    f = RandomReLU(4, 8, seed=0).double()
    x = torch.randn(10, 4, dtype=torch.float64)
    fx = f(x)
    assert (fx >= 0).all()
    torch.testing.assert_close(fx, torch.relu(x / 4**0.25 @ f.W.T) / math.sqrt(8))
    # a query orthogonal to every row's positive half: project onto -W's cone
    q = -(f.W.sum(0, keepdim=True)) * 100
    q = q.reshape(1, 1, 4)
    k, v = torch.randn(1, 5, 4, dtype=torch.float64), torch.randn(1, 5, 3, dtype=torch.float64)
    out = linattn.linear_attention(q, k, v, feature_map=f)
    assert torch.isfinite(out).all()


def _maps():
    return [
        FavorPlus(4, 12, seed=0),
        RandomReLU(4, 12, seed=0),
        Hedgehog(4, 6),
    ]


@pytest.mark.parametrize("fmap", _maps(), ids=["favor", "random-relu", "hedgehog"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_maps_match_reference_and_gradcheck(fmap, is_causal):
    fmap = fmap.double()
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 9, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    got = linattn.linear_attention(q, k, v, feature_map=fmap, is_causal=is_causal, chunk_size=4)
    want = linattn.reference.linear_attention(q, k, v, feature_map=fmap, is_causal=is_causal)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
    assert torch.autograd.gradcheck(
        lambda *a: linattn.linear_attention(*a, feature_map=fmap, is_causal=is_causal), (q, k, v)
    )


@pytest.mark.parametrize("fmap", _maps(), ids=["favor", "random-relu", "hedgehog"])
def test_maps_work_in_step_relative_and_modules(fmap):
    fmap = fmap.double()
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 4, dtype=torch.float64) for _ in range(3))
    par = linattn.linear_attention(q, k, v, feature_map=fmap, is_causal=True)
    state = linattn.LinearAttentionState.zeros((1, 2), fmap.num_features(4), 4,
                                               dtype=torch.float64)
    for t in range(6):
        o_t, state = linattn.linear_attention_step(q[..., t, :], k[..., t, :], v[..., t, :],
                                                   state, feature_map=fmap)
        torch.testing.assert_close(o_t, par[..., t, :], rtol=1e-9, atol=1e-9)
    r = torch.randn(2, 11, 4, dtype=torch.float64)
    for causal in (False, True):
        got = linattn.relative_linear_attention(q, k, v, r, feature_map=fmap, is_causal=causal,
                                                method="fft")
        want = linattn.reference.relative_linear_attention(q, k, v, r, feature_map=fmap,
                                                           is_causal=causal)
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
    m = linattn.nn.MultiheadLinearAttention(8, 2, feature_map=fmap.float().new_feature_map()
                                            if not isinstance(fmap, Hedgehog) else Hedgehog(4, 6),
                                            max_len=6)
    assert m(torch.randn(2, 6, 8)).shape == (2, 6, 8)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("fmap", _maps(), ids=["favor", "random-relu", "hedgehog"])
def test_half_inputs_up_to_10_stay_finite(fmap, dtype):
    g = torch.Generator().manual_seed(0)
    q, k, v = ((torch.rand(2, 256, 4, generator=g) * 20 - 10).to(dtype) for _ in range(3))
    for causal in (False, True):
        out = linattn.linear_attention(q, k, v, feature_map=fmap, is_causal=causal)
        assert out.dtype == dtype and torch.isfinite(out).all()


def test_hedgehog_distillation_beats_elu_on_held_out_queries():
    torch.manual_seed(0)
    d = 8
    # spiky softmax targets: a few strongly aligned keys per query
    q = torch.randn(4, 32, d) * 1.5
    k = torch.randn(4, 32, d) * 1.5
    h = Hedgehog(d, 16)
    losses = fit_hedgehog(h, q[:3], k[:3], steps=200, lr=3e-2)
    assert losses[-1] < 0.9 * losses[0]

    def kl(weights):
        target = softmax_attention_weights(q[3:], k[3:])
        return (target * (target.log() - weights.clamp_min(1e-12).log())).sum(-1).mean().item()

    elu = linattn.feature_maps.EluPlusOne()
    with torch.no_grad():
        assert kl(linear_attention_weights(h, q[3:], k[3:])) < kl(
            linear_attention_weights(elu, q[3:], k[3:])
        )


def test_bad_input_dimension_is_named():
    with pytest.raises(ValueError, match="q: expected inputs of last dimension 8"):
        FavorPlus(8, 4).forward_queries(torch.randn(3, 5))
    with pytest.raises(ValueError, match="head_dim, num_features"):
        FavorPlus(0, 4)
