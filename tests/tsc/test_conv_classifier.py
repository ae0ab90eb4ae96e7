"""ConvAttentionClassifier: fits and predicts labels of any type, probabilities, the ablation
without the mixer, the ridge head alone agreeing with RidgeClassifierCV, scikit-learn's clone
and pipelines, and one-line errors."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("sklearn")

from sklearn.base import clone  # noqa: E402
from sklearn.linear_model import RidgeClassifierCV  # noqa: E402

from linattn.tsc import ConvAttentionClassifier  # noqa: E402
from linattn.tsc.conv_classifier import RIDGE_ALPHAS, ridge_proba  # noqa: E402

FAST = {"steps": 30, "features": 400}


def _two_shapes(n: int, length: int = 60, seed: int = 0):
    """A bump early against a bump late in noise: where a shape sits decides the class."""
    g = np.random.default_rng(seed)
    X = 0.3 * g.standard_normal((n, length)).astype(np.float32)
    y = np.array(["early", "late"] * (n // 2))
    t = np.arange(length)
    for i, label in enumerate(y):
        centre = length * (0.25 if label == "early" else 0.75) + g.integers(-3, 4)
        X[i] += np.exp(-0.5 * ((t - centre) / 3.0) ** 2).astype(np.float32) * 2
    return X, y


def test_fits_and_predicts_labels_of_any_type():
    X, y = _two_shapes(40)
    Xt, yt = _two_shapes(20, seed=1)
    clf = ConvAttentionClassifier(**FAST).fit(X, y)
    assert clf.classes_.tolist() == ["early", "late"]
    pred = clf.predict(Xt)
    assert pred.dtype == y.dtype and set(pred) <= {"early", "late"}
    assert clf.score(Xt, yt) >= 0.9
    proba = clf.predict_proba(Xt)
    assert proba.shape == (20, 2)
    np.testing.assert_allclose(proba.sum(1), 1.0, rtol=0, atol=1e-5)
    assert clf.fit_time_ > 0 and clf.n_features_in_ == 60


def test_the_ablation_has_no_mixer_and_the_ridge_head_is_ridge_classifier_cv():
    X, y = _two_shapes(30)
    pool = ConvAttentionClassifier(num_layers=0, **FAST).fit(X, y)
    assert len(pool.net_.blocks) == 0
    full = ConvAttentionClassifier(**FAST).fit(X, y)
    assert len(full.net_.blocks) == 2
    # the ridge head: RidgeClassifierCV on the mean of the standardised tokens
    T = (full.tokens_.transform(X) - full.mean_) / full.scale_
    ref = RidgeClassifierCV(alphas=RIDGE_ALPHAS).fit(T.mean(1), (y == "late").astype(int))
    np.testing.assert_allclose(full.ridge_.decision_function(T.mean(1)),
                               ref.decision_function(T.mean(1)), rtol=1e-5, atol=1e-5)
    no_ridge = ConvAttentionClassifier(ridge=False, **FAST).fit(X, y)
    assert no_ridge.ridge_ is None


def test_ridge_proba_places_the_classes_it_saw():
    two = ridge_proba(np.array([-1.0, 0.0, 2.0]))
    assert two.shape == (3, 2) and two[2, 1] > two[2, 0] and two[1, 0] == two[1, 1]
    spread = ridge_proba(np.array([[0.3, -0.1]]), np.array([0, 2]), 4)
    np.testing.assert_allclose(spread[:, [0, 2]], ridge_proba(np.array([[0.3, -0.1]])))
    assert spread[0, 1] == spread[0, 3] == 0


def test_clone_and_pipeline():
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import FunctionTransformer

    X, y = _two_shapes(20)
    clf = ConvAttentionClassifier(segments=8, **FAST)
    assert clone(clf).get_params() == clf.get_params()
    pipe = make_pipeline(FunctionTransformer(lambda a: a - a.mean(1, keepdims=True)), clf)
    assert pipe.fit(X, y).predict(X).shape == (20,)


def test_missing_values_and_bad_input():
    X, y = _two_shapes(20)
    bad = X.copy()
    bad[3, 10] = np.nan
    with pytest.raises(ValueError, match=r"row 3"):
        ConvAttentionClassifier(**FAST).fit(bad, y)
    ConvAttentionClassifier(missing="interpolate", **FAST).fit(bad, y)
    with pytest.raises(ValueError, match="one class"):
        ConvAttentionClassifier(**FAST).fit(X, np.zeros(20))
    with pytest.raises(ValueError, match=r"y must have shape \(20,\)"):
        ConvAttentionClassifier(**FAST).fit(X, y[:5])
    with pytest.raises(ValueError, match=r"shape \(n_series, length\)"):
        ConvAttentionClassifier(**FAST).fit(X[0], y)
