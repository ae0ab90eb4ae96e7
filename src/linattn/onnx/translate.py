"""ONNX translations of the ``linattn::onnx_*`` ops (:mod:`linattn.onnx.ops`) for
``torch.onnx.export(..., custom_translation_table=TRANSLATIONS)``: each becomes one node of
the standard opset-27 operator it mirrors. Needs onnxscript (the ``onnx`` extra)."""

from __future__ import annotations

import torch
from onnxscript.onnx_opset import opset27 as op

import linattn.onnx.ops  # noqa: F401  (registers the torch ops translated here)

__all__ = ["OPSET", "TRANSLATIONS"]

#: The default-domain opset the exported models import (LinearAttention, CausalConvWithState).
OPSET = 27


def _linear_attention(query, key, value, past_state, decay=None, beta=None,
                      update_rule: str = "linear", num_heads: int = 1, scale: float = 1.0):
    return op.LinearAttention(query, key, value, past_state, decay, beta,
                              update_rule=update_rule, q_num_heads=num_heads,
                              kv_num_heads=num_heads, scale=scale)


def _causal_conv(x, weight, past_state, activation: str = "none"):
    return op.CausalConvWithState(x, weight, None, past_state, activation=activation)


#: the torch op overload → its translation
TRANSLATIONS = {
    torch.ops.linattn.onnx_linear_attention.default: _linear_attention,
    torch.ops.linattn.onnx_causal_conv.default: _causal_conv,
}
