"""The language model's training and sampling options, declared once and torch-free: the
library checks its values with them (:class:`~linattn.lm.training.TrainConfig`,
:func:`~linattn.lm.generation.generate_text`, :class:`~linattn.lm.training.Trainer`) and
``linattn lm`` parses its flags with them, so a bad flag fails before torch is imported. The
model's own fields are declared beside its mixers (:data:`linattn.nn.mixers.CONFIG_CHECKS`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from linattn._config import POSITIVE_INT, SEED, Check, Range
from linattn._memory import TRAINING_BYTES_PER_PARAMETER, check_fits, lm_parameters

__all__ = ["TRAIN_CHECKS", "GENERATE_CHECKS", "CHECKPOINT_EVERY", "check_train_config",
           "check_generate", "SIZE_DEFAULTS", "training_bytes", "check_training_memory"]

#: The fields of :class:`~linattn.lm.training.TrainConfig`. A budget is needed: ``steps``,
#: ``max_time`` (training seconds) or both (:func:`check_train_config`).
TRAIN_CHECKS: dict[str, Check] = {
    "context": POSITIVE_INT,
    "batch_size": POSITIVE_INT,
    "lr": Check(float, Range(0.0, math.inf, False), float32=True),
    "weight_decay": Check(float, Range(0.0, math.inf), float32=True),
    "warmup": POSITIVE_INT,
    "steps": Check(int, Range(1, math.inf), optional=True),
    "max_time": Check(float, Range(0.0, math.inf, False), optional=True),
    "seed": SEED,
    "val_tokens": POSITIVE_INT,
    "eval_every": POSITIVE_INT,
    "corpus_bytes": POSITIVE_INT,
}

#: Seconds between periodic checkpoints (:class:`~linattn.lm.training.Trainer`; 0: every step).
CHECKPOINT_EVERY = Check(float, Range(0.0, math.inf))

#: The sampling options of :func:`~linattn.lm.generation.generate_text` (temperature 0:
#: greedy; top_k None: every token).
GENERATE_CHECKS: dict[str, Check] = {
    "max_new_tokens": Check(int, Range(0, math.inf)),
    "temperature": Check(float, Range(0.0, math.inf)),
    "top_k": Check(int, Range(1, math.inf), optional=True),
    "seed": SEED,
}


def check_train_config(values: Mapping[str, Any]) -> None:
    """ValueError naming the field for a training option of the wrong type or range, or
    ``steps, max_time`` when neither gives a budget."""
    for name, check in TRAIN_CHECKS.items():
        if name in values:
            check.check(name, values[name])
    if values.get("steps") is None and values.get("max_time") is None:
        raise ValueError("steps, max_time: give a budget, either or both")


def check_generate(values: Mapping[str, Any]) -> None:
    """ValueError naming the option for a sampling option of the wrong type or range."""
    for name, check in GENERATE_CHECKS.items():
        if name in values:
            check.check(name, values[name])


#: The sizes of ``linattn lm train``'s defaults (the command's flags take them from here): what
#: an estimate of training memory that does not fit compares with, to name the option that
#: made it too large (:func:`linattn._memory.check_fits`).
SIZE_DEFAULTS: dict[str, Any] = {"d_model": 128, "num_layers": 4, "context": 256,
                                 "batch_size": 32, "short_conv": 0, "mlp_dim": None,
                                 "vocab_size": 256, "window": None}


def training_bytes(values: Mapping[str, Any]) -> int:
    """A lower bound of the bytes training needs: the model's parameters with their gradients
    and Adam's moments, and one step's activations (per token and layer q, k, v, the output
    and the MLP's hidden layer; the logits and their gradient), the token shift's padded
    copies, the batch of ids, and the hybrid's state: per layer a ring buffer of the last
    ``window`` keys and values, whatever the context (``window=10**9`` asked for 238 GiB in
    an allocation). ``values``: the model's and the training's options (LMConfig and
    TrainConfig fields; ``mlp_dim`` None is 4·d_model, ``window`` None the hybrid's default)."""
    E, L, V = values["d_model"], values["num_layers"], values["vocab_size"]
    mlp = 4 * E if values.get("mlp_dim") is None else values["mlp_dim"]
    k = values.get("short_conv") or 0
    B, T = values["batch_size"], values["context"]
    params = lm_parameters(values)
    activations = 4 * B * T * (L * (4 * E + mlp) + 2 * V)
    shift = 8 * B * (T + k) * E if k else 0
    ring = 0
    if values.get("attention") == "hybrid":
        from linattn.nn.mixers import DEFAULT_WINDOW  # torch-free

        ring = 8 * B * E * L * (values.get("window") or DEFAULT_WINDOW)
    return TRAINING_BYTES_PER_PARAMETER * params + activations + shift + 8 * B * (T + 1) + ring


def check_training_memory(model: Mapping[str, Any], train: Mapping[str, Any],
                          available: int | None = None) -> None:
    """ValueError naming the option (a field name) when training ``model`` with ``train``
    cannot fit in the memory available (:func:`training_bytes`)."""
    check_fits(training_bytes, {**model, **train}, SIZE_DEFAULTS, "training this model",
               available)
