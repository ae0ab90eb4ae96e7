"""linattn.tsc.attention_features: the features against a direct loop over their definition
(plain and causal), the pooling identity at sharpness 0, chunking, determinism, errors."""

from __future__ import annotations

import numpy as np
import pytest

import linattn.tsc.attention_features as af
from linattn.tsc.attention_features import RandomAttentionFeatures

EPS32 = float(np.finfo(np.float32).eps)


def _tokens(n=5, S=7, F=12, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, S, F)).astype(np.float32)


def _direct(a: RandomAttentionFeatures, tokens: np.ndarray) -> np.ndarray:
    """The module docstring's definition, one series, head and token at a time, in float64;
    per head the values' means over the tokens, then their maxima (the transform's layout)."""
    Wq, Wk = a.query_.double().numpy(), a.key_.double().numpy()
    idx = a.value_index_.numpy()
    m = a.key_dim
    rows = []
    for t in tokens.astype(np.float64):
        row = []
        for h in range(a.heads):
            q = np.exp(a.sharpness * (t @ Wq[:, h * m:(h + 1) * m]))
            k = np.exp(a.sharpness * (t @ Wk[:, h * m:(h + 1) * m]))
            v = t[:, idx[h]]
            o = []
            for s in range(len(t)):
                r = np.arange(s + 1) if a.causal else np.arange(len(t))
                w = k[r] @ q[s]
                o.append(w @ v[r] / w.sum())
            o = np.array(o)
            row.append(np.r_[o.mean(0), o.max(0)])
        rows.append(np.concatenate(row))
    return np.stack(rows)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sharpness", [0.5, 1.0, 2.0])
def test_features_match_a_direct_loop_over_the_definition(causal, sharpness):
    tokens = _tokens()
    a = RandomAttentionFeatures(heads=3, key_dim=4, values=5, sharpness=sharpness,
                                causal=causal, random_state=1).fit(tokens)
    got = a.transform(tokens)
    assert got.shape == (5, 3 * 5 * 2) == (5, a.n_features)
    want = _direct(a, tokens)
    # float32 matmuls over F=12 features and S=7 tokens, then a ratio: a few hundred ulps
    np.testing.assert_allclose(got, want, rtol=300 * EPS32, atol=300 * EPS32)


def test_sharpness_zero_is_pooling_every_token_alike():
    tokens = _tokens()
    a = RandomAttentionFeatures(heads=4, values=3, sharpness=0.0).fit(tokens)
    got = a.transform(tokens).reshape(5, 4, 2, 3)
    pooled = tokens[:, :, a.value_index_.numpy()].mean(1)  # (n, heads, values)
    np.testing.assert_allclose(got[:, :, 0], pooled, rtol=0, atol=30 * EPS32)
    np.testing.assert_allclose(got[:, :, 1], pooled, rtol=0, atol=30 * EPS32)


def test_causal_first_token_passes_on_its_own_values():
    tokens = _tokens(S=1)
    a = RandomAttentionFeatures(heads=2, values=4, causal=True).fit(tokens)
    got = a.transform(tokens).reshape(5, 2, 2, 4)
    own = tokens[:, 0, a.value_index_.numpy()]
    np.testing.assert_allclose(got[:, :, 0], own, rtol=10 * EPS32, atol=10 * EPS32)


def test_chunks_and_rows_are_independent(monkeypatch):
    tokens = _tokens(n=9)
    a = RandomAttentionFeatures(heads=3, values=2).fit(tokens)
    whole = a.transform(tokens)
    monkeypatch.setattr(af, "_CHUNK", 2)
    np.testing.assert_allclose(a.transform(tokens), whole, rtol=10 * EPS32, atol=10 * EPS32)
    np.testing.assert_allclose(a.transform(tokens[4:5]), whole[4:5], rtol=10 * EPS32,
                               atol=10 * EPS32)


def test_the_draw_follows_random_state():
    tokens = _tokens()
    one = RandomAttentionFeatures(heads=2, random_state=3).fit(tokens).transform(tokens)
    two = RandomAttentionFeatures(heads=2, random_state=3).fit(tokens).transform(tokens)
    other = RandomAttentionFeatures(heads=2, random_state=4).fit(tokens).transform(tokens)
    np.testing.assert_array_equal(one, two)  # the same process, the same draw
    assert not np.allclose(one, other)


def test_large_projections_do_not_overflow():
    tokens = 100 * _tokens()
    got = RandomAttentionFeatures(heads=2, sharpness=2.0).fit(tokens).transform(tokens)
    assert np.isfinite(got).all()


def test_value_features_are_distinct_within_a_head_when_there_are_enough():
    a = RandomAttentionFeatures(heads=6, values=12).fit(_tokens())
    assert all(len(set(row.tolist())) == 12 for row in a.value_index_)
    few = RandomAttentionFeatures(heads=2, values=20).fit(_tokens())  # 12 features: repeats
    assert few.value_index_.shape == (2, 20) and int(few.value_index_.max()) < 12


@pytest.mark.parametrize("kwargs, message", [
    (dict(heads=0), "heads"), (dict(key_dim=0), "key_dim"), (dict(values=0), "values"),
    (dict(sharpness=-1.0), "sharpness"), (dict(sharpness=float("nan")), "sharpness")])
def test_bad_parameters_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RandomAttentionFeatures(**kwargs)


def test_bad_tokens_are_named():
    a = RandomAttentionFeatures(heads=2)
    with pytest.raises(RuntimeError, match="call fit"):
        a.transform(_tokens())
    with pytest.raises(ValueError, match=r"\(n, S, F\)"):
        a.fit(np.zeros((3, 4)))
    a.fit(_tokens())
    with pytest.raises(ValueError, match="13 features; fitted on 12"):
        a.transform(_tokens(F=13))
    bad = _tokens()
    bad[1, 2, 3] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        a.transform(bad)
