"""benchmarks/mqar.py on a tiny grid: two cells in two processes, the table and the plot."""

from __future__ import annotations

import pytest


def test_tiny_grid(load_benchmark, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    mqar = load_benchmark("mqar")
    argv = ["--out", str(tmp_path), "--mixers", "softmax,gated_delta", "--d-models", "16",
            "--settings", "16:2", "--train-examples", "64", "--epochs", "1",
            "--batch-size", "32", "--lrs", "1e-3", "--jobs", "1",
            "--train-mix", "8:1:32", "--eval-at", "24:3"]
    # a vocabulary of 8192 is the harness's default; the tiny grid keeps it (the cells are
    # 64 short sequences) and checks the wiring, not the accuracy
    assert mqar.main(argv) == 0
    out = capsys.readouterr().out
    assert "| softmax | (16, 2) | 16 |" in out and "| gated_delta | (16, 2) | 16 |" in out
    assert "| gated_delta | (24, 3) via (16, 2) | 16 |" in out and "32 of (8, 1)" in out
    assert (tmp_path / "mqar.png").stat().st_size > 0
    assert len(list(tmp_path.glob("*.json"))) == 2
    # --report redraws the table from the saved cells, running nothing
    (tmp_path / "mqar.png").unlink()
    assert mqar.main(["--out", str(tmp_path), "--report"]) == 0
    again = capsys.readouterr().out
    assert [line for line in again.splitlines() if line.startswith("| gated_delta")] == [
        line for line in out.splitlines() if line.startswith("| gated_delta")]
    assert (tmp_path / "mqar.png").stat().st_size > 0


def test_extra_cells_and_their_order(load_benchmark, monkeypatch):
    import argparse

    mqar = load_benchmark("mqar")
    assert mqar.parse_extra("gated_delta/128/1/0, linear_plain:relu/64/2/3") == [
        ("gated_delta", 128, 1, 0), ("linear_plain:relu", 64, 2, 3)]
    assert mqar.parse_extra("") == []
    for bad in ("gated_delta/128/1", "gated_delta/0/1/0", "/64/2/0", "gla/64/two/0"):
        with pytest.raises(argparse.ArgumentTypeError, match="mixer/d_model/heads/seed"):
            mqar.parse_extra(bad)
    seen = []
    monkeypatch.setattr(mqar, "_cell", lambda c, m, d, out: seen.append(
        (m, d, c.num_heads, c.seed, c.seq_len)) or {"mixer": m})
    base = mqar.RecallConfig(mixer="softmax")
    out = mqar.run(base, ["softmax", "based"], [64], [(256, 16)], "unused", 1, [0],
                   extra=[("gated_delta", 128, 1, 1)])
    assert [r["mixer"] for r in out] == ["softmax", "based", "gated_delta"]
    assert seen[-1] == ("gated_delta", 128, 1, 1, 256)
    cells = [(base, "softmax", 64), (base, "based", 64), (base, "taylor", 64),
             (base, "gated_delta", 128), (base, "gla", 64)]
    # Based first, then the d_model-128 cell and Taylor (equal cost: grid order), then the rest
    assert mqar.submission_order(cells) == [1, 2, 3, 0, 4]


class _Stop(Exception):
    """Raised by a stand-in ``run`` once it has recorded what main passed to it."""


def _record(calls):
    def run(*a, **k):
        calls.append(a)
        raise _Stop

    return run


def test_the_table_extra_cells_only_with_the_tables_grid(load_benchmark, monkeypatch, tmp_path):
    mqar = load_benchmark("mqar")
    calls = []
    monkeypatch.setattr(mqar, "run", _record(calls))
    with pytest.raises(_Stop):
        mqar.main(["--out", str(tmp_path)])
    assert calls[-1][2] == [64] and len(calls[-1][1]) == 13
    assert [e[0] for e in calls[-1][7]] == ["gated_delta"] * 3
    with pytest.raises(_Stop):
        mqar.main(["--out", str(tmp_path), "--mixers", "softmax"])
    assert calls[-1][7] == [] and calls[-1][1] == ["softmax"]
    with pytest.raises(_Stop):
        mqar.main(["--out", str(tmp_path), "--d-models", "32", "--extra", "gla/32/1/0"])
    assert calls[-1][7] == [("gla", 32, 1, 0)] and calls[-1][2] == [32]


def test_schedule_estimate_hands_out_the_costliest_first(load_benchmark):
    mqar = load_benchmark("mqar")

    def cell(mixer, seconds, d=64, heads=2, seed=0):
        return {"config": {"mixer": mixer, "d_model": d, "num_heads": heads, "seed": seed,
                           "feature_map": None}, "sweep_time_s": seconds}

    cells = [cell("softmax", 300), cell("gla", 600), cell("based", 1000), cell("taylor", 500)]
    # based alone on one worker (1000); taylor, softmax, gla on the other (1400)
    assert mqar.schedule_estimate(cells, 2) == 1400
    assert mqar.schedule_estimate(cells, 1) == 2400
    assert mqar.schedule_estimate(cells, 4) == 1000
    assert "4 cells, 2,400 s of training summed; 2 jobs started costliest first: 1,400 s" in (
        mqar._times_text(cells, 2))

    # equal costs are handed out in the default command's grid order (softmax, gated_delta,
    # ..., gla), whatever order they are given in: based on one worker (100); softmax (60) and
    # gated_delta (50) on the other, to 110; gla then on the first worker, to 110. In the
    # reversed order gla, gated_delta and softmax would all go to the second worker: 120.
    eq = [cell("gla", 10), cell("based", 100), cell("gated_delta", 50), cell("softmax", 60)]
    assert mqar.schedule_estimate(eq, 2) == mqar.schedule_estimate(eq[::-1], 2) == 110
    extra = cell("gated_delta", 7, d=128, heads=1, seed=1)
    assert mqar._grid_position(extra) == (1, 1)
    assert mqar._grid_position(cell("linear_plain", 1)) == (0, 5)
