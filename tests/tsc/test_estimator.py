"""LinearAttentionClassifier: the scikit-learn contract, parameters derived from the configs,
labels, lengths, save/load and every tampered config.json."""

from __future__ import annotations

import json
import shutil
import warnings
from dataclasses import fields

import numpy as np
import pytest
import torch

pytest.importorskip("sklearn")
pytest.importorskip("safetensors")

from sklearn.base import clone  # noqa: E402
from sklearn.model_selection import StratifiedKFold, cross_val_score  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402
from sklearn.utils.estimator_checks import check_estimator  # noqa: E402

from linattn.tsc import LinearAttentionClassifier, ModelConfig  # noqa: E402
from linattn.tsc.training import (  # noqa: E402
    DEFAULT_MIN_BATCHES,
    DEFAULT_MIN_STEPS,
    CheckpointError,
    TrainConfig,
)

TINY = dict(patch=4, d_model=8, num_layers=1, num_heads=2, head_dim=4, mlp_dim=16, epochs=2,
            batch_size=32, n_threads=1, min_steps=0, min_batches=0)  # as given (fast tests)


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


def test_params_are_the_config_fields():
    model = {f.name: f.default for f in fields(ModelConfig)}
    train = {f.name: f.default for f in fields(TrainConfig)}
    del model["length"], model["n_classes"], train["seed"]
    expected = {**model, **train, "min_steps": DEFAULT_MIN_STEPS,
                "min_batches": DEFAULT_MIN_BATCHES, "random_state": 0,
                "n_threads": None, "device": "cpu", "missing": "error", "verbose": False}
    assert LinearAttentionClassifier().get_params() == expected
    clf = LinearAttentionClassifier(num_layers=2, lr=3e-3, window=12, random_state=5)
    copy = clone(clf)
    assert copy is not clf and copy.get_params() == clf.get_params()
    assert repr(clf) == "LinearAttentionClassifier(lr=0.003, num_layers=2, random_state=5, " \
        "window=12)"
    assert "``num_layers=3``" in LinearAttentionClassifier.__doc__
    with pytest.raises(TypeError, match="unknown parameter.*stem"):
        LinearAttentionClassifier(stem="conv")
    with pytest.raises(TypeError):
        LinearAttentionClassifier(4)  # keyword only


def test_deprecated_parameter_names():
    with pytest.warns(DeprecationWarning, match="'depth' is deprecated, use 'num_layers'"):
        clf = LinearAttentionClassifier(depth=2)
    assert clf.get_params()["num_layers"] == 2 and "depth" not in clf.get_params()
    with pytest.warns(DeprecationWarning, match="'heads' is deprecated"):
        clf.set_params(heads=1)
    assert clf.num_heads == 1
    pipe = make_pipeline(StandardScaler(), LinearAttentionClassifier())
    with pytest.warns(DeprecationWarning):
        pipe.set_params(linearattentionclassifier__depth=4)
    assert pipe[-1].num_layers == 4


@pytest.mark.parametrize("kw, match", [
    (dict(num_layers=1.5), "num_layers must be an int, got 1.5"),
    (dict(num_heads=0), "num_heads must be a positive integer"),
    (dict(feature_map="bogus"), "feature_map must be one of"),
    (dict(window=3), "window must be 0 or an integer >= patch"),
    (dict(epochs=0), r"epochs must be in \[1, inf\)"),
    (dict(epochs=2.0), "epochs must be an int"),
    (dict(lr=-1.0), r"lr must be in \(0.0, 3.4028234663852886e\+38\]"),
    # issue 51 probe: beyond float32 (the optimiser's scalars), a traceback from inside Adam
    (dict(lr=1e300), r"lr must be in \(0.0, 3.4028234663852886e\+38\], got 1e\+300"),
    (dict(weight_decay=1e300), r"weight_decay must be in \[0.0, 3.4028234663852886e\+38\]"),
    (dict(pct_start=1.0), "pct_start must be in"),
    (dict(shift="yes"), "shift must be a bool"),
    (dict(scale_low=1.5), "scale_low must be <= scale_high"),
    (dict(n_threads="x"), "n_threads must be None or a positive integer, got 'x'"),
    (dict(n_threads=0), "n_threads must be None or a positive integer"),
    (dict(random_state=np.random.RandomState(0)), "random_state must be None or an int"),
    # seeds the generators cannot take (issue 51): named, not torch's overflow
    (dict(random_state=2**70), r"random_state: expected an integer in \[0, 4294967295\], "
                               f"got {2**70}"),
    (dict(random_state=-1), r"random_state: expected an integer in \[0, 4294967295\]"),
    (dict(verbose="loud"), "verbose must be a bool"),
    (dict(device=0), "device must be a string such as 'cpu' or 'cuda', got 0"),
    (dict(device="bogus"), "device: not a torch device: 'bogus'"),
    (dict(device="meta"), "device: 'meta' holds no data"),
    (dict(missing="drop"), "missing must be one of 'error', 'interpolate', got 'drop'"),
    (dict(missing=None), "missing must be one of"),
    # absurd sizes (issue 51): refused before anything is allocated, naming the parameter
    (dict(d_model=10**9), "d_model: training this model needs about"),
    (dict(mlp_dim=10**9), "mlp_dim: training this model needs about"),
    (dict(num_layers=10**9), "num_layers: training this model needs about"),
])
def test_fit_validates_every_parameter(kw, match):
    X, y = toy(n=20, length=16, n_classes=2)
    with pytest.raises(ValueError, match=f"LinearAttentionClassifier: {match}"):
        LinearAttentionClassifier(**{**TINY, **kw}).fit(X, y)


def test_numpy_scalars_are_accepted_and_saved_as_json(tmp_path):
    X, y = toy(n=20, length=16, n_classes=2)
    params = {**TINY, "num_layers": np.int64(1), "lr": np.float32(1e-3),
              "random_state": np.int64(2)}
    LinearAttentionClassifier(**params).fit(X, y).save(tmp_path / "m")
    saved = json.loads((tmp_path / "m" / "config.json").read_text())
    assert saved["params"]["num_layers"] == 1 and saved["params"]["random_state"] == 2


def test_pipeline_and_cross_val_score():
    # an easy problem (the class is the frequency of a sine at a random phase): the pipeline's
    # cross-validated accuracy must be far above chance (0.5)
    X, y = toy(n=80, length=24, n_classes=2)
    params = {**TINY, "epochs": 25, "lr": 3e-3}
    pipe = make_pipeline(StandardScaler(), LinearAttentionClassifier(**params))
    scores = cross_val_score(pipe, X, y, cv=StratifiedKFold(2, shuffle=True, random_state=0))
    assert scores.shape == (2,) and scores.min() > 0.8, scores
    # the pipeline hands the scaler's output to the classifier: the same as the steps by hand
    pipe.fit(X, y)
    scaler = StandardScaler().fit(X)
    by_hand = LinearAttentionClassifier(**params).fit(scaler.transform(X), y)
    np.testing.assert_array_equal(pipe.predict_proba(X), by_hand.predict_proba(
        scaler.transform(X)))
    assert not np.allclose(by_hand.predict_proba(X), by_hand.predict_proba(scaler.transform(X)))


def test_fit_is_deterministic_and_restores_threads():
    X, y = toy(n=40, length=20, n_classes=2)
    before = torch.get_num_threads()
    a = LinearAttentionClassifier(**TINY, random_state=3).fit(X, y).predict_proba(X)
    b = LinearAttentionClassifier(**TINY, random_state=3).fit(X, y).predict_proba(X)
    assert torch.get_num_threads() == before
    np.testing.assert_array_equal(a, b)


def test_save_load_round_trip(tmp_path):
    X, y = toy(n=50, length=33, n_classes=3)
    y = y.astype(np.int64) * 10 - 7  # labels in some other encoding
    clf = LinearAttentionClassifier(**TINY, spectral=True).fit(X, y)
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
    clf = LinearAttentionClassifier(**TINY, window=6, spectral=True).fit(X, y)
    clf.save(tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert cfg["model"]["window"] == 6 and cfg["model"]["spectral"] is True
    assert cfg["model"]["num_layers"] == cfg["params"]["num_layers"] == 1
    back = LinearAttentionClassifier.load(tmp_path / "m")
    assert back.get_params() == clf.get_params()
    np.testing.assert_array_equal(back.predict_proba(X), clf.predict_proba(X))


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


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    """A tiny fitted 2-class model (labels "a", "b"; series of 16 samples) saved to a folder."""
    X, y = toy(n=24, length=16, n_classes=2)
    folder = tmp_path_factory.mktemp("saved") / "m"
    LinearAttentionClassifier(**TINY).fit(X, np.array(["a", "b"])[y]).save(folder)
    return folder, X


def tampered(saved_model, tmp_path, edit) -> object:
    """A copy of the saved model whose config.json went through ``edit(cfg)``."""
    folder = tmp_path / "m"
    shutil.copytree(saved_model[0], folder)
    cfg = json.loads((folder / "config.json").read_text())
    edit(cfg)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def both(key, value):
    """Set a parameter the same way in ``params`` and ``model`` (they must agree)."""
    def edit(cfg):
        cfg["params"][key] = cfg["model"][key] = value
    return edit


def put(*path_and_value):
    *path, value = path_and_value

    def edit(cfg):
        node = cfg
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
    return edit


@pytest.mark.parametrize("edit, match", [
    (put("classes", ["a", "b", "c"]), r"classes must be a list of 2 labels \(the model's "
                                      r"n_classes\)"),
    (put("classes", ["b", "b"]), "classes must be distinct and sorted"),
    (put("classes", ["b", "a"]), "classes must be distinct and sorted"),
    (put("classes", "ab"), "classes must be a list of 2 labels"),
    (put("classes", ["ab", "cd"]), "not exactly representable as <U1"),
    (put("classes_dtype", "bogus"), "classes_dtype: not a NumPy dtype"),
    (put("classes_dtype", "V8"), "classes_dtype: unsupported dtype"),
    (put("n_features_in", 50.9), r"n_features_in must be an integer in \[1, 16\]"),
    (put("n_features_in", -5), "n_features_in must be an integer"),
    (put("n_features_in", 17), "n_features_in must be an integer"),
    (put("n_features_in", True), "n_features_in must be an integer"),
    (put("model", "feature_map", "bogus"), "model: feature_map must be one of"),
    (both("feature_map", "bogus"), "params: feature_map must be one of"),
    (put("params", "tta", "x"), r"params: uses the removed test-time augmentation \(tta='x'\)"),
    (put("params", "mixup", 0.2), "removed mixup"),
    (put("model", "stem", "conv"), "model: uses the removed convolutional stems"),
    (put("params", "n_threads", "x"), "params: n_threads must be None or a positive integer"),
    (put("params", "verbose", "x"), "params: verbose must be a bool"),
    (put("params", "device", 5), "params: device must be a string"),
    (put("params", "device", "bogus"), "params: device: not a torch device"),
    (put("params", "lr", "fast"), "params: lr must be a float"),
    (put("params", "colour", 1), "params: unknown keys"),
    (put("model", "length", 1e9), "model: length must be an int, got 1000000000.0"),
    (put("model", "mlp_dim", 2e9), "model: mlp_dim must be an int"),
    (lambda cfg: cfg["model"].update(depth=1e5, num_layers=None),
     "model: both 'depth' .* different values 100000.0 and None"),
    (lambda cfg: cfg["model"].update(depth=cfg["model"].pop("num_layers") * 1e5),
     "model: num_layers must be an int, got 100000.0"),
    (put("params", "patch", 5), "params and model disagree on patch"),
    (put("params", "num_heads", 2.0), "params: num_heads must be an int"),
    (lambda cfg: cfg.pop("classes"), "missing key 'classes'"),
    (put("params", []), "params: expected an object"),
    (put("model", "num_heads", 2.5), "model: num_heads must be an int"),
    # sizes that fit the types but not the weights: refused before anything is allocated
    (both("num_layers", 100_000), r"model.safetensors: holds 1 encoder blocks \(blocks.\*\) "
                                  "where config.json has num_layers=100000"),
    (put("model", "length", 10**9), "model.safetensors: holds .* values, fewer than the"),
    (both("mlp_dim", 2 * 10**9), r"fewer than the \d+ that config.json's sizes need "
                                 r"\(mlp_dim=2000000000"),
    (both("d_model", 16), r"model.safetensors: embed.weight has shape \(8, 4\) where "
                          r"config.json implies \(16, 4\)"),
    (both("head_dim", 2), r"blocks.0.attn.rel has shape \(2, 7, 4\) where config.json "
                          r"implies \(2, 7, 2\)"),
    (lambda cfg: cfg.update(classes=["a", "b", "c"]) or cfg["model"].update(n_classes=3),
     r"head.weight has shape \(2, 8\) where config.json implies \(3, 8\)"),
    (both("spectral", True), "embed.weight has shape"),
])
def test_tampered_config_is_refused_before_building(saved_model, tmp_path, edit, match):
    folder = tampered(saved_model, tmp_path, edit)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(CheckpointError, match=match) as err:
            LinearAttentionClassifier.load(folder)
    assert len(str(err.value).splitlines()) == 1
    assert "config.json" in str(err.value) or "model.safetensors" in str(err.value)


def test_old_config_with_deprecated_names_and_neutral_removed_options(saved_model, tmp_path):
    def old_style(cfg):
        for part in ("params", "model"):
            cfg[part]["depth"] = cfg[part].pop("num_layers")
            cfg[part]["heads"] = cfg[part].pop("num_heads")
            cfg[part].update(stem="linear", stem_channels=32, spectrum_tokens=0,
                             spectral_window=0)
        cfg["params"].update(tta=1, mixup=0.0, cutmix=0.0)

    folder = tampered(saved_model, tmp_path, old_style)
    with pytest.warns(DeprecationWarning) as record:
        back = LinearAttentionClassifier.load(folder)
    assert sorted({str(w.message).split(": ")[-1] for w in record}) == [
        "'depth' is deprecated, use 'num_layers'", "'heads' is deprecated, use 'num_heads'"]
    fresh = LinearAttentionClassifier.load(saved_model[0])
    assert back.get_params() == fresh.get_params()
    X = saved_model[1]
    np.testing.assert_array_equal(back.predict_proba(X), fresh.predict_proba(X))
    assert list(back.predict(X[:3])) == list(fresh.predict(X[:3]))


# -- device --------


def test_device_cpu_is_the_default_bit_for_bit():
    X, y = toy(n=40, length=20, n_classes=2)
    default = LinearAttentionClassifier(**TINY, random_state=1).fit(X, y)
    for device in ("cpu", torch.device("cpu")):
        clf = LinearAttentionClassifier(**TINY, random_state=1, device=device).fit(X, y)
        assert next(clf.model_.parameters()).device.type == "cpu"
        np.testing.assert_array_equal(clf.predict_proba(X), default.predict_proba(X))
        assert [r["train_loss"] for r in clf.history_] == \
            [r["train_loss"] for r in default.history_]


def test_cuda_without_cuda_is_one_line(monkeypatch):
    # what a machine without CUDA says (simulated where there is one)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    X, y = toy(n=20, length=16, n_classes=2)
    for device in ("cuda", "cuda:1"):
        with pytest.raises(ValueError, match=f"LinearAttentionClassifier: device '{device}': "
                                             "CUDA is not available .*use device='cpu'") as err:
            LinearAttentionClassifier(**TINY, device=device).fit(X, y)
        assert len(str(err.value).splitlines()) == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_fit_predict_save_load(tmp_path):  # pragma: no cover - run where CUDA is
    X, y = toy(n=40, length=20, n_classes=2)
    clf = LinearAttentionClassifier(**TINY, device="cuda").fit(X, y)
    assert next(clf.model_.parameters()).is_cuda
    proba = clf.predict_proba(X)
    clf.save(tmp_path / "m")
    back = LinearAttentionClassifier.load(tmp_path / "m")
    assert back.device == "cpu"
    np.testing.assert_allclose(back.predict_proba(X), proba, atol=1e-5)


def test_saved_model_loads_on_cpu_whatever_its_device(saved_model, tmp_path):
    # a model trained on a GPU records device "cuda": it still loads here, on the CPU
    folder = tampered(saved_model, tmp_path, put("params", "device", "cuda:3"))
    back = LinearAttentionClassifier.load(folder, device="cpu")
    assert back.device == "cpu" and next(back.model_.parameters()).device.type == "cpu"
    fresh = LinearAttentionClassifier.load(saved_model[0])
    assert fresh.device == "cpu"
    X = saved_model[1]
    np.testing.assert_array_equal(back.predict_proba(X), fresh.predict_proba(X))
    with pytest.raises(ValueError, match="LinearAttentionClassifier.load: device: not a torch "
                                         "device: 'bogus'"):
        LinearAttentionClassifier.load(saved_model[0], device="bogus")


def test_set_params_device_after_fit_is_checked():
    X, y = toy(n=20, length=16, n_classes=2)
    clf = LinearAttentionClassifier(**TINY).fit(X, y)
    clf.set_params(device="bogus")
    with pytest.raises(ValueError, match="device: not a torch device"):
        clf.predict(X)


# -- the UCR archive's variety: labels, class counts, lengths, sizes, balance, NaN --------

ONE_EPOCH = {**TINY, "epochs": 1}


@pytest.mark.parametrize("labels", [
    np.array(["walk", "run", "sit", "stand", "lie"]),  # strings, 5 classes
    np.array([-1, 7, 3, 12, 100]),  # integers, not 0..k-1
    np.array([1.0, 2.0, 3.0, 4.0, 5.0]),  # integral floats (non-integral ones are regression)
])
def test_label_types_and_many_classes(labels):
    X, y = toy(n=60, length=30, n_classes=5)
    clf = LinearAttentionClassifier(**ONE_EPOCH).fit(X, labels[y])
    assert clf.classes_.tolist() == sorted(labels.tolist())
    pred = clf.predict(X)
    assert pred.dtype == labels.dtype and set(pred) <= set(labels)
    assert clf.predict_proba(X).shape == (60, 5)


@pytest.mark.parametrize("length, patch", [(24, 4), (1751, 10)])
def test_short_and_long_series(length, patch):
    X, y = toy(n=20, length=length, n_classes=2)
    clf = LinearAttentionClassifier(**{**ONE_EPOCH, "patch": patch}).fit(X, y)
    assert clf.model_.config.tokens == -(-length // patch)
    assert clf.predict_proba(X).shape == (20, 2) and np.isfinite(clf.predict_proba(X)).all()


def test_tiny_imbalanced_training_set_with_singleton_classes():
    # 16 series in 4 classes of 1, 2, 4 and 9 (Fungi has one series per class; batch_size
    # 64 > n): the rare classes are still learned as classes and predicted as labels
    X, _ = toy(n=16, length=40, n_classes=2)
    y = np.repeat(np.array(["a", "b", "c", "d"]), [1, 2, 4, 9])
    clf = LinearAttentionClassifier(**{**ONE_EPOCH, "batch_size": 64}).fit(X, y)
    assert clf.classes_.tolist() == ["a", "b", "c", "d"]
    proba = clf.predict_proba(X)
    assert proba.shape == (16, 4) and np.allclose(proba.sum(1), 1)


def test_unequal_class_balance_is_learned():
    # 90% / 10%: the minority class must be recognised, not swallowed by the majority
    X, y = toy(n=200, length=24, n_classes=2, seed=3)
    keep = np.concatenate([np.flatnonzero(y == 0), np.flatnonzero(y == 1)[:20]])
    X, y = X[keep], y[keep]
    clf = LinearAttentionClassifier(**{**TINY, "epochs": 40, "lr": 3e-3}).fit(X, y)
    pred = clf.predict(X)
    assert np.mean(pred[y == 1] == 1) > 0.5 and np.mean(pred[y == 0] == 0) > 0.9


def nan_padded(seed=0):
    """Series of 20 to 36 samples NaN padded to 36 (the archive's variable-length layout), and
    the same series zero padded."""
    X, y = toy(n=40, length=36, n_classes=2, seed=seed)
    lengths = np.random.default_rng(seed).integers(20, 37, len(X))
    pad = np.arange(36) >= lengths[:, None]
    return np.where(pad, np.nan, X).astype(np.float32), np.where(pad, 0, X), y


def test_trailing_nan_padding_is_the_models_zero_padding():
    X_nan, X_zero, y = nan_padded()
    assert np.isnan(X_nan).any()
    a = LinearAttentionClassifier(**TINY).fit(X_nan, y, X_val=X_nan[:8], y_val=y[:8])
    b = LinearAttentionClassifier(**TINY).fit(X_zero, y, X_val=X_zero[:8], y_val=y[:8])
    untimed = [[{k: v for k, v in r.items() if k != "time_s"} for r in e.history_] for e in (a, b)]
    assert a.n_features_in_ == 36 and untimed[0] == untimed[1]  # the same run, bit for bit
    np.testing.assert_array_equal(a.predict_proba(X_nan), b.predict_proba(X_zero))
    np.testing.assert_array_equal(a.predict_proba(X_nan), a.predict_proba(X_zero))


def test_missing_values_inside_a_series_are_refused_in_one_line():
    X_nan, _, y = nan_padded()
    X_nan[5, 3] = np.nan
    with pytest.raises(ValueError, match=r"^X: row 5 has a missing value \(NaN\) at sample 3, "
                                         r"inside the series; pass missing='interpolate' or "
                                         r"impute first, .*SimpleImputer") as err:
        LinearAttentionClassifier(**TINY).fit(X_nan, y)
    assert len(str(err.value).splitlines()) == 1
    fitted = LinearAttentionClassifier(**ONE_EPOCH).fit(np.nan_to_num(X_nan), y)
    with pytest.raises(ValueError, match="X: row 5 has a missing value"):
        fitted.predict(X_nan)
    with pytest.raises(ValueError, match="X_val: row 5 has a missing value"):
        LinearAttentionClassifier(**ONE_EPOCH).fit(np.nan_to_num(X_nan), y, X_val=X_nan,
                                                   y_val=y)
    # what the message suggests works
    from sklearn.impute import SimpleImputer

    X, y = toy(n=30, length=20, n_classes=2)
    X[4, 7] = X[9, 0] = np.nan
    pipe = make_pipeline(SimpleImputer(), LinearAttentionClassifier(**ONE_EPOCH)).fit(X, y)
    assert pipe.predict(X).shape == (30,)


@pytest.mark.parametrize("row, match", [
    (np.full(16, np.nan), r"X: row 2 is all NaN \(an empty series\); drop it"),
    (np.r_[np.ones(8), np.inf, np.ones(7)], "Input X contains infinity"),  # scikit-learn's
    (np.r_[np.ones(8), np.nan, np.ones(6), np.nan], "X: row 2 has a missing value .NaN. at "
                                                     "sample 8"),
])
def test_other_non_finite_input_is_refused(row, match):
    X, y = toy(n=20, length=16, n_classes=2)
    X[2] = row
    with pytest.raises(ValueError, match=match):
        LinearAttentionClassifier(**ONE_EPOCH).fit(X, y)


def test_missing_interpolate_is_linear_interpolation_along_time():
    X_nan, X_zero, y = nan_padded(seed=1)
    X_nan[5, 3:6] = np.nan  # a gap of 3 samples inside row 5
    X_nan[9, 0] = np.nan  # a missing first value
    by_hand = X_zero.copy()
    by_hand[5, 3:6] = np.interp([3, 4, 5], [2, 6], X_zero[5, [2, 6]])
    by_hand[9, 0] = X_zero[9, 1]
    a = LinearAttentionClassifier(**TINY, missing="interpolate").fit(X_nan, y)
    b = LinearAttentionClassifier(**TINY).fit(by_hand.astype(np.float32), y)
    np.testing.assert_array_equal(a.predict_proba(X_nan), b.predict_proba(by_hand))


def test_min_steps_default_raises_the_epochs_of_small_data():
    assert LinearAttentionClassifier().get_params()["min_steps"] == DEFAULT_MIN_STEPS > 0
    assert LinearAttentionClassifier().get_params()["min_batches"] == DEFAULT_MIN_BATCHES
    X, y = toy(n=60)
    # 60 series in batches of 32: 2 steps an epoch; 1 epoch raised to 3 by a floor of 6 steps
    clf = LinearAttentionClassifier(**{**TINY, "epochs": 1, "min_steps": 6}).fit(X, y)
    assert len(clf.history_) == 3
    assert len(LinearAttentionClassifier(**{**TINY, "epochs": 1}).fit(X, y).history_) == 1
    # at least 6 batches: batches of 10, 6 steps an epoch, so a floor of 6 steps is 1 epoch
    assert len(LinearAttentionClassifier(**{**TINY, "epochs": 1, "min_steps": 6,
                                            "min_batches": 6}).fit(X, y).history_) == 1
    with pytest.raises(ValueError, match=r"min_steps must be in \[0, inf\)"):
        LinearAttentionClassifier(min_steps=-5).fit(X, y)


def test_config_saved_before_min_steps_loads_with_it_off(saved_model, tmp_path):
    folder, X = saved_model
    assert LinearAttentionClassifier.load(folder).get_params()["min_steps"] == 0  # TINY's
    edited = tampered(saved_model, tmp_path, lambda cfg: cfg["params"].update(min_steps=700))
    assert LinearAttentionClassifier.load(edited).get_params()["min_steps"] == 700
    edited = tampered(saved_model, tmp_path / "old", lambda cfg: cfg["params"].pop("min_steps"))
    old = LinearAttentionClassifier.load(edited)
    assert old.get_params()["min_steps"] == 0  # refitting it trains exactly its epochs
    edited = tampered(saved_model, tmp_path / "old2",
                      lambda cfg: cfg["params"].pop("min_batches"))
    assert LinearAttentionClassifier.load(edited).get_params()["min_batches"] == 0
    np.testing.assert_array_equal(old.predict_proba(X),
                                  LinearAttentionClassifier.load(folder).predict_proba(X))


# --- issue 24: non-finite weights, deep JSON, divergence, thread counts ---


def test_non_finite_weights_are_refused_at_load(saved_model, tmp_path):
    """A model whose weights hold a NaN used to load and predict one class for everything."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "m"
    shutil.copytree(saved_model[0], folder)
    w = load_file(str(folder / "model.safetensors"))
    w["blocks.0.mlp.0.weight"][1, 2] = float("nan")
    w["head.weight"][0, 0] = float("inf")
    save_file(w, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"model.safetensors: blocks.0.mlp.0.weight holds "
                                              r"non-finite values") as err:
        LinearAttentionClassifier.load(folder)
    assert str(err.value).startswith(str(folder / "model.safetensors"))


@pytest.mark.parametrize("data", [b"[" * 100_000 + b"]" * 100_000, b"\xff\xfe{", b""])
def test_unparsable_config_json_is_a_checkpoint_error(saved_model, tmp_path, data):
    folder = tmp_path / "m"
    shutil.copytree(saved_model[0], folder)
    (folder / "config.json").write_bytes(data)
    with pytest.raises(CheckpointError, match=r"config.json: not valid JSON"):
        LinearAttentionClassifier.load(folder)


def test_a_diverging_fit_raises_and_leaves_the_checkpoint_good(tmp_path):
    from linattn.train_loop import NonFiniteError, first_non_finite, read_checkpoint

    X, y = toy(n=40, length=16, n_classes=2)
    # one batch an epoch: a checkpoint after step 1, the loss NaN at step 2
    clf = LinearAttentionClassifier(**{**TINY, "epochs": 5, "batch_size": 64}, lr=1e30)
    with pytest.raises(NonFiniteError, match=r"^training diverged at step 2: the loss is nan.*"
                                             r"checkpoint.pt keeps step 1\)$"):
        clf.fit(X, y, checkpoint_dir=tmp_path / "ck")
    ck = read_checkpoint(tmp_path / "ck" / "checkpoint.pt")
    assert ck["step"] == 1 and first_non_finite(ck["model"]) is None


def test_thread_counts_are_capped_at_the_cpus(monkeypatch):
    """n_threads=10**9 aborted inside libgomp and 100000 crashed with SIGSEGV: counts above the
    CPUs available are capped with one warning (torch.set_num_threads is recorded here, not
    called with absurd counts)."""
    from linattn._config import available_cpus

    X, y = toy(n=20, length=16, n_classes=2)
    seen = []
    real = torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda n: seen.append(n) or real(min(n, 2)))
    with pytest.warns(RuntimeWarning, match=r"n_threads: 1000000000 threads asked for, .* using"):
        LinearAttentionClassifier(**{**TINY, "n_threads": 10**9}).fit(X, y)
    assert seen and seen[0] == available_cpus()
    with pytest.raises(ValueError, match="n_threads must be None or a positive integer"):
        LinearAttentionClassifier(**{**TINY, "n_threads": -1}).fit(X, y)


def test_thread_limit_holds_blas_to_n_threads_and_restores_it():
    """n_threads bounds the ridge heads' BLAS too (not only torch), and gives it back."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    from linattn.tsc.shared import ThreadLimit

    def blas_threads():
        return [d["num_threads"] for d in threadpoolctl.threadpool_info()
                if d["user_api"] == "blas"]

    np.ones((4, 4)) @ np.ones((4, 4))  # numpy's BLAS loaded
    before, torch_before = blas_threads(), torch.get_num_threads()
    if not before:
        pytest.skip("no BLAS library that threadpoolctl can see")
    with ThreadLimit(1):
        assert blas_threads() == [1] * len(before)
        assert torch.get_num_threads() == 1
    assert blas_threads() == before and torch.get_num_threads() == torch_before
    with ThreadLimit(None):  # None leaves both alone
        assert blas_threads() == before


def test_complex_series_are_one_line():
    """scikit-learn's own refusal of complex X ran to 15 lines."""
    X, y = toy(n=20, length=16, n_classes=2)
    with pytest.raises(ValueError, match=r"^LinearAttentionClassifier: Complex data not supported: "
                                         r"X holds complex\d+ values; the series must be real "
                                         r"numbers$"):
        LinearAttentionClassifier(**TINY).fit(X + 1j, y)
    est = LinearAttentionClassifier(**TINY).fit(X, y)
    with pytest.raises(ValueError, match=r"^LinearAttentionClassifier: Complex data not"):
        est.predict(X + 1j)


@pytest.mark.parametrize("bad", [np.zeros(16, np.float32), np.float32(3.0), None],
                         ids=["1-D", "scalar", "None"])
def test_x_that_is_not_two_dimensional_is_one_line(bad):
    """scikit-learn's refusal of a 1-D X spans three lines and prints the array (issue 51)."""
    X, y = toy(n=20, length=16, n_classes=2)
    want = r"^LinearAttentionClassifier: X must have shape \(n_series, length\), got \(.*\)"
    with pytest.raises(ValueError, match=want) as err:
        LinearAttentionClassifier(**ONE_EPOCH).fit(bad, y)
    assert "\n" not in str(err.value)
    clf = LinearAttentionClassifier(**ONE_EPOCH).fit(X, y)
    for call in (clf.predict, clf.predict_proba, lambda x: clf.score(x, y)):
        with pytest.raises(ValueError, match=want) as err:
            call(bad)
        assert "\n" not in str(err.value)


def test_finite_values_near_float32s_largest_give_no_numpy_warning():
    """scikit-learn's finiteness check sums X first: ±3e38 (finite float32) overflowed to
    inf - inf and numpy printed "invalid value encountered in reduce", a second line before
    `forda train`'s error (issue 51)."""
    X, y = toy(n=20, length=16, n_classes=2)
    X = np.where(np.arange(16) % 2, 3e38, -3e38).astype(np.float32) * np.ones_like(X)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with pytest.raises(ValueError, match="X: row 0: values up to 3e\\+38 overflow"):
            LinearAttentionClassifier(**ONE_EPOCH).fit(X, y)


def test_finite_input_too_large_for_the_model_is_named_not_nan():
    """Series of scale 1e20 (finite float32) overflow inside the fitted model: predict_proba
    returned NaN probabilities silently (issue 51); now a ValueError naming X."""
    X, y = toy(n=20, length=16, n_classes=2)
    clf = LinearAttentionClassifier(**ONE_EPOCH).fit(X, y)
    with pytest.raises(ValueError, match=r"^X: the model's outputs are not finite for 20 "
                                         r"series \(\|X\| up to 1\.\d+e\+20\)"):
        clf.predict_proba(X * np.float32(1e20))


def test_finite_series_that_overflow_the_model_are_named_before_training():
    """Finite float32 values near its largest (3e38) overflow the model's arithmetic: fit
    diverged at its first step and blamed the learning rate (issue 51 fifth probe); now a
    ValueError naming X's row, before any training, and ``overflowing_row`` says which."""
    X, y = toy(n=20, length=16, n_classes=2)
    X[5] = np.where(np.arange(16) % 2, 3e38, -3e38).astype(np.float32)
    clf = LinearAttentionClassifier(**ONE_EPOCH)
    assert clf.overflowing_row(X) == 5
    assert clf.overflowing_row(X[:5]) is None
    with pytest.raises(ValueError, match=r"^X: row 5: values up to 3e\+38 overflow the model's "
                                         r"float32 arithmetic before any training"):
        clf.fit(X, y)
    assert not hasattr(clf, "model_")


def test_activations_beyond_memory_are_refused_before_training():
    """num_heads=10**6: its parameters fit in memory, one batch's activations do not; fit
    (and forda train) ran for minutes (issue 51 fifth probe): now a ValueError naming it,
    before a model is built."""
    X, y = toy(n=20, length=400, n_classes=2)
    clf = LinearAttentionClassifier(**{**ONE_EPOCH, "num_heads": 10**6})
    clf.check_memory()  # the parameters alone fit
    with pytest.raises(ValueError, match=r"^LinearAttentionClassifier: num_heads: training "
                                         r"this model needs about [\d.]+ [GT]iB of memory"):
        clf.fit(X, y)
    assert not hasattr(clf, "model_")
