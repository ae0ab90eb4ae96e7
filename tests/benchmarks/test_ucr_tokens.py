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


def test_run_on_a_made_up_dataset_never_reads_test(bench, tmp_path, monkeypatch):
    import linattn.datasets as ds

    g = np.random.default_rng(0)
    X = np.concatenate([np.sin(np.linspace(0, 8, 30))[None] + 0.1 * g.standard_normal((12, 30)),
                        np.cos(np.linspace(0, 8, 30))[None] + 0.1 * g.standard_normal((12, 30))])
    y = np.array(["a"] * 12 + ["b"] * 12)
    monkeypatch.setattr(ds, "load_ucr", lambda name, download=False: (X.astype(np.float32), y,
                                                                      _Unread(), _Unread()))
    out = tmp_path / "r.json"
    monkeypatch.setattr(bench, "STEPS", 5)
    assert bench.main(["--datasets", "Made", "--results", str(out)]) == 0
    row = json.loads(out.read_text())["datasets"]["Made"]
    assert (row["train"], row["validation"], row["classes"]) == (16, 8, 2)
    assert set(row["accuracy"]) == set(bench.VARIANTS)
    assert row["accuracy"]["ridge"] == 1.0  # sine against cosine: the ridge head separates them
    # a rerun skips the dataset (no refit) and prints the summary
    monkeypatch.setattr(bench, "study", lambda name: pytest.fail("refitted"))
    assert bench.main(["--datasets", "Made", "--results", str(out)]) == 0
