"""Flowformer's flow attention.

``op.py`` holds the public functions; ``reference.py`` the ground truth the tests hold them to.
"""

from linattn.ops.flowformer.op import (
    FLOW_EPS,
    SigmoidFeatures,
    flow_feature_map,
    flowformer_attention,
)

__all__ = ["flowformer_attention", "SigmoidFeatures", "FLOW_EPS", "flow_feature_map"]
