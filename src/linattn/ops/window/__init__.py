"""Sliding-window softmax plus linear attention, one normaliser.

``op.py`` holds the public functions; ``reference.py`` the ground truth the tests hold them to.
"""

from linattn.ops.window.op import (
    WindowLinearAttentionState,
    check_window,
    window_linear_attention,
    window_linear_attention_step,
)

__all__ = ["WindowLinearAttentionState", "window_linear_attention", "window_linear_attention_step",
           "check_window"]
