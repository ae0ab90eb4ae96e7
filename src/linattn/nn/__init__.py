"""Modules built on :mod:`linattn.ops`: attention, encoder blocks, models."""

from linattn.nn.attention import MultiheadLinearAttention
from linattn.nn.encoder import EncoderBlock, LinearTransformerEncoder
from linattn.nn.lm import LinearTransformerLM, LMState

__all__ = ["MultiheadLinearAttention", "EncoderBlock", "LinearTransformerEncoder",
           "LinearTransformerLM", "LMState"]
