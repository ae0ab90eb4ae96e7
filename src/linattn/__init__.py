"""linattn: linear attention for PyTorch."""

__version__ = "0.1.0"

from linattn import (
    feature_maps,  # noqa: E402
    nn,  # noqa: E402
)
from linattn.ops import reference  # noqa: E402
from linattn.ops.linear import linear_attention  # noqa: E402
from linattn.ops.recurrent import LinearAttentionState, linear_attention_step  # noqa: E402
from linattn.ops.relative import relative_linear_attention  # noqa: E402

__all__ = [
    "__version__",
    "feature_maps",
    "reference",
    "linear_attention",
    "LinearAttentionState",
    "linear_attention_step",
    "relative_linear_attention",
    "nn",
]
