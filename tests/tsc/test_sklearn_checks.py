"""Both estimators of linattn.tsc against scikit-learn's own estimator checks
(``check_estimator``): parameters, cloning, fitted attributes, input validation and its
messages, pickling, and the rest of its list. Small, fast configurations; the checks are
about the API, not the models' accuracy."""

from __future__ import annotations

import warnings

import pytest

pytest.importorskip("sklearn", minversion="1.6")  # expected_failed_checks

from sklearn.utils.estimator_checks import check_estimator  # noqa: E402

from linattn.tsc import ConvAttentionClassifier, LinearAttentionClassifier  # noqa: E402


def _failed(estimator, expected: dict[str, str] | None = None) -> list[str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = check_estimator(estimator, on_fail=None, expected_failed_checks=expected)
    assert len(results) > 40  # the whole list ran
    return [f"{r['check_name']}: {r['exception']!r}" for r in results
            if r["status"] == "failed"]


def test_conv_attention_classifier_passes_check_estimator():
    est = ConvAttentionClassifier(steps=5, segments=2, features=84, quantiles=0,
                                  global_features=200, difference_features=100,
                                  competing_groups=2, d_model=8, num_heads=2, num_layers=1,
                                  n_threads=1)
    assert _failed(est) == []


def test_linear_attention_classifier_passes_check_estimator():
    est = LinearAttentionClassifier(epochs=1, min_steps=0, d_model=8, num_heads=2, head_dim=4,
                                    mlp_dim=8, num_layers=1, patch=1, n_threads=1,
                                    verbose=False)
    # scikit-learn's toy accuracy bar (two-feature blobs, 0.83) is no task for a sequence
    # model of patch tokens trained for a step; everything else is held
    expected = {"check_classifiers_train": "two-sample 'series' of blobs; accuracy, not API"}
    assert _failed(est, expected) == []
