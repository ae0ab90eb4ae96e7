"""Linear attention: non-causal and chunked causal, the recurrent step, the fast CPU paths.

``op.py`` holds the public functions; ``reference.py`` the ground truth the tests hold them to.
"""

from linattn.ops.linear.op import linear_attention
from linattn.ops.linear.recurrent import LinearAttentionState, linear_attention_step

__all__ = ["linear_attention", "LinearAttentionState", "linear_attention_step"]
