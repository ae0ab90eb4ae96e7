"""The heads of :class:`~linattn.tsc.ConvAttentionClassifier` and how they are joined: the
ridge head (:class:`RidgeHead`, its probabilities by :func:`ridge_proba`), the heads' class
probabilities apart (:class:`Heads`) and together (:func:`joined_heads`), and the
standardisation of the features they read (:func:`fit_scaling`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from sklearn.linear_model import RidgeClassifierCV

__all__ = ["RIDGE_ALPHAS", "RIDGE_TEMPERATURE", "RidgeHead", "ridge_proba", "Heads",
           "joined_heads", "token_scaling", "fit_scaling"]

RIDGE_ALPHAS = np.logspace(-3, 3, 10)
#: Sharpness of the ridge's softmax: the estimator's ``ridge_temperature`` default, and
#: :func:`ridge_proba`'s. 5 since the third configuration (round 4 of docs/experiments.md;
#: 3 in the first configuration, 30 in the second); every published UCR result of the
#: third, fourth and fifth configurations was fitted at 5 (``ridge_temperature: 5.0`` in each
#: row's parameters). For two classes the columns are (−d, d), so a decision value of ±1 (the
#: ridge's targets) becomes 0.99995 / 0.00005 and one of ±0.1 becomes 0.73 / 0.27: the ridge
#: outvotes the net where it is sure, a confident net decides where the ridge is near 0.
RIDGE_TEMPERATURE = 5.0


class Heads(NamedTuple):
    """Each head's class probabilities (n, n_classes) (:meth:`ConvAttentionClassifier.
    head_probas`); None for a head the model has not."""

    nets: np.ndarray
    ridge: np.ndarray | None
    stem: np.ndarray | None = None


def joined_heads(nets: np.ndarray, ridge: np.ndarray | None,
                 stem: np.ndarray | None = None, net_weight: float = 0.5) -> np.ndarray:
    """The estimator's probabilities from its :class:`Heads`: ``net_weight · nets +
    (1 − net_weight) · ridge`` (the nets' alone without a ridge head; at the default 1/2 the
    two heads' mean), then, with a stem net, the mean of that and the stem's."""
    joined = nets if ridge is None else net_weight * nets + (1 - net_weight) * ridge
    return joined if stem is None else (joined + stem) / 2


def token_scaling(tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-feature mean and spread of training tokens (n, S, F) over series and segments, or of
    features (n, F) over series; the 1e-3 floor keeps a feature that never varies in training
    (a threshold no series crosses) from blowing up on new series."""
    leading = tuple(range(tokens.ndim - 1))
    return tokens.mean(leading), tokens.std(leading) + 1e-3


def fit_scaling(features: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(standardised features, mean, scale): :func:`token_scaling` of training features
    applied to them."""
    mean, scale = token_scaling(features)
    return (features - mean) / scale, mean, scale


def ridge_proba(decision: np.ndarray, present: np.ndarray | None = None,
                n_classes: int | None = None,
                temperature: float = RIDGE_TEMPERATURE) -> np.ndarray:
    """Softmax of ``temperature`` × ridge decision values, two columns for two classes;
    with ``present`` (the class indices the ridge saw, its ``classes_``) one column per class
    of ``n_classes``, 0 for a class it never saw (a small split can miss a class)."""
    if decision.ndim == 1:
        decision = np.stack([-decision, decision], 1)
    z = temperature * decision
    z = np.exp(z - z.max(1, keepdims=True))
    z /= z.sum(1, keepdims=True)
    if present is None:
        return z
    out = np.zeros((len(z), n_classes))
    out[:, present] = z
    return out


@dataclass
class RidgeHead:
    """A fitted ridge classifier's linear map, all that prediction needs (and all a saved
    model keeps): decision values ``F @ coef.T + intercept`` of features F (n, n_features),
    one column when ``coef`` has one row (two classes: positive for ``classes_[1]``)."""

    coef: np.ndarray  # (1 or n_present, n_features)
    intercept: np.ndarray  # (1 or n_present,)
    classes_: np.ndarray  # the class indices the ridge saw
    alpha_: float

    @classmethod
    def fit(cls, F: np.ndarray, codes: np.ndarray) -> RidgeHead:
        """``RidgeClassifierCV(alphas=RIDGE_ALPHAS)`` (leave-one-out alpha) on F, codes."""
        r = RidgeClassifierCV(alphas=RIDGE_ALPHAS).fit(F, codes)
        return cls(np.atleast_2d(r.coef_), np.atleast_1d(r.intercept_), r.classes_,
                   float(r.alpha_))

    def decision_function(self, F: np.ndarray) -> np.ndarray:
        d = np.asarray(F) @ self.coef.T + self.intercept
        return d[:, 0] if d.shape[1] == 1 else d
