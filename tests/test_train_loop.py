"""The shared training loop on a toy regression: crash/stop -> resume is bit-identical,
metrics.jsonl holds each record once, Ctrl-C saves and the previous SIGINT handler comes back;
a diverging run stops with one error and keeps its last good checkpoint, a damaged checkpoint
is one CheckpointError, a full disk one OSError naming the file."""

from __future__ import annotations

import json
import os
import signal
import threading

import pytest
import torch
from torch import nn

from linattn.train_loop import (
    CheckpointError,
    NonFiniteError,
    Stopped,
    TrainLoop,
    first_non_finite,
    read_checkpoint,
)


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


# --- divergence, damaged checkpoints, a full disk (issue 24) ---


class Diverging(Toy):
    """Toy whose loss turns NaN at step ``bad`` (0-based), as a far too high learning rate
    does."""

    def __init__(self, tmp, bad, **kw):
        super().__init__(tmp, **kw)
        self.bad = bad

    def loss(self):
        loss = super().loss()
        return loss * float("nan") if self.step == self.bad else loss


def test_a_non_finite_loss_stops_before_the_step_and_keeps_the_last_checkpoint(tmp_path):
    loop = Diverging(tmp_path, bad=5, steps=10, save_at=(2, 4))
    with pytest.raises(NonFiniteError, match=r"^training diverged at step 6: the loss is nan .*"
                                             r"lower the learning rate .*ck/checkpoint.pt keeps "
                                             r"step 4\)$"):
        loop.run()
    assert loop.step == 5  # the bad step was not applied
    assert all(torch.isfinite(v).all() for v in loop.model.state_dict().values())
    ck = read_checkpoint(tmp_path / "ck" / "checkpoint.pt")
    assert ck["step"] == 4 and first_non_finite(ck["model"]) is None
    assert isinstance(NonFiniteError("x"), ValueError)  # the library's error: a ValueError
    with pytest.raises(NonFiniteError, match="at step 1, before any update: .*no checkpoint was "
                                             "written"):
        Diverging(tmp_path / "b", bad=0).run()
    assert not (tmp_path / "b" / "ck" / "checkpoint.pt").exists()


def test_non_finite_weights_are_never_checkpointed(tmp_path):
    loop = Toy(tmp_path, steps=2)
    loop.run()
    with torch.no_grad():
        loop.model[0].weight[0, 0] = float("inf")
    with pytest.raises(NonFiniteError, match=r"0.weight holds non-finite values; .*keeps step 2"):
        loop.save_checkpoint()
    assert read_checkpoint(tmp_path / "ck" / "checkpoint.pt")["step"] == 2


@pytest.mark.parametrize("edit, match", [
    (lambda ck: ck["model"]["0.weight"].fill_(float("nan")), "0.weight holds non-finite"),
    (lambda ck: ck.pop("optimizer"), "does not fit this model"),
    # the tensor named (torch's message had the keys on its second line)
    (lambda ck: ck["model"].pop("2.bias"), r"does not fit this model \(missing tensor "
                                           r"'2.bias'\)$"),
    (lambda ck: ck["model"].update(extra=torch.zeros(1)), r"\(unexpected tensor 'extra'\)$"),
    (lambda ck: ck["model"].update({"0.weight": torch.zeros(3, 4)}),
     r"\('0.weight' has shape \(3, 4\) where the model has \(8, 4\)\)$"),
    (lambda ck: ck.pop("meta"), "incomplete checkpoint"),
    (lambda ck: ck.update(step=-1), "corrupt checkpoint"),
    (lambda ck: ck.update(history="[" * 100_000), "corrupt checkpoint"),
    (lambda ck: ck.update(history="not json"), "corrupt checkpoint"),
])
def test_damaged_checkpoint_is_one_checkpoint_error(tmp_path, edit, match):
    Toy(tmp_path, steps=2).run()
    path = tmp_path / "ck" / "checkpoint.pt"
    ck = torch.load(path, weights_only=True)
    edit(ck)
    torch.save(ck, path)
    with pytest.raises(CheckpointError, match=match) as err:
        Toy(tmp_path, steps=2).load_checkpoint()
    assert str(err.value).startswith(str(path)) and "\n" not in str(err.value)


@pytest.mark.parametrize("data, reason", [
    (b"", "empty or truncated file"),
    (b"garbage\x80\x03", "not a torch checkpoint"),
    (b"PK\x03\x04junk", "corrupt or truncated archive"),
])
def test_unreadable_checkpoint_reason_is_short(tmp_path, data, reason):
    (tmp_path / "checkpoint.pt").write_bytes(data)
    with pytest.raises(CheckpointError, match=reason) as err:
        read_checkpoint(tmp_path / "checkpoint.pt")
    assert "weights_only" not in str(err.value)


def test_full_disk_keeps_the_checkpoint_and_names_the_file(tmp_path, monkeypatch):
    """A write that fails (ENOSPC) is an OSError naming the checkpoint; the previous one and
    metrics.jsonl stay whole."""
    import errno

    import linattn._io as io_mod

    loop = Toy(tmp_path, steps=4, save_at=(2,))
    real = io_mod.Path.write_bytes

    def full(self, data):
        if self.name.startswith(".checkpoint.pt") and loop.step == 4:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, data)

    monkeypatch.setattr(io_mod.Path, "write_bytes", full)
    with pytest.raises(OSError, match="No space left on device") as err:
        loop.run()
    assert err.value.filename == str(tmp_path / "ck" / "checkpoint.pt")
    assert read_checkpoint(tmp_path / "ck" / "checkpoint.pt")["step"] == 2
    assert [p.name for p in (tmp_path / "ck").iterdir()] == ["checkpoint.pt"]  # no temp file
    assert metric_steps(tmp_path) == [2, 4]


def test_a_non_finite_first_step_does_not_blame_the_learning_rate(tmp_path):
    """A loss that is not finite at step 1 comes before any update: the inputs or the initial
    weights overflow, and lowering the learning rate cannot help (issue 51 fifth probe: forda
    train on data near 3e38 said "lower the learning rate")."""
    with pytest.raises(NonFiniteError) as err:
        Diverging(tmp_path, bad=0).run()
    message = str(err.value)
    assert message.startswith("training diverged at step 1, before any update: the loss is nan")
    assert "overflow float32, whatever the learning rate" in message
    assert "lower the learning rate" not in message
