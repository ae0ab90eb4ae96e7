"""cosFormer: ReLU features with a cosine re-weighting by distance.

``op.py`` holds the public functions; ``reference.py`` the ground truth the tests hold them to.
"""

from linattn.ops.cosformer.op import CosFormerFeatures, cosformer_attention

__all__ = ["cosformer_attention", "CosFormerFeatures"]
