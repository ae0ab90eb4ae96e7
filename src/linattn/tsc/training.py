"""The training loop: AdamW + one-cycle LR, label smoothing, clipping, shift/scale augmentation,
per-epoch checkpoints that resume to the identical result, and a clean stop on Ctrl-C.

Determinism: the shuffle and augmentation of epoch e come from a generator seeded by (seed, e)
(:func:`~linattn.tsc.data.epoch_generator`); dropout draws from torch's global generator, whose
state is saved in every checkpoint. On CPU with a fixed thread count a run is bit-reproducible,
and a resumed run matches an uninterrupted one bit for bit.

Checkpoint folder layout (the pointer file is the commit point, so a crash mid-write leaves the
previous checkpoint intact)::

    DIR/latest.json              {"dir": "e0012-b0000", "epoch": 12, "batch": 0}
    DIR/e0012-b0000/model.safetensors   weights
    DIR/e0012-b0000/config.json         model + training configuration
    DIR/e0012-b0000/state.pt            optimiser, scheduler, RNG state, progress, history

Data parallelism: when ``torch.distributed`` is initialised with more than one rank (e.g.
``torchrun --nproc_per_node N -m linattn forda train``) the model is wrapped in
``DistributedDataParallel`` and every global batch of ``batch_size`` series is split across
the ranks the way ``DistributedSampler`` splits an epoch (one shared seeded permutation, strided
by rank). Each rank's loss is weighted by its share of the batch, so DDP's gradient average is
exactly the single-process gradient of the whole batch and the schedule is unchanged. Rank 0
alone shows progress, writes metrics and checkpoints; a Ctrl-C on any rank stops all of them
at the same step. Resuming continues with the same weights, optimiser and data order; only the
dropout streams of ranks above 0 are not restored.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from linattn._io import write_atomic
from linattn.tsc.data import augment, epoch_generator
from linattn.tsc.metrics import accuracy, macro_f1

__all__ = ["TrainConfig", "Trainer", "predict_logits", "write_json", "CheckpointError"]


class CheckpointError(ValueError):
    """A checkpoint or model folder is missing, incomplete or corrupt."""


@dataclass
class TrainConfig:
    """Training hyper-parameters (the reference recipe's defaults).

    ``mixup`` / ``cutmix``: Beta(α, α) parameter of mixing each training series with a partner
    from its batch (the batch in reverse order); 0 = off (the reference), at most one of them.
    Mixup takes ``λ·x + (1 − λ)·x'``; cutmix (along time) replaces a circular segment of
    ``round((1 − λ)·L)`` samples at a random start by the partner's; the loss is
    ``λ·CE(y) + (1 − λ)·CE(y')`` with λ per series. Drawn from a generator of (seed, epoch), so
    resuming stays exact.
    """

    epochs: int = 80
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.05
    pct_start: float = 0.3
    label_smoothing: float = 0.05
    clip: float = 1.0
    shift: bool = True
    scale_low: float = 0.8
    scale_high: float = 1.2
    mixup: float = 0.0
    cutmix: float = 0.0
    seed: int = 0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


def write_json(path: Path, obj) -> None:
    """Write JSON atomically (temp file in the same folder + os.replace)."""
    write_atomic(path, (json.dumps(obj, indent=2) + "\n").encode())


@torch.no_grad()
def predict_logits(model: nn.Module, X: np.ndarray | torch.Tensor, batch_size: int = 256,
                   shifts: tuple[int, ...] = (0,)) -> torch.Tensor:
    """Eval-mode logits (n, classes), averaged over circular ``shifts`` of the input (test-time
    augmentation; the default is the plain prediction)."""
    was_training = model.training
    model.eval()
    X = torch.as_tensor(np.asarray(X, dtype=np.float32))
    out = []
    for i in range(0, len(X), batch_size):
        xb = X[i : i + batch_size]
        acc = None
        for s in shifts:
            logits = model(torch.roll(xb, s, dims=1) if s else xb).float()
            p = logits.log_softmax(-1) if len(shifts) > 1 else logits
            acc = p if acc is None else acc + p
        out.append(acc / len(shifts))
    model.train(was_training)
    if not out:
        return torch.zeros(0, getattr(getattr(model, "config", None), "n_classes", 0))
    return torch.cat(out)


class Trainer:
    """Train ``model`` on (X, y) with integer labels ``y`` in ``[0, n_classes)``.

    Args:
        X_val, y_val: evaluated after every epoch (loss, accuracy, macro F1) if given.
        checkpoint_dir: a checkpoint after every epoch (and on Ctrl-C) goes here.
        metrics_path: one JSON line per epoch is appended here.
        progress: a tqdm bar per epoch with the loss and validation F1.
        desc: the bar's label.
        on_step: called as ``on_step(trainer, epoch, batch)`` after every optimiser step.
    """

    def __init__(
        self,
        model: nn.Module,
        X: np.ndarray,
        y: np.ndarray,
        config: TrainConfig,
        *,
        X_val: np.ndarray | None = None,
        y_val: np.ndarray | None = None,
        checkpoint_dir: str | os.PathLike | None = None,
        metrics_path: str | os.PathLike | None = None,
        progress: bool = False,
        desc: str = "train",
        on_step: Callable[[Trainer, int, int], None] | None = None,
    ) -> None:
        self.model, self.config = model, config
        distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if distributed else 0
        self.world = dist.get_world_size() if distributed else 1
        if self.world > config.batch_size:
            raise ValueError(f"batch_size: {config.batch_size} is smaller than the "
                             f"{self.world} ranks")
        # the module that runs forward passes: DDP all-reduces gradients across ranks
        self.net = nn.parallel.DistributedDataParallel(model) if self.world > 1 else model
        progress = progress and self.rank == 0
        self.X = torch.as_tensor(np.asarray(X, dtype=np.float32))
        self.y = torch.as_tensor(np.asarray(y, dtype=np.int64))
        if len(self.X) == 0:
            raise ValueError("X: no training series")
        self.X_val = None if X_val is None else np.asarray(X_val, dtype=np.float32)
        self.y_val = None if y_val is None else np.asarray(y_val, dtype=np.int64)
        self.checkpoint_dir = None if checkpoint_dir is None else Path(checkpoint_dir)
        self.metrics_path = None if metrics_path is None else Path(metrics_path)
        self.writes = self.rank == 0  # only rank 0 writes metrics and checkpoints
        self.progress, self.desc, self.on_step = progress, desc, on_step
        c = config
        self.steps_per_epoch = math.ceil(len(self.X) / c.batch_size)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=c.lr,
                                           weight_decay=c.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.OneCycleLR(
            self.optimizer, max_lr=c.lr, total_steps=max(2, c.epochs * self.steps_per_epoch),
            pct_start=c.pct_start,
        )
        self.epoch = 0  # completed epochs
        self.batch = 0  # completed batches of the current epoch
        self.loss_sum, self.n_seen = 0.0, 0
        self.elapsed = 0.0
        self.history: list[dict] = []
        self._stop = False

    # -- stopping --------
    def request_stop(self) -> None:
        """Finish the current optimiser step, save a checkpoint, raise KeyboardInterrupt."""
        self._stop = True

    def _on_sigint(self, signum, frame) -> None:
        self._stop = True
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C is immediate

    # -- one epoch's plan --------
    def _plan(self, epoch: int):
        c, n = self.config, len(self.X)
        g = epoch_generator(c.seed, epoch)
        perm = torch.randperm(n, generator=g)
        shifts = torch.randint(0, self.X.shape[1], (n,), generator=g) if c.shift else None
        scales = None
        if (c.scale_low, c.scale_high) != (1.0, 1.0):
            scales = c.scale_low + (c.scale_high - c.scale_low) * torch.rand(n, generator=g)
        return perm, shifts, scales

    def _mix_plan(self, epoch: int):
        """Per-series λ (and cut starts) of an epoch, or None without mixing."""
        c, (n, L) = self.config, self.X.shape
        alpha = c.mixup or c.cutmix
        if not alpha:
            return None
        g = np.random.default_rng([c.seed, epoch, 0x6D6978])
        lam = torch.as_tensor(g.beta(alpha, alpha, n), dtype=torch.float32)
        starts = torch.as_tensor(g.integers(0, L, n))
        if c.cutmix:
            cut = torch.round((1 - lam) * L).long()
            lam = 1 - cut.float() / L
            return lam, starts, cut
        return lam, None, None

    def _mixed_loss(self, xb, yb, mix, pos):
        """Mix the batch xb (positions ``pos`` of the epoch's order) with its reverse; the
        mixed logits' loss."""
        c = self.config
        lam, starts, cut = (None if m is None else m[pos] for m in mix)
        rev = torch.arange(len(xb) - 1, -1, -1)
        if cut is None:
            xb = lam[:, None] * xb + (1 - lam[:, None]) * xb[rev]
        else:
            L = xb.shape[1]
            inside = (torch.arange(L)[None, :] - starts[:, None]) % L < cut[:, None]
            xb = torch.where(inside, xb[rev], xb)
        logits = self.net(xb)
        ce = F.cross_entropy(logits, yb, label_smoothing=c.label_smoothing, reduction="none")
        ce2 = F.cross_entropy(logits, yb[rev], label_smoothing=c.label_smoothing,
                              reduction="none")
        return (lam * ce + (1 - lam) * ce2).mean()

    def evaluate(self) -> dict:
        if self.X_val is None:
            return {}
        logits = predict_logits(self.model, self.X_val)
        yv = torch.as_tensor(self.y_val)
        loss = F.cross_entropy(logits, yv).item() if len(yv) else float("nan")
        pred = logits.argmax(-1).numpy()
        k = logits.shape[1]
        return {"val_loss": loss, "val_acc": accuracy(self.y_val, pred),
                "val_f1": macro_f1(self.y_val, pred, k)}

    def run(self) -> list[dict]:
        """Train until ``config.epochs`` epochs are complete; returns the per-epoch history."""
        install = self.checkpoint_dir is not None and threading.current_thread() is \
            threading.main_thread()
        previous = signal.signal(signal.SIGINT, self._on_sigint) if install else None
        try:
            while self.epoch < self.config.epochs:
                self._run_epoch()
        finally:
            if install:
                signal.signal(signal.SIGINT, previous)
        return self.history

    def _run_epoch(self) -> None:
        c, model = self.config, self.model
        perm, shifts, scales = self._plan(self.epoch)
        mix = self._mix_plan(self.epoch)
        bar = None
        if self.progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=self.steps_per_epoch, initial=self.batch, leave=True,
                       desc=f"{self.desc} epoch {self.epoch + 1}/{c.epochs}", unit="batch",
                       dynamic_ncols=True)
        t0 = time.perf_counter()
        model.train()
        try:
            while self.batch < self.steps_per_epoch:
                batch_idx = perm[self.batch * c.batch_size : (self.batch + 1) * c.batch_size]
                idx = batch_idx[self.rank :: self.world]  # this rank's share of the batch
                xb = augment(self.X[idx], None if shifts is None else shifts[idx],
                             None if scales is None else scales[idx])
                if mix is None:
                    logits = self.net(xb)
                    loss = F.cross_entropy(logits, self.y[idx],
                                           label_smoothing=c.label_smoothing)
                else:
                    loss = self._mixed_loss(xb, self.y[idx], mix, idx)
                self.optimizer.zero_grad(set_to_none=True)
                # weight by the share: DDP's mean over ranks is then the whole batch's mean
                (loss * (self.world * len(idx) / len(batch_idx))).backward()
                if c.clip:
                    nn.utils.clip_grad_norm_(model.parameters(), c.clip)
                self.optimizer.step()
                self.scheduler.step()
                self.batch += 1
                self.loss_sum += loss.item() * len(idx)
                self.n_seen += len(idx)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{self.loss_sum / self.n_seen:.4f}", refresh=False)
                if self.on_step is not None:
                    self.on_step(self, self.epoch, self.batch)
                self._agree_on_stop()
                if self._stop and self.batch < self.steps_per_epoch:
                    self.elapsed += time.perf_counter() - t0
                    t0 = time.perf_counter()
                    self.save_checkpoint()
                    raise KeyboardInterrupt
            self.elapsed += time.perf_counter() - t0
            loss_sum, n_seen = self._summed(self.loss_sum, self.n_seen)
            record = {"stage": self.desc, "epoch": self.epoch + 1,
                      "train_loss": loss_sum / max(1, n_seen),
                      "lr": self.scheduler.get_last_lr()[0], **self.evaluate(),
                      "time_s": round(self.elapsed, 3)}
            if bar is not None:
                post = {"loss": f"{record['train_loss']:.4f}"}
                if "val_f1" in record:
                    post["val_f1"] = f"{record['val_f1']:.4f}"
                bar.set_postfix(post)
        finally:
            if bar is not None:
                bar.close()
        self.history.append(record)
        self.epoch += 1
        self.batch, self.loss_sum, self.n_seen = 0, 0.0, 0
        if self.metrics_path is not None and self.writes:
            self.metrics_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.metrics_path, "a") as f:
                f.write(json.dumps(record) + "\n")
        if self.checkpoint_dir is not None:
            self.save_checkpoint()
        if self._stop:
            raise KeyboardInterrupt

    # -- data parallelism --------
    def _agree_on_stop(self) -> None:
        """With several ranks, stop everywhere if any rank was asked to (a rank that stopped
        alone would leave the others waiting in the next all-reduce)."""
        if self.world > 1:
            flag = torch.tensor([float(self._stop)])
            dist.all_reduce(flag)
            self._stop = bool(flag.item())

    def _summed(self, *values: float) -> tuple[float, ...]:
        """Sums over the ranks (the values themselves with one rank)."""
        if self.world == 1:
            return values
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t)
        return tuple(t.tolist())

    # -- checkpoints --------
    def save_checkpoint(self) -> Path | None:
        """Write a checkpoint (rank 0 only; other ranks return None)."""
        from safetensors.torch import save_file

        if not self.writes:
            return None
        root = self.checkpoint_dir
        assert root is not None
        root.mkdir(parents=True, exist_ok=True)
        name = f"e{self.epoch:04d}-b{self.batch:04d}"
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=root))
        weights = {k: v.detach().contiguous() for k, v in self.model.state_dict().items()}
        save_file(weights, str(tmp / "model.safetensors"))
        write_json(tmp / "config.json", {
            "model": self.model.config.to_dict(), "train": self.config.to_dict()})
        state = {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "epoch": self.epoch, "batch": self.batch,
            "loss_sum": self.loss_sum, "n_seen": self.n_seen,
            "elapsed": self.elapsed, "history": json.dumps(self.history),
        }
        torch.save(state, tmp / "state.pt")
        final = root / name
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        old = self._latest(root)
        write_json(root / "latest.json", {"dir": name, "epoch": self.epoch, "batch": self.batch})
        if old is not None and old != name and (root / old).exists():
            shutil.rmtree(root / old)
        return final

    @staticmethod
    def _latest(root: Path) -> str | None:
        try:
            return json.loads((root / "latest.json").read_text())["dir"]
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def load_checkpoint(self) -> bool:
        """Restore the latest checkpoint of ``checkpoint_dir``; False if there is none."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        root = self.checkpoint_dir
        if root is None or not (root / "latest.json").exists():
            return False
        name = self._latest(root)
        if name is None or not (root / name).is_dir():
            raise CheckpointError(f"{root / 'latest.json'}: does not point at a checkpoint")
        d = root / name
        try:
            saved = json.loads((d / "config.json").read_text())
            weights = load_file(str(d / "model.safetensors"))
            state = torch.load(d / "state.pt", weights_only=True)
        except (OSError, ValueError, SafetensorError, RuntimeError, EOFError,
                pickle.UnpicklingError) as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise CheckpointError(f"{d}: unreadable checkpoint ({first})") from None
        if saved.get("model") != self.model.config.to_dict() or \
                saved.get("train") != self.config.to_dict():
            raise CheckpointError(
                f"{d}: checkpoint was made with a different configuration; use a new --out "
                "or the same options")
        self.model.load_state_dict(weights)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["torch_rng"])
        self.epoch, self.batch = state["epoch"], state["batch"]
        self.loss_sum, self.n_seen = state["loss_sum"], state["n_seen"]
        self.elapsed = state["elapsed"]
        self.history = json.loads(state["history"])
        if self.metrics_path is not None and self.writes:  # drop lines after this checkpoint
            lines = "".join(json.dumps(r) + "\n" for r in self.history)
            write_atomic(self.metrics_path, lines.encode())
        return True
