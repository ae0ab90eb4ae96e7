"""Time-series classification with linear attention: data, model, training, evaluation.

``FordATransformer`` is the encoder (torch module); ``LinearAttentionClassifier`` wraps it as a
scikit-learn estimator (needs the ``forda`` extra: scikit-learn, safetensors, tqdm).

The names load on first use, so that torch-free parts (:mod:`linattn.tsc.recipes`, which
``linattn forda`` checks its options against) import without torch.
"""

from __future__ import annotations

from linattn._lazy import lazy_exports

#: module -> the public names it defines
__all__, __getattr__, __dir__ = lazy_exports(__name__, globals(), {
    "linattn.tsc.model": ("FordATransformer", "ModelConfig"),
    "linattn.tsc.estimator": ("LinearAttentionClassifier",),  # scikit-learn: an optional extra
    "linattn.tsc.conv_classifier": ("ConvAttentionClassifier",),  # scikit-learn too
    "linattn.tsc.conv_tokens": ("ConvTokens",),
    "linattn.tsc.competing": ("CompetingKernels",),
})
