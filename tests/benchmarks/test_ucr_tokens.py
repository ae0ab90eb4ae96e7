"""benchmarks/ucr_tokens.py: the inner split, the ridge scores, the summary's arithmetic, and
a run on a hand-made dataset that never touches its TEST split."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("sklearn")


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark("ucr_tokens")


def test_inner_split_is_disjoint_and_stratified(bench):
    y = np.repeat([0, 1, 2], [10, 20, 30])
    tr, va = bench.inner_split(y)
    assert not set(tr) & set(va) and len(tr) + len(va) == 60
    assert np.bincount(y[va]).tolist() == [3, 6, 9]
    tr, va = bench.inner_split(np.array([0, 1, 1, 1, 1, 1, 1]))  # a class of one: unstratified
    assert len(tr) + len(va) == 7
    y = np.repeat(np.arange(5), 2)  # 5 classes of 2: a 30 % part of 3 cannot hold them all
    tr, va = bench.inner_split(y)
    assert (len(tr), len(va)) == (7, 3)


def test_summary_counts(bench):
    res = {"datasets": {
        "A": {"accuracy": {"ridge": 0.5, "attn": 0.7, "pool": 0.6, "attn+ridge": 0.7,
                           "pool+ridge": 0.6}, "transform_s": 1, "ridge_s": 1, "attn_s": 1,
              "pool_s": 1},
        "B": {"accuracy": {"ridge": 0.9, "attn": 0.8, "pool": 0.8, "attn+ridge": 0.9,
                           "pool+ridge": 0.9}, "transform_s": 1, "ridge_s": 1, "attn_s": 1,
              "pool_s": 1},
        "FordB": {"accuracy": {v: 0.0 for v in bench.VARIANTS}}}}
    text = bench.summary(res)
    assert "on 2 datasets" in text
    assert "| attn | 0.7500 |" in text and "| ridge | 0.7000 |" in text
    assert "attn against pool: W/T/L 1/1/0, mean difference +0.0500" in text
    assert "fit time, all variants: 8 s" in text


class _Unread:
    """A TEST split that fails the run if anything reads it."""

    def __getattr__(self, name):
        raise AssertionError("the TEST split was read")

    def __array__(self, *a, **k):
        raise AssertionError("the TEST split was read")


@pytest.fixture
def made_up(bench, monkeypatch):
    """"Made": 12 noisy sines against 12 noisy cosines of 30 points, its TEST unreadable, and
    every round's fits shrunk to a few steps and small feature counts."""
    import linattn.datasets as ds

    g = np.random.default_rng(0)
    X = np.concatenate([np.sin(np.linspace(0, 8, 30))[None] + 0.1 * g.standard_normal((12, 30)),
                        np.cos(np.linspace(0, 8, 30))[None] + 0.1 * g.standard_normal((12, 30))])
    y = np.array(["a"] * 12 + ["b"] * 12)
    monkeypatch.setattr(ds, "load_ucr", lambda name, download=False: (X.astype(np.float32), y,
                                                                      _Unread(), _Unread()))
    monkeypatch.setattr(bench, "STEPS", 5)
    monkeypatch.setattr(bench, "RIDGE_FEATURES", 1000)
    monkeypatch.setattr(bench, "LONG_STEPS", 5)
    monkeypatch.setattr(bench, "ESTIMATOR_PARAMS", {"steps": 5, "global_features": 1000,
                                                    "competing_groups": 4})


@pytest.mark.parametrize("rnd", [2, 3, 4, 5, 6, 7, 8, 9, 10, 11])
def test_later_rounds_summaries_name_their_own_variants(bench, rnd):
    variants = bench.ROUND_VARIANTS[rnd]
    assert {v for pair in bench.PAIRS[rnd] for v in pair} <= set(variants)
    res = {"datasets": {"A": {"accuracy": {v: 0.5 for v in variants}, "transform_s": 2,
                              "weight": 0.25}}}
    text = bench.summary(res)
    assert all(f"| {v} | 0.5000 |" in text for v in variants)
    assert "fit time, all variants: 2 s" in text
    assert ("ridgeSel chose" in text) == (rnd == 5)


def test_round_5_summary_counts_the_datasets_where_the_joined_head_was_chosen(bench):
    acc = {v: 0.5 for v in bench.VARIANTS_5}
    res = {"datasets": {n: {"accuracy": acc, "chosen": c}
                        for n, c in (("A", "ridgeHR"), ("B", "ridgeH"), ("C", "ridgeHR"))}}
    assert "ridgeSel chose ridgeHR on 2 of 3 datasets" in bench.summary(res)


def test_series_features_are_the_values_and_their_differences(bench):
    X = np.array([[1.0, 3.0, 2.0], [0.0, 0.0, 5.0]])
    np.testing.assert_array_equal(bench._series_features(X),
                                  [[1, 3, 2, 2, -1], [0, 0, 5, 0, 5]])


@pytest.mark.parametrize("rnd", [1, 2, 3, 4, 5, 6, 7])
def test_run_on_a_made_up_dataset_never_reads_test(bench, tmp_path, monkeypatch, made_up,
                                                   rnd):
    out = tmp_path / "r.json"
    args = ["--datasets", "Made", "--results", str(out), "--round", str(rnd)]
    assert bench.main(args) == 0
    row = json.loads(out.read_text())["datasets"]["Made"]
    assert (row["train"], row["validation"], row["classes"]) == (16, 8, 2)
    variants = bench.ROUND_VARIANTS[rnd]
    assert set(row["accuracy"]) == set(variants)
    ridge = {1: "ridge", 5: "ridgeH", 6: "ridge0", 7: "ridge"}.get(rnd, "ridge10k")
    if rnd in (6, 7):  # a sure ridge outvotes a net of 5 steps: every variant separates them
        assert row["accuracy"] == {v: 1.0 for v in variants}
    else:  # sine against cosine: the ridge head separates them
        assert row["accuracy"][ridge] == 1.0
    if rnd > 1:  # every head's validation probabilities, beside the results
        heads = np.load(tmp_path / "r_heads" / "Made.npz")
        assert heads["y"].shape == (8,) and heads[ridge].shape == (8, 2)
    if rnd == 4:
        assert row["accuracy"]["ridgeH"] == 1.0 and heads["ridgeH"].shape == (8, 2)
    if rnd == 5:  # the chosen head's probabilities are ridgeSel's, chosen on the inner train
        assert row["chosen"] in ("ridgeH", "ridgeHR")
        assert set(row["loo"]) == {"ridgeH", "ridgeR", "ridgeHR"}
        np.testing.assert_array_equal(heads["ridgeSel"], heads[row["chosen"]])
    if rnd == 6:  # two seeds, two different models, each head (n, 2) probabilities
        assert {"net0", "net1", "ridge1"} <= set(heads)
        assert not np.array_equal(heads["net0"], heads["net1"])
        np.testing.assert_allclose(heads["net1"].sum(1), 1, rtol=1e-5)
    # a rerun skips the dataset (no refit) and prints the summary
    if rnd == 7:  # the net and its ablation, both kept; the ablation's net is another model
        assert {"net_long", "pool_net_long", "ridge"} == set(heads) - {"y"}
        assert not np.array_equal(heads["net_long"], heads["pool_net_long"])
    for study in ("study", "study_2", "study_3", "study_4", "study_5", "study_6", "study_7"):
        monkeypatch.setattr(bench, study, lambda *a: pytest.fail("refitted"))
    assert bench.main(args) == 0


def test_chosen_weight_prefers_the_best_join_then_the_weight_nearest_a_half(bench):
    y = np.array([0, 0, 1])
    net = np.array([[0.8, 0.2], [0.8, 0.2], [0.3, 0.7]])  # right on all three
    # a ridge wrong on the first two: joins at 0.75 and 1 are right on all, 0.5 is not
    assert bench.chosen_weight(net, np.array([[0.0, 1.0]] * 3), y) == 0.75
    # a ridge that agrees with the net: every join but the ridge alone is right; 1/2 wins
    assert bench.chosen_weight(net, np.array([[0.6, 0.4], [0.6, 0.4], [0.6, 0.4]]), y) == 0.5
    # a sure net, wrong on all, against a hesitant ridge: only the ridge alone is right
    hesitant = np.array([[0.6, 0.4], [0.6, 0.4], [0.4, 0.6]])
    assert bench.chosen_weight(np.array([[0.0, 1.0], [0.0, 1.0], [1.0, 0.0]]), hesitant, y) == 0.0


def _after_round_7(bench, tmp_path, monkeypatch, rnd: int):
    """Round ``rnd`` on the made-up set, which reuses round 7's kept heads: refused in one
    line without them, then run after round 7; (round 7's results, its results, its row)."""
    r7, out = tmp_path / "r7.json", tmp_path / f"r{rnd}.json"
    monkeypatch.setattr(bench, "ROUND7_HEADS", tmp_path / "none")
    with pytest.raises(SystemExit, match="no round-7 heads"):
        bench.main(["--datasets", "Made", "--results", str(out), "--round", str(rnd)])
    assert bench.main(["--datasets", "Made", "--results", str(r7), "--round", "7"]) == 0
    monkeypatch.setattr(bench, "ROUND7_HEADS", tmp_path / "r7_heads")
    assert bench.main(["--datasets", "Made", "--results", str(out), "--round", str(rnd)]) == 0
    return r7, out, json.loads(out.read_text())["datasets"]["Made"]


def test_round_8_joins_round_7s_heads_at_the_weight_its_inner_train_chose(
        bench, tmp_path, monkeypatch, made_up):
    r7, r8, row = _after_round_7(bench, tmp_path, monkeypatch, 8)
    assert set(row["accuracy"]) == set(bench.VARIANTS_8) and row["sub_s"] > 0
    kept, heads = np.load(tmp_path / "r7_heads" / "Made.npz"), np.load(tmp_path / "r8_heads" /
                                                                      "Made.npz")
    # the weight comes from the fit on 70 % of the inner train (16 series: 5 held), and it
    # joins round 7's heads of the whole inner train; at 1/2 that is round 7's own "long"
    assert heads["sub_y"].shape == (5,) and heads["sub_net"].shape == (5, 2)
    w = row["weight"]
    assert w == bench.chosen_weight(heads["sub_net"], heads["sub_ridge"], heads["sub_y"])
    joined = w * kept["net_long"] + (1 - w) * kept["ridge"]
    assert row["accuracy"]["chosen"] == float((joined.argmax(1) == kept["y"]).mean())
    r7_row = json.loads(r7.read_text())["datasets"]["Made"]
    assert row["accuracy"]["long"] == r7_row["accuracy"]["long"]
    assert "the net's chosen weight: " in bench.summary(json.loads(r8.read_text()))
    np.savez(tmp_path / "r7_heads" / "Made.npz", **{**kept, "y": kept["y"][::-1]})
    with pytest.raises(SystemExit, match="not this dataset's inner validation"):
        bench.main(["--datasets", "Made", "--results", str(tmp_path / "r8b.json"),
                    "--round", "8"])


def test_round_9_fits_a_stem_net_and_its_ablation_beside_round_7s_heads(
        bench, tmp_path, monkeypatch, made_up):
    from linattn.tsc.conv_classifier import joined_heads

    r7, r9, row = _after_round_7(bench, tmp_path, monkeypatch, 9)
    assert set(row["accuracy"]) == set(bench.VARIANTS_9)
    assert row["stem_s"] > 0 and row["pool_stem_s"] > 0
    kept, heads = (np.load(tmp_path / f"{r}_heads" / "Made.npz") for r in ("r7", "r9"))
    assert set(heads) == {"y", "stem", "pool_stem"}  # the new heads only: round 7 keeps its own
    assert not np.array_equal(heads["stem"], heads["pool_stem"])  # two different nets
    np.testing.assert_allclose(heads["stem"].sum(1), 1, rtol=1e-5)
    # long+stem: round 7's estimator and the stem net averaged, as the estimator would join
    joined = joined_heads(kept["net_long"], kept["ridge"], heads["stem"])
    assert row["accuracy"]["long+stem"] == float((joined.argmax(1) == kept["y"]).mean())
    r7_row = json.loads(r7.read_text())["datasets"]["Made"]
    assert row["accuracy"]["long"] == r7_row["accuracy"]["long"]
    assert "long+stem against long: " in bench.summary(json.loads(r9.read_text()))
    # the stem is the estimator's own with stem=True, fitted on the same inner train
    est, X, y, va = _estimator_with_stem(bench, 0)
    tol = 1e3 * np.finfo(np.float32).eps
    np.testing.assert_allclose(est.head_probas(X[va]).stem, heads["stem"], rtol=tol, atol=tol)


def _estimator_with_stem(bench, split_seed: int):
    """(the estimator with ``stem=True`` as rounds 9 to 11 fit it, on the made-up set's inner
    train at ``split_seed``; X; y; the validation indices)."""
    from linattn.tsc import ConvAttentionClassifier

    X, y, _, tr, va, _ = bench._inner_data("Made", split_seed)
    est = ConvAttentionClassifier(stem=True, random_state=0, n_threads=1,
                                  **{**bench.FOURTH_CONFIGURATION, **bench.ESTIMATOR_PARAMS,
                                     "steps": bench.LONG_STEPS})
    return est.fit(X[tr], y[tr]), X, y, va


@pytest.mark.parametrize("rnd, split_seed", [(10, 1), (11, 2)])
def test_rounds_10_and_11_fit_the_estimator_with_its_stem_on_a_fresh_split(
        bench, tmp_path, made_up, rnd, split_seed):
    out = tmp_path / "r10.json"
    assert bench.main(["--datasets", "Made", "--results", str(out), "--round", str(rnd)]) == 0
    row = json.loads(out.read_text())["datasets"]["Made"]
    assert set(row["accuracy"]) == set(bench.VARIANTS_10)
    assert row["split_seed"] == split_seed and row["fit_s"] > 0
    # the heads are the estimator's own; stem@1/4 weighs the stem a quarter, stem@1/2 is the
    # estimator's join (stem=True)
    est, X, y, va = _estimator_with_stem(bench, split_seed)
    for earlier in range(split_seed):  # not an earlier round's split
        assert not np.array_equal(va, bench._inner_data("Made", earlier)[4])
    heads = np.load(tmp_path / "r10_heads" / "Made.npz")
    np.testing.assert_array_equal(heads["y"], y[va])
    tol = 1e3 * np.finfo(np.float32).eps
    for k, v in zip(("net", "ridge", "stem"), est.head_probas(X[va]), strict=True):
        np.testing.assert_allclose(heads[k], v, rtol=tol, atol=tol)
    sums = bench.round10_sums(heads["net"], heads["ridge"], heads["stem"])
    assert row["accuracy"] == {k: float((v.argmax(1) == y[va]).mean()) for k, v in sums.items()}
    np.testing.assert_allclose(sums["stem@1/2"], est.predict_proba(X[va]), rtol=tol, atol=tol)
    text = bench.summary(json.loads(out.read_text()))
    assert "stem@1/4 against long: " in text and f"split seed {split_seed})" in text
    # its rows are not comparable with rounds 1-9's: the same sizes, another split
    r7 = tmp_path / "r7.json"
    r7.write_text(json.dumps({"datasets": {"Made": {**{k: row[k] for k in ("train",
                                                                          "validation")},
                                                    "accuracy": {"long": 0.5}}}}))
    with pytest.raises(ValueError, match="Made was split otherwise"):
        bench.against(json.loads(out.read_text()), *bench.against_base([f"{r7}:long"]))


def test_round10_sums_weigh_the_stem_a_quarter_and_a_half(bench):
    # a stem that disagrees with the others everywhere, surest where they are least: at 1/4
    # it overrules them on the last series only, at 1/2 on all three
    nets = np.array([[0.9, 0.1], [0.8, 0.2], [0.7, 0.3]])
    ridge = np.array([[0.7, 0.3], [0.6, 0.4], [0.5, 0.5]])
    stem = np.array([[0.0, 1.0], [0.0, 1.0], [0.0, 1.0]])
    sums = bench.round10_sums(nets, ridge, stem)
    long = (nets + ridge) / 2
    np.testing.assert_allclose(sums["long"], long)
    np.testing.assert_allclose(sums["stem@1/4"], 0.75 * long + 0.25 * stem)
    np.testing.assert_allclose(sums["stem@1/2"], 0.5 * long + 0.5 * stem)
    assert sums["stem@1/4"].argmax(1).tolist() == [0, 0, 1]
    assert sums["stem@1/2"].argmax(1).tolist() == [1, 1, 1]
    assert sums["stem"] is stem and sums["net"] is nets and sums["ridge"] is ridge


def test_on_codes_puts_each_column_on_its_class_code(bench):
    p = np.array([[0.7, 0.3], [0.2, 0.8]])
    out = bench.on_codes(p, np.array([0, 2]), 3)
    np.testing.assert_array_equal(out, [[0.7, 0.0, 0.3], [0.2, 0.0, 0.8]])


@pytest.mark.parametrize("rnd, variant, ridge", [(6, "one", "ridge0"), (7, "long", "ridge")])
def test_rounds_6_and_7_score_the_classes_of_the_dataset_when_the_inner_train_misses_one(
        bench, tmp_path, monkeypatch, rnd, variant, ridge):
    """The middle class "b" is only in the validation part: the estimator sees classes 0 and 2,
    and its second column must count as class 2 (scored as class 1 it got every "c" wrong)."""
    import linattn.datasets as ds

    g = np.random.default_rng(1)
    t = np.linspace(0, 8, 30)
    X = np.concatenate([np.sin(t)[None] + 0.1 * g.standard_normal((12, 30)),
                        np.zeros((1, 30)),
                        np.cos(t)[None] + 0.1 * g.standard_normal((12, 30))])
    y = np.array(["a"] * 12 + ["b"] + ["c"] * 12)
    monkeypatch.setattr(ds, "load_ucr", lambda name, download=False: (X.astype(np.float32), y,
                                                                      _Unread(), _Unread()))
    va = np.array([0, 1, 2, 12, 13, 14, 15])  # three of "a", the "b", three of "c"
    tr = np.setdiff1d(np.arange(25), va)
    monkeypatch.setattr(bench, "inner_split", lambda codes, seed=0: (tr, va))
    monkeypatch.setattr(bench, "ESTIMATOR_PARAMS", {"steps": 5, "global_features": 1000,
                                                    "competing_groups": 4})
    monkeypatch.setattr(bench, "LONG_STEPS", 5)
    out = tmp_path / "r.json"
    assert bench.main(["--datasets", "Made", "--results", str(out), "--round", str(rnd)]) == 0
    row = json.loads(out.read_text())["datasets"]["Made"]
    assert row["classes"] == 3
    assert row["accuracy"][variant] == pytest.approx(6 / 7)  # only the unseen "b" is wrong
    heads = np.load(tmp_path / "r_heads" / "Made.npz")
    assert heads[ridge].shape == (7, 3) and not heads[ridge][:, 1].any()


def test_against_counts_wins_ties_and_losses_on_shared_datasets(bench, tmp_path):
    def row(acc, variant):
        return {"train": 7, "validation": 3, "accuracy": {variant: acc}}

    other = tmp_path / "r6.json"
    other.write_text(json.dumps({"datasets": {"A": row(0.5, "one"), "B": row(0.8, "one"),
                                              "C": row(0.9, "one")}}))
    mine = {"datasets": {"A": row(0.6, "long"), "B": row(0.8, "long"), "D": row(0.1, "long")}}
    text = bench.against(mine, *bench.against_base([f"{other}:one"]))
    assert "on 2 shared datasets" in text and "W/T/L 1/1/0" in text
    assert "mean difference +0.0500" in text
    with pytest.raises(ValueError, match="FILE:VARIANT"):
        bench.against_base([str(other)])
    with pytest.raises(ValueError, match="not a variant"):
        bench.against_base([f"{other}:two"])
    with pytest.raises(ValueError, match="no dataset in both"):
        bench.against({"datasets": {"D": row(0.1, "long")}}, "one",
                      bench.load_rows([str(other)], "x"))
    mine["datasets"]["A"]["train"] = 8  # another inner split: not comparable
    with pytest.raises(ValueError, match="A was split otherwise"):
        bench.against(mine, *bench.against_base([f"{other}:one"]))


@pytest.mark.parametrize("content", ["[]", "{", '{"meta": {}}', '{"datasets": []}'])
def test_against_refuses_a_bad_file_before_fitting_anything(bench, tmp_path, monkeypatch,
                                                            capsys, content):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    monkeypatch.setattr(bench, "study_7", lambda *a: pytest.fail("fitted"))
    rc = bench.main(["--round", "7", "--datasets", "Made", "--results",
                     str(tmp_path / "r.json"), "--against", f"{bad}:one"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and str(bad) in err and "\n" not in err
    assert not (tmp_path / "r.json").exists()


def test_join_writes_the_union_of_halves_and_refuses_overlaps(bench, tmp_path, capsys):
    def part(name, *sets):
        f = tmp_path / name
        f.write_text(json.dumps({"datasets": {n: {"accuracy": {"long": 0.5, "pool_long": 0.4,
                                                                "net_long": 0.3,
                                                                "pool_net_long": 0.2,
                                                                "ridge": 0.1}}
                                              for n in sets}}))
        return str(f)

    a, b = part("a.json", "A", "B"), part("b.json", "C")
    out = tmp_path / "all.json"
    assert bench.main(["--join", a, b, "--results", str(out)]) == 0
    assert list(json.loads(out.read_text())["datasets"]) == ["A", "B", "C"]
    assert "on 3 datasets" in capsys.readouterr().out  # the joined file's summary
    assert bench.main(["--join", a, part("c.json", "B"), "--results", str(out)]) == 2
    assert "B is in an earlier file too" in capsys.readouterr().err


def test_round_6_fits_the_estimator_at_the_600_steps_it_ran_with(bench, monkeypatch):
    import linattn.tsc.conv_classifier as cc

    seen = []

    def fit(self, X, y):
        seen.append(self.steps)
        raise StopIteration

    monkeypatch.setattr(cc.ConvAttentionClassifier, "fit", fit)
    monkeypatch.setattr(bench, "_inner_data", lambda name: (
        np.zeros((4, 8), np.float32), np.array([0, 1, 0, 1]), np.array(["a", "b"]),
        np.arange(3), np.arange(3, 4), {}))
    with pytest.raises(StopIteration):
        bench.study_6("Made")
    assert seen == [bench.STEPS] == [600]


def test_resharpen_is_the_ridge_softmax_at_another_temperature(bench, tmp_path):
    from linattn.tsc.conv_classifier import ridge_proba

    d = np.array([[0.4, -0.2, 0.1], [-1.0, 0.5, 0.3]])
    kept = ridge_proba(d, np.array([0, 2, 3]), 4)  # class 1 never seen: a column of 0
    want = ridge_proba(d, np.array([0, 2, 3]), 4, 30.0)
    tol = 100 * np.finfo(np.float64).eps
    np.testing.assert_allclose(bench.resharpen(kept, 30.0), want, rtol=tol, atol=tol)
    assert (bench.resharpen(kept, 30.0)[:, 1] == 0).all()
    # the table: a net head plus the resharpened ridge, over the datasets both folders have
    y = np.array([0, 1])
    for folder, heads in (("a", {"ridge10k": np.array([[0.6, 0.4], [0.45, 0.55]])}),
                          ("b", {"net": np.array([[0.1, 0.9], [0.6, 0.4]])})):
        (tmp_path / folder).mkdir()
        np.savez(tmp_path / folder / "D.npz", y=y, **heads)
    text = bench.temperature_table([tmp_path / "a", tmp_path / "b"])
    assert "on 1 datasets" in text and "| (ridge10k alone) | 1.0000 |" in text
    # t=3 and 5: the net outvotes the soft ridge on both series; t=10: on the first only (its
    # ridge log-odds 10/3·log(0.6/0.4) = 1.35 against the net's 2.2); t=20 and 30: on neither
    assert "| net | 0.0000 | 0.0000 | 0.5000 | 1.0000 | 1.0000 |" in text
    # another kept ridge head, and the attention net against its no-mixer twin at each t
    (tmp_path / "c").mkdir()
    np.savez(tmp_path / "c" / "D.npz", y=y, ridgeH=np.array([[0.6, 0.4], [0.45, 0.55]]),
             attnG=np.array([[0.1, 0.9], [0.6, 0.4]]), poolG=np.array([[0.5, 0.5], [0.5, 0.5]]))
    text = bench.temperature_table([tmp_path / "c"], "ridgeH")
    assert "| attnG | 0.0000 | 0.0000 | 0.5000 | 1.0000 | 1.0000 |" in text
    assert "| attnG against poolG, W/T/L | 0/0/1 | 0/0/1 | 0/0/1 | 0/1/0 | 0/1/0 |" in text
    assert "no ridge10k head kept" in bench.temperature_table([tmp_path / "c"])
