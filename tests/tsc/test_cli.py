"""``linattn forda``: a tiny end-to-end run, resume, report, and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sklearn")
pytest.importorskip("safetensors")
pytest.importorskip("matplotlib")

from linattn.cli import main  # noqa: E402
from linattn.tsc import LinearAttentionClassifier  # noqa: E402

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "FordA"
needs_forda = pytest.mark.skipif(not SHARED.is_dir(), reason="no ../shared/data/FordA")
TINY = ["--set", "d_model=16", "--set", "depth=1", "--set", "heads=2", "--set", "head_dim=8",
        "--set", "mlp_dim=32"]


def run(capsys, *argv):
    code = main(["forda", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(err: str, match: str) -> None:
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert match in err, err


def test_evaluate_missing_model_folder(tmp_path, capsys):
    code, _, err = run(capsys, "evaluate", "--model", str(tmp_path / "absent"))
    assert code == 2
    one_line_error(err, "no such folder")


def test_evaluate_corrupt_weights(tmp_path, capsys):
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((20, 30)).astype(np.float32), np.arange(20) % 2
    LinearAttentionClassifier(patch=5, d_model=8, depth=1, heads=2, head_dim=4, epochs=1).fit(
        X, y).save(tmp_path / "m")
    (tmp_path / "m" / "model.safetensors").write_bytes(b"\x00" * 64)
    code, _, err = run(capsys, "evaluate", "--model", str(tmp_path / "m"))
    assert code == 2
    one_line_error(err, "model.safetensors: corrupt weights file")


def test_train_rejects_bad_options(tmp_path, capsys):
    code, _, err = run(capsys, "train", "--out", str(tmp_path / "r"), "--set", "nope=1")
    assert code == 2
    one_line_error(err, "unknown parameter(s) nope")
    code, _, err = run(capsys, "train", "--out", str(tmp_path / "r"), "--recipe", "magic")
    assert code == 2
    one_line_error(err, "unknown recipe 'magic'")
    code, _, err = run(capsys, "train", "--out", str(tmp_path / "r"), "--set", "mixup=0.2",
                       "--set", "cutmix=0.2")
    assert code == 2
    one_line_error(err, "at most one")
    code, _, err = run(capsys, "train", "--out", str(tmp_path / "r"), "--set", "window=3")
    assert code == 2
    one_line_error(err, "window")
    code, _, err = run(capsys, "train", "--out", str(tmp_path / "r"), "--data-dir",
                       str(tmp_path / "nowhere"))
    assert code == 2
    one_line_error(err, "no such folder")


@needs_forda
def test_train_evaluate_resume_end_to_end(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", "--out", str(out), "--subset", "160", "--epochs", "2", "--threads", "1",
            "--quiet", "--data-dir", str(SHARED), "--export", str(tmp_path / "export"), *TINY]
    code, stdout, _ = run(capsys, *args)
    assert code == 0, stdout
    assert "validation macro F1" in stdout and "TEST macro F1" in stdout
    for stage in ("val", "full"):
        records = [json.loads(x) for x in (out / stage / "metrics.jsonl").read_text().splitlines()]
        assert [r["epoch"] for r in records] == [1, 2]
        assert all(("val_f1" in r) == (stage == "val") for r in records)
        assert not (out / stage / "checkpoint").exists()  # removed once the stage is complete
    test = json.loads((out / "test.json").read_text())
    assert test["n"] == 160 and sum(map(sum, test["confusion_matrix"])) == 160
    assert json.loads((tmp_path / "export" / "test.json").read_text()) == test
    shipped = LinearAttentionClassifier.load(tmp_path / "export")
    assert shipped.get_params()["d_model"] == 16
    # the final recipe: patches of 20, overlapping windows of 40, per-patch spectra
    assert {k: shipped.get_params()[k] for k in ("patch", "window", "spectral")} == {
        "patch": 20, "window": 40, "spectral": True}

    code, _, err = run(capsys, *args)  # same --out again without --resume
    assert code == 2
    one_line_error(err, "already holds a run")
    code, stdout, _ = run(capsys, *args, "--resume")
    assert code == 0 and stdout.count("already complete") == 2

    code, stdout, _ = run(capsys, "evaluate", "--model", str(out), "--no-baselines",
                          "--threads", "1", "--data-dir", str(SHARED))
    assert code == 0
    assert f"macro F1 {test['macro_f1']:.4f}" in stdout  # the same model, the same figure
    report = (out / "report.md").read_text()
    for png in ("training_curves.png", "confusion_matrix.png", "relative_kernels.png"):
        assert (out / png).stat().st_size > 1000 and png in report


SHIPPED = Path(__file__).resolve().parents[2] / "models" / "forda"


@needs_forda
@pytest.mark.skipif(not (SHIPPED / "test.json").is_file(), reason="no shipped model")
def test_shipped_model_reproduces_its_reported_score():
    from linattn.datasets import load_ucr
    from linattn.tsc.metrics import macro_f1

    _, _, X_test, y_test = load_ucr("FordA", data_dir=SHARED)
    reported = json.loads((SHIPPED / "test.json").read_text())
    pred = LinearAttentionClassifier.load(SHIPPED).predict(X_test)
    assert macro_f1((y_test > 0).astype(int), (pred > 0).astype(int), 2) == pytest.approx(
        reported["macro_f1"], abs=1e-6)
    assert float(np.mean(pred == y_test)) == pytest.approx(reported["accuracy"], abs=1e-6)
