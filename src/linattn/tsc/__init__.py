"""Time-series classification with linear attention: data, model, training, evaluation.

``FordATransformer`` is the encoder (torch module); ``LinearAttentionClassifier`` wraps it as a
scikit-learn estimator (needs the ``forda`` extra: scikit-learn, safetensors, tqdm).
"""

from linattn.tsc.model import FordATransformer, ModelConfig

__all__ = ["FordATransformer", "ModelConfig", "LinearAttentionClassifier"]


def __getattr__(name: str):
    if name == "LinearAttentionClassifier":  # scikit-learn is an optional dependency
        from linattn.tsc.estimator import LinearAttentionClassifier

        return LinearAttentionClassifier
    raise AttributeError(f"module 'linattn.tsc' has no attribute {name!r}")
