"""Training loop: the loss falls, checkpoints resume to the identical result, Ctrl-C saves."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
import torch

pytest.importorskip("safetensors")

from linattn.tsc.data import augment, epoch_generator, stratified_split  # noqa: E402
from linattn.tsc.model import FordATransformer, ModelConfig  # noqa: E402
from linattn.tsc.training import CheckpointError, TrainConfig, Trainer  # noqa: E402

SMALL = ModelConfig(length=60, n_classes=2, patch=6, d_model=16, depth=2, heads=2, head_dim=8,
                    mlp_dim=32)


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


def test_ctrl_c_mid_epoch_saves_and_resumes_identically(tmp_path):
    torch.set_num_threads(1)
    ref = make(tmp_path / "a")
    ref.run()

    def sigint_in_epoch_2(tr, epoch, batch):  # a real SIGINT, handled between steps
        if epoch == 1 and batch == 2:
            os.kill(os.getpid(), signal.SIGINT)

    part = make(tmp_path / "b", on_step=sigint_in_epoch_2)
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN under nohup or a background job
    with pytest.raises(KeyboardInterrupt):
        part.run()
    assert signal.getsignal(signal.SIGINT) is before  # the trainer's handler is removed
    assert (part.epoch, part.batch) == (1, 2)
    resumed = make(tmp_path / "b")
    assert resumed.load_checkpoint() and (resumed.epoch, resumed.batch) == (1, 2)
    resumed.run()
    assert strip_time(resumed.history) == strip_time(ref.history)
    for k, v in weights(ref).items():
        torch.testing.assert_close(weights(resumed)[k], v, rtol=0, atol=0)
    # only the latest checkpoint is kept
    assert sorted(p.name for p in (tmp_path / "b" / "ckpt").iterdir()) == [
        "e0002-b0000", "latest.json"]


def test_resume_rejects_other_config_and_corrupt_checkpoint(tmp_path):
    tr = make(tmp_path, cfg=TrainConfig(epochs=1, batch_size=16, seed=1))
    tr.run()
    other = make(tmp_path, cfg=TrainConfig(epochs=1, batch_size=16, seed=2))
    with pytest.raises(CheckpointError, match="different configuration"):
        other.load_checkpoint()
    (tmp_path / "ckpt" / "e0001-b0000" / "state.pt").write_bytes(b"garbage")
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


@pytest.mark.parametrize("mix", [dict(mixup=0.4), dict(cutmix=1.0)])
def test_mixing_trains_and_resumes_identically(tmp_path, mix):
    torch.set_num_threads(1)
    cfg = TrainConfig(epochs=2, batch_size=16, lr=3e-3, seed=1, **mix)
    ref = make(tmp_path / "a", cfg=cfg)
    hist = ref.run()
    plain = make(tmp_path / "p")
    plain.run()
    assert strip_time(hist) != strip_time(plain.history)  # mixing changed the training
    assert np.isfinite(hist[-1]["train_loss"])

    def stop_mid_epoch_2(tr, epoch, batch):
        if epoch == 1 and batch == 2:
            tr.request_stop()

    part = make(tmp_path / "b", cfg=cfg, on_step=stop_mid_epoch_2)
    with pytest.raises(KeyboardInterrupt):
        part.run()
    resumed = make(tmp_path / "b", cfg=cfg)
    assert resumed.load_checkpoint() and (resumed.epoch, resumed.batch) == (1, 2)
    resumed.run()
    assert strip_time(resumed.history) == strip_time(hist)
    for k, v in weights(ref).items():
        torch.testing.assert_close(weights(resumed)[k], v, rtol=0, atol=0)


def test_cutmix_replaces_a_circular_segment():
    X, y = data(n=4, length=10)
    tr = Trainer(FordATransformer(ModelConfig(length=10, patch=5, d_model=8, depth=1, heads=2,
                                              head_dim=4, mlp_dim=8)),
                 X, y, TrainConfig(epochs=1, batch_size=4, cutmix=1.0, seed=3))
    lam, starts, cut = tr._mix_plan(0)
    assert torch.allclose(lam, 1 - cut.float() / 10)
    seen = {}
    tr.net = lambda xb: seen.setdefault("x", xb) @ torch.zeros(10, 2)
    tr._mixed_loss(torch.as_tensor(X), torch.as_tensor(y), (lam, starts, cut), torch.arange(4))
    xb = seen["x"]
    for b in range(4):
        inside = (torch.arange(10) - starts[b]) % 10 < cut[b]
        assert int(inside.sum()) == int(cut[b])
        torch.testing.assert_close(xb[b][inside], torch.as_tensor(X[3 - b])[inside])
        torch.testing.assert_close(xb[b][~inside], torch.as_tensor(X[b])[~inside])
