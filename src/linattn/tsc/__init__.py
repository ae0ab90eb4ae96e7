"""Time-series classification with linear attention: data, model, training, evaluation.

``FordATransformer`` is the encoder (torch module); ``LinearAttentionClassifier`` wraps it as a
scikit-learn estimator (needs the ``forda`` extra: scikit-learn, safetensors, tqdm).

The names load on first use, so that torch-free parts (:mod:`linattn.tsc.recipes`, which
``linattn forda`` checks its options against) import without torch.
"""

from __future__ import annotations

from linattn._lazy import lazy_exports

_EXPORTS = {
    "FordATransformer": "linattn.tsc.model",
    "ModelConfig": "linattn.tsc.model",
    "LinearAttentionClassifier": "linattn.tsc.estimator",  # scikit-learn: an optional extra
    "ConvAttentionClassifier": "linattn.tsc.conv_classifier",  # scikit-learn too
    "ConvTokens": "linattn.tsc.conv_tokens",
    "CompetingKernels": "linattn.tsc.competing",
}

__all__ = ["FordATransformer", "ModelConfig", "LinearAttentionClassifier",
           "ConvAttentionClassifier", "ConvTokens", "CompetingKernels"]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals(), __all__)
