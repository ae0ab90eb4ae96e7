"""Causal softmax attention with a per-head exponential decay (ALiBi).

``op.py`` holds the public functions; ``reference.py`` the ground truth the tests hold them to.
"""

from linattn.ops.decay_softmax.op import decay_softmax_attention

__all__ = ["decay_softmax_attention"]
