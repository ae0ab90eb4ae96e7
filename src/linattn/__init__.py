"""linattn: linear attention for PyTorch.

Names are imported on first use (PEP 562), so ``import linattn`` and the light commands
(``linattn solve``, ``linattn --help``) do not pay for importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

#: public name -> (module, attribute or None for the module itself)
_EXPORTS: dict[str, tuple[str, str | None]] = {
    "feature_maps": ("linattn.feature_maps", None),
    "nn": ("linattn.nn", None),
    "fla": ("linattn.fla", None),
    "reference": ("linattn.ops.reference", None),
    "linear_attention": ("linattn.ops.linear", "linear_attention"),
    "LinearAttentionState": ("linattn.ops.recurrent", "LinearAttentionState"),
    "linear_attention_step": ("linattn.ops.recurrent", "linear_attention_step"),
    "relative_linear_attention": ("linattn.ops.relative", "relative_linear_attention"),
    "cosformer_attention": ("linattn.ops.cosformer", "cosformer_attention"),
    "decay_linear_attention": ("linattn.ops.decay", "decay_linear_attention"),
    "decay_linear_attention_step": ("linattn.ops.decay", "decay_linear_attention_step"),
    "decay_softmax_attention": ("linattn.ops.decay_softmax", "decay_softmax_attention"),
    "flowformer_attention": ("linattn.ops.flowformer", "flowformer_attention"),
    "window_linear_attention": ("linattn.ops.window", "window_linear_attention"),
    "window_linear_attention_step": ("linattn.ops.window", "window_linear_attention_step"),
    "WindowLinearAttentionState": ("linattn.ops.window", "WindowLinearAttentionState"),
    "gated_linear_attention": ("linattn.ops.gated", "gated_linear_attention"),
    "gated_linear_attention_step": ("linattn.ops.gated", "gated_linear_attention_step"),
    "delta_rule": ("linattn.ops.delta", "delta_rule"),
    "delta_rule_step": ("linattn.ops.delta", "delta_rule_step"),
}

__all__ = [
    "__version__",
    "feature_maps",
    "nn",
    "fla",
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

if TYPE_CHECKING:  # for type checkers and IDEs: the names as eager imports
    from linattn import feature_maps, fla, nn
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


def __getattr__(name: str):
    try:
        module, attr = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'linattn' has no attribute {name!r}") from None
    value = importlib.import_module(module)
    if attr is not None:
        value = getattr(value, attr)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
