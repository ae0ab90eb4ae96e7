"""FordA training: AdamW + one-cycle LR, label smoothing, clipping, shift/scale augmentation,
on the shared :class:`~linattn.train_loop.TrainLoop` (a checkpoint after every epoch that resumes
to the identical result, a clean stop on Ctrl-C, ``metrics.jsonl`` with one line per epoch).

Determinism: the shuffle and augmentation of epoch e come from a generator seeded by (seed, e)
(:func:`~linattn.tsc.data.epoch_generator`); dropout draws from torch's global generator, whose
state is saved in every checkpoint. On CPU with a fixed thread count a run is bit-reproducible,
and a resumed run matches an uninterrupted one bit for bit.

Checkpoint: ``DIR/checkpoint.pt``, the loop's single atomic file (its ``meta`` is
``{"model": model config, "train": TrainConfig}``); step s is batch ``s % steps_per_epoch`` of
epoch ``s // steps_per_epoch``. The folder layout of earlier versions (``DIR/latest.json``
pointing at ``DIR/eEEEE-bBBBB/`` with ``model.safetensors``, ``config.json``, ``state.pt``) is
still read, so their interrupted runs resume.

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

import math
import os
import pickle
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from linattn._config import (
    F32_MAX,
    Range,
    Removed,
    check_field_types,
    check_ranges,
    drop_removed,
)
from linattn._io import read_json, write_json
from linattn.train_loop import CHECKPOINT_FILE, CheckpointError, TrainLoop, first_line
from linattn.tsc.data import augment, epoch_generator
from linattn.tsc.metrics import accuracy, macro_f1

__all__ = ["TrainConfig", "Trainer", "EpochLoop", "predict_logits", "write_json", "CheckpointError",
           "TRAIN_RANGES", "REMOVED_TRAIN_OPTIONS", "DEFAULT_MIN_STEPS", "DEFAULT_MIN_BATCHES",
           "MIN_BATCH", "model_device", "to_cpu"]


@dataclass
class TrainConfig:
    """Training hyper-parameters (the reference recipe's defaults).

    ``min_steps`` is a floor on the number of optimiser steps: when ``epochs`` passes over the
    data would make fewer than ``min_steps`` steps (small datasets: one step an epoch up to
    ``batch_size`` series), the run is lengthened to ``ceil(min_steps / steps_per_epoch)``
    epochs (:meth:`epochs_for`), and the one-cycle schedule spans them. 0 (off: exactly
    ``epochs``) is this dataclass's default, so saved configurations without the field and the
    training loop used directly behave as before; the estimator's default is
    :data:`DEFAULT_MIN_STEPS`. Data with ``epochs * steps_per_epoch >= min_steps`` are
    unaffected (FordA's reference run: 80 x 57 = 4,560 steps). ``min_batches`` (0: off, here
    and in the estimator) shrinks the batch of a small set (:meth:`batch_for`: fewer than
    ``4 * batch_size`` series for 4) so that an epoch makes about that many steps; the batch is
    set before ``min_steps`` counts steps. It was a candidate default, not adopted.

    ``from_dict`` reads saved configurations: unknown keys are ignored, missing ones take the
    defaults (``min_steps`` 0), and the removed experiments ``mixup`` / ``cutmix`` are accepted
    at their neutral value 0 only.
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
    seed: int = 0
    min_steps: int = 0
    min_batches: int = 0

    def to_dict(self) -> dict:
        return asdict(self)

    def batch_for(self, n_train: int) -> int:
        """The batch size of a run over ``n_train`` series: ``batch_size``, or with
        ``min_batches`` > 0 ``min(batch_size, max(8, n_train // min_batches))``, so that a
        small set makes about ``min_batches`` batches an epoch (batches of 8 at the least)."""
        if n_train < 1:
            raise ValueError(f"batch_for: n_train must be positive, got {n_train}")
        if not self.min_batches:
            return self.batch_size
        return min(self.batch_size, max(MIN_BATCH, n_train // self.min_batches))

    def epochs_for(self, n_train: int) -> int:
        """The epochs a run over ``n_train`` series makes: ``epochs``, raised to
        ``ceil(min_steps / steps_per_epoch)`` if that is more (``steps_per_epoch =
        ceil(n_train / batch_for(n_train))``)."""
        steps_per_epoch = math.ceil(n_train / self.batch_for(n_train))
        return max(self.epochs, math.ceil(self.min_steps / steps_per_epoch))

    def validate(self, where: str = "train config") -> None:
        """ValueError naming the field for a wrong type or a value out of range."""
        values = self.to_dict()
        check_field_types(values, type(self), where)
        check_ranges(values, TRAIN_RANGES, where)
        if self.scale_low > self.scale_high:
            raise ValueError(f"{where}: scale_low must be <= scale_high, got "
                             f"{self.scale_low!r} > {self.scale_high!r}")

    @classmethod
    def from_dict(cls, d: dict, where: str = "train config") -> TrainConfig:
        """The config of a saved dict; removed options are dropped at their neutral value
        (anything else is a :class:`CheckpointError`), other unknown keys ignored."""
        d = drop_removed(d, REMOVED_TRAIN_OPTIONS, where, error=CheckpointError)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


#: Allowed ranges of the training fields (their types come from the annotations).
TRAIN_RANGES: dict[str, Range] = {
    "epochs": (1, math.inf, True, False),
    "batch_size": (1, math.inf, True, False),
    # at most float32's largest: the optimiser takes them as float32 scalars
    "lr": (0.0, F32_MAX, False, True),
    "weight_decay": (0.0, F32_MAX, True, True),
    "pct_start": (0.0, 1.0, False, False),
    "label_smoothing": (0.0, 1.0, True, False),
    "clip": (0.0, math.inf, True, False),
    "scale_low": (0.0, math.inf, False, False),
    "scale_high": (0.0, math.inf, False, False),
    "min_steps": (0, math.inf, True, False),
    "min_batches": (0, math.inf, True, False),
}

#: The smallest batch ``min_batches`` shrinks a batch to (:meth:`TrainConfig.batch_for`).
MIN_BATCH = 8

#: The estimator's ``min_steps`` and ``min_batches`` (:class:`~linattn.tsc.
#: LinearAttentionClassifier`; 0 in this dataclass): chosen on inner TRAIN/validation splits of
#: UCR datasets (docs/experiments.md, "Second run").
DEFAULT_MIN_STEPS = 1000
DEFAULT_MIN_BATCHES = 0  # tried (4) and not adopted: worse than batch 64 at 1000 steps

#: Rejected experiments (removed after linattn 0.1.0) that old saved configurations may still
#: name, at their neutral value 0 (None in some hand-written files).
REMOVED_TRAIN_OPTIONS: Removed = {
    "mixup": (lambda v, d: v in (0, None), "mixup"),
    "cutmix": (lambda v, d: v in (0, None), "cutmix"),
}


def model_device(model: nn.Module) -> torch.device:
    """The device of a module's first parameter (CPU for a module without any)."""
    p = next(model.parameters(), None)
    return torch.device("cpu") if p is None else p.device


def to_cpu(obj):
    """``obj`` with every tensor in it (nested dicts, lists, tuples) copied to the CPU: what
    checkpoints and saved models store, so that they load on a machine without the training
    device."""
    if isinstance(obj, Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


@torch.no_grad()
def predict_logits(model: nn.Module, X: np.ndarray | torch.Tensor, batch_size: int = 256,
                   device: str | torch.device | None = None) -> torch.Tensor:
    """Eval-mode logits (n, classes), on the CPU, of the series X (n, length), in batches of
    ``batch_size`` moved to ``device`` (None: where the model's parameters are)."""
    was_training = model.training
    model.eval()
    device = model_device(model) if device is None else torch.device(device)
    X = torch.as_tensor(np.asarray(X, dtype=np.float32))
    out = [model(X[i : i + batch_size].to(device)).float().cpu()
           for i in range(0, len(X), batch_size)]
    model.train(was_training)
    if not out:
        return torch.zeros(0, getattr(getattr(model, "config", None), "n_classes", 0))
    return torch.cat(out)


class EpochLoop(TrainLoop):
    """A :class:`~linattn.train_loop.TrainLoop` over ``epochs`` passes of the training series
    X (n, length), in batches of ``batch_size``: step s is batch ``s % steps_per_epoch`` of epoch
    ``s // steps_per_epoch``. Epoch e's order, circular shifts (if ``shift``) and scales (uniform
    in ``scale``; (1, 1) = none) come from a generator seeded by (seed, e), so a resumed run
    draws the same batches. Subclasses add the loss, the records and the schedule (``scheduler``
    may be set after ``__init__``, since it needs ``steps_per_epoch``)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, X, *, epochs: int,
                 batch_size: int, seed: int, shift: bool = True,
                 scale: tuple[float, float] = (0.8, 1.2), **loop_kwargs) -> None:
        self.X = torch.as_tensor(np.asarray(X, dtype=np.float32))
        if self.X.ndim != 2 or len(self.X) == 0:
            raise ValueError(f"X: expected training series (n >= 1, length), got shape "
                             f"{tuple(self.X.shape)}")
        self.epochs, self.batch_size, self.seed = epochs, batch_size, seed
        self.shift, self.scale = shift, scale
        self.steps_per_epoch = math.ceil(len(self.X) / batch_size)
        super().__init__(model, optimizer, bar_total=epochs * self.steps_per_epoch,
                         bar_unit="batch", **loop_kwargs)
        self.loss_sum, self.n_seen = 0.0, 0  # of the current epoch, on this rank
        self._plan_of: tuple[int, tuple] | None = None  # (epoch, its plan)

    @property
    def epoch(self) -> int:
        """Completed epochs."""
        return self.step // self.steps_per_epoch

    @property
    def batch(self) -> int:
        """Completed batches of the current epoch."""
        return self.step % self.steps_per_epoch

    def finished(self) -> bool:
        return self.epoch >= self.epochs

    def _position(self) -> tuple[int, int]:
        """(epoch, batches done in it) of the step just taken."""
        return (self.step - 1) // self.steps_per_epoch, (self.step - 1) % self.steps_per_epoch + 1

    def _plan(self, epoch: int) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Epoch ``epoch``'s order (n,), shifts (n,) and scales (n,) (None: not augmented)."""
        if self._plan_of is None or self._plan_of[0] != epoch:
            n, (low, high) = len(self.X), self.scale
            g = epoch_generator(self.seed, epoch)
            perm = torch.randperm(n, generator=g)
            shifts = torch.randint(0, self.X.shape[1], (n,), generator=g) if self.shift else None
            scales = None if (low, high) == (1.0, 1.0) else low + (high - low) * torch.rand(
                n, generator=g)
            self._plan_of = (epoch, (perm, shifts, scales))
        return self._plan_of[1]

    def batch_indices(self) -> Tensor:
        """The positions in X of the series of step ``self.step`` (<= batch_size)."""
        b = self.batch
        return self._plan(self.epoch)[0][b * self.batch_size : (b + 1) * self.batch_size]

    def augmented(self, idx: Tensor) -> Tensor:
        """X[idx] (len(idx), length), shifted and scaled as this epoch's plan says."""
        _, shifts, scales = self._plan(self.epoch)
        return augment(self.X[idx], None if shifts is None else shifts[idx],
                       None if scales is None else scales[idx])

    def track(self, loss: Tensor, n: int) -> None:
        """Add a batch of ``n`` series with mean loss ``loss`` to the epoch's loss."""
        self.loss_sum += loss.item() * n
        self.n_seen += n

    def extra_state(self) -> dict:
        return {"loss_sum": self.loss_sum, "n_seen": self.n_seen}

    def load_extra_state(self, state: dict) -> None:
        self.loss_sum, self.n_seen = state["loss_sum"], state["n_seen"]

    def postfix(self) -> dict:
        return {"epoch": f"{self.epoch + 1}/{self.epochs}",
                "loss": f"{self.loss_sum / max(1, self.n_seen):.4f}"}


class Trainer(EpochLoop):
    """Train ``model`` on (X, y) with integer labels ``y`` in ``[0, n_classes)``.

    Args:
        X_val, y_val: evaluated after every epoch (loss, accuracy, macro F1) if given.
        checkpoint_dir: a checkpoint after every epoch (and on Ctrl-C) goes here.
        metrics_path: one JSON line per epoch is written here.
        progress: a tqdm bar over the run, a line per epoch with the loss and validation F1.
        desc: the bar's label (and the ``stage`` of every record).
        on_step: called as ``on_step(trainer, epoch, batch)`` after every optimiser step, with
            ``batch`` the batches done in 0-based ``epoch`` (1 … steps_per_epoch).
        device: where the model is trained (moved there first; None: where it is). The
            series stay on the CPU, where each epoch's shuffle and augmentation are drawn, and
            each batch is moved to ``device``; checkpoints hold CPU copies of every tensor.
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
        device: str | torch.device | None = None,
    ) -> None:
        c = self.config = config
        if len(X) == 0:
            raise ValueError("X: no training series")
        if device is not None:
            model.to(device)  # before the optimiser is built over its parameters
        self.device = model_device(model)
        self.y = torch.as_tensor(np.asarray(y, dtype=np.int64))
        self.X_val = None if X_val is None else np.asarray(X_val, dtype=np.float32)
        self.y_val = None if y_val is None else np.asarray(y_val, dtype=np.int64)
        optimizer = torch.optim.AdamW(model.parameters(), lr=c.lr, weight_decay=c.weight_decay)
        super().__init__(
            model, optimizer, X, epochs=c.epochs_for(len(X)), batch_size=c.batch_for(len(X)),
            seed=c.seed,
            shift=c.shift, scale=(c.scale_low, c.scale_high), clip=c.clip,
            checkpoint_dir=checkpoint_dir, metrics_path=metrics_path,
            meta={"model": model.config.to_dict(), "train": c.to_dict()}, progress=progress,
            desc=desc,
            on_step=None if on_step is None else lambda _: on_step(self, *self._position()))
        self.scheduler = torch.optim.lr_scheduler.OneCycleLR(
            optimizer, max_lr=c.lr, total_steps=max(2, self.epochs * self.steps_per_epoch),
            pct_start=c.pct_start)
        if self.world > self.batch_size:
            raise ValueError(f"batch_size: {self.batch_size} is smaller than the "
                             f"{self.world} ranks")
        # the module that runs forward passes: DDP all-reduces gradients across ranks
        self.net = nn.parallel.DistributedDataParallel(model) if self.world > 1 else model

    def loss(self) -> torch.Tensor:
        batch_idx = self.batch_indices()
        idx = batch_idx[self.rank :: self.world]  # this rank's share of the batch
        loss = F.cross_entropy(self.net(self.augmented(idx).to(self.device)),
                               self.y[idx].to(self.device),
                               label_smoothing=self.config.label_smoothing)
        self.track(loss, len(idx))
        # weight by the share: DDP's mean over ranks is then the whole batch's mean
        return loss * (self.world * len(idx) / len(batch_idx))

    def after_step(self, loss: torch.Tensor) -> dict | None:
        if self.batch != 0:  # mid-epoch
            return None
        loss_sum, n_seen = self._summed(self.loss_sum, self.n_seen)
        self.loss_sum, self.n_seen = 0.0, 0
        return {"stage": self.desc, "epoch": self.epoch, "train_loss": loss_sum / max(1, n_seen),
                "lr": self.scheduler.get_last_lr()[0], **self.evaluate(),
                "time_s": round(self.elapsed, 3)}

    def check_meta(self, saved: dict, path: Path) -> None:
        # a checkpoint of an earlier version spells its configs the old way (renamed fields,
        # removed options at their neutral value): compare them in today's spelling
        train, model = saved.get("train"), saved.get("model")
        if isinstance(train, dict):
            saved = {**saved, "train": TrainConfig.from_dict(train, f"{path}: train").to_dict()}
        if isinstance(model, dict):  # meta["model"] is self.model.config.to_dict()
            try:
                upgraded = type(self.model.config).from_dict(model, f"{path}: model")
                saved = {**saved, "model": upgraded.to_dict()}
            except ValueError:
                pass  # not a config of this model: reported as a different configuration
        super().check_meta(saved, path)

    def describe(self, record: dict) -> str:
        extra = f", val F1 {record['val_f1']:.4f}" if "val_f1" in record else ""
        return (f"{self.desc} epoch {record['epoch']}/{self.epochs}: "
                f"train loss {record['train_loss']:.4f}{extra}")

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

    # -- data parallelism --------
    def _summed(self, *values: float) -> tuple[float, ...]:
        """Sums over the ranks (the values themselves with one rank)."""
        if self.world == 1:
            return values
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t)
        return tuple(t.tolist())

    # -- checkpoints --------
    def state(self) -> dict:
        # CPU copies: a checkpoint written on a GPU resumes (and loads) anywhere; restoring
        # moves the weights and the optimiser's moments back to the model's device
        return to_cpu(super().state())

    def load_checkpoint(self) -> bool:
        """Restore the checkpoint of ``checkpoint_dir`` (also one in the folder layout of
        earlier versions); False if there is none."""
        root = self.checkpoint_dir
        if root is not None and not (root / CHECKPOINT_FILE).exists() and \
                (root / "latest.json").exists():
            self.restore(*_read_legacy(root, self.steps_per_epoch))
            return True
        return super().load_checkpoint()


def _read_legacy(root: Path, steps_per_epoch: int) -> tuple[dict, Path]:
    """A checkpoint of the earlier folder layout (``latest.json`` -> ``eEEEE-bBBBB/``) as the
    loop's checkpoint dict, and its folder."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        d = root / read_json(root / "latest.json")["dir"]
    except (OSError, ValueError, KeyError, TypeError):
        raise CheckpointError(f"{root / 'latest.json'}: does not point at a checkpoint") from None
    try:
        meta = read_json(d / "config.json")
        weights = load_file(str(d / "model.safetensors"))
        state = torch.load(d / "state.pt", weights_only=True)
        return {
            "meta": meta, "model": weights, "optimizer": state["optimizer"],
            "scheduler": state["scheduler"], "rng": {"torch": state["torch_rng"]},
            "step": state["epoch"] * steps_per_epoch + state["batch"],
            "elapsed": state["elapsed"], "history": state["history"],
            "extra": {"loss_sum": state["loss_sum"], "n_seen": state["n_seen"]},
        }, d
    except (OSError, ValueError, KeyError, TypeError, SafetensorError, RuntimeError, EOFError,
            pickle.UnpicklingError, RecursionError, AttributeError) as err:
        raise CheckpointError(f"{d}: unreadable checkpoint ({first_line(err)})") from None
