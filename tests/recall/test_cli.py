"""``linattn recall train|table``: the command-line contract (one line, exit 2) and a tiny
real run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from linattn.cli import main

TINY = ["--d-model", "16", "--num-heads", "2", "--seq-len", "16", "--pairs", "2",
        "--vocab-size", "32", "--train-examples", "64", "--val-examples", "16",
        "--test-examples", "16", "--epochs", "1", "--batch-size", "32", "--train-mix", "",
        "--quiet"]


def _one_line_error(capsys, argv: list[str], match: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("linattn recall: error: ") and match in err, err


def test_train_writes_result_json(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["recall", "train", "--mixer", "softmax", "--lr", "1e-3", "--out", str(out),
                 *TINY]) == 0
    summary = json.loads(capsys.readouterr().out)
    saved = json.loads((out / "result.json").read_text())
    assert summary["test_acc"] == saved["test_acc"] and 0 <= saved["test_acc"] <= 1
    assert saved["config"]["mixer"] == "softmax" and saved["lr"] == 1e-3
    # K and V caches (2 layers, float32) and the token shift's last 3 embeddings
    assert saved["state_bytes"] == 2 * 2 * 16 * 16 * 4 + 3 * 16 * 4
    assert [p.name for p in out.iterdir()] == ["result.json"]  # no temporary left


def test_train_sweeps_rates(tmp_path, capsys):
    assert main(["recall", "train", "--mixer", "gated_delta", "--lr-sweep", "1e-3,5e-3",
                 "--out", str(tmp_path), *TINY]) == 0
    saved = json.loads((tmp_path / "result.json").read_text())
    assert [r["lr"] for r in saved["sweep"]] == [1e-3, 5e-3]
    assert saved["val_acc"] == max(r["val_acc"] for r in saved["sweep"])


def test_train_mix_trains_on_every_set(tmp_path, capsys):
    assert main(["recall", "train", "--mixer", "linear", "--lr", "1e-3", "--out", str(tmp_path),
                 *TINY, "--train-mix", "8:1:40,12:2:8"]) == 0
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved["config"]["train_mix"] == [[8, 1, 40], [12, 2, 8]]
    assert saved["sweep"][0]["steps"] == 2 + 2 + 1


def test_table_prints_a_row_per_cell(tmp_path, capsys):
    assert main(["recall", "table", "--mixers", "softmax,linear:relu", "--d-models", "16",
                 "--lr", "1e-3", "--out", str(tmp_path), *TINY]) == 0
    out = capsys.readouterr().out
    assert "| softmax | (16, 2) | 16 |" in out and "| linear (relu) | (16, 2) | 16 |" in out
    assert len(list(tmp_path.glob("*.json"))) == 2


def test_table_seeds_make_one_row(tmp_path, capsys):
    assert main(["recall", "table", "--mixers", "softmax", "--d-models", "16", "--seeds", "0,3",
                 "--lr", "1e-3", "--out", str(tmp_path), *TINY]) == 0
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if line.startswith("| softmax")][0].split(
        " | ")[6] == "2"  # the seeds column
    assert (tmp_path / "softmax-d16-T16-P2-s3.json").exists()


@pytest.mark.parametrize("argv, match", [
    (["--pairs", "5"], "--seq-len: 16 is too short for 5 key-value pairs"),
    (["--lr", "-1"], "--lr: expected a finite number > 0, got -1"),
    (["--short-conv", "-1"], "--short-conv: expected"),
    (["--lr-sweep", "1e-3,x"], "--lr-sweep: expected a finite number > 0"),
    (["--mixer", "bogus"], "--mixer: expected one of"),
    (["--mixer", "softmax", "--window", "4"], "--window: not used with attention='softmax'"),
    (["--num-heads", "3"], "--num-heads: d_model 16 is not divisible by 3"),
    (["--lr", "1e-3", "--lr-sweep"], "not allowed with argument"),
    (["--stop-at", "2"], "--stop-at: expected a number in (0, 1]"),
    (["--train-mix", "8:1"], "--train-mix: expected seq_len:pairs:examples"),
    (["--train-mix", "6:2:8"], "--train-mix: (6, 2, 8): seq_len: 6 is too short"),
    (["--eval-at", "512"], "--eval-at: expected seq_len:pairs"),
    (["--eval-at", "8:4"], "--eval-at: (8, 4): seq_len: 8 is too short"),
])
def test_train_bad_options_one_line(tmp_path, capsys, argv, match):
    _one_line_error(capsys, ["recall", "train", "--out", str(tmp_path / "r"), *TINY, *argv],
                    match)
    assert not (tmp_path / "r").exists()


def test_table_bad_mixer_and_out(tmp_path, capsys):
    _one_line_error(capsys, ["recall", "table", "--mixers", "softmax,linear:bogus",
                             "--out", str(tmp_path)], "--mixers: expected one of")
    a_file = tmp_path / "f"
    a_file.write_text("")
    _one_line_error(capsys, ["recall", "table", "--out", str(a_file / "x"), *TINY], "--out: ")


def test_refused_before_torch(tmp_path):
    """Bad options fail while parsing, with torch unimportable (instant errors)."""
    code = ("import sys; sys.modules['torch'] = None\n"
            "from linattn.cli import main\n"
            f"sys.exit(main(['recall', 'train', '--out', {str(tmp_path)!r}, '--pairs', '100']))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip() == ("linattn recall: error: --seq-len: 256 is too short for 100 "
                                "key-value pairs (need at least 4 * num_kv_pairs = 400)")
