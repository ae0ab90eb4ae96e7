"""The baselines of ``linattn forda evaluate``: the spectral features and the tuned spectral
logistic regression, whose every choice is made on the validation split."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("sklearn")

from linattn.tsc.evaluation import (  # noqa: E402
    SPECTRUM_GRID,
    baselines,
    describe_choice,
    log_spectrum,
    spectrum_features,
    tune_spectrum_baseline,
)


def tones(n: int = 80, length: int = 64, high: bool = False, seed: int = 0):
    """Noise plus a sine at a random phase whose frequency (bins 5 or 9, or 25 or 29 with
    ``high``, i.e. above half the Nyquist bin 32) is the class."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    f = (25 if high else 5) + 4 * y
    t = np.arange(length)
    X = np.sin(2 * np.pi * f[:, None] * t / length + rng.uniform(0, 6.3, (n, 1)))
    return (X + 0.3 * rng.standard_normal((n, length))).astype(np.float32), y


def test_spectrum_features():
    X, _ = tones(n=4, length=64)
    np.testing.assert_allclose(spectrum_features(X), log_spectrum(X))
    assert spectrum_features(X, keep=0.5).shape == (4, 17)  # ceil(0.5 * 33) of 33 bins
    assert spectrum_features(X, keep=0.01).shape == (4, 1)
    mag = spectrum_features(X, "hann", "magnitude")
    np.testing.assert_allclose(mag, np.abs(np.fft.rfft(X * np.hanning(64), axis=1)), rtol=1e-6)
    # circular shifts leave the untapered magnitude unchanged (not aligned in time is fine)
    np.testing.assert_allclose(spectrum_features(np.roll(X, 7, axis=1), scale="magnitude"),
                               spectrum_features(X, scale="magnitude"), rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("kw, match", [
    (dict(window="hamming"), "window: expected one of"),
    (dict(scale="power"), "scale: expected one of"),
    (dict(keep=0), r"keep: expected a fraction in \(0, 1\]"),
    (dict(keep=1.5), "keep: expected a fraction"),
    (dict(keep=True), "keep: expected a fraction"),
])
def test_spectrum_features_refuses_bad_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        spectrum_features(np.zeros((2, 8)), **kw)


def test_choice_is_the_validation_maximum_and_test_plays_no_part():
    X, y = tones(n=100, high=True)
    Xt, yt = tones(n=60, high=True, seed=1)
    grid = {**SPECTRUM_GRID, "keep": (0.5, 1.0), "C": (0.01, 1.0)}
    r = tune_spectrum_baseline(X, y, Xt, yt, grid=grid)
    assert len(r["grid"]) == 2 * 2 * 2 * 2
    best = max(r["grid"], key=lambda row: row["val_f1"])
    assert r["val_f1"] == best["val_f1"]
    # the class lives above half the bins: keeping the lower half is near chance, all bins win
    assert r["choice"]["keep"] == 1.0
    assert max(row["val_f1"] for row in r["grid"] if row["keep"] == 0.5) < 0.8
    assert r["val_f1"] > 0.95 and r["test_f1"] > 0.9
    # TEST is scored after the choice, never used for it: other test labels, same choice
    flipped = tune_spectrum_baseline(X, y, Xt, 1 - yt, grid=grid)
    assert flipped["choice"] == r["choice"] and flipped["grid"] == r["grid"]
    assert flipped["test_f1"] < 0.1
    # without a test set: the same selection, no test figure
    val_only = tune_spectrum_baseline(X, y, grid=grid)
    assert val_only["choice"] == r["choice"] and "test_f1" not in val_only


def test_ties_go_to_the_first_in_grid_order_with_strong_regularisation_first():
    X, y = tones(n=60)  # easy: every combination separates the validation split
    r = tune_spectrum_baseline(X, y, grid={"window": ("none", "hann"),
                                           "scale": ("magnitude",), "keep": (1.0,),
                                           "C": (100.0, 0.1)})
    assert all(row["val_f1"] == 1.0 for row in r["grid"])
    assert r["choice"] == {"window": "none", "scale": "magnitude", "keep": 1.0, "C": 0.1}
    assert describe_choice(r["choice"]) == "none window, magnitude, all bins, C = 0.1"
    assert describe_choice({**r["choice"], "keep": 0.5}).endswith("lowest 0.5 of the bins, "
                                                                  "C = 0.1")


@pytest.mark.parametrize("grid", [
    {"window": ("none",)},
    {**SPECTRUM_GRID, "C": ()},
    {**SPECTRUM_GRID, "colour": ("red",)},
    {**SPECTRUM_GRID, "C": 1.0},
])
def test_bad_grid_is_refused(grid):
    X, y = tones(n=20)
    with pytest.raises(ValueError, match="grid: expected non-empty tuples for exactly window, "
                                         "scale, keep, C"):
        tune_spectrum_baseline(X, y, grid=grid)


def test_baselines_report_untuned_and_tuned_rows():
    X, y = tones(n=60)
    Xt, yt = tones(n=30, seed=2)
    out = baselines(X, y, Xt, yt)
    names = list(out)
    assert names[:2] == ["raw samples", "log-magnitude spectrum"]
    assert len(names) == 3 and names[2].startswith("spectrum tuned on validation (")
    assert set(out[names[2]]["choice"]) == set(SPECTRUM_GRID)
    for row in out.values():
        assert 0 <= row["val_f1"] <= 1 and 0 <= row["test_f1"] <= 1
    assert list(baselines(X, y, tuned=False)) == names[:2]
    assert baselines(X, y, Xt, yt, threads=None) == out  # the thread limit changes no figure
    assert "test_f1" not in baselines(X, y, tuned=False)["raw samples"]
