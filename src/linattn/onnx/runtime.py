"""Running an exported :class:`~linattn.nn.LinearTransformerLM` in onnxruntime, state carried
from call to call: a prefill of any length, then one token at a time, in constant memory."""

from __future__ import annotations

import os

import numpy as np

__all__ = ["LMSession", "session"]


def session(path: str | os.PathLike, threads: int | None = None):
    """An onnxruntime CPU session for ``path``; ``threads``: intra-op threads (None: ORT's
    default)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads: expected a positive integer, got {threads!r}")
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


class LMSession:
    """An exported LM in onnxruntime: ``logits = lm(ids)`` runs ids (B, T) after the states
    it holds and keeps the new ones (``reset()`` forgets them). The states are the graph's
    ``past_*`` inputs, zeros at the start, shapes read off the model file."""

    def __init__(self, path: str | os.PathLike, threads: int | None = None) -> None:
        self.session = session(path, threads)
        inputs = self.session.get_inputs()
        if not inputs or inputs[0].name != "ids":
            raise ValueError(f"path: {path} is not a linattn LM export (no 'ids' input)")
        self._past = [i for i in inputs[1:] if i.name != "position"]
        self._positional = any(i.name == "position" for i in inputs)
        self.states: list[np.ndarray] | None = None
        self.position = 0  # tokens seen since the start (or the last reset)

    def reset(self) -> None:
        self.states, self.position = None, 0

    def zeros(self, batch: int) -> list[np.ndarray]:
        """The start states for a batch of ``batch``."""
        return [np.zeros([batch, *i.shape[1:]], np.float32) for i in self._past]

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        if ids.ndim != 2 or ids.shape[1] < 1:
            raise ValueError(f"ids: expected shape (B, T) with T >= 1, got {ids.shape}")
        states = self.zeros(ids.shape[0]) if self.states is None else self.states
        feed = {"ids": ids, **{i.name: s for i, s in zip(self._past, states, strict=True)}}
        if self._positional:
            feed["position"] = np.array(self.position, np.int64)
        logits, *self.states = self.session.run(None, feed)
        self.position += ids.shape[1]
        return logits
