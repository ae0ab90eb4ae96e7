"""linattn: linear attention for PyTorch."""

__version__ = "0.1.0"

# The version is defined before the submodules, which read it (the CLI prints it).
from linattn import feature_maps, nn  # noqa: E402
from linattn.ops import reference  # noqa: E402
from linattn.ops.cosformer import cosformer_attention  # noqa: E402
from linattn.ops.linear import linear_attention  # noqa: E402
from linattn.ops.recurrent import LinearAttentionState, linear_attention_step  # noqa: E402
from linattn.ops.relative import relative_linear_attention  # noqa: E402

__all__ = [
    "__version__",
    "feature_maps",
    "nn",
    "reference",
    "linear_attention",
    "LinearAttentionState",
    "linear_attention_step",
    "relative_linear_attention",
    "cosformer_attention",
]
