"""Modules built on :mod:`linattn.ops`: attention, encoder blocks, models.

Names are imported on first use (PEP 562), so that :mod:`linattn.nn.mixers`, the registry of
the language model's token mixers, can be read without importing torch (the command line
builds its ``--attention`` choices from it).
"""

from __future__ import annotations

import importlib

#: public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    "MultiheadLinearAttention": "linattn.nn.attention",
    "EncoderBlock": "linattn.nn.encoder",
    "LinearTransformerEncoder": "linattn.nn.encoder",
    "LinearTransformerLM": "linattn.nn.lm",
    "LMConfig": "linattn.nn.lm",
    "LMState": "linattn.nn.lm",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'linattn.nn' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
