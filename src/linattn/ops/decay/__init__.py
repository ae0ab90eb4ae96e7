"""Causal linear attention with a per-head exponential decay (retention-style).

``op.py`` holds the public functions; ``reference.py`` the ground truth the tests hold them to.
"""

from linattn.ops.decay.op import (
    DEFAULT_CHUNK_SIZE,
    decay_linear_attention,
    decay_linear_attention_step,
)

__all__ = ["decay_linear_attention", "decay_linear_attention_step", "DEFAULT_CHUNK_SIZE"]
