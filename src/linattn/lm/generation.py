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
from collections.abc import Iterator
from pathlib import Path

import torch

from linattn.lm.options import check_generate
from linattn.nn.lm import LinearTransformerLM, LMConfig
from linattn.nn.mixers import check_positions
from linattn.train_loop import (
    CHECKPOINT_FILE,
    LOAD_ERRORS,
    CheckpointError,
    first_line,
    first_non_finite,
    load_error_reason,
    state_dict_mismatch,
    torch_load,
)

__all__ = ["load_model", "generate_text"]


def load_model(path: str | os.PathLike) -> tuple[LinearTransformerLM, dict]:
    """The model stored in a run folder (or a checkpoint file), in eval mode, and the
    checkpoint dict. The loop's checkpoints keep the configuration under ``meta``; earlier ones
    at the top level (:meth:`~linattn.nn.LMConfig.from_dict` reads either's spelling).
    :class:`~linattn.train_loop.CheckpointError` when it cannot be read or does not fit."""
    path = Path(path)
    f = path / CHECKPOINT_FILE if path.is_dir() else path
    try:
        ck = torch_load(f)
    except LOAD_ERRORS as err:
        raise CheckpointError(f"{f}: cannot load a model ({load_error_reason(err)})") from None
    try:
        config = LMConfig.from_dict(ck.get("meta", ck)["model_config"], f"{f}: model_config")
        model = LinearTransformerLM.from_config(config)
        wrong = state_dict_mismatch(model, ck["model"])
        if wrong is not None:  # named here: torch's message has the keys on its 2nd line
            raise ValueError(wrong)
        model.load_state_dict(ck["model"])
    except KeyError as err:  # (another program's dict of tensors: torch reads safetensors)
        raise CheckpointError(f"{f}: cannot load a model (no {first_line(err)}: not a "
                              "checkpoint of linattn's language model)") from None
    except (RuntimeError, TypeError, ValueError, AttributeError, IndexError) as err:
        raise CheckpointError(f"{f}: cannot load a model ({first_line(err)})") from None
    bad = first_non_finite(ck["model"])
    if bad is not None:  # a diverged model samples garbage (or fails in multinomial)
        raise CheckpointError(f"{f}: {bad} holds non-finite values (NaN or infinity); the model "
                              "is unusable")
    return model.eval(), ck


def generate_text(model: LinearTransformerLM, prompt: str, max_new_tokens: int = 300,
                  temperature: float = 0.8, top_k: int | None = None, seed: int = 0
                  ) -> Iterator[str]:
    """The text a byte-level ``model`` continues ``prompt`` with, piece by piece as it is
    sampled (:meth:`~linattn.nn.LinearTransformerLM.stream`; seeded by ``seed``): each piece
    is what the bytes so far decode to as UTF-8 (invalid sequences replaced), the prompt not
    included. ValueError at once (not at the first piece) for an empty prompt or an option out
    of range (:data:`linattn.lm.options.GENERATE_CHECKS`)."""
    check_generate({"max_new_tokens": max_new_tokens, "temperature": temperature,
                    "top_k": top_k, "seed": seed})
    if not isinstance(prompt, str):
        raise TypeError(f"prompt: expected a str, got {type(prompt).__name__}")
    try:
        data = prompt.encode("utf-8")
    except UnicodeEncodeError as err:  # a lone surrogate: bytes of an argument not UTF-8
        raise ValueError(f"prompt: not UTF-8 text (character {err.start} is a lone surrogate "
                         f"{prompt[err.start]!a}, e.g. a byte of a command-line argument that "
                         "is not UTF-8)") from None
    if not data:
        raise ValueError("prompt: give at least one character")
    # the positions the kind's weights hold (cosFormer's horizon), checked before the first
    # piece (a stream that fails half-way has printed its text already); the last token is
    # sampled, not read
    attention = model.config.attention
    check_positions(attention, len(data), "prompt")
    check_positions(attention, len(data) + max(max_new_tokens - 1, 0), "max_new_tokens")
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
