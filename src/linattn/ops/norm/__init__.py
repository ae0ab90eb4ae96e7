"""The gated RMSNorm of linear-attention layers (Qwen3-Next, Qwen3.5, Kimi, Mamba2, fla).

``op.py`` holds the public function; ``reference.py`` the ground truth the tests hold it to.
"""

from linattn.ops.norm.op import rms_norm_gated

__all__ = ["rms_norm_gated"]
