"""Training the byte-level language model: :class:`Trainer` (or :func:`train`) fits a
:class:`~linattn.nn.LinearTransformerLM` on a byte corpus (by default the standard library's
source, :func:`~linattn.lm.data.stdlib_corpus`) and reports validation bits per byte.

::

    from linattn.lm import LMConfig, TrainConfig, train

    result = train(LMConfig(vocab_size=256, d_model=128, num_layers=4, num_heads=4),
                   TrainConfig(max_time=330, eval_every=50), out="runs/lm-linear")
    result["val_bpc"]

The recipe: AdamW (β 0.9/0.95), ``lr`` with ``warmup`` warm-up steps and a cosine to 10 % over
the budget (``steps``, training seconds ``max_time`` or the first of both; evaluation time is
not counted), gradient clipping at 1, ``batch_size`` random windows of ``context`` tokens a step
(:func:`~linattn.lm.data.training_windows`), validation every ``eval_every`` steps on the first
``val_tokens`` held-out bytes (:func:`evaluate`). Training runs on
:class:`~linattn.train_loop.TrainLoop`: with an ``out`` folder, ``out/checkpoint.pt`` is written
atomically every ``checkpoint_every`` seconds, at the end and on Ctrl-C, ``out/metrics.jsonl``
gets a line per validation and ``out/result.json`` the final figures; ``resume=True`` continues
a checkpoint to the bit-identical result of an uninterrupted run. A resumed run may change the
budget and the validation cadence (:data:`FREE`), nothing else.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from linattn._io import FolderLock, write_json
from linattn.lm.data import (
    byte_ids,
    check_windows,
    stdlib_corpus,
    training_windows,
    validation_windows,
)
from linattn.lm.options import CHECKPOINT_EVERY, check_train_config, check_training_memory
from linattn.nn.lm import LinearTransformerLM, LMConfig
from linattn.nn.mixers import check_positions
from linattn.train_loop import CHECKPOINT_FILE, CheckpointError, TrainLoop

__all__ = ["TrainConfig", "LMTraining", "Trainer", "train", "evaluate", "flushed_denormals",
           "FREE", "VOCAB_SIZE"]

#: Byte tokens: the model's vocabulary must hold 256 ids.
VOCAB_SIZE = 256

#: The training options a resumed run may change (to extend a run).
FREE = ("steps", "max_time", "eval_every")


@dataclass(frozen=True)
class TrainConfig:
    """Training options (the demo recipe's defaults; docs/lm.md). A budget is needed:
    ``steps``, ``max_time`` (training seconds) or both, whichever ends first. ValueError naming
    the field for a bad value."""

    context: int = 256
    batch_size: int = 32
    lr: float = 2e-3
    weight_decay: float = 0.01
    warmup: int = 30
    steps: int | None = None
    max_time: float | None = None
    seed: int = 0
    val_tokens: int = 65_536
    eval_every: int = 100
    corpus_bytes: int = 4_000_000

    def __post_init__(self) -> None:
        check_train_config(self.to_dict())  # declared once: linattn.lm.options

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "train config") -> TrainConfig:
        """The options saved as ``d`` (:meth:`to_dict`); ValueError naming ``where`` and the key
        for unknown keys and bad values."""
        if not isinstance(d, Mapping):
            raise ValueError(f"{where}: expected a dict, got {type(d).__name__}")
        unknown = sorted(set(d) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"{where}: unknown keys {unknown}")
        try:
            return cls(**d)
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None


def evaluate(model: LinearTransformerLM, val: torch.Tensor, context: int, max_tokens: int,
             batch: int = 32) -> float:
    """Bits per byte over non-overlapping windows of ``context`` targets (first ``max_tokens``
    of the validation ids ``val``); every window starts from an empty state, as in training.
    The model is in eval mode meanwhile, then back in its mode."""
    was = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        with torch.no_grad():
            for w in validation_windows(val, context, max_tokens, batch):
                logits = model(w[:, :-1])
                total += F.cross_entropy(logits.flatten(0, 1), w[:, 1:].flatten(),
                                         reduction="sum").item()
                count += w[:, 1:].numel()
    finally:
        model.train(was)
    return total / count / math.log(2)


@contextmanager
def flushed_denormals() -> Iterator[None]:
    """Flush subnormal floats to 0 inside the block (this thread's FTZ/DAZ), then restore.

    Subnormals (e.g. exp of scores ~90 below a row's max) run through microcode on x86: they
    made the softmax baseline's SDPA backward 2–3× slower at context 4,096 (docs/lm.md).
    Flushing changes values below 1.2e-38 only. Restored on exit: the mode is process state,
    and Python's own float parsing obeys it."""
    was_on = (torch.tensor(2e-38, dtype=torch.float32) / 4).item() == 0.0  # 5e-39: subnormal
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(was_on)


class LMTraining(TrainLoop):
    """The language model's loop: step s trains on ``batch_size`` random windows of
    ``context + 1`` bytes drawn by a generator seeded by (seed, s), so a resumed run draws the
    same data; warm-up then cosine decay to 10 % over the budget (steps, training seconds or
    the first of both); validation every ``eval_every`` steps. ``meta`` is what checkpoints
    store and a resumed run must match (:meth:`check_meta`)."""

    def __init__(self, model: LinearTransformerLM, config: TrainConfig, train_ids: torch.Tensor,
                 val_ids: torch.Tensor, *, out: str | os.PathLike | None = None,
                 meta: dict | None = None, checkpoint_every: float | None = 60.0,
                 progress: bool = False,
                 on_step: Callable[[TrainLoop], None] | None = None) -> None:
        c = self.config = config
        optimizer = torch.optim.AdamW(model.parameters(), lr=c.lr,
                                      weight_decay=c.weight_decay, betas=(0.9, 0.95))
        self.timed = c.steps is None  # the bar counts seconds
        super().__init__(
            model, optimizer, clip=1.0, checkpoint_dir=out, checkpoint_every=checkpoint_every,
            metrics_path=None if out is None else Path(out) / "metrics.jsonl",
            meta=meta, progress=progress, desc=f"lm {model.config.attention}",
            bar_total=int(c.max_time) if self.timed else c.steps,
            bar_unit="s" if self.timed else "step", on_step=on_step)
        self.train_ids, self.val_ids = train_ids, val_ids
        self.loss_ema: float | None = None

    def budget_used(self) -> float:
        """Fraction of the budget used (drives the cosine schedule)."""
        c = self.config
        fr = [self.step / c.steps] if c.steps else []
        if c.max_time:
            fr.append(self.elapsed / c.max_time)
        return min(1.0, max(fr))

    def finished(self) -> bool:
        return self.budget_used() >= 1.0

    def learning_rate(self) -> float:
        c = self.config
        warm = min(1.0, (self.step + 1) / c.warmup)
        return c.lr * warm * (0.1 + 0.45 * (1 + math.cos(math.pi * self.budget_used())))

    def loss(self) -> torch.Tensor:
        c = self.config
        w = training_windows(self.train_ids, c.context, c.batch_size, c.seed, self.step)
        logits = self.model(w[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1), w[:, 1:].flatten())

    def after_step(self, loss: torch.Tensor) -> dict | None:
        value = loss.item()
        self.loss_ema = value if self.loss_ema is None else 0.95 * self.loss_ema + 0.05 * value
        if self.step % self.config.eval_every:
            return None
        bpc = evaluate(self.model, self.val_ids, self.config.context, self.config.val_tokens)
        return {"step": self.step, "time_s": round(self.elapsed, 2),
                "train_bpc": self.loss_ema / math.log(2), "val_bpc": bpc}

    def extra_state(self) -> dict:
        return {"loss_ema": self.loss_ema}

    def load_extra_state(self, state: dict) -> None:
        self.loss_ema = state["loss_ema"]

    def check_meta(self, saved: dict, path: Path) -> None:
        """The checkpoint's model and training options must be this run's, compared in today's
        spelling (:meth:`LMConfig.from_dict`, :meth:`TrainConfig.from_dict`), except
        :data:`FREE`; so must its corpus."""
        if _comparable(saved) != _comparable(self.meta):
            raise CheckpointError(f"{path}: made with other options or another corpus; "
                                  "use the same options or a new --out")

    def bar_position(self) -> int:
        return int(self.elapsed) if self.timed else self.step  # whole seconds on a timed bar

    def postfix(self) -> dict:
        bpc = float("nan") if self.loss_ema is None else self.loss_ema / math.log(2)
        return {"bpc": f"{bpc:.3f}", "step": self.step}

    def describe(self, record: dict) -> str:
        return (f"step {record['step']} ({record['time_s']:.0f} s): "
                f"val {record['val_bpc']:.4f} bits/byte")


def _comparable(meta: Any) -> Any:
    """``meta`` with its configs in today's spelling, the free training options left out."""
    if not isinstance(meta, dict):
        return meta
    out = dict(meta)
    try:
        out["model_config"] = LMConfig.from_dict(meta.get("model_config")).to_dict()
    except ValueError:
        pass  # compared as saved: not equal to a valid config
    train = meta.get("train_config")
    if isinstance(train, dict):
        try:
            train = TrainConfig.from_dict(train).to_dict()
        except ValueError:
            pass
        out["train_config"] = {k: v for k, v in train.items() if k not in FREE}
    return out


class Trainer:
    """One training run of a :class:`~linattn.nn.LinearTransformerLM` (module docstring).

    Making a Trainer reads the corpus, builds the model (seeded by ``config.seed``) and, with
    ``resume``, restores the checkpoint in ``out``; :meth:`run` trains and returns the result.

    Args:
        model_config: the model (an :class:`~linattn.nn.LMConfig`, or its dict); byte tokens
            need ``vocab_size`` ≥ 256, a checkpoint a feature map given by name.
        config: the training options.
        out: the run folder (checkpoint, ``metrics.jsonl``, ``result.json``); None: nothing is
            written and the run cannot be resumed.
        resume: continue the checkpoint in ``out`` (FileNotFoundError if there is none;
            without ``resume`` an existing one is a FileExistsError, so no run is overwritten).
            A checkpoint made with other options raises
            :class:`~linattn.train_loop.CheckpointError`.
        corpus: ``(train bytes, validation bytes, info)``; default
            ``stdlib_corpus(config.corpus_bytes)``.
        checkpoint_every: seconds between checkpoints (one is also written at the end and on a
            stop).
        progress: a progress bar (needs tqdm).
        on_step: called as ``on_step(loop)`` after every optimiser step (``loop.step`` counts
            them; ``loop.request_stop()`` stops the run as Ctrl-C does).

    Attributes: ``model``, ``loop`` (the :class:`LMTraining`), ``corpus_info``, ``out``.
    """

    def __init__(self, model_config: LMConfig | Mapping[str, Any], config: TrainConfig, *,
                 out: str | os.PathLike | None = None, resume: bool = False,
                 corpus: tuple[bytes, bytes, dict] | None = None,
                 checkpoint_every: float = 60.0, progress: bool = False,
                 on_step: Callable[[TrainLoop], None] | None = None) -> None:
        if not isinstance(model_config, LMConfig):
            model_config = LMConfig.from_dict(model_config)
        CHECKPOINT_EVERY.check("checkpoint_every", checkpoint_every)
        if model_config.vocab_size < VOCAB_SIZE:
            raise ValueError(f"vocab_size: byte tokens need at least {VOCAB_SIZE}, "
                             f"got {model_config.vocab_size}")
        # absurd sizes refused before anything is allocated (an OOM kill otherwise), and a
        # context longer than the kind's weights hold (cosFormer's horizon)
        check_training_memory(model_config.to_dict(), config.to_dict())
        check_positions(model_config.attention, config.context, "context")
        self.model_config, self.config = model_config, config
        self.out = None if out is None else Path(out)
        self._lock: FolderLock | None = None
        if self.out is None:
            if resume:
                raise ValueError("resume: needs the run folder out")
        else:
            if not isinstance(model_config.feature_map, str):
                raise ValueError("feature_map: a checkpoint stores the feature map by name; "
                                 f"got {type(model_config.feature_map).__name__}")
            ck = self.out / CHECKPOINT_FILE
            if resume and not ck.exists():
                raise FileNotFoundError(f"resume: no checkpoint in {self.out}")
            # the folder's one owner until run() ends (FolderInUseError: another run has it);
            # whether it holds a run is asked again under the lock
            self._lock = FolderLock(self.out)
            if ck.exists() and not resume:
                self._lock.release()
                raise FileExistsError(f"{self.out} already holds a run; resume it or choose "
                                      "another folder")
        try:
            tr, va, self.corpus_info = (stdlib_corpus(config.corpus_bytes) if corpus is None
                                        else corpus)
            self.train_ids, self.val_ids = byte_ids(tr), byte_ids(va)
            # now, not at the first step or evaluation (a traceback after the corpus line)
            check_windows(config.context, len(self.train_ids), len(self.val_ids))
            torch.manual_seed(config.seed)
            self.model = LinearTransformerLM.from_config(model_config)
            self.loop = LMTraining(
                self.model, config, self.train_ids, self.val_ids, out=self.out,
                meta={"model_config": model_config.to_dict(), "train_config": config.to_dict(),
                      "corpus": self.corpus_info},
                checkpoint_every=checkpoint_every, progress=progress, on_step=on_step)
            if resume:
                self.loop.load_checkpoint()
        except BaseException:
            self.close()
            raise

    @property
    def checkpoint_path(self) -> Path | None:
        return self.loop.checkpoint_path

    def run(self) -> dict[str, Any]:
        """Train to the end of the budget (subnormals flushed, :func:`flushed_denormals`),
        evaluate on ``config.val_tokens`` held-out bytes and return the result (also written
        to ``out/result.json``): ``attention``, ``val_bpc``, ``parameters``, ``train_time_s``,
        ``steps``, ``tokens_seen``, ``threads``, ``model``, ``train``, ``corpus``. A stop
        (Ctrl-C, ``request_stop``) saves the checkpoint and raises
        :class:`~linattn.train_loop.Stopped`."""
        c, loop = self.config, self.loop
        try:
            with flushed_denormals():
                loop.run()
            bpc = evaluate(self.model, self.val_ids, c.context, c.val_tokens)
            result = {"attention": self.model_config.attention, "val_bpc": round(bpc, 4),
                      "parameters": self.model.num_parameters(),
                      "train_time_s": round(loop.elapsed, 1), "steps": loop.step,
                      "tokens_seen": loop.step * c.batch_size * c.context,
                      "threads": torch.get_num_threads(), "model": self.model_config.to_dict(),
                      "train": c.to_dict(), "corpus": self.corpus_info}
            if self.out is not None:
                write_json(self.out / "result.json", result)
        finally:
            self.close()
        return result

    def close(self) -> None:
        """Give up the run folder (:class:`~linattn._io.FolderLock`); :meth:`run` does at its
        end. A Trainer that is never run holds it until it is closed or collected."""
        if self._lock is not None:
            self._lock.release()


def train(model_config: LMConfig | Mapping[str, Any], config: TrainConfig, **kwargs: Any
          ) -> dict[str, Any]:
    """``Trainer(model_config, config, **kwargs).run()``: train and return the result."""
    return Trainer(model_config, config, **kwargs).run()
