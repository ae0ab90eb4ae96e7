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
from linattn.tsc.conv_classifier import (  # noqa: E402
    RIDGE_ALPHAS,
    ridge_proba,
    token_net_proba,
)

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
    tol = 1e3 * np.finfo(np.float32).eps  # float32 tokens, float64 solve
    np.testing.assert_allclose(full.ridge_.decision_function(T.mean(1)),
                               ref.decision_function(T.mean(1)), rtol=tol, atol=tol)
    # the probabilities are the mean of the net's and the ridge head's
    both = (token_net_proba(full.net_, T) + ridge_proba(ref.decision_function(T.mean(1)),
                                                        ref.classes_, 2)) / 2
    np.testing.assert_allclose(full.predict_proba(X), both, rtol=tol, atol=tol)
    no_ridge = ConvAttentionClassifier(ridge=False, **FAST).fit(X, y)
    assert no_ridge.ridge_ is None  # the net's probabilities alone (same tokens, same scaling)
    np.testing.assert_allclose(no_ridge.predict_proba(X), token_net_proba(no_ridge.net_, T),
                               rtol=tol, atol=tol)


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
    for bad, match in (({"d_model": 30}, r"d_model \(30\) must be a multiple of num_heads"),
                       ({"steps": 0}, "steps must be an integer >= 1"),
                       ({"num_layers": -1}, "num_layers must be an integer >= 0"),
                       ({"dropout": 1.0}, r"dropout must be a finite number in \[0, 1\)"),
                       ({"lr": 0.0}, "lr must be a finite number > 0"),
                       ({"random_state": "a"}, "random_state must be None or an int")):
        with pytest.raises(ValueError, match=match):
            ConvAttentionClassifier(**{**FAST, **bad}).fit(X, y)
    # None seeds as 0, and NumPy integers are integers
    a = ConvAttentionClassifier(random_state=None, **FAST).fit(X, y).predict_proba(X)
    b = ConvAttentionClassifier(random_state=np.int64(0), **FAST).fit(X, y).predict_proba(X)
    tol = 1e3 * np.finfo(np.float32).eps
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol)
