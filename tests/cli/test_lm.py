"""``linattn lm``: a tiny train run, checkpoint + resume to the identical result, generate, the
user errors. The library behind it is tested in tests/lm/."""

from __future__ import annotations

import json

import pytest
import torch

from linattn.cli import main
from linattn.lm import load_model
from linattn.ops.dispatch import DEFAULT_CHUNK_SIZE

TINY = ["--d-model", "16", "--num-layers", "1", "--num-heads", "2", "--context", "32",
        "--batch-size", "4", "--corpus-bytes", "300000", "--val-tokens", "512",
        "--eval-every", "2", "--threads", "1", "--quiet", "--warmup", "2"]


def records(run):
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k != "time_s"} for line in lines]


def test_train_interrupt_resume_matches_uninterrupted(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["lm", "train", "--out", str(a), "--steps", "4", *TINY]) == 0
    result = json.loads((a / "result.json").read_text())
    assert result["steps"] == 4 and result["val_bpc"] > 0
    assert main(["lm", "train", "--out", str(b), "--steps", "4", "--stop-after", "2",
                 *TINY]) == 130  # the Ctrl-C path: checkpoint saved, clean exit
    assert torch.load(b / "checkpoint.pt", weights_only=True)["step"] == 2
    assert main(["lm", "train", "--out", str(b), "--steps", "4", *TINY]) == 2  # not --resume
    assert main(["lm", "train", "--out", str(b), "--steps", "4", "--resume", *TINY]) == 0
    ma, mb = load_model(a)[0], load_model(b)[0]
    for (k, va), vb in zip(ma.state_dict().items(), mb.state_dict().values(), strict=True):
        assert torch.equal(va, vb), k
    assert json.loads((b / "result.json").read_text())["val_bpc"] == result["val_bpc"]
    # each record once, with the numbers of the uninterrupted run (train_bpc's average too)
    assert records(b) == records(a) and [r["step"] for r in records(a)] == [2, 4]
    capsys.readouterr()
    assert main(["lm", "generate", "--model", str(a), "--prompt", "def ", "--max-new-tokens",
                 "12", "--seed", "1", "--threads", "1"]) == 0
    first = capsys.readouterr().out
    assert first.startswith("def ")
    main(["lm", "generate", "--model", str(a), "--prompt", "def ", "--max-new-tokens", "12",
          "--seed", "1", "--threads", "1"])
    assert capsys.readouterr().out == first


def test_old_flag_spellings_and_resume_with_other_options(tmp_path, capsys):
    old = [{"--num-layers": "--layers", "--num-heads": "--heads"}.get(a, a) for a in TINY]
    assert main(["lm", "train", "--out", str(tmp_path), "--steps", "2", *old]) == 0
    ck = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    cfg = ck["meta"]["model_config"]
    assert (cfg["num_layers"], cfg["num_heads"], cfg["chunk_size"]) == (1, 2, DEFAULT_CHUNK_SIZE)
    # a longer budget may extend the run; another architecture may not
    assert main(["lm", "train", "--out", str(tmp_path), "--steps", "3", "--resume", *TINY]) == 0
    capsys.readouterr()
    assert main(["lm", "train", "--out", str(tmp_path), "--steps", "4", "--resume", *TINY,
                 "--d-model", "8"]) == 2
    assert "made with other options" in capsys.readouterr().err


def test_hybrid_trains_saves_and_generates(tmp_path, capsys):
    assert main(["lm", "train", "--out", str(tmp_path), "--steps", "2", "--attention", "hybrid",
                 "--window", "4", *TINY]) == 0
    model, _ = load_model(tmp_path)
    assert (model.config.attention, model.config.window) == ("hybrid", 4)
    capsys.readouterr()
    assert main(["lm", "generate", "--model", str(tmp_path), "--prompt", "def ",
                 "--max-new-tokens", "5", "--seed", "0", "--threads", "1"]) == 0
    assert capsys.readouterr().out.startswith("def ")


def test_user_errors(tmp_path, capsys):
    def error(*argv):
        assert main(list(argv)) == 2
        err = capsys.readouterr().err
        assert err.startswith("linattn lm: error: ") and err.count("\n") == 1, err
        return err

    for bad in (["--window", "4"], ["--attention", "hybrid", "--window", "0"]):
        assert "--window: " in error("lm", "train", "--out", str(tmp_path / "w"), "--steps",
                                     "1", *bad, *TINY)
    assert "--feature-map: not used with attention='gated_delta'" in error(
        "lm", "train", "--out", str(tmp_path / "f"), "--steps", "1", "--attention",
        "gated_delta", "--feature-map", "relu", *TINY)
    assert "--steps, --max-time: " in error("lm", "train", "--out", str(tmp_path / "x"),
                                            *TINY)  # no budget
    assert "--warmup: expected a positive integer" in error(
        "lm", "train", "--out", str(tmp_path / "x"), "--steps", "1", *TINY, "--warmup", "0")
    assert "--resume: no checkpoint in" in error(
        "lm", "train", "--out", str(tmp_path / "y"), "--resume", "--steps", "1", *TINY)
    assert "cannot load a model" in error("lm", "generate", "--model", str(tmp_path / "none"),
                                          "--prompt", "a")
    assert not (tmp_path / "w").exists() and not (tmp_path / "x").exists()


def test_existing_run_and_empty_prompt_are_user_errors(tmp_path, capsys):
    assert main(["lm", "train", "--out", str(tmp_path), "--steps", "1", *TINY]) == 0
    capsys.readouterr()
    assert main(["lm", "train", "--out", str(tmp_path), "--steps", "1", *TINY]) == 2
    assert "already holds a run; pass --resume or choose a new --out" in capsys.readouterr().err
    assert main(["lm", "generate", "--model", str(tmp_path), "--prompt", ""]) == 2
    assert "--prompt: give at least one character" in capsys.readouterr().err


def test_attention_choices_come_from_the_mixer_registry_without_torch():
    """The parser is built by every `linattn` command: its --attention choices are the
    registry's kinds, read without importing torch."""
    import subprocess
    import sys

    code = ("import sys; from linattn.cli import build_parser; p = build_parser(); "
            "from linattn.nn.mixers import MIXERS; "
            "a = p._subparsers._group_actions[0].choices['lm']._subparsers._group_actions[0]; "
            "t = a.choices['train']; "
            "c = next(x for x in t._actions if x.dest == 'attention').choices; "
            "print(list(c) == list(MIXERS), 'torch' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert res.stdout.split() == ["True", "False"], res.stderr


@pytest.mark.parametrize("argv", [["lm"], ["lm", "--help"]])
def test_help(argv, capsys):
    try:
        assert main(argv) == 0
    except SystemExit as e:
        assert e.code == 0
    assert "lm" in capsys.readouterr().out


def test_generate_refuses_a_diverged_checkpoint(tmp_path, capsys):
    """Non-finite weights are refused at load, naming the file and the first such tensor."""
    assert main(["lm", "train", "--out", str(tmp_path), "--steps", "1", *TINY]) == 0
    ck = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    ck["model"]["embed.weight"][7, 0] = float("nan")
    torch.save(ck, tmp_path / "checkpoint.pt")
    capsys.readouterr()
    assert main(["lm", "generate", "--model", str(tmp_path), "--prompt", "a"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (f"linattn lm: error: {tmp_path / 'checkpoint.pt'}: embed.weight holds "
                   "non-finite values (NaN or infinity); the model is unusable\n")
