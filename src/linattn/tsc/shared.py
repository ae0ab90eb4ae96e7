"""What both scikit-learn estimators of :mod:`linattn.tsc` share
(:class:`~linattn.tsc.LinearAttentionClassifier` and
:class:`~linattn.tsc.ConvAttentionClassifier`): their parameters' checks (``random_state``,
``n_threads``), the thread limit a fit and a prediction run under, and the pieces of a saved
model's folder (the config's format and class labels). Neither estimator's module imports the
other's."""

from __future__ import annotations

import numbers
import os
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits  # a dependency of scikit-learn

from linattn._config import SEED, THREADS, torch_threads
from linattn._io import read_json
from linattn.train_loop import CheckpointError

__all__ = ["plain", "check_threads", "seed_of", "ThreadLimit", "open_saved_model",
           "read_classes"]


def plain(value: Any) -> Any:
    """A NumPy scalar as the Python number it holds (configs are written as JSON)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return value


def check_threads(value: Any, where: str) -> None:
    """``n_threads``: None or a thread count (:data:`linattn._config.THREADS`)."""
    if value is not None:
        try:
            THREADS.check("n_threads", value)
        except ValueError:
            raise ValueError(f"{where}: n_threads must be None or {THREADS.expected()}, got "
                             f"{value!r}") from None


def seed_of(random_state: Any, where: str) -> int:
    """The seed an estimator's ``random_state`` stands for: None is 0, an integer itself (a
    seed, :data:`linattn._config.SEED`: 2**70 failed inside torch); a one-line ValueError
    naming ``where`` and ``random_state`` for anything else (a RandomState instance too)."""
    if random_state is None:
        return 0
    if (isinstance(random_state, (bool, np.bool_))
            or not isinstance(random_state, numbers.Integral)):
        raise ValueError(f"{where}: random_state must be None or an int (a RandomState "
                         f"instance is not supported), got {random_state!r}")
    try:
        return int(SEED.check("random_state", int(random_state)))
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None


class ThreadLimit:
    """Run a block with ``torch.set_num_threads(n)`` and the BLAS libraries (numpy's, scipy's:
    the ridge heads' solves) held to n threads (None: leave both as they are), then restore. A
    count above the CPUs available is capped there, with one warning
    (:func:`linattn._config.torch_threads`, the helper every thread count goes through)."""

    def __init__(self, n: int | None) -> None:
        self.n, self.stack = n, ExitStack()

    def __enter__(self):
        n = self.stack.enter_context(torch_threads(self.n, "n_threads"))
        if n is not None:
            # n_threads=1 must mean one thread for the whole fit: left alone, OpenBLAS spins
            # its own threads in the ridge's Gram product and eigendecomposition, and two such
            # fits side by side on 2 cores took twice the CPU time (docs/timeseries.md)
            blas = threadpool_limits(limits=n, user_api="blas")
            self.stack.callback(blas.restore_original_limits)

    def __exit__(self, *exc):
        self.stack.close()


def open_saved_model(path: str | os.PathLike, fmt: str, name: str) -> tuple[dict, Path, Path]:
    """(config, config.json path, model.safetensors path) of a folder written by an estimator's
    ``save``: a missing folder or file, an unreadable or malformed config.json, or one of
    another ``format`` raise :class:`~linattn.train_loop.CheckpointError` in one line."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such model folder")
    cfg_path, w_path = path / "config.json", path / "model.safetensors"
    for p in (cfg_path, w_path):
        if not p.is_file():
            raise CheckpointError(f"{p}: missing (not a saved {name})")
    try:
        cfg = read_json(cfg_path)  # also a file nested too deeply to parse
    except OSError as err:
        raise CheckpointError(f"{cfg_path}: cannot be read ({err.strerror or err})") from None
    except ValueError as err:
        raise CheckpointError(str(err)) from None
    if not isinstance(cfg, dict) or cfg.get("format") != fmt:
        raise CheckpointError(f"{cfg_path}: not a {fmt} config")
    return cfg, cfg_path, w_path


def read_classes(cfg: dict, n_classes: int, cfg_path: Path) -> np.ndarray:
    """The saved class labels as an array: a list of ``n_classes`` distinct, sorted labels that
    ``classes_dtype`` (a plain NumPy scalar type) holds exactly."""
    raw = cfg["classes"]
    try:
        dtype = np.dtype(cfg["classes_dtype"])
    except (TypeError, ValueError):
        raise ValueError(f"{cfg_path}: classes_dtype: not a NumPy dtype: "
                         f"{cfg['classes_dtype']!r}") from None
    if dtype.kind not in "biufcUSO" or dtype.shape != ():
        raise ValueError(f"{cfg_path}: classes_dtype: unsupported dtype {dtype.str!r}")
    if not isinstance(raw, list) or len(raw) != n_classes:
        raise ValueError(f"{cfg_path}: classes must be a list of {n_classes} labels (the "
                         f"model's n_classes), got {raw!r}")
    classes = np.asarray(raw, dtype=dtype)
    if classes.ndim != 1 or classes.tolist() != raw:
        raise ValueError(f"{cfg_path}: classes {raw!r} are not exactly representable as "
                         f"{dtype.str}")
    if len(set(raw)) != len(raw) or sorted(raw) != raw:
        raise ValueError(f"{cfg_path}: classes must be distinct and sorted, got {raw!r}")
    return classes
