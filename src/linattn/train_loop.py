"""The training loop shared by every trainer of the library (FordA, the streaming classifier, the
language model): the optimiser step, checkpoints that resume to the bit-identical result, a
clean stop on Ctrl-C, progress and ``metrics.jsonl``.

A trainer subclasses :class:`TrainLoop` and supplies only what differs: how step ``self.step``
draws its batch and computes its loss (:meth:`~TrainLoop.loss`), when the budget is used up
(:meth:`~TrainLoop.finished`), its learning-rate rule (a torch scheduler, or
:meth:`~TrainLoop.learning_rate`), and what it logs or evaluates (:meth:`~TrainLoop.after_step`).
Each step is::

    lr rule -> loss() -> zero_grad -> backward -> clip grad norm -> optimiser step
    -> scheduler step -> step += 1 -> on_step -> after_step (maybe a record) -> maybe save

Checkpoint: one file, ``DIR/checkpoint.pt``, replaced atomically (temp file + rename), so a crash
mid-write leaves the previous one. ``torch.load(weights_only=True)`` reads it::

    format      "linattn-train/1"
    meta        the trainer's configuration; resuming requires a compatible one (check_meta)
    model, optimizer, scheduler     state dicts (scheduler None without one)
    rng         {"torch": the CPU generator's state[, "cuda": per-device states]}
    step        optimiser steps done
    elapsed     seconds of training (evaluation and checkpointing excluded)
    history     JSON text of the records logged so far
    extra       the trainer's own counters (extra_state)

A resumed run restores all of it, so it continues exactly as the uninterrupted run would have
(dropout draws from torch's global generator, whose state is saved), and :meth:`TrainLoop.run`
first rewrites ``metrics.jsonl`` to the restored history: records logged after the checkpoint
by a run that then crashed are dropped instead of repeated.

Ctrl-C (SIGINT, handled only when a checkpoint folder is given and the loop runs in the main
thread): the first one lets the current step finish, saves a checkpoint and raises
KeyboardInterrupt; a second one interrupts at once. The previous handler (whatever it was,
``SIG_IGN`` included) is restored when :meth:`TrainLoop.run` returns or raises.

With ``torch.distributed`` initialised, rank 0 alone shows progress and writes files, and a stop
on any rank stops every rank at the same step (an all-reduce of the stop flag).

Divergence: a step whose loss or gradient norm is not finite (a learning rate far too high)
raises :class:`NonFiniteError` before the optimiser applies it, and no checkpoint is written
from weights that are not finite: the last checkpoint written stays the last good state. With
several ranks the gradient norm decides (DDP's all-reduce gives every rank the same one, NaN
included), so every rank stops at the same step.
"""

from __future__ import annotations

import io
import json
import math
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from linattn._io import append_text, write_atomic

if TYPE_CHECKING:
    import torch
    from torch import nn

# torch is imported inside the methods: `linattn lm` subclasses TrainLoop in its CLI module,
# which every `linattn` command imports, and the light commands should not pay for torch.

__all__ = ["TrainLoop", "CheckpointError", "NonFiniteError", "Stopped", "CHECKPOINT_FILE",
           "read_checkpoint", "first_non_finite", "state_dict_mismatch"]

CHECKPOINT_FILE = "checkpoint.pt"
FORMAT = "linattn-train/1"


class CheckpointError(ValueError):
    """A checkpoint or model folder is missing, incomplete, corrupt or made for another
    configuration."""


class NonFiniteError(ValueError):
    """Training diverged: a loss, a gradient or the weights are not finite (NaN or infinite).
    Raised before the step is applied and before any checkpoint of it is written."""


def first_non_finite(tensors: Mapping[str, Any]) -> str | None:
    """The name of the first floating-point tensor of ``tensors`` (a state dict) holding a NaN
    or an infinity, or None."""
    import torch

    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex()) \
                and not bool(torch.isfinite(t).all()):
            return name
    return None


class Stopped(KeyboardInterrupt):
    """Raised by :meth:`TrainLoop.run` after a requested stop (Ctrl-C, ``request_stop``), once
    the checkpoint is saved; a second Ctrl-C raises a plain KeyboardInterrupt at once."""


def state_dict_mismatch(module: nn.Module, weights: Any) -> str | None:
    """Why ``module.load_state_dict(weights)`` would fail, in one line naming the tensor: a
    missing or an unexpected key, a value that is not a tensor, another shape; None when the
    weights fit. (torch's own message puts the keys on its second line.)"""
    import torch

    if not isinstance(weights, Mapping):
        return f"the weights are a {type(weights).__name__}, not a dict of tensors"
    own = module.state_dict()

    def named(kind: str, keys: list) -> str:
        more = f" and {len(keys) - 1} more" if len(keys) > 1 else ""
        return f"{kind} tensor {keys[0]!r}{more}"

    missing = [k for k in own if k not in weights]
    if missing:
        return named("missing", missing)
    unexpected = [k for k in weights if k not in own]
    if unexpected:
        return named("unexpected", unexpected)
    for key, want in own.items():
        got = weights[key]
        if not isinstance(got, torch.Tensor):
            return f"{key!r} is a {type(got).__name__}, not a tensor"
        if got.shape != want.shape:
            return f"{key!r} has shape {tuple(got.shape)} where the model has {tuple(want.shape)}"
    return None


def first_line(err: BaseException) -> str:
    """The first line of an error's message (its type's name if it has none)."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


#: What ``torch.load`` raises for a file that is not a checkpoint it can read safely.
LOAD_ERRORS = (OSError, ValueError, RuntimeError, EOFError, pickle.UnpicklingError,
               RecursionError, KeyError, TypeError, AttributeError, IndexError)


def load_error_reason(err: BaseException) -> str:
    """A short reason for a failed ``torch.load(..., weights_only=True)`` (torch's own
    messages run to several sentences, and its advice to load the file unsafely is not ours)."""
    if isinstance(err, pickle.UnpicklingError):
        return "not a torch checkpoint, or one holding more than tensors and plain values"
    if isinstance(err, KeyError):  # torch's legacy reader on another program's file: KeyError(6)
        return "not a torch checkpoint"
    if isinstance(err, EOFError):
        return "empty or truncated file"
    if isinstance(err, RecursionError):
        return "nested too deeply"
    if isinstance(err, RuntimeError) and "PytorchStreamReader" in str(err):
        return "not a torch checkpoint (corrupt or truncated archive)"
    if isinstance(err, OSError):
        return err.strerror or first_line(err)
    return first_line(err)[:200]


def torch_load(path: str | os.PathLike) -> Any:
    """``torch.load(path, weights_only=True)`` with torch's warnings about the file (its pickle
    protocol) kept off the terminal; the errors of :data:`LOAD_ERRORS` pass through. A path
    that is neither a regular file nor a folder (a FIFO, a device) is an OSError before it is
    opened: reading one would wait for a writer or never end."""
    import stat
    import warnings

    import torch

    mode = os.stat(path).st_mode
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):  # (a folder: torch's own error)
        raise OSError(0, "not a regular file")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.load(path, weights_only=True)


def read_checkpoint(path: str | os.PathLike) -> dict:
    """The checkpoint dict stored at ``path`` (see the module docstring for its keys)."""
    try:
        ck = torch_load(path)
    except LOAD_ERRORS as err:
        raise CheckpointError(f"{path}: unreadable checkpoint ({load_error_reason(err)})"
                              ) from None
    if not isinstance(ck, dict) or ck.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a {FORMAT} checkpoint")
    return ck


class TrainLoop:
    """Runs optimiser steps until :meth:`finished`; see the module docstring for the mechanics.

    Args:
        model: the module whose weights are trained and checkpointed (not a DDP wrapper).
        optimizer: the optimiser over ``model``'s parameters.
        scheduler: a torch LR scheduler, stepped after every optimiser step.
        clip: max gradient norm (0 or None: no clipping).
        checkpoint_dir: the folder of ``checkpoint.pt``; None: no checkpoints, no Ctrl-C handler.
        checkpoint_every: seconds between periodic checkpoints; None: after every record.
            A checkpoint is always written at the end and on a stop.
        metrics_path: every record is appended here as a JSON line.
        meta: the configuration stored in checkpoints and compared on resume.
        progress: show a tqdm bar (rank 0 only).
        desc: the bar's label.
        bar_total, bar_unit: the bar's length and unit (default: steps).
        on_step: called as ``on_step(loop)`` after every optimiser step (tests stop runs here).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        scheduler: Any = None,
        clip: float | None = None,
        checkpoint_dir: str | os.PathLike | None = None,
        checkpoint_every: float | None = None,
        metrics_path: str | os.PathLike | None = None,
        meta: dict | None = None,
        progress: bool = False,
        desc: str = "train",
        bar_total: int | None = None,
        bar_unit: str = "step",
        on_step: Callable[[TrainLoop], None] | None = None,
    ) -> None:
        import torch.distributed as dist

        self.model, self.optimizer, self.scheduler, self.clip = model, optimizer, scheduler, clip
        distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if distributed else 0
        self.world = dist.get_world_size() if distributed else 1
        self.writes = self.rank == 0  # only rank 0 writes metrics and checkpoints
        self.checkpoint_dir = None if checkpoint_dir is None else Path(checkpoint_dir)
        self.checkpoint_every = checkpoint_every
        self.metrics_path = None if metrics_path is None else Path(metrics_path)
        self.meta = {} if meta is None else meta
        # no bar without a standard error to draw it on (a process started with `2>&-`)
        self.progress = progress and self.rank == 0 and sys.stderr is not None
        self.desc, self.bar_total, self.bar_unit = desc, bar_total, bar_unit
        self.on_step = on_step
        self.step = 0  # optimiser steps done
        self.elapsed = 0.0  # seconds spent in steps
        self.history: list[dict] = []
        self._stop = False
        self._last_save = time.perf_counter()
        self._saved_step: int | None = None  # the step of the checkpoint on disk, if any

    # -- what a trainer supplies ---------------------------------------------------------------
    def loss(self) -> torch.Tensor:
        """The scalar to back-propagate for step ``self.step`` (draw its batch here)."""
        raise NotImplementedError

    def finished(self) -> bool:
        """True once the training budget is used up."""
        raise NotImplementedError

    def learning_rate(self) -> float | None:
        """The learning rate of step ``self.step``, set before it; None: leave it to the
        scheduler (or keep it constant)."""
        return None

    def after_step(self, loss: torch.Tensor) -> dict | None:
        """Bookkeeping after a step (``self.step`` already counts it); a record to log (e.g. an
        epoch's evaluation) or None."""
        return None

    def extra_state(self) -> dict:
        """The trainer's own counters, stored in checkpoints (tensors, numbers, strings)."""
        return {}

    def load_extra_state(self, state: dict) -> None:
        """Restore what :meth:`extra_state` returned."""

    def check_meta(self, saved: dict, path: Path) -> None:
        """Raise CheckpointError when the checkpoint at ``path`` was made with a configuration
        ``saved`` that this run cannot continue (default: any difference from ``meta``)."""
        if saved != self.meta:
            raise CheckpointError(f"{path}: checkpoint was made with a different configuration; "
                                  "use a new --out or the same options")

    def should_save(self, record: dict | None) -> bool:
        """A periodic checkpoint now? After every record, or every ``checkpoint_every`` s."""
        if self.checkpoint_every is None:
            return record is not None
        return time.perf_counter() - self._last_save >= self.checkpoint_every

    def bar_position(self) -> int:
        """Where the progress bar stands (in ``bar_unit``)."""
        return self.step

    def postfix(self) -> dict:
        """Numbers shown beside the progress bar."""
        return {}

    def describe(self, record: dict) -> str:
        """The line a record prints above the progress bar."""
        return json.dumps(record)

    # -- stopping --------------------------------------------------------------------------------
    def request_stop(self) -> None:
        """Finish the current optimiser step, save a checkpoint, raise :class:`Stopped` (a
        KeyboardInterrupt)."""
        self._stop = True

    def _on_sigint(self, signum, frame) -> None:
        self._stop = True
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C is immediate

    @contextmanager
    def _sigint_stops(self) -> Iterator[None]:
        """Handle Ctrl-C as a stop request while the block runs, then restore the handler."""
        if self.checkpoint_dir is None or threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.signal(signal.SIGINT, self._on_sigint)
        try:
            yield
        finally:  # None: a handler not installed from Python; the default is the best we can do
            signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)

    def _agree_on_stop(self) -> None:
        """With several ranks, stop everywhere if any rank was asked to (a rank that stopped
        alone would leave the others waiting in the next all-reduce)."""
        if self.world > 1:
            import torch
            import torch.distributed as dist

            flag = torch.tensor([float(self._stop)])
            dist.all_reduce(flag)
            self._stop = bool(flag.item())

    # -- the loop --------------------------------------------------------------------------------
    def _optimizer_step(self) -> torch.Tensor:
        from torch import nn

        lr = self.learning_rate()
        if lr is not None:
            for group in self.optimizer.param_groups:
                group["lr"] = lr
        loss = self.loss()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        norm = nn.utils.clip_grad_norm_(self.model.parameters(),
                                        self.clip if self.clip else math.inf)
        # the gradient norm is every rank's (DDP all-reduced the gradients); the loss is this
        # rank's alone, so with several ranks it would stop one rank and leave the others
        # waiting: there a non-finite loss shows in the (NaN) gradients
        finite = torch_isfinite(norm) and (self.world > 1 or torch_isfinite(loss.detach()))
        if not finite:
            raise NonFiniteError(self._diverged(
                self.step + 1, f"the loss is {float(loss.detach()):g} and the gradient norm "
                f"{float(norm):g}"))
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        return loss

    def run(self) -> list[dict]:
        """Train until :meth:`finished`; returns the history (every record logged)."""
        self._write_metrics()  # the file equals the history: no lines from after the checkpoint
        self.model.train()
        bar = None
        if self.progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=self.bar_total, initial=self.bar_position(), unit=self.bar_unit,
                       desc=self.desc, dynamic_ncols=True)
        self._last_save = time.perf_counter()
        try:
            with self._sigint_stops():
                while not self.finished():
                    t0 = time.perf_counter()
                    loss = self._optimizer_step()
                    self.step += 1
                    self.elapsed += time.perf_counter() - t0
                    if self.on_step is not None:
                        self.on_step(self)
                    record = self.after_step(loss)
                    if record is not None:
                        self._log(record, bar)
                    if bar is not None:
                        bar.update(self.bar_position() - bar.n)
                        bar.set_postfix(self.postfix(), refresh=False)
                    self._agree_on_stop()
                    if self._stop or self.finished() or self.should_save(record):
                        self.save_checkpoint()
                    if self._stop:
                        raise Stopped(f"stopped at step {self.step}")
        finally:
            if bar is not None:
                bar.close()
        return self.history

    def _diverged(self, step: int, what: str) -> str:
        """The message of a :class:`NonFiniteError` at ``step``."""
        if self._saved_step is not None and self.checkpoint_path is not None:
            kept = f"{self.checkpoint_path} keeps step {self._saved_step}"
        else:
            kept = "no checkpoint was written"
        if step == 1:  # before any update: the learning rate played no part
            return (f"training diverged at step 1, before any update: {what}; the inputs or "
                    f"the initial weights overflow float32, whatever the learning rate ({kept})")
        return (f"training diverged at step {step}: {what}; lower the learning rate "
                f"({kept})")

    # -- metrics ---------------------------------------------------------------------------------
    def _log(self, record: dict, bar) -> None:
        self.history.append(record)
        if bar is not None:
            bar.write(self.describe(record))
        if self.metrics_path is not None and self.writes:
            append_text(self.metrics_path, json.dumps(record) + "\n")

    def _write_metrics(self) -> None:
        if self.metrics_path is not None and self.writes:
            self.metrics_path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.metrics_path,
                         "".join(json.dumps(r) + "\n" for r in self.history).encode())

    # -- checkpoints -----------------------------------------------------------------------------
    @property
    def checkpoint_path(self) -> Path | None:
        return None if self.checkpoint_dir is None else self.checkpoint_dir / CHECKPOINT_FILE

    def state(self) -> dict:
        """The checkpoint dict of the current state (see the module docstring)."""
        import torch

        rng = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        return {
            "format": FORMAT, "meta": self.meta, "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": None if self.scheduler is None else self.scheduler.state_dict(),
            "rng": rng, "step": self.step, "elapsed": self.elapsed,
            "history": json.dumps(self.history), "extra": self.extra_state(),
        }

    def save_checkpoint(self) -> Path | None:
        """Write ``checkpoint.pt`` atomically (rank 0 only); its path, or None if not written."""
        import torch

        path = self.checkpoint_path
        if path is None or not self.writes:
            return None
        bad = first_non_finite(self.model.state_dict())
        if bad is not None:  # never replace the last good checkpoint with a diverged state
            raise NonFiniteError(self._diverged(self.step, f"{bad} holds non-finite values"))
        path.parent.mkdir(parents=True, exist_ok=True)
        # serialised in memory, then written by Python: a failed write (a full disk) is an
        # OSError naming the file, where torch.save's own writer raises a RuntimeError
        buffer = io.BytesIO()
        torch.save(self.state(), buffer)
        write_atomic(path, buffer.getbuffer())
        self._last_save = time.perf_counter()
        self._saved_step = self.step
        return path

    def load_checkpoint(self) -> bool:
        """Restore ``checkpoint.pt`` of ``checkpoint_dir``; False if there is none."""
        path = self.checkpoint_path
        if path is None or not path.exists():
            return False
        self.restore(read_checkpoint(path), path)
        return True

    def restore(self, ck: dict, path: Path) -> None:
        """Continue from the checkpoint dict ``ck`` (read from ``path``)."""
        import torch

        try:
            meta, weights = ck["meta"], ck["model"]
        except (KeyError, TypeError) as err:
            raise CheckpointError(f"{path}: incomplete checkpoint ({first_line(err)})") from None
        self.check_meta(meta, path)
        bad = first_non_finite(weights) if isinstance(weights, Mapping) else None
        if bad is not None:
            raise CheckpointError(f"{path}: {bad} holds non-finite values (NaN or infinity)")
        wrong = state_dict_mismatch(self.model, weights)
        if wrong is not None:
            raise CheckpointError(f"{path}: does not fit this model ({wrong})")
        try:
            self.model.load_state_dict(weights)
            self.optimizer.load_state_dict(ck["optimizer"])
            if self.scheduler is not None:
                self.scheduler.load_state_dict(ck["scheduler"])
        except (KeyError, RuntimeError, ValueError, TypeError, AttributeError) as err:
            raise CheckpointError(f"{path}: does not fit this model ({first_line(err)})") from None
        try:
            rng = ck["rng"]
            torch.set_rng_state(rng["torch"])
            if "cuda" in rng and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(rng["cuda"])
            step, elapsed = ck["step"], ck["elapsed"]
            if isinstance(step, bool) or not isinstance(step, int) or step < 0 or \
                    isinstance(elapsed, bool) or not isinstance(elapsed, (int, float)) or \
                    not math.isfinite(elapsed):
                raise ValueError(f"step {step!r}, elapsed {elapsed!r}")
            history = json.loads(ck["history"])
            if not isinstance(history, list):
                raise ValueError("history is not a list")
            self.step, self.elapsed, self.history = step, float(elapsed), history
            self.load_extra_state(ck["extra"])
        except (KeyError, TypeError, ValueError, RuntimeError, RecursionError,
                AttributeError) as err:
            raise CheckpointError(f"{path}: corrupt checkpoint ({first_line(err)})") from None
        self._saved_step = self.step


def torch_isfinite(t: torch.Tensor) -> bool:
    """Whether every value of ``t`` is finite."""
    import torch

    return bool(torch.isfinite(t).all())
