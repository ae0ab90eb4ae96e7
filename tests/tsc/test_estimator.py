"""LinearAttentionClassifier: the scikit-learn contract, labels, lengths, save/load."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("sklearn")
pytest.importorskip("safetensors")

from sklearn.model_selection import cross_val_score  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import FunctionTransformer  # noqa: E402
from sklearn.utils.estimator_checks import check_estimator  # noqa: E402

from linattn.tsc import LinearAttentionClassifier  # noqa: E402
from linattn.tsc.training import CheckpointError  # noqa: E402

TINY = dict(patch=4, d_model=8, depth=1, heads=2, head_dim=4, mlp_dim=16, epochs=2,
            batch_size=32, n_threads=1)


def toy(n=60, length=37, n_classes=3, seed=0):
    """Series whose class sets the frequency of a sine at a random phase (not aligned)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, n_classes, n)
    t = np.arange(length)
    phase = rng.uniform(0, 2 * np.pi, n)
    X = np.sin(2 * np.pi * (y[:, None] + 1) * t / 12 + phase[:, None])
    X += 0.1 * rng.standard_normal((n, length))
    return X.astype(np.float32), y


def test_check_estimator():
    # Every check runs; the one that wants > 83% training accuracy from a 2-epoch fit of a
    # tiny model is the single expected failure (accuracy is tested below with more epochs).
    expected = {"check_classifiers_train": "needs high training accuracy from a 2-epoch fit"}
    check_estimator(LinearAttentionClassifier(**TINY), expected_failed_checks=expected,
                    on_skip=None)


def test_labels_lengths_and_classes():
    X, y = toy(n=90, length=37, n_classes=3)
    labels = np.array(["low", "mid", "high"])[y]
    clf = LinearAttentionClassifier(**{**TINY, "epochs": 30, "lr": 3e-3}).fit(X, labels)
    assert clf.model_.config.tokens == 10  # 37 samples padded to 10 patches of 4
    assert list(clf.classes_) == ["high", "low", "mid"]
    pred = clf.predict(X)
    assert pred.dtype == labels.dtype and set(pred) <= set(labels)
    proba = clf.predict_proba(X)
    assert proba.shape == (90, 3) and np.allclose(proba.sum(1), 1.0)
    assert clf.score(X, labels) > 0.6  # frequency is easy; chance is 1/3
    with pytest.raises(ValueError, match="37 features"):
        clf.predict(X[:, :30])


def test_pipeline_and_cross_val_score():
    X, y = toy(n=60, length=24, n_classes=2)
    pipe = make_pipeline(FunctionTransformer(lambda a: a * 2.0),
                         LinearAttentionClassifier(**TINY))
    scores = cross_val_score(pipe, X, y, cv=2)
    assert scores.shape == (2,) and np.all((0 <= scores) & (scores <= 1))


def test_fit_is_deterministic_and_restores_threads():
    X, y = toy(n=40, length=20, n_classes=2)
    before = torch.get_num_threads()
    a = LinearAttentionClassifier(**TINY, random_state=3).fit(X, y).predict_proba(X)
    b = LinearAttentionClassifier(**TINY, random_state=3).fit(X, y).predict_proba(X)
    assert torch.get_num_threads() == before
    np.testing.assert_array_equal(a, b)


def test_tta_averages_shifted_predictions():
    X, y = toy(n=40, length=20, n_classes=2)
    clf = LinearAttentionClassifier(**TINY).fit(X, y)
    p1 = clf.predict_proba(X)
    clf.set_params(tta=4)
    assert clf._tta_shifts() == (0, 5, 10, 15)
    p4 = clf.predict_proba(X)
    assert p4.shape == p1.shape and not np.allclose(p1, p4)


def test_save_load_round_trip(tmp_path):
    X, y = toy(n=50, length=33, n_classes=3)
    y = y.astype(np.int64) * 10 - 7  # labels in some other encoding
    clf = LinearAttentionClassifier(**TINY, spectral=True, stem="conv", tta=2).fit(X, y)
    clf.save(tmp_path / "m")
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["config.json",
                                                                  "model.safetensors"]
    back = LinearAttentionClassifier.load(tmp_path / "m")
    assert back.get_params() == clf.get_params()
    np.testing.assert_array_equal(back.predict_proba(X), clf.predict_proba(X))
    np.testing.assert_array_equal(back.predict(X), clf.predict(X))
    assert back.predict(X).dtype == y.dtype and set(back.classes_) == {-7, 3, 13}


def test_variants_round_trip(tmp_path):
    X, y = toy(n=40, length=32, n_classes=2)
    clf = LinearAttentionClassifier(**TINY, stem="inception", stem_channels=8, window=6,
                                    spectral=True, spectral_window=10, mixup=0.2).fit(X, y)
    clf.save(tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert cfg["model"]["stem"] == "inception" and cfg["model"]["window"] == 6
    assert cfg["model"]["spectral_window"] == 10
    assert cfg["params"]["mixup"] == 0.2
    back = LinearAttentionClassifier.load(tmp_path / "m")
    assert back.get_params() == clf.get_params()
    np.testing.assert_array_equal(back.predict_proba(X), clf.predict_proba(X))
    LinearAttentionClassifier(**TINY, cutmix=0.5).fit(X, y)
    with pytest.raises(ValueError, match="at most one"):
        LinearAttentionClassifier(**TINY, mixup=0.2, cutmix=0.2).fit(X, y)
    with pytest.raises(ValueError, match="mixup"):
        LinearAttentionClassifier(**TINY, mixup=-1).fit(X, y)


def test_load_errors(tmp_path):
    with pytest.raises(CheckpointError, match="no such model folder"):
        LinearAttentionClassifier.load(tmp_path / "absent")
    X, y = toy(n=20, length=16, n_classes=2)
    LinearAttentionClassifier(**TINY).fit(X, y).save(tmp_path / "m")
    w = tmp_path / "m" / "model.safetensors"
    w.write_bytes(w.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="corrupt weights"):
        LinearAttentionClassifier.load(tmp_path / "m")
    (tmp_path / "m" / "config.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(CheckpointError, match="config.json: not a"):
        LinearAttentionClassifier.load(tmp_path / "m")
