"""Modules built on :mod:`linattn.ops`: attention, encoder blocks, models.

Names are imported on first use (PEP 562), so that :mod:`linattn.nn.mixers`, the registry of
the language model's token mixers, can be read without importing torch (the command line
builds its ``--attention`` choices from it).
"""

from __future__ import annotations

from linattn._lazy import lazy_exports

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


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals(), __all__)
