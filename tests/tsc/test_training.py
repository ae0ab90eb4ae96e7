"""Training loop: the loss falls, checkpoints resume to the identical result, Ctrl-C saves."""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest
import torch

pytest.importorskip("safetensors")

from linattn.tsc.data import (  # noqa: E402
    augment,
    epoch_generator,
    fill_nan_padding,
    stratified_split,
)
from linattn.tsc.model import FordATransformer, ModelConfig  # noqa: E402
from linattn.tsc.training import (  # noqa: E402
    CheckpointError,
    TrainConfig,
    Trainer,
    predict_logits,
    to_cpu,
)

SMALL = ModelConfig(length=60, n_classes=2, patch=6, d_model=16, num_layers=2, num_heads=2,
                    head_dim=8, mlp_dim=32)


def data(n=96, length=60, seed=0):
    """Two classes that differ in the frequency of a randomly shifted sine."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    t = np.arange(length)
    X = np.sin(2 * np.pi * (2 + 3 * y[:, None]) * t / length + rng.uniform(0, 6.3, (n, 1)))
    return (X + 0.3 * rng.standard_normal((n, length))).astype(np.float32), y


def make(tmp, cfg=None, **kw):
    X, y = data()
    torch.manual_seed(0)
    model = FordATransformer(SMALL)
    cfg = cfg or TrainConfig(epochs=2, batch_size=16, lr=3e-3, seed=1)
    return Trainer(model, X[:72], y[:72], cfg, X_val=X[72:], y_val=y[72:],
                   checkpoint_dir=tmp / "ckpt", metrics_path=tmp / "metrics.jsonl", **kw)


def weights(trainer):
    return {k: v.clone() for k, v in trainer.model.state_dict().items()}


def strip_time(history):
    return [{k: v for k, v in r.items() if k != "time_s"} for r in history]


def test_loss_falls_and_resume_is_identical(tmp_path):
    torch.set_num_threads(1)
    full = make(tmp_path / "a")
    hist = full.run()
    assert [r["epoch"] for r in hist] == [1, 2]
    assert hist[1]["train_loss"] < hist[0]["train_loss"]
    assert hist[1]["val_loss"] < hist[0]["val_loss"]
    lines = (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2

    # Stop after epoch 1 (a checkpoint at the epoch boundary), resume: the same epoch 2.
    def stop_after_first_epoch(tr, epoch, batch):
        if epoch == 0 and batch == tr.steps_per_epoch:
            tr.request_stop()

    part = make(tmp_path / "b", on_step=stop_after_first_epoch)
    with pytest.raises(KeyboardInterrupt):
        part.run()
    assert len(part.history) == 1
    resumed = make(tmp_path / "b")
    assert resumed.load_checkpoint() and resumed.epoch == 1
    resumed.run()
    assert strip_time(resumed.history) == strip_time(hist)
    for k, v in weights(full).items():
        torch.testing.assert_close(weights(resumed)[k], v, rtol=0, atol=0)
    assert len((tmp_path / "b" / "metrics.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize("install", [None, signal.SIG_IGN])
def test_ctrl_c_mid_epoch_saves_and_resumes_identically(tmp_path, install):
    torch.set_num_threads(1)
    ref = make(tmp_path / "a")
    ref.run()

    def sigint_in_epoch_2(tr, epoch, batch):  # a real SIGINT, handled between steps
        if epoch == 1 and batch == 2:
            os.kill(os.getpid(), signal.SIGINT)

    part = make(tmp_path / "b", on_step=sigint_in_epoch_2)
    # None: whatever the test process started with (SIG_IGN under nohup or a background job)
    outer = signal.getsignal(signal.SIGINT) if install is None else signal.signal(
        signal.SIGINT, install)
    try:
        before = signal.getsignal(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            part.run()
        assert signal.getsignal(signal.SIGINT) is before  # the trainer's handler is removed
    finally:
        signal.signal(signal.SIGINT, outer)
    assert (part.epoch, part.batch) == (1, 2)
    resumed = make(tmp_path / "b")
    assert resumed.load_checkpoint() and (resumed.epoch, resumed.batch) == (1, 2)
    resumed.run()
    assert strip_time(resumed.history) == strip_time(ref.history)
    for k, v in weights(ref).items():
        torch.testing.assert_close(weights(resumed)[k], v, rtol=0, atol=0)
    # one checkpoint file, replaced in place; one metrics line per epoch
    assert sorted(p.name for p in (tmp_path / "b" / "ckpt").iterdir()) == ["checkpoint.pt"]
    assert len((tmp_path / "b" / "metrics.jsonl").read_text().splitlines()) == 2


def to_legacy_layout(ckpt_dir, steps_per_epoch):
    """Rewrite checkpoint.pt in the folder layout of linattn 0.1 (latest.json -> eEEEE-bBBBB/),
    whose train config still named mixup and cutmix and whose model config spelled num_layers
    and num_heads as depth and heads, beside the options removed since."""
    from safetensors.torch import save_file

    ck = torch.load(ckpt_dir / "checkpoint.pt", weights_only=True)
    epoch, batch = divmod(ck["step"], steps_per_epoch)
    name = f"e{epoch:04d}-b{batch:04d}"
    d = ckpt_dir / name
    d.mkdir()
    save_file({k: v.contiguous() for k, v in ck["model"].items()}, str(d / "model.safetensors"))
    model = dict(ck["meta"]["model"])
    model["depth"], model["heads"] = model.pop("num_layers"), model.pop("num_heads")
    model.update(stem="linear", stem_channels=32, spectrum_tokens=0, spectral_window=0)
    meta = {"model": model, "train": {**ck["meta"]["train"], "mixup": 0.0, "cutmix": 0.0}}
    (d / "config.json").write_text(json.dumps(meta))
    torch.save({"optimizer": ck["optimizer"], "scheduler": ck["scheduler"],
                "torch_rng": ck["rng"]["torch"], "epoch": epoch, "batch": batch,
                "elapsed": ck["elapsed"], "history": ck["history"], **ck["extra"]},
               d / "state.pt")
    (ckpt_dir / "latest.json").write_text(json.dumps({"dir": name, "epoch": epoch,
                                                      "batch": batch}))
    (ckpt_dir / "checkpoint.pt").unlink()


def test_checkpoint_of_the_earlier_folder_layout_resumes(tmp_path):
    torch.set_num_threads(1)
    ref = make(tmp_path / "a")
    ref.run()

    def stop_in_epoch_2(tr, epoch, batch):
        if epoch == 1 and batch == 3:
            tr.request_stop()

    part = make(tmp_path / "b", on_step=stop_in_epoch_2)
    with pytest.raises(KeyboardInterrupt):
        part.run()
    to_legacy_layout(tmp_path / "b" / "ckpt", part.steps_per_epoch)
    resumed = make(tmp_path / "b")
    with pytest.warns(DeprecationWarning, match="'(depth|heads)' is deprecated"):
        assert resumed.load_checkpoint() and (resumed.epoch, resumed.batch) == (1, 3)
    resumed.run()
    assert strip_time(resumed.history) == strip_time(ref.history)
    for k, v in weights(ref).items():
        assert torch.equal(weights(resumed)[k], v), k
    (tmp_path / "b" / "ckpt" / "checkpoint.pt").unlink()
    (tmp_path / "b" / "ckpt" / "latest.json").write_text('{"dir": "nowhere"}')
    with pytest.raises(CheckpointError, match="unreadable checkpoint"):
        make(tmp_path / "b").load_checkpoint()


def test_resume_rejects_other_config_and_corrupt_checkpoint(tmp_path):
    tr = make(tmp_path, cfg=TrainConfig(epochs=1, batch_size=16, seed=1))
    tr.run()
    other = make(tmp_path, cfg=TrainConfig(epochs=1, batch_size=16, seed=2))
    with pytest.raises(CheckpointError, match="different configuration"):
        other.load_checkpoint()
    (tmp_path / "ckpt" / "checkpoint.pt").write_bytes(b"garbage")
    again = make(tmp_path, cfg=TrainConfig(epochs=1, batch_size=16, seed=1))
    with pytest.raises(CheckpointError, match="unreadable checkpoint"):
        again.load_checkpoint()


def test_stratified_split_keeps_class_ratios():
    y = np.array([0] * 50 + [1] * 30 + [2] * 5)
    tr, va = stratified_split(y, 0.2, seed=0)
    assert len(np.intersect1d(tr, va)) == 0 and len(tr) + len(va) == len(y)
    assert [int((y[va] == c).sum()) for c in range(3)] == [10, 6, 1]
    np.testing.assert_array_equal(stratified_split(y, 0.2, seed=0)[1], va)


def test_augment_shift_and_scale():
    x = torch.arange(10.0).repeat(2, 1)
    out = augment(x, torch.tensor([0, 3]), torch.tensor([1.0, 2.0]))
    torch.testing.assert_close(out[0], x[0])
    torch.testing.assert_close(out[1], 2.0 * torch.roll(x[1], 3))
    a = torch.rand(3, generator=epoch_generator(5, 7))
    b = torch.rand(3, generator=epoch_generator(5, 7))
    assert torch.equal(a, b)


def test_removed_mixing_options_read_back_only_at_zero():
    d = TrainConfig(epochs=3).to_dict()
    assert "mixup" not in d and "cutmix" not in d
    assert TrainConfig.from_dict({**d, "mixup": 0.0, "cutmix": 0.0}) == TrainConfig(epochs=3)
    for name in ("mixup", "cutmix"):
        with pytest.raises(CheckpointError, match=f"uses the removed {name} \\({name}=0.2\\)"):
            TrainConfig.from_dict({**d, name: 0.2})


def test_device_cpu_trains_bit_for_bit_like_no_device(tmp_path, assert_close):
    """device="cpu" runs the very computation of no device: in one process, with the same
    shapes and thread count, training and predictions agree bit for bit. Predictions in other
    batches agree to float32 rounding (other shapes reorder the kernels' sums)."""
    torch.set_num_threads(1)
    plain = make(tmp_path / "a")
    hist = plain.run()
    on_cpu = make(tmp_path / "b", device="cpu")  # reseeds: dropout draws the same
    assert on_cpu.device == torch.device("cpu")
    assert strip_time(hist) == strip_time(on_cpu.run())
    for k, v in weights(plain).items():
        assert torch.equal(v, on_cpu.model.state_dict()[k]), k
    X, _ = data()
    expected = predict_logits(plain.model, X[:5])
    logits = predict_logits(on_cpu.model, X[:5], device="cpu")  # the same one batch of 5
    assert logits.device.type == "cpu" and logits.shape == (5, 2)
    torch.testing.assert_close(logits, expected, rtol=0, atol=0)
    # batches of 2 instead of one of 5: the kernels may block and order their float32 sums
    # differently (measured on an AMD EPYC Zen 4, AVX-512, AVX2 and scalar kernels: up to 1.25
    # eps at the logits' scale). 64 eps of that scale (at least 1: 7.6e-6) allows the error's
    # growth through the 2-block model's sums of <= 32 terms; any two series differ by >= 0.1.
    batched = predict_logits(on_cpu.model, X[:5], batch_size=2, device="cpu")
    assert batched.device.type == "cpu" and batched.shape == (5, 2)
    assert_close(batched, expected, ulps=64)
    # the checkpoint's tensors are CPU tensors (written from CPU copies on any device)
    ck = torch.load(tmp_path / "b" / "ckpt" / "checkpoint.pt", weights_only=True)
    tensors = [*ck["model"].values(), *ck["optimizer"]["state"][0].values()]
    assert tensors and all(t.device.type == "cpu" for t in tensors)


def test_to_cpu_copies_nested_tensors():
    t = torch.ones(2, requires_grad=True)
    out = to_cpu({"a": [t, (t, 3)], "b": "text", "c": None})
    assert out["b"] == "text" and out["c"] is None and out["a"][1][1] == 3
    assert isinstance(out["a"], list) and isinstance(out["a"][1], tuple)
    assert not out["a"][0].requires_grad and torch.equal(out["a"][0], t.detach())


def test_fill_nan_padding_names_the_line_of_a_file():
    X = np.array([[1.0, np.nan, 2.0], [1.0, 2.0, np.nan]], dtype=np.float32)
    with pytest.raises(ValueError, match=r"^data.tsv line 1 has a missing value \(NaN\) at "
                                         r"sample 1, inside the series"):
        fill_nan_padding(X, "data.tsv", first_line=1)


def test_fill_nan_padding():
    X = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert fill_nan_padding(X) is X  # all finite: no copy
    X[1, 2:] = np.nan
    X[2, 3] = np.nan
    out = fill_nan_padding(X)
    assert out.dtype == np.float32 and np.isnan(X).sum() == 3  # the input is left alone
    np.testing.assert_array_equal(out, [[0, 1, 2, 3], [4, 5, 0, 0], [8, 9, 10, 0]])
    for bad, match in ((np.array([[1.0, np.nan, 2.0]]), "row 0 has a missing value .NaN. at "
                                                         "sample 1, inside the series"),
                       (np.array([[1.0, 2.0], [np.nan, np.nan]]), "row 1 is all NaN"),
                       (np.array([[1.0, -np.inf]]), "row 0 holds an infinite value .sample 1.")):
        with pytest.raises(ValueError, match=f"^Xv: {match}"):
            fill_nan_padding(bad, "Xv")


def test_fill_nan_padding_interpolates_on_request():
    X = np.array([[np.nan, 1.0, np.nan, np.nan, 4.0, np.nan], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]])
    with pytest.raises(ValueError, match="row 0 has a missing value .NaN. at sample 0"):
        fill_nan_padding(X)
    np.testing.assert_array_equal(fill_nan_padding(X, missing="interpolate"),
                                  [[1, 1, 2, 3, 4, 0], [1, 2, 3, 4, 5, 6]])
    with pytest.raises(ValueError, match=r"missing: expected one of \('error', 'interpolate'\)"):
        fill_nan_padding(X, missing="mean")


# -- min_steps: a floor on optimiser steps for small datasets --------------------------------
@pytest.mark.parametrize("n, min_steps, epochs", [
    (28, 1000, 1000),    # one batch an epoch: 1000 epochs of 1 step
    (100, 1000, 500),    # 2 batches an epoch
    (390, 1000, 143),    # 7 batches: 80 epochs are 560 steps < 1000
    (768, 1000, 84),     # 12 batches: 960 steps < 1000
    (769, 1000, 80),     # 13 batches: 1040 steps, unaffected
    (3601, 1000, 80),    # FordA's TRAIN (57 batches, 4,560 steps): unaffected
    (2880, 2000, 80),    # FordA's validation-stage train split (45 batches): unaffected
    (3601, 4560, 80),    # exactly the steps it makes anyway
    (28, 0, 80),         # 0: off, exactly `epochs`
])
def test_min_steps_raises_the_epochs_of_small_data_only(n, min_steps, epochs):
    cfg = TrainConfig(epochs=80, batch_size=64, min_steps=min_steps)
    assert cfg.epochs_for(n) == epochs
    assert cfg.epochs_for(n) * -(-n // 64) >= min(min_steps, 80 * -(-n // 64))
    with pytest.raises(ValueError, match="n_train must be positive"):
        cfg.epochs_for(0)


@pytest.mark.parametrize("n, batch, epochs", [
    (16, 8, 500),      # 16 // 4 = 4 -> 8 at the least: 2 batches an epoch
    (28, 8, 250),      # 7 -> 8: 4 batches (Coffee)
    (100, 25, 250),    # 4 batches of 25
    (175, 43, 200),    # Fish: 5 batches of 43 (the last of 3)
    (255, 63, 200),
    (256, 64, 250),    # 4 batches of 64: the batch is batch_size from here on
    (3601, 64, 80),    # FordA: unaffected
])
def test_min_batches_shrinks_the_batch_of_small_data_only(n, batch, epochs):
    cfg = TrainConfig(epochs=80, batch_size=64, min_steps=1000, min_batches=4)
    assert cfg.batch_for(n) == batch and cfg.epochs_for(n) == epochs
    assert TrainConfig(batch_size=64).batch_for(n) == 64  # 0: off
    assert TrainConfig(batch_size=4, min_batches=4).batch_for(n) == 4  # never above batch_size
    with pytest.raises(ValueError, match="n_train must be positive"):
        cfg.batch_for(0)


@pytest.mark.parametrize("field", ["min_steps", "min_batches"])
@pytest.mark.parametrize("value, match", [(-1, r"must be in \[0, inf\)"),
                                          (2.0, "must be an int"),
                                          (True, "must be an int")])
def test_min_steps_and_min_batches_are_validated(field, value, match):
    with pytest.raises(ValueError, match=f"{field} {match}"):
        TrainConfig(**{field: value}).validate()


def test_config_saved_before_min_steps_reads_back_with_it_off():
    d = TrainConfig(epochs=3, min_steps=500).to_dict()
    assert d["min_steps"] == 500 and TrainConfig.from_dict(d) == TrainConfig(epochs=3,
                                                                             min_steps=500)
    old = {k: v for k, v in d.items() if k not in ("min_steps", "min_batches")}
    assert TrainConfig.from_dict(old).min_steps == 0 == TrainConfig.from_dict(old).min_batches
    # the dataclass (the loop used directly): off
    assert TrainConfig().min_steps == 0 == TrainConfig().min_batches


def test_trainer_runs_the_raised_epochs_and_an_unbinding_floor_changes_nothing(tmp_path):
    torch.set_num_threads(1)
    # 72 series in batches of 16: 5 steps an epoch; a floor of 12 steps makes 1 epoch into 3
    raised = make(tmp_path / "r", cfg=TrainConfig(epochs=1, batch_size=16, lr=3e-3, seed=1,
                                                 min_steps=12))
    assert raised.epochs == 3 and len(raised.run()) == 3 and raised.step == 15
    assert raised.scheduler.total_steps == 15
    # 2 epochs already make 10 steps >= 10: bit for bit the run without a floor
    off = make(tmp_path / "a")
    hist = off.run()
    floor = make(tmp_path / "b", cfg=TrainConfig(epochs=2, batch_size=16, lr=3e-3, seed=1,
                                                min_steps=10))  # reseeds: dropout the same
    assert strip_time(hist) == strip_time(floor.run())
    for k, v in weights(off).items():
        assert torch.equal(v, floor.model.state_dict()[k]), k
    # 72 series, at least 9 batches: batches of 8, 9 steps an epoch
    small = make(tmp_path / "s", cfg=TrainConfig(epochs=1, batch_size=16, seed=1,
                                                min_batches=9))
    assert (small.batch_size, small.steps_per_epoch, small.epochs) == (8, 9, 1)
    small.run()
    assert small.step == 9
