"""The ``linattn::`` ops that an ONNX export traces: one node per standard ONNX op.

``torch.onnx.export`` translates each op of a traced graph; the recurrences inside linattn's
own forms (chunk loops, Python decisions on T) would come out as a static graph per length.
So the export form of a model calls these two ops instead, each the exact counterpart of an
ONNX opset-27 operator, with its inputs in that operator's layout:

* ``linattn::onnx_linear_attention``: ONNX ``LinearAttention`` (packed ``(B, T, H·d)`` inputs,
  state ``(B, H, d_k, d_v)``, ``update_rule`` linear / gated / delta / gated_delta);
* ``linattn::onnx_causal_conv``: ONNX ``CausalConvWithState`` (channels first, weight
  ``(C, 1, k)``, state ``(B, C, k − 1)``).

Their PyTorch implementations call linattn's ops (:func:`linattn.delta_rule`,
:func:`linattn.gated_linear_attention`), so the export form computes in eager what the model
computes; their fake implementations give the shapes for any T, which is what lets one export
serve every sequence length. Torch-only: the ONNX translations are in
:mod:`linattn.onnx.translate`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["UPDATE_RULES", "linear_attention_packed", "causal_conv_packed"]

#: ``update_rule`` → (takes a decay, takes β): the rules of ONNX ``LinearAttention``.
UPDATE_RULES: dict[str, tuple[bool, bool]] = {
    "linear": (False, False), "gated": (True, False),
    "delta": (False, True), "gated_delta": (True, True)}


def _heads(x: Tensor, num_heads: int) -> Tensor:
    """(B, T, H·d) -> (B, H, T, d)."""
    B, T, _ = x.shape
    return x.reshape(B, T, num_heads, -1).transpose(1, 2)


@torch.library.custom_op("linattn::onnx_linear_attention", mutates_args=())
def linear_attention_packed(query: Tensor, key: Tensor, value: Tensor, past_state: Tensor,
                            decay: Tensor | None, beta: Tensor | None, update_rule: str,
                            num_heads: int, scale: float) -> tuple[Tensor, Tensor]:
    """ONNX ``LinearAttention`` with ``q_num_heads = kv_num_heads = num_heads``: query, key
    (B, T, H·d_k), value (B, T, H·d_v), past_state (B, H, d_k, d_v), decay (B, T, H) or
    (B, T, H·d_k) log-gates, beta (B, T, H). Returns (output (B, T, H·d_v), present_state)."""
    from linattn.ops.delta.op import delta_rule
    from linattn.ops.gated.op import gated_linear_attention

    H = num_heads
    B, T, _ = query.shape
    q, k, v = _heads(query, H), _heads(key, H), _heads(value, H)
    S0 = past_state.float()
    g = gk = None
    if decay is not None:  # (B, T, H): one gate per head; (B, T, H·d_k): one per key
        gates = _heads(decay.float(), H)
        g, gk = (gates[..., 0], None) if gates.shape[-1] == 1 else (None, gates)
    if update_rule in ("delta", "gated_delta"):
        b = _heads(beta.float(), H)[..., 0]
        o, S = delta_rule(q, k, v, b, g, scale=scale, initial_state=S0, return_state=True)
    else:
        o, S = gated_linear_attention(q, k, v, g=g, gk=gk, scale=scale, initial_state=S0,
                                      return_state=True)
    out = o.transpose(1, 2).reshape(B, T, -1).to(query.dtype)
    return out.clone(), S.to(past_state.dtype).clone()


@linear_attention_packed.register_fake
def _(query, key, value, past_state, decay, beta, update_rule, num_heads, scale):
    B, T, _ = query.shape
    return (query.new_empty(B, T, value.shape[-1]), torch.empty_like(past_state))


@torch.library.custom_op("linattn::onnx_causal_conv", mutates_args=())
def causal_conv_packed(x: Tensor, weight: Tensor, past_state: Tensor,
                       activation: str) -> tuple[Tensor, Tensor]:
    """ONNX ``CausalConvWithState`` without a bias: x (B, C, T), weight (C, 1, k) (its last tap
    meets the newest input), past_state (B, C, k − 1). Returns (y (B, C, T), present_state, the
    last k − 1 inputs of past_state followed by x)."""
    xp = torch.cat([past_state.to(x.dtype), x], -1)
    y = F.conv1d(xp, weight.to(x.dtype), groups=x.shape[1])
    if activation in ("silu", "swish"):
        y = F.silu(y)
    k = weight.shape[-1]
    return y, xp[..., xp.shape[-1] - (k - 1):].clone()


@causal_conv_packed.register_fake
def _(x, weight, past_state, activation):
    return torch.empty_like(x), torch.empty_like(past_state)
