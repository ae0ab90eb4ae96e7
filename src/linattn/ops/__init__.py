"""Pure tensor functions: no module state. ``reference`` holds the quadratic ground truth."""

from linattn.ops import reference
from linattn.ops.cosformer import cosformer_attention
from linattn.ops.decay import decay_linear_attention, decay_linear_attention_step
from linattn.ops.decay_softmax import decay_softmax_attention
from linattn.ops.delta import delta_rule, delta_rule_step
from linattn.ops.flowformer import flowformer_attention
from linattn.ops.gated import gated_linear_attention, gated_linear_attention_step
from linattn.ops.linear import linear_attention
from linattn.ops.recurrent import LinearAttentionState, linear_attention_step
from linattn.ops.relative import relative_linear_attention
from linattn.ops.window import (
    WindowLinearAttentionState,
    window_linear_attention,
    window_linear_attention_step,
)

__all__ = [
    "reference",
    "linear_attention",
    "LinearAttentionState",
    "linear_attention_step",
    "relative_linear_attention",
    "cosformer_attention",
    "decay_linear_attention",
    "decay_linear_attention_step",
    "decay_softmax_attention",
    "flowformer_attention",
    "window_linear_attention",
    "window_linear_attention_step",
    "WindowLinearAttentionState",
    "gated_linear_attention",
    "gated_linear_attention_step",
    "delta_rule",
    "delta_rule_step",
]
