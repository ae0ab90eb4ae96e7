"""Modules built on :mod:`linattn.ops`: attention, encoder blocks, models.

Names are imported on first use (PEP 562), so that :mod:`linattn.nn.mixers`, the registry of
the language model's token mixers, can be read without importing torch (the command line
builds its ``--attention`` choices from it).
"""

from __future__ import annotations

from linattn._lazy import lazy_exports

#: module -> the public names it defines
__all__, __getattr__, __dir__ = lazy_exports(__name__, globals(), {
    "linattn.nn.attention": ("MultiheadLinearAttention",),
    "linattn.nn.encoder": ("EncoderBlock", "LinearTransformerEncoder"),
    "linattn.nn.lm": ("LinearTransformerLM", "LMConfig", "LMState"),
})
