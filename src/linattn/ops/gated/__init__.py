"""Gated linear attention (RetNet, GLA).

``op.py`` holds the public functions; ``reference.py`` the ground truth the tests hold them to.
"""

from linattn.ops.gated.op import (
    check_gate,
    decayed,
    gated_linear_attention,
    gated_linear_attention_step,
    initial_state_for,
    segsum,
)

__all__ = [
    "gated_linear_attention",
    "gated_linear_attention_step",
    "segsum",
    "check_gate",
    "initial_state_for",
    "decayed",
]
