"""Gated linear attention (RetNet, GLA).

``op.py`` holds the public functions; ``reference.py`` the ground truth the tests hold them to.
"""

from linattn.ops.gated.chunk import check_gate, decayed, initial_state_for, segsum
from linattn.ops.gated.op import gated_linear_attention, gated_linear_attention_step

__all__ = ["gated_linear_attention", "gated_linear_attention_step", "segsum", "check_gate",
           "initial_state_for", "decayed"]
