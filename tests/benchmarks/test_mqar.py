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
