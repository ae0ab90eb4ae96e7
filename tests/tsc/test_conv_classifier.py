"""ConvAttentionClassifier: fits and predicts labels of any type, probabilities, the ablation
without the mixer, the ridge head alone agreeing with RidgeClassifierCV, scikit-learn's clone,
pipelines and estimator checks, and one-line errors."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pytest.importorskip("sklearn")

from sklearn.base import clone  # noqa: E402
from sklearn.linear_model import RidgeClassifierCV  # noqa: E402
from sklearn.utils.estimator_checks import check_estimator  # noqa: E402

from linattn.tsc import ConvAttentionClassifier  # noqa: E402
from linattn.tsc.conv_classifier import (  # noqa: E402
    RIDGE_ALPHAS,
    ridge_proba,
    token_net_proba,
)

FAST = {"steps": 30, "features": 400, "global_features": 2000, "difference_features": 1000}
#: The fourth configuration's ridge and join (no first differences, the heads' mean).
FOURTH = {"difference_features": 0, "net_weight": 0.5}
#: The first configuration: the ridge on the pooled tokens, no global token, temperature 3.
POOLED = {**FAST, **FOURTH, "global_features": 0, "global_token": False,
          "ridge_temperature": 3.0, "competing_groups": 0}


def test_check_estimator():
    """scikit-learn's own checks (parameters, cloning, fitted attributes, input validation and
    its messages, pickling, and the rest of its list), all passed; a small, fast configuration:
    the checks are about the API, not the accuracy."""
    est = ConvAttentionClassifier(steps=5, segments=2, features=84, quantiles=0,
                                  global_features=200, difference_features=100,
                                  competing_groups=2, d_model=8, num_heads=2, num_layers=1,
                                  n_threads=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = check_estimator(est, on_fail=None)
    assert len(results) > 40  # the whole list ran
    assert [f"{r['check_name']}: {r['exception']!r}" for r in results
            if r["status"] == "failed"] == []


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


def _saved_before(folder, *params: str):
    """Remove ``params`` from a saved model's config.json: a file saved before they existed."""
    import json

    cfg = json.loads((folder / "config.json").read_text())
    for name in params:
        del cfg["params"][name]
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def _without_tensor(folder, name: str):
    """Remove tensor ``name`` from a saved model's weights file: a damaged model."""
    from safetensors.torch import load_file, save_file

    weights = load_file(str(folder / "model.safetensors"))
    del weights[name]
    save_file(weights, str(folder / "model.safetensors"))
    return folder


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
    pool = ConvAttentionClassifier(num_layers=0, **POOLED).fit(X, y)
    assert len(pool.net_.blocks) == 0
    full = ConvAttentionClassifier(**POOLED).fit(X, y)
    assert len(full.net_.blocks) == 2
    # the ridge head: RidgeClassifierCV on the mean of the standardised tokens
    T = (full.tokens_.transform(X) - full.mean_) / full.scale_
    ref = RidgeClassifierCV(alphas=RIDGE_ALPHAS).fit(T.mean(1), (y == "late").astype(int))
    tol = 1e3 * np.finfo(np.float32).eps  # float32 tokens, float64 solve
    np.testing.assert_allclose(full.ridge_.decision_function(T.mean(1)),
                               ref.decision_function(T.mean(1)), rtol=tol, atol=tol)
    # the probabilities are the mean of the net's and the ridge head's
    both = (token_net_proba(full.net_, T) + ridge_proba(ref.decision_function(T.mean(1)),
                                                        ref.classes_, 2, 3.0)) / 2
    np.testing.assert_allclose(full.predict_proba(X), both, rtol=tol, atol=tol)
    no_ridge = ConvAttentionClassifier(ridge=False, **POOLED).fit(X, y)
    assert no_ridge.ridge_ is None  # the net's probabilities alone (same tokens, same scaling)
    np.testing.assert_allclose(no_ridge.predict_proba(X), token_net_proba(no_ridge.net_, T),
                               rtol=tol, atol=tol)
    # the heads apart: the net's and the ridge's, which predict_proba averages
    net, ridge, stem = full.head_probas(X)
    assert stem is None  # no stem net by default
    np.testing.assert_allclose(net, token_net_proba(full.net_, T), rtol=tol, atol=tol)
    np.testing.assert_allclose(ridge, ridge_proba(ref.decision_function(T.mean(1)),
                                                  ref.classes_, 2, 3.0), rtol=tol, atol=tol)
    assert no_ridge.head_probas(X)[1] is None


def test_a_richer_global_ridge_head_and_an_ensemble_of_nets():
    from linattn.tsc.conv_tokens import ConvTokens

    X, y = _two_shapes(30)
    clf = ConvAttentionClassifier(**{**POOLED, "global_features": 2000, "n_nets": 2}).fit(X, y)
    assert len(clf.nets_) == 2 and clf.net_ is clf.nets_[0]
    w0, w1 = (dict(n.named_parameters())["head.weight"] for n in clf.nets_)
    assert not np.allclose(w0.detach(), w1.detach())  # two seeds, two nets
    # the ridge reads one-segment tokens of its own, standardised with the training mean/spread
    G = ConvTokens(1, 2000, clf.quantiles, random_state=0).fit(X).transform(X)[:, 0]
    assert G.shape[1] == clf.global_tokens_.n_features > clf.tokens_.n_features
    G = (G - G.mean(0)) / (G.std(0) + 1e-3)
    ref = RidgeClassifierCV(alphas=RIDGE_ALPHAS).fit(G, (y == "late").astype(int))
    tol = 1e3 * np.finfo(np.float32).eps
    np.testing.assert_allclose(clf.ridge_.decision_function(G), ref.decision_function(G),
                               rtol=tol, atol=tol)
    T = (clf.tokens_.transform(X) - clf.mean_) / clf.scale_
    nets = (token_net_proba(clf.nets_[0], T) + token_net_proba(clf.nets_[1], T)) / 2
    both = (nets + ridge_proba(ref.decision_function(G), ref.classes_, 2, 3.0)) / 2
    np.testing.assert_allclose(clf.predict_proba(X), both, rtol=tol, atol=tol)
    # a global token: the nets read the same standardised global features as the ridge, and the
    # ridge's softmax is sharpened by ridge_temperature
    tok = ConvAttentionClassifier(**{**POOLED, "global_features": 2000, "global_token": True,
                                     "ridge_temperature": 10.0}).fit(X, y)
    assert tok.net_.global_embed[1].in_features == G.shape[1]
    net = token_net_proba(tok.net_, T, global_features=G)
    both = (net + ridge_proba(ref.decision_function(G), ref.classes_, 2, 10.0)) / 2
    np.testing.assert_allclose(tok.predict_proba(X), both, rtol=tol, atol=tol)
    with pytest.raises(ValueError, match="global_token needs global_features > 0"):
        ConvAttentionClassifier(**{**FAST, "global_features": 0}).fit(X, y)
    with pytest.raises(ValueError, match="ridge_temperature must be a finite number > 0"):
        ConvAttentionClassifier(ridge_temperature=0.0, **FAST).fit(X, y)
    with pytest.raises(ValueError, match="n_nets must be an integer >= 1"):
        ConvAttentionClassifier(n_nets=0, **FAST).fit(X, y)
    with pytest.raises(ValueError, match="global_features must be an integer >= 0"):
        ConvAttentionClassifier(**{**FAST, "global_features": -1}).fit(X, y)


def test_competing_kernel_counts_join_the_ridge_heads_features(tmp_path):
    from linattn.tsc.competing import CompetingKernels
    from linattn.tsc.conv_tokens import ConvTokens

    X, y = _two_shapes(30)
    clf = ConvAttentionClassifier(**{**FAST, **FOURTH, "competing_groups": 4}).fit(X, y)
    # the ridge reads [global PPV features, competing-kernel counts], each standardised with
    # the training mean and spread, in that order
    G = ConvTokens(1, 2000, clf.quantiles, random_state=0).fit(X).transform(X)[:, 0]
    H = CompetingKernels(4, random_state=0).fit(X).transform(X)
    assert H.shape[1] == clf.competing_.n_features
    both = np.hstack([(G - G.mean(0)) / (G.std(0) + 1e-3), (H - H.mean(0)) / (H.std(0) + 1e-3)])
    ref = RidgeClassifierCV(alphas=RIDGE_ALPHAS).fit(both, (y == "late").astype(int))
    tol = 1e3 * np.finfo(np.float32).eps
    np.testing.assert_allclose(clf.ridge_.decision_function(both), ref.decision_function(both),
                               rtol=tol, atol=tol)
    T = (clf.tokens_.transform(X) - clf.mean_) / clf.scale_
    Gs = (G - clf.global_mean_) / clf.global_scale_  # the net's global token: PPV features only
    want = (token_net_proba(clf.net_, T, global_features=Gs)
            + ridge_proba(ref.decision_function(both), ref.classes_, 2, clf.ridge_temperature)) / 2
    np.testing.assert_allclose(clf.predict_proba(X), want, rtol=tol, atol=tol)
    back = ConvAttentionClassifier.load(clf.save(tmp_path / "m"))
    np.testing.assert_array_equal(back.predict_proba(X), clf.predict_proba(X))
    from linattn.train_loop import CheckpointError

    with pytest.raises(CheckpointError, match=r"competing.weights.\*: expected"):
        ConvAttentionClassifier.load(_without_tensor(tmp_path / "m", "competing.weights.0"))
    # without global features the counts sit beside the pooled tokens; a refit without counts
    # drops them
    pooled = ConvAttentionClassifier(**{**POOLED, "competing_groups": 4}).fit(X, y)
    assert pooled.ridge_.coef.shape[1] == pooled.tokens_.n_features + H.shape[1]
    back = ConvAttentionClassifier.load(pooled.save(tmp_path / "pooled"))
    np.testing.assert_array_equal(back.predict_proba(X), pooled.predict_proba(X))
    assert pooled.set_params(competing_groups=0).fit(X, y).competing_ is None
    with pytest.raises(ValueError, match="competing_groups must be 0 or even"):
        ConvAttentionClassifier(**{**FAST, "competing_groups": 3}).fit(X, y)
    # a file saved before competing_groups existed (no such key) loads as a model without them
    fitted = ConvAttentionClassifier(**{**FAST, "competing_groups": 0}).fit(X, y)
    back = ConvAttentionClassifier.load(_saved_before(fitted.save(tmp_path / "old"),
                                                      "competing_groups"))
    assert back.competing_groups == 0 and back.competing_ is None
    np.testing.assert_array_equal(back.predict_proba(X), fitted.predict_proba(X))
    # without a ridge head nothing reads them, and they are not computed
    assert ConvAttentionClassifier(**{**FAST, "ridge": False}).fit(X, y).competing_ is None


def test_first_differences_join_the_ridge_and_net_weight_weighs_the_heads(tmp_path):
    from linattn.train_loop import CheckpointError
    from linattn.tsc.competing import CompetingKernels
    from linattn.tsc.conv_tokens import ConvTokens

    X, y = _two_shapes(30)
    params = {**FAST, "competing_groups": 4, "difference_features": 300, "net_weight": 0.25}
    clf = ConvAttentionClassifier(**params).fit(X, y)
    # the ridge reads [global PPV, competing counts, the first differences' PPV (no
    # quantiles)], each standardised with its training mean and spread, in that order
    dX = np.ascontiguousarray(np.diff(X, axis=1))
    parts = [ConvTokens(1, 2000, clf.quantiles, random_state=0).fit(X).transform(X)[:, 0],
             CompetingKernels(4, random_state=0).fit(X).transform(X),
             ConvTokens(1, 300, 0, random_state=0).fit(dX).transform(dX)[:, 0]]
    assert parts[2].shape[1] == clf.difference_tokens_.n_features
    both = np.hstack([(P - P.mean(0)) / (P.std(0) + 1e-3) for P in parts])
    assert clf.ridge_.coef.shape[1] == both.shape[1]
    ref = RidgeClassifierCV(alphas=RIDGE_ALPHAS).fit(both, (y == "late").astype(int))
    tol = 1e3 * np.finfo(np.float32).eps
    np.testing.assert_allclose(clf.ridge_.decision_function(both), ref.decision_function(both),
                               rtol=tol, atol=tol)
    # net_weight weighs the nets against the ridge; 1 and 0 leave one head alone
    nets, ridge, stem = clf.head_probas(X)
    assert stem is None
    np.testing.assert_allclose(clf.predict_proba(X), 0.25 * nets + 0.75 * ridge,
                               rtol=tol, atol=tol)
    np.testing.assert_allclose(
        ridge, ridge_proba(ref.decision_function(both), ref.classes_, 2, clf.ridge_temperature),
        rtol=tol, atol=tol)
    np.testing.assert_array_equal(clf.set_params(net_weight=1.0).predict_proba(X), nets)
    np.testing.assert_array_equal(clf.set_params(net_weight=0.0).predict_proba(X), ridge)
    clf.set_params(net_weight=0.25)
    back = ConvAttentionClassifier.load(clf.save(tmp_path / "m"))
    assert (back.difference_features, back.net_weight) == (300, 0.25)
    np.testing.assert_array_equal(back.predict_proba(X), clf.predict_proba(X))
    with pytest.raises(CheckpointError, match=r"difference_tokens.mean"):
        ConvAttentionClassifier.load(_without_tensor(tmp_path / "m", "difference_tokens.mean"))
    # a file saved before the two parameters existed loads as a model without differences,
    # joined evenly
    fitted = ConvAttentionClassifier(**{**FAST, **FOURTH}).fit(X, y)
    back = ConvAttentionClassifier.load(_saved_before(fitted.save(tmp_path / "old"),
                                                      "difference_features", "net_weight"))
    assert back.difference_tokens_ is None and back.net_weight == 0.5
    np.testing.assert_array_equal(back.predict_proba(X), fitted.predict_proba(X))
    # without a ridge head nothing reads the differences, and they are not computed
    no_ridge = ConvAttentionClassifier(**{**params, "ridge": False}).fit(X, y)
    assert no_ridge.difference_tokens_ is None
    for bad, match in (({"net_weight": 1.5}, r"net_weight must be a finite number in \[0, 1\]"),
                       ({"net_weight": float("nan")}, "net_weight must be"),
                       ({"difference_features": -1},
                        "difference_features must be an integer >= 0")):
        with pytest.raises(ValueError, match=match):
            ConvAttentionClassifier(**{**params, **bad}).fit(X, y)
    with pytest.raises(ValueError, match="difference_features > 0 needs series of at least 2"):
        ConvAttentionClassifier(**params).fit(X[:, :1], y)


def test_one_ridge_temperature_default_the_published_results_used():
    """ridge_proba's default and the estimator's are one number, 5: the value every
    published UCR row was fitted with (benchmarks/ucr_results.json keeps the TEST rows;
    docs/experiments.md, round 4)."""
    import inspect

    from linattn.tsc.heads import RIDGE_TEMPERATURE

    assert RIDGE_TEMPERATURE == 5.0
    assert ConvAttentionClassifier().ridge_temperature == RIDGE_TEMPERATURE
    default = inspect.signature(ridge_proba).parameters["temperature"].default
    assert default == RIDGE_TEMPERATURE
    d = np.array([0.1, -1.0])
    np.testing.assert_allclose(ridge_proba(d), ridge_proba(d, temperature=5.0))


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
                       # issue 51 probe: beyond float32, a traceback from inside the optimiser
                       ({"lr": 1e300}, "lr must be a finite number > 0 that float32 holds"),
                       ({"weight_decay": 1e300}, "weight_decay must be a finite number >= 0 "
                        "that float32 holds"),
                       ({"random_state": "a"}, "random_state must be None or an int")):
        with pytest.raises(ValueError, match=match):
            ConvAttentionClassifier(**{**FAST, **bad}).fit(X, y)
    # None seeds as 0, and NumPy integers are integers
    a = ConvAttentionClassifier(random_state=None, **FAST).fit(X, y).predict_proba(X)
    b = ConvAttentionClassifier(random_state=np.int64(0), **FAST).fit(X, y).predict_proba(X)
    tol = 1e3 * np.finfo(np.float32).eps
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


def test_save_and_load_give_the_same_predictions(tmp_path):
    X, y = _two_shapes(30)
    for i, params in enumerate(({}, {"n_nets": 2, "global_token": False}, {"ridge": False},
                                POOLED, {**POOLED, "ridge": False})):
        clf = ConvAttentionClassifier(**{**FAST, **params}).fit(X, y)
        back = ConvAttentionClassifier.load(clf.save(tmp_path / str(i)))
        assert back.get_params() == clf.get_params()
        assert back.classes_.tolist() == ["early", "late"] and back.n_features_in_ == 60
        np.testing.assert_array_equal(back.predict_proba(X), clf.predict_proba(X))


def test_save_and_load_with_three_classes(tmp_path):
    X, y = _two_shapes(30)
    X[::3] = X[::3][:, ::-1]  # a third class: the series reversed
    y = y.astype(object)
    y[::3] = "reversed"
    clf = ConvAttentionClassifier(**FAST).fit(X, y.astype(str))
    back = ConvAttentionClassifier.load(clf.save(tmp_path / "m"))
    assert back.classes_.tolist() == ["early", "late", "reversed"]
    assert back.ridge_.alpha_ == clf.ridge_.alpha_ and back.ridge_.coef.shape[0] == 3
    np.testing.assert_array_equal(back.predict_proba(X), clf.predict_proba(X))


def test_load_refuses_damaged_models_in_one_line(tmp_path):
    import json

    from safetensors.torch import load_file, save_file

    from linattn.train_loop import CheckpointError

    X, y = _two_shapes(20)
    good = ConvAttentionClassifier(**FAST).fit(X, y).save(tmp_path / "m")
    cfg = json.loads((good / "config.json").read_text())
    weights = load_file(str(good / "model.safetensors"))

    def damaged(config=None, tensors=None):
        d = tmp_path / f"d{len(list(tmp_path.iterdir()))}"
        d.mkdir()
        (d / "config.json").write_text(json.dumps(config or cfg))
        save_file(tensors if tensors is not None else weights, str(d / "model.safetensors"))
        return d

    nan = dict(weights)
    nan["nets.0.head.weight"] = nan["nets.0.head.weight"] * float("nan")
    wrong_shape = dict(weights)
    wrong_shape["ridge.coef"] = wrong_shape["ridge.coef"][:, :5].contiguous()
    edited = {name: dict(weights) for name in ("edges", "classes", "extra", "dtype")}
    edited["edges"]["tokens.edges"] = weights["tokens.edges"].flip(0).contiguous()
    edited["classes"]["ridge.classes"] = weights["ridge.classes"].flip(0).contiguous()
    edited["extra"]["nets.0.extra"] = weights["nets.0.head.bias"].clone()
    edited["dtype"]["nets.0.head.weight"] = weights["nets.0.head.weight"].double()
    params = cfg["params"]
    cases = [
        (damaged(tensors=edited["edges"]), "tokens.edges: not those of these parameters"),
        (damaged(tensors=edited["classes"]), r"and classes 0..1 \(int64\)"),
        (damaged(tensors=edited["extra"]), "unexpected tensor nets.0.extra"),
        (damaged(tensors=edited["dtype"]), "nets.0.head.weight: expected torch.float32"),
        (damaged({**cfg, "ridge_alpha": 10 ** 400}), "ridge_alpha must be a finite number > 0"),
        (damaged({**cfg, "params": {k: v for k, v in params.items() if k != "n_nets"}}),
         r"params: missing keys \['n_nets'\]"),
        (damaged({**cfg, "params": {**params, "ridge": "no"}}), "ridge must be True or False"),
        (damaged({**cfg, "params": {**params, "missing": "x"}}), "missing must be one of"),
        (damaged({**cfg, "params": {**params, "dropout": 10 ** 400}}), "dropout must be"),
        (damaged({**cfg, "classes": "ab"}), "classes must be a list of at least 2 labels"),
        (tmp_path / "nowhere", "no such model folder"),
        (damaged({**cfg, "format": "other"}), "not a linattn.tsc.ConvAttentionClassifier"),
        (damaged({**cfg, "params": {**cfg["params"], "steps": 0}}), "steps must be an integer"),
        (damaged({**cfg, "params": {**cfg["params"], "bogus": 1}}), r"unknown keys \['bogus'\]"),
        (damaged({k: v for k, v in cfg.items() if k != "classes"}), "missing key 'classes'"),
        (damaged(tensors={k: v for k, v in weights.items() if k != "tokens.edges"}),
         "missing tensor tokens.edges"),
        (damaged(tensors=nan), "nets.0.head.weight holds non-finite values"),
        (damaged(tensors=wrong_shape), r"ridge.\*: expected float32 coef \(1, "),
        (damaged(tensors={**weights, "nets.1.head.bias": weights["nets.0.head.bias"].clone()}),
         "unexpected tensor nets.1.head.bias"),
        (damaged({**cfg, "params": {**cfg["params"], "d_model": 32}}),
         r"model.safetensors: nets.0.embed.1.weight: expected shape \(32, "),
    ]
    for folder, match in cases:
        with pytest.raises(CheckpointError, match=match) as err:
            ConvAttentionClassifier.load(folder)
        assert "\n" not in str(err.value)
    (good / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(CheckpointError, match="corrupt weights file"):
        ConvAttentionClassifier.load(good)


def test_members_average_whole_models_at_consecutive_seeds(tmp_path):
    import json

    from safetensors.torch import load_file, save_file

    from linattn.train_loop import CheckpointError

    X, y = _two_shapes(30)
    params = {**FAST, "competing_groups": 4}
    ens = ConvAttentionClassifier(n_members=3, random_state=5, **params).fit(X, y)
    assert len(ens.members_) == 2 and ens.get_params()["n_members"] == 3
    singles = [ConvAttentionClassifier(random_state=s, **params).fit(X, y) for s in (5, 6, 7)]
    tol = 1e3 * np.finfo(np.float32).eps
    # member m is the estimator at random_state + m; the ensemble, their mean
    np.testing.assert_allclose(ens.predict_proba(X),
                               np.mean([s.predict_proba(X) for s in singles], 0),
                               rtol=tol, atol=tol)
    ridge = ens.head_probas(X).ridge
    np.testing.assert_allclose(ridge, np.mean([s.head_probas(X)[1] for s in singles], 0),
                               rtol=tol, atol=tol)
    assert not np.allclose(singles[0].predict_proba(X), singles[1].predict_proba(X))
    import torch

    for model, single in zip((ens, *ens.members_), singles, strict=True):  # exactly
        mine, theirs = model._tensors(), single._tensors()
        assert mine.keys() == theirs.keys()
        assert all(torch.equal(mine[k], theirs[k]) for k in mine)
        assert model.ridge_.alpha_ == single.ridge_.alpha_
    np.testing.assert_array_equal(ens.members_[1].predict_proba(X), singles[2].predict_proba(X))
    # saved and loaded whole
    back = ConvAttentionClassifier.load(ens.save(tmp_path / "m"))
    assert back.get_params() == ens.get_params() and len(back.members_) == 2
    np.testing.assert_array_equal(back.predict_proba(X), ens.predict_proba(X))
    w_path, cfg_path = tmp_path / "m" / "model.safetensors", tmp_path / "m" / "config.json"
    weights = load_file(str(w_path))
    cut = dict(weights)
    del cut["members.2.ridge.coef"]
    save_file(cut, str(w_path))
    with pytest.raises(CheckpointError,
                       match=r"member 2 \(tensors members\.2\.\*\): missing tensor ridge\.coef"):
        ConvAttentionClassifier.load(tmp_path / "m")
    save_file({**weights, "members.3.ridge.coef": weights["ridge.coef"].clone()}, str(w_path))
    with pytest.raises(CheckpointError, match=r"unexpected tensor members\.3\.ridge\.coef"):
        ConvAttentionClassifier.load(tmp_path / "m")
    save_file(weights, str(w_path))
    cfg = json.loads(cfg_path.read_text())
    cfg["member_ridge_alphas"] = cfg["member_ridge_alphas"][:1]
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="member_ridge_alphas must be a list of 2"):
        ConvAttentionClassifier.load(tmp_path / "m")
    cfg["member_ridge_alphas"] = [cfg["member_ridge_alphas"][0], -1.0]
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"member_ridge_alphas\[1\] must be"):
        ConvAttentionClassifier.load(tmp_path / "m")
    # one member is the plain estimator, with nothing of members in its files; a file from
    # before n_members existed loads as one model, and a stray member alpha is refused
    one = ConvAttentionClassifier(**params).fit(X, y)
    assert one.members_ == []
    cfg_path = one.save(tmp_path / "one") / "config.json"
    cfg = json.loads(cfg_path.read_text())
    assert "member_ridge_alphas" not in cfg
    del cfg["params"]["n_members"]
    cfg_path.write_text(json.dumps(cfg))
    back = ConvAttentionClassifier.load(tmp_path / "one")
    assert back.n_members == 1 and back.members_ == []
    np.testing.assert_array_equal(back.predict_proba(X), one.predict_proba(X))
    cfg_path.write_text(json.dumps({**cfg, "member_ridge_alphas": [1.0]}))
    with pytest.raises(CheckpointError, match="member_ridge_alphas given but n_members is 1"):
        ConvAttentionClassifier.load(tmp_path / "one")
    with pytest.raises(ValueError, match="n_members must be an integer >= 1"):
        ConvAttentionClassifier(n_members=0, **FAST).fit(X, y)


def test_a_stem_net_joins_the_heads_and_saves_with_them(tmp_path):

    import torch
    from safetensors.torch import load_file, save_file

    from linattn.train_loop import CheckpointError
    from linattn.tsc.conv_classifier import stem_net_proba, train_stem_net

    X, y = _two_shapes(30)
    clf = ConvAttentionClassifier(stem=True, **FAST).fit(X, y)
    heads = clf.head_probas(X)
    tol = 1e3 * np.finfo(np.float32).eps
    np.testing.assert_allclose(heads.stem, stem_net_proba(clf.stem_net_, X), rtol=tol, atol=tol)
    # the token nets and the ridge averaged, then that and the stem net's averaged
    # the nets and the ridge joined at net_weight, then the stem beside that at 1/2
    joined = clf.net_weight * heads.nets + (1 - clf.net_weight) * heads.ridge
    np.testing.assert_allclose(clf.predict_proba(X), (joined + heads.stem) / 2, rtol=tol,
                               atol=tol)
    # the stem net is train_stem_net at the estimator's seed and training parameters
    ref = train_stem_net(X, (y == "late").astype(np.int64), 2, steps=FAST["steps"], seed=0)
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(clf.stem_net_.state_dict()[k], v)
    # without it the other heads are unchanged (the stem draws no random numbers of theirs)
    plain = ConvAttentionClassifier(**FAST).fit(X, y).head_probas(X)
    assert plain.stem is None and clf.stem_net_ is not None
    np.testing.assert_allclose(plain.nets, heads.nets, rtol=tol, atol=tol)
    np.testing.assert_allclose(plain.ridge, heads.ridge, rtol=tol, atol=tol)
    # a reversed view (negative strides) is read like any array
    rev = ConvAttentionClassifier(stem=True, **FAST).fit(X[:, ::-1], y)
    np.testing.assert_allclose(rev.predict_proba(X[:, ::-1]),
                               rev.predict_proba(X[:, ::-1].copy()), rtol=tol, atol=tol)
    with pytest.raises(ValueError, match="stem=True needs series of at least 2 samples, got 1"):
        ConvAttentionClassifier(stem=True, **FAST).fit(X[:, :1], y)
    # the ablation removes the mixer from the stem net too
    assert len(ConvAttentionClassifier(stem=True, num_layers=0, **FAST).fit(X, y)
               .stem_net_.blocks) == 0
    with pytest.raises(ValueError, match="stem must be True or False, got 1"):
        ConvAttentionClassifier(stem=1, **FAST).fit(X, y)
    # saved and loaded whole; a damaged stem is named in one line
    good = clf.save(tmp_path / "m")
    back = ConvAttentionClassifier.load(good)
    np.testing.assert_array_equal(back.predict_proba(X), clf.predict_proba(X))
    weights = load_file(str(good / "model.safetensors"))
    no_stem = _saved_before(ConvAttentionClassifier(**FAST).fit(X, y).save(tmp_path / "plain"),
                            "stem")  # a file saved before the stem net existed
    assert ConvAttentionClassifier.load(no_stem).stem is False
    plain_weights = load_file(str(no_stem / "model.safetensors"))
    for i, (tensors, match) in enumerate((
            ({k: v for k, v in weights.items() if k != "stem.head.weight"},
             "stem.head.weight: expected torch.float32 of shape .* got nothing"),
            ({**plain_weights, "stem.head.bias": weights["stem.head.bias"]},
             "unexpected tensor stem.head.bias"))):
        d = tmp_path / f"d{i}"
        d.mkdir()
        (d / "config.json").write_text((good if i == 0 else no_stem).joinpath(
            "config.json").read_text())
        save_file(tensors, str(d / "model.safetensors"))
        with pytest.raises(CheckpointError, match=match) as err:
            ConvAttentionClassifier.load(d)
        assert "\n" not in str(err.value)


def test_members_carry_their_own_stem_nets(tmp_path):
    X, y = _two_shapes(20)
    params = {**FAST, "stem": True, "random_state": 3}
    ens = ConvAttentionClassifier(n_members=2, **params).fit(X, y)
    singles = [ConvAttentionClassifier(**{**params, "random_state": s}).fit(X, y) for s in (3, 4)]
    tol = 1e3 * np.finfo(np.float32).eps
    stems = [s.head_probas(X).stem for s in singles]
    assert not np.allclose(*stems)  # member 1 trains its stem at random_state + 1
    np.testing.assert_allclose(ens.head_probas(X).stem, np.mean(stems, 0), rtol=tol, atol=tol)
    back = ConvAttentionClassifier.load(ens.save(tmp_path / "m"))
    assert back.members_[0].stem_net_ is not None
    np.testing.assert_array_equal(back.predict_proba(X), ens.predict_proba(X))


@pytest.mark.parametrize("name, value", [("features", 10**12), ("global_features", 10**12),
                                         ("segments", 10**9)])
def test_absurd_sizes_are_refused_before_anything_is_allocated(name, value):
    """features=10**12 allocated until the OOM killer came (137): now one ValueError naming
    the parameter."""
    X, y = _two_shapes(20)
    with pytest.raises(ValueError, match=rf"^ConvAttentionClassifier.fit: {name}: fitting "
                                         r"this model needs about "):
        ConvAttentionClassifier(**{**FAST, name: value}).fit(X, y)


@pytest.mark.parametrize("seed", [2**70, -1])
def test_a_seed_the_generators_cannot_take_is_named(seed):
    X, y = _two_shapes(20)
    with pytest.raises(ValueError, match=r"^ConvAttentionClassifier.fit: random_state: expected "
                                         r"an integer in \[0, 4294967295\]"):
        ConvAttentionClassifier(**{**FAST, "random_state": seed}).fit(X, y)


def test_an_unfitted_model_is_not_fitted_for_every_method(tmp_path):
    """predict read classes_ before predict_proba checked the fit: AttributeError."""
    from sklearn.exceptions import NotFittedError

    X, y = _two_shapes(4)
    est = ConvAttentionClassifier(**FAST)
    for call in (est.predict, est.predict_proba, est.head_probas, lambda X: est.score(X, y),
                 lambda X: est.save(tmp_path / "m")):
        with pytest.raises(NotFittedError):
            call(X)


def test_no_series_and_complex_series_are_named():
    """0 rows said 'y has one class'; complex X lost its imaginary part silently."""
    X, y = _two_shapes(20)
    with pytest.raises(ValueError, match=r"^ConvAttentionClassifier.fit: X has 0 series; "
                                         r"fitting needs at least 2 \(found 0 sample\(s\)\)$"):
        ConvAttentionClassifier(**FAST).fit(X[:0], y[:0])
    with pytest.raises(ValueError, match=r"^ConvAttentionClassifier.fit: Complex data not "
                                         r"supported: X holds complex\d+ values"):
        ConvAttentionClassifier(**FAST).fit(X + 1j, y)
