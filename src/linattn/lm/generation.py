"""Loading a trained language model and sampling text from it.

::

    from linattn.lm import generate_text, load_model

    model, _ = load_model("runs/lm-linear")
    for piece in generate_text(model, "    def __init__(self", 200, top_k=20):
        print(piece, end="", flush=True)
"""

from __future__ import annotations

import codecs
import os
import pickle
from collections.abc import Iterator
from pathlib import Path

import torch

from linattn.nn.lm import LinearTransformerLM, LMConfig
from linattn.train_loop import CHECKPOINT_FILE, CheckpointError, first_line

__all__ = ["load_model", "generate_text"]


def load_model(path: str | os.PathLike) -> tuple[LinearTransformerLM, dict]:
    """The model stored in a run folder (or a checkpoint file), in eval mode, and the
    checkpoint dict. The loop's checkpoints keep the configuration under ``meta``; earlier ones
    at the top level (:meth:`~linattn.nn.LMConfig.from_dict` reads either's spelling).
    :class:`~linattn.train_loop.CheckpointError` when it cannot be read or does not fit."""
    path = Path(path)
    f = path / CHECKPOINT_FILE if path.is_dir() else path
    try:
        ck = torch.load(f, weights_only=True)
        config = LMConfig.from_dict(ck.get("meta", ck)["model_config"], f"{f}: model_config")
        model = LinearTransformerLM.from_config(config)
        model.load_state_dict(ck["model"])
    except (OSError, KeyError, RuntimeError, EOFError, TypeError, ValueError, AttributeError,
            pickle.UnpicklingError) as err:
        raise CheckpointError(f"{f}: cannot load a model ({first_line(err)})") from None
    return model.eval(), ck


def generate_text(model: LinearTransformerLM, prompt: str, max_new_tokens: int = 300,
                  temperature: float = 0.8, top_k: int | None = None, seed: int = 0
                  ) -> Iterator[str]:
    """The text a byte-level ``model`` continues ``prompt`` with, piece by piece as it is
    sampled (:meth:`~linattn.nn.LinearTransformerLM.stream`; seeded by ``seed``): each piece
    is what the bytes so far decode to as UTF-8 (invalid sequences replaced), the prompt not
    included. ValueError at once (not at the first piece) for an empty prompt."""
    data = prompt.encode("utf-8")
    if not data:
        raise ValueError("prompt: give at least one character")
    ids = torch.tensor([list(data)], dtype=torch.long)
    tokens = model.stream(ids, max_new_tokens, temperature, top_k,
                          torch.Generator().manual_seed(seed))
    return _decoded(tokens)


def _decoded(tokens: Iterator[torch.Tensor]) -> Iterator[str]:
    dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for tok in tokens:
        piece = dec.decode(bytes([int(tok[0])]))
        if piece:
            yield piece
    rest = dec.decode(b"", final=True)
    if rest:
        yield rest
