"""linattn.lm.training: TrainConfig, the Trainer API (in memory, checkpoints, resume),
evaluate, flushed_denormals."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from linattn.lm import LMConfig, TrainConfig, Trainer, evaluate, train
from linattn.lm.data import byte_ids, stdlib_corpus, training_windows, validation_windows
from linattn.lm.training import flushed_denormals
from linattn.nn import LinearTransformerLM
from linattn.train_loop import CheckpointError

TEXT = b"".join(b"def f%d(x):\n    return x + %d\n" % (i, i) for i in range(200))
CORPUS = (TEXT, TEXT[:1000], {"files": 2, "python": "test", "train_bytes": len(TEXT),
                               "val_bytes": 1000})
MODEL = LMConfig(vocab_size=256, d_model=16, num_layers=1, num_heads=2, chunk_size=8)
TRAIN = TrainConfig(context=16, batch_size=4, steps=4, val_tokens=128, eval_every=2, warmup=2)


def test_train_config_checks_its_fields():
    assert TrainConfig(max_time=1.5).to_dict()["max_time"] == 1.5
    assert TrainConfig.from_dict(TRAIN.to_dict()) == TRAIN
    for bad, match in (({}, "^steps, max_time: give a budget"),
                       ({"steps": 0}, "^steps: expected a positive integer"),
                       ({"steps": 1, "context": 2.0}, "^context"),
                       ({"steps": 1, "lr": 0.0}, "^lr: expected a finite number > 0"),
                       ({"max_time": float("inf")}, "^max_time"),
                       ({"steps": 1, "weight_decay": -1.0}, "^weight_decay"),
                       ({"steps": 1, "seed": True}, "^seed"),
                       # issue 24: these trained forever or failed in max() of no budget
                       ({"steps": -1}, "^steps: expected a positive integer, got -1"),
                       ({"max_time": -5.0}, "^max_time: expected a finite number > 0"),
                       ({"max_time": 0.0}, "^max_time: expected a finite number > 0"),
                       ({"steps": 1, "lr": float("nan")}, "^lr: expected a finite number > 0"),
                       ({"steps": 1, "lr": float("inf")}, "^lr: expected a finite number > 0"),
                       ({"steps": 1, "eval_every": 0}, "^eval_every: expected a positive"),
                       # issue 51 probe: beyond float32 (the optimiser's scalars)
                       ({"steps": 1, "lr": 1e300}, "^lr: expected a finite number > 0 that "
                        "float32 holds"),
                       ({"steps": 1, "lr": 1e-300}, "^lr: expected a finite number > 0 that "
                        "float32 holds"),
                       ({"steps": 1, "weight_decay": 1e300}, "^weight_decay: expected a finite "
                        "number >= 0 that float32 holds")):
        with pytest.raises(ValueError, match=match):
            TrainConfig(**bad)
    with pytest.raises(ValueError, match="train config: unknown keys"):
        TrainConfig.from_dict({"steps": 1, "nope": 1})


def test_train_in_memory_returns_the_result():
    result = train(MODEL, TRAIN, corpus=CORPUS)
    assert result["steps"] == 4 and result["attention"] == "linear"
    assert result["val_bpc"] > 0 and result["model"] == MODEL.to_dict()
    assert result["parameters"] == LinearTransformerLM.from_config(MODEL).num_parameters()
    with pytest.raises(ValueError, match="^resume"):
        Trainer(MODEL, TRAIN, corpus=CORPUS, resume=True)
    with pytest.raises(ValueError, match="^vocab_size: byte tokens"):
        Trainer(LMConfig(100, 16, 1, 2), TRAIN, corpus=CORPUS)


def test_stopped_run_resumes_to_the_uninterrupted_result(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    want = Trainer(MODEL.to_dict(), TRAIN, out=a, corpus=CORPUS).run()

    def stop_at_2(loop):
        if loop.step == 2:
            loop.request_stop()

    with pytest.raises(KeyboardInterrupt):
        Trainer(MODEL, TRAIN, out=b, corpus=CORPUS, on_step=stop_at_2).run()
    with pytest.raises(FileExistsError):
        Trainer(MODEL, TRAIN, out=b, corpus=CORPUS)
    with pytest.raises(FileNotFoundError):
        Trainer(MODEL, TRAIN, out=tmp_path / "c", corpus=CORPUS, resume=True)
    with pytest.raises(CheckpointError, match="made with other options"):
        Trainer(LMConfig(256, 16, 1, 2, chunk_size=4), TRAIN, out=b, corpus=CORPUS, resume=True)
    # the budget may grow on resume: a longer run is the same run
    resumed = Trainer(MODEL, TRAIN, out=b, corpus=CORPUS, resume=True)
    assert resumed.loop.step == 2
    got = resumed.run()
    assert got["val_bpc"] == want["val_bpc"] and got["steps"] == 4
    assert json.loads((b / "result.json").read_text())["val_bpc"] == want["val_bpc"]
    assert (a / "metrics.jsonl").read_text().count("\n") == 2


def test_checkpoint_of_the_earlier_cli_resumes(tmp_path):
    """Earlier versions stored the CLI's subset of the config (no mlp_dim, no decay): it is
    compared in today's spelling."""
    out = tmp_path / "run"
    Trainer(MODEL, TRAIN, out=out, corpus=CORPUS).run()
    ck = torch.load(out / "checkpoint.pt", weights_only=True)
    old = {k: v for k, v in ck["meta"]["model_config"].items() if k not in ("mlp_dim", "decay")}
    ck["meta"]["model_config"] = old
    torch.save(ck, out / "checkpoint.pt")
    longer = TrainConfig(**{**TRAIN.to_dict(), "steps": 5})
    assert Trainer(MODEL, longer, out=out, corpus=CORPUS, resume=True).run()["steps"] == 5


def test_evaluate_keeps_the_mode_and_scores_bits():
    torch.manual_seed(0)
    model = LinearTransformerLM.from_config(MODEL).train()
    ids = torch.randint(0, 256, (300,))
    bpc = evaluate(model, ids, 16, 128)
    assert model.training and 0 < bpc < 9  # about log2(256) = 8 for an untrained model


def test_flushed_denormals_is_scoped():
    """Training flushes subnormals (the softmax kernel's speed) and leaves the process as it
    found it: Python's float parsing obeys the same mode."""
    import platform

    def subnormal_quarter() -> float:
        return (torch.tensor(2e-38, dtype=torch.float32) / 4).item()

    assert subnormal_quarter() != 0.0
    with flushed_denormals():
        inside = subnormal_quarter()
    assert subnormal_quarter() != 0.0
    assert float("2.2250738585072014e-309") != 0.0
    if platform.machine().lower() in ("x86_64", "amd64"):
        assert inside == 0.0


def test_feature_map_instance_needs_no_checkpoint(tmp_path):
    from linattn.feature_maps import ReluPlusOne

    cfg = LMConfig(256, 16, 1, 2, feature_map=ReluPlusOne())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert train(cfg, TrainConfig(context=16, batch_size=2, steps=1, val_tokens=32),
                     corpus=CORPUS)["steps"] == 1
    with pytest.raises(ValueError, match="^feature_map: a checkpoint stores"):
        Trainer(cfg, TRAIN, out=tmp_path, corpus=CORPUS)


def test_a_diverging_run_stops_with_one_error_and_keeps_its_checkpoint(tmp_path):
    """A learning rate far too high: the loss turns NaN; the run stops before applying that
    step (NonFiniteError, a ValueError), the last checkpoint is the last good state and no
    result is written."""
    from linattn.train_loop import NonFiniteError, first_non_finite, read_checkpoint

    config = TrainConfig(context=16, batch_size=4, steps=20, val_tokens=128, eval_every=10,
                         warmup=1, lr=1e30)
    with pytest.raises(NonFiniteError, match=r"^training diverged at step \d+: the loss is nan"
                                             r".* keeps step \d+\)$") as err:
        Trainer(MODEL, config, out=tmp_path, corpus=CORPUS, checkpoint_every=0).run()
    ck = read_checkpoint(tmp_path / "checkpoint.pt")
    assert f"keeps step {ck['step']})" in str(err.value)
    assert first_non_finite(ck["model"]) is None
    assert not (tmp_path / "result.json").exists()


def test_checkpoint_every_is_checked():
    for bad in (-1.0, float("nan"), "60"):
        with pytest.raises(ValueError, match="^checkpoint_every: expected a finite number >= 0"):
            Trainer(MODEL, TRAIN, corpus=CORPUS, checkpoint_every=bad)


def test_a_run_folder_has_one_trainer_at_a_time(tmp_path):
    """Two runs into one folder would both write its checkpoint and interleave its metrics: the
    second is refused while the first holds the folder, and may start once it is done."""
    from linattn._io import FolderInUseError

    first = Trainer(MODEL, TRAIN, out=tmp_path / "run", corpus=CORPUS)
    with pytest.raises(FolderInUseError, match="in use by another linattn run"):
        Trainer(MODEL, TRAIN, out=tmp_path / "run", corpus=CORPUS)
    first.run()
    with pytest.raises(FileExistsError):  # done: a finished run, not a busy one
        Trainer(MODEL, TRAIN, out=tmp_path / "run", corpus=CORPUS)
    Trainer(MODEL, TRAIN, out=tmp_path / "run", corpus=CORPUS, resume=True).run()


@pytest.mark.parametrize("model, train, name", [
    ({"d_model": 65536, "num_heads": 1}, {}, "d_model"),
    ({}, {"batch_size": 10**9}, "batch_size"),
    ({}, {"context": 10**9}, "context"),
    ({"short_conv": 10**9}, {}, "short_conv"),
])
def test_absurd_sizes_are_refused_before_anything_is_allocated(model, train, name, tmp_path):
    """Were an OOM kill (137) or an allocation traceback; now one ValueError naming the
    option, and no run folder."""
    cfg = LMConfig(**{**MODEL.to_dict(), **model})
    with pytest.raises(ValueError, match=rf"^{name}: training this model needs about "):
        Trainer(cfg, TrainConfig(**{**TRAIN.to_dict(), **train}), out=tmp_path / "run",
                corpus=CORPUS)
    assert not (tmp_path / "run").exists()


def test_a_context_the_corpus_or_the_kind_cannot_hold_is_refused_before_training(tmp_path):
    """Were errors at the first step or the first evaluation (after the corpus line), and an
    IndexError for a validation split shorter than a window."""
    small = (TEXT[:500], TEXT[:100], CORPUS[2])
    with pytest.raises(ValueError, match=r"^context: 600 needs at least 602 training tokens, "
                                         r"the corpus has 500$"):
        Trainer(MODEL, TrainConfig(**{**TRAIN.to_dict(), "context": 600}), corpus=small)
    with pytest.raises(ValueError, match=r"^context: 200 needs at least 201 validation tokens, "
                                         r"the corpus has 100$"):
        Trainer(MODEL, TrainConfig(**{**TRAIN.to_dict(), "context": 200}), corpus=small)
    with pytest.raises(ValueError, match=r"^context: cosformer's weights hold for 1024 "):
        Trainer(LMConfig(256, 16, 1, 2, attention="cosformer"),
                TrainConfig(**{**TRAIN.to_dict(), "context": 2000}), corpus=CORPUS)


# -------------------- linattn.lm.data
# linattn.lm.data: the stdlib corpus, byte ids, training and validation windows.


def test_corpus_is_the_stdlib_split_by_file():
    tr, va, info = stdlib_corpus(300_000)
    assert 0 < len(va) < len(tr) and len(tr) + len(va) <= 300_000
    assert b"def " in tr and info["files"] > 1
    assert (info["train_bytes"], info["val_bytes"]) == (len(tr), len(va))


def test_corpus_skips_tests_and_needs_source(tmp_path):
    for i in range(10):
        (tmp_path / f"m{i}.py").write_text(f"x = {i}\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "t.py").write_text("skipped\n")
    tr, va, info = stdlib_corpus(root=str(tmp_path))
    assert info["files"] == 10 and va == b"x = 9\n\n" and b"skipped" not in tr
    with pytest.raises(ValueError, match="no Python source"):
        stdlib_corpus(root=str(tmp_path / "tests" / "none"))


def test_training_windows_are_seeded_by_seed_and_step():
    ids = byte_ids(bytes(range(200)))
    assert ids.dtype == torch.int64 and ids[5] == 5
    a = training_windows(ids, 16, 3, seed=0, step=4)
    assert a.shape == (3, 17) and (a.diff(dim=1) == 1).all()  # contiguous windows
    assert torch.equal(a, training_windows(ids, 16, 3, seed=0, step=4))
    assert not torch.equal(a, training_windows(ids, 16, 3, seed=0, step=5))
    with pytest.raises(ValueError, match="context"):
        training_windows(ids, 199, 1, 0, 0)


def test_validation_windows_cover_the_first_tokens_without_overlap():
    ids = torch.arange(100)
    batches = list(validation_windows(ids, 10, 45, batch_size=3))
    assert [len(b) for b in batches] == [3, 1]  # 45 targets: 4 windows of 10
    w = torch.cat(batches)
    assert torch.equal(w[:, 0], torch.arange(0, 40, 10)) and w.shape[1] == 11


def test_a_budget_without_a_validation_file_names_corpus_bytes():
    """Said 'no Python source found' of a stdlib full of it."""
    with pytest.raises(ValueError, match=r"^corpus_bytes: 20000 bytes hold \d+ file\(s\), too "
                                         r"few for a validation file"):
        stdlib_corpus(20_000)
