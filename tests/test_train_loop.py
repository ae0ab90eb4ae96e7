"""The shared training loop on a toy regression: crash/stop -> resume is bit-identical,
metrics.jsonl holds each record once, Ctrl-C saves and the previous SIGINT handler comes back."""

from __future__ import annotations

import json
import os
import signal
import threading

import pytest
import torch
from torch import nn

from linattn.train_loop import CheckpointError, Stopped, TrainLoop, read_checkpoint


class Toy(TrainLoop):
    """Fit y = x·w with dropout (so the RNG state matters) over ``steps`` steps; a record every
    ``every`` steps; a checkpoint only at the steps in ``save_at`` (and at the end / on stop)."""

    def __init__(self, tmp, steps=10, every=2, save_at=(), seed=0, **kw):
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.3), nn.Linear(8, 1))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        super().__init__(model, opt, scheduler=sched, clip=1.0, checkpoint_dir=tmp / "ck",
                         metrics_path=tmp / "metrics.jsonl", meta={"steps": steps}, **kw)
        self.steps, self.every, self.save_at = steps, every, set(save_at)
        self.loss_sum = 0.0

    def finished(self):
        return self.step >= self.steps

    def loss(self):
        g = torch.Generator().manual_seed(self.step)
        x = torch.randn(16, 4, generator=g)
        loss = ((self.model(x)[:, 0] - x @ torch.tensor([1.0, -2.0, 0.5, 3.0])) ** 2).mean()
        self.loss_sum += loss.item()
        return loss

    def after_step(self, loss):
        if self.step % self.every:
            return None
        return {"step": self.step, "loss_sum": self.loss_sum,
                "lr": self.optimizer.param_groups[0]["lr"]}

    def should_save(self, record):
        return self.step in self.save_at

    def extra_state(self):
        return {"loss_sum": self.loss_sum}

    def load_extra_state(self, state):
        self.loss_sum = state["loss_sum"]


def weights(loop):
    return {k: v.clone() for k, v in loop.model.state_dict().items()}


def metric_steps(tmp):
    return [json.loads(line)["step"] for line in (tmp / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def reference(tmp_path):
    ref = Toy(tmp_path / "ref")
    ref.run()
    return ref


def assert_same_run(loop, ref):
    assert loop.history == ref.history
    for k, v in weights(ref).items():
        assert torch.equal(weights(loop)[k], v), k
    assert loop.step == ref.step == 10


def test_crash_then_resume_is_identical_and_logs_each_record_once(tmp_path, reference):
    def crash(loop):
        if loop.step == 7:
            raise RuntimeError("power cut")

    first = Toy(tmp_path, save_at={4}, on_step=crash)
    with pytest.raises(RuntimeError, match="power cut"):
        first.run()
    assert metric_steps(tmp_path) == [2, 4, 6]  # 6 was logged after the checkpoint at 4
    again = Toy(tmp_path, seed=1)  # other initial weights: the checkpoint must replace them
    assert again.load_checkpoint() and again.step == 4
    again.run()
    assert_same_run(again, reference)
    assert metric_steps(tmp_path) == [2, 4, 6, 8, 10]
    assert read_checkpoint(tmp_path / "ck" / "checkpoint.pt")["step"] == 10


def test_request_stop_saves_and_raises(tmp_path, reference):
    def stop(loop):
        if loop.step == 5:
            loop.request_stop()

    first = Toy(tmp_path, on_step=stop)
    with pytest.raises(Stopped):  # a KeyboardInterrupt
        first.run()
    assert first.step == 5 and metric_steps(tmp_path) == [2, 4]
    again = Toy(tmp_path)
    assert again.load_checkpoint() and again.step == 5
    again.run()
    assert_same_run(again, reference)


def sigint_at_step_3(loop):
    if loop.step == 3:
        os.kill(os.getpid(), signal.SIGINT)  # handled between steps: the step finishes


@pytest.mark.parametrize("before", [signal.default_int_handler, signal.SIG_IGN, signal.SIG_DFL])
def test_ctrl_c_saves_and_restores_the_previous_handler(tmp_path, reference, before):
    previous = signal.signal(signal.SIGINT, before)
    try:
        first = Toy(tmp_path, on_step=sigint_at_step_3)
        with pytest.raises(KeyboardInterrupt):
            first.run()
        assert signal.getsignal(signal.SIGINT) is before
    finally:
        signal.signal(signal.SIGINT, previous)
    assert first.step == 3
    again = Toy(tmp_path)
    assert again.load_checkpoint() and again.step == 3
    again.run()
    assert_same_run(again, reference)


def test_second_ctrl_c_interrupts_at_once(tmp_path):
    def two_sigints(loop):
        if loop.step == 3:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)  # the default handler by now: raises here

    loop = Toy(tmp_path, on_step=two_sigints)
    with pytest.raises(KeyboardInterrupt) as info:
        loop.run()
    assert not isinstance(info.value, Stopped)  # no checkpoint was waited for
    assert not (tmp_path / "ck" / "checkpoint.pt").exists()


def test_no_handler_outside_the_main_thread(tmp_path):
    seen = []
    loop = Toy(tmp_path, steps=2, on_step=lambda lp: seen.append(signal.getsignal(signal.SIGINT)))
    before = signal.getsignal(signal.SIGINT)
    t = threading.Thread(target=loop.run)
    t.start()
    t.join()
    assert seen == [before, before] and loop.step == 2


def test_resume_rejects_other_meta_and_garbage(tmp_path):
    Toy(tmp_path, steps=2).run()
    with pytest.raises(CheckpointError, match="different configuration"):
        Toy(tmp_path, steps=3).load_checkpoint()
    (tmp_path / "ck" / "checkpoint.pt").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="unreadable checkpoint"):
        Toy(tmp_path, steps=2).load_checkpoint()
    torch.save({"step": 1}, tmp_path / "ck" / "checkpoint.pt")
    with pytest.raises(CheckpointError, match="not a linattn-train/1 checkpoint"):
        Toy(tmp_path, steps=2).load_checkpoint()
    assert Toy(tmp_path / "none").load_checkpoint() is False


def test_fresh_run_rewrites_stale_metrics(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 99}\n')
    Toy(tmp_path, steps=4).run()
    assert metric_steps(tmp_path) == [2, 4]
