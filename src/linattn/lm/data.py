"""The language model's data: the standard-library corpus, byte ids, training and validation
windows.

Tokens are bytes (vocabulary 256). :func:`stdlib_corpus` reads the ``.py`` files of the running
interpreter's standard library — a corpus every machine with Python has offline — and holds out
every 10th file for validation. Training step s reads ``batch_size`` random windows of
``context + 1`` bytes drawn by a generator seeded by (seed, s) (:func:`training_windows`), so a
resumed run draws the same data; validation reads consecutive non-overlapping windows
(:func:`validation_windows`).
"""

from __future__ import annotations

import hashlib
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import Tensor

__all__ = ["stdlib_corpus", "byte_ids", "training_windows", "validation_windows", "check_windows",
           "SKIP_DIRS"]

#: Folders of the standard library left out of the corpus (tests, installed packages).
SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "__pycache__"}


def stdlib_corpus(max_bytes: int = 4_000_000, root: str | None = None) -> tuple[bytes, bytes, dict]:
    """(train, val, info): the stdlib's ``*.py`` files (tests and site-packages excluded) in
    sorted order, whole files until ``max_bytes``; file i goes to val when i % 10 == 9.

    ``info``: the root, the Python version, the files used, the bytes of each split and a hash
    of the text. ValueError when no Python source is found under ``root`` (default: the
    running interpreter's stdlib), or naming ``corpus_bytes`` when ``max_bytes`` ends before a
    validation file."""
    base = Path(root or sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in base.rglob("*.py")
                   if not SKIP_DIRS.intersection(p.relative_to(base).parts[:-1]))
    train, val, total, used = [], [], 0, 0
    for i, p in enumerate(files):
        try:
            data = p.read_bytes() + b"\n"
        except OSError:
            continue
        if total + len(data) > max_bytes and total:
            break
        (val if i % 10 == 9 else train).append(data)
        total += len(data)
        used += 1
    tr, va = b"".join(train), b"".join(val)
    if not used:
        raise ValueError(f"no Python source found under {base}")
    if not tr or not va:  # the budget ended before the first validation file (the 10th)
        raise ValueError(f"corpus_bytes: {max_bytes} bytes hold {used} file(s), too few for "
                         f"a validation file (every 10th); give more")
    info = {"root": str(base), "python": sys.version.split()[0], "files": used,
            "train_bytes": len(tr), "val_bytes": len(va),
            "sha256": hashlib.sha256(tr + va).hexdigest()[:16]}
    return tr, va, info


def byte_ids(text: bytes) -> Tensor:
    """The bytes of ``text`` as token ids: (N,) int64."""
    return torch.frombuffer(bytearray(text), dtype=torch.uint8).long()


def check_windows(context: int, train_tokens: int | None = None,
                  val_tokens: int | None = None) -> None:
    """ValueError naming ``context`` unless the corpus holds a window: ``context + 2``
    training tokens (a window of ``context + 1`` and more than one start to draw), ``context +
    1`` validation tokens. Checked before training, not at its first step or evaluation."""
    for tokens, need, what in ((train_tokens, context + 2, "training"),
                               (val_tokens, context + 1, "validation")):
        if tokens is not None and tokens < need:
            raise ValueError(f"context: {context} needs at least {need} {what} tokens, the "
                             f"corpus has {tokens}")


def training_windows(ids: Tensor, context: int, batch_size: int, seed: int, step: int) -> Tensor:
    """Step ``step``'s batch: (batch_size, context + 1) windows of ``ids`` at random starts
    drawn by a generator seeded by (seed, step) (inputs ``[:, :-1]``, targets ``[:, 1:]``)."""
    check_windows(context, train_tokens=len(ids))
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(0, len(ids) - context - 1, (batch_size,), generator=g)
    return ids[starts[:, None] + torch.arange(context + 1)]


def validation_windows(ids: Tensor, context: int, max_tokens: int,
                       batch_size: int = 32) -> Iterator[Tensor]:
    """Batches of non-overlapping windows of ``context + 1`` tokens (``context`` targets each)
    covering the first ``max_tokens`` targets of ``ids`` (at least one window)."""
    n = max(1, min(len(ids) - 1, max_tokens) // context)
    starts = torch.arange(n) * context
    for i in range(0, n, batch_size):
        yield ids[starts[i : i + batch_size, None] + torch.arange(context + 1)]
