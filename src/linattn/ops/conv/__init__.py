"""The short causal depthwise convolution (Mamba2, Gated DeltaNet, Kimi Delta Attention, LFM2).

``op.py`` holds the public functions; ``reference.py`` the ground truth the tests hold them to.
"""

from linattn.ops.conv.op import causal_conv1d, causal_conv1d_step

__all__ = ["causal_conv1d", "causal_conv1d_step"]
