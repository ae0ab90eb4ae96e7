"""Relative positions inside linear attention (FFT / Toeplitz).

``op.py`` holds the public functions; ``reference.py`` the ground truth the tests hold them to.
"""

from linattn.ops.relative.op import DIRECT_MAX_T, FFT_BLOCK_BYTES, relative_linear_attention

__all__ = ["relative_linear_attention", "DIRECT_MAX_T", "FFT_BLOCK_BYTES"]
