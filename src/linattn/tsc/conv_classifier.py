"""``ConvAttentionClassifier``: linear attention over random-convolution tokens, with a ridge
head beside it (issue 27).

A series becomes :class:`~linattn.tsc.conv_tokens.ConvTokens` (per time segment, the
proportion of positions where each of many fixed dilated kernels exceeds its threshold, and
interval quantiles), standardised with the training tokens' mean and spread. Two heads read
them, and their class probabilities are added:

* :class:`~linattn.tsc.conv_tokens.TokenNet`: linear-attention encoder blocks with relative
  positions over the tokens, trained with AdamW, label smoothing and a one-cycle schedule for
  at least ``steps`` steps (so small sets get many epochs and large ones a few);
* a ridge classifier (``RidgeClassifierCV``, alphas ``logspace(-3, 3, 10)`` chosen by
  leave-one-out on the training series) on the tokens' mean, the global proportions; its
  decision values become probabilities by a softmax of 3 × them.

``num_layers=0`` removes the mixer (the ablation: a linear model of the pooled tokens beside
the ridge). The defaults were chosen on inner validation splits of the UCR TRAIN sets only
(``benchmarks/ucr_tokens.py``, docs/benchmarks.md "Convolution tokens").
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.linear_model import RidgeClassifierCV
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted

from linattn._config import Check, Range
from linattn.tsc.conv_tokens import ConvTokens, TokenNet, at_least, check_param
from linattn.tsc.data import fill_nan_padding
from linattn.tsc.estimator import _ThreadLimit, seed_of

__all__ = ["ConvAttentionClassifier", "train_token_net", "token_net_proba", "ridge_proba"]

RIDGE_ALPHAS = np.logspace(-3, 3, 10)
#: Each parameter's rule (:func:`~linattn.tsc.conv_tokens.check_param`).
PARAM_RULES = {
    **{name: at_least(low) for name, low in (
        ("segments", 1), ("features", 1), ("quantiles", 0), ("num_layers", 0), ("d_model", 1),
        ("num_heads", 1), ("steps", 1), ("batch_size", 1))},
    "dropout": (Check(float, Range(0.0, 1.0)), "a finite number in [0, 1)"),
    "lr": (Check(float, Range(0.0, math.inf, False)), "a finite number > 0"),
    "weight_decay": (Check(float, Range(0.0, math.inf)), "a finite number >= 0"),
}
#: Sharpness of the ridge's softmax. For two classes the columns are (−d, d), so a decision
#: value of ±1 (the ridge's targets) becomes 0.998 / 0.002 and one of ±0.2 becomes 0.77 / 0.23:
#: the ridge outvotes the net where it is sure, the net decides where the ridge is near 0.
#: Chosen with the rest on the TRAIN-only validation study.
RIDGE_TEMPERATURE = 3.0


def token_scaling(tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-feature mean and spread of training tokens (n, S, F) over series and segments; the
    1e-3 floor keeps a feature that never varies in training (a threshold no series crosses)
    from blowing up on new series."""
    return tokens.mean((0, 1)), tokens.std((0, 1)) + 1e-3


def train_token_net(tokens: np.ndarray, y: np.ndarray, n_classes: int, *, num_layers: int = 2,
                    d_model: int = 64, num_heads: int = 4, dropout: float = 0.1,
                    steps: int = 600, batch_size: int = 32, lr: float = 2e-3,
                    weight_decay: float = 0.05, seed: int = 0) -> TokenNet:
    """A :class:`TokenNet` fitted on tokens (n, S, F) float32 and labels 0..n_classes−1:
    ``ceil(steps / batches per epoch)`` epochs of shuffled batches, AdamW, one-cycle lr, label
    smoothing 0.1; returned in eval mode."""
    torch.manual_seed(seed)
    x, t = torch.from_numpy(tokens), torch.from_numpy(np.asarray(y, dtype=np.int64))
    net = TokenNet(x.shape[2], x.shape[1], n_classes, d_model=d_model, num_layers=num_layers,
                   num_heads=num_heads, dropout=dropout)
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=weight_decay)
    batch = min(batch_size, len(x))
    per_epoch = math.ceil(len(x) / batch)
    epochs = max(1, math.ceil(steps / per_epoch))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, lr, total_steps=epochs * per_epoch)
    net.train()
    for _ in range(epochs):
        order = torch.randperm(len(x))
        for i in range(0, len(x), batch):
            b = order[i:i + batch]
            loss = F.cross_entropy(net(x[b]), t[b], label_smoothing=0.1)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    return net.eval()


def token_net_proba(net: TokenNet, tokens: np.ndarray, batch: int = 512) -> np.ndarray:
    """Class probabilities (n, n_classes) of tokens (n, S, F)."""
    with torch.no_grad():
        x = torch.from_numpy(tokens)
        return torch.cat([net(x[i:i + batch]).softmax(1)
                          for i in range(0, len(x), batch)]).numpy()


def ridge_proba(decision: np.ndarray, present: np.ndarray | None = None,
                n_classes: int | None = None) -> np.ndarray:
    """Softmax of ``RIDGE_TEMPERATURE`` × ridge decision values, two columns for two classes;
    with ``present`` (the class indices the ridge saw, its ``classes_``) one column per class
    of ``n_classes``, 0 for a class it never saw (a small split can miss a class)."""
    if decision.ndim == 1:
        decision = np.stack([-decision, decision], 1)
    z = RIDGE_TEMPERATURE * decision
    z = np.exp(z - z.max(1, keepdims=True))
    z /= z.sum(1, keepdims=True)
    if present is None:
        return z
    out = np.zeros((len(z), n_classes))
    out[:, present] = z
    return out


class ConvAttentionClassifier(ClassifierMixin, BaseEstimator):
    """Linear attention over random-convolution tokens plus a ridge head (module docstring).

    ``X``: (n_series, length) float, NaN refused unless ``missing="interpolate"`` (trailing NaN
    padding becomes zeros, inner NaN is interpolated); ``y``: any labels. Token parameters:
    ``segments``, ``features``, ``quantiles`` (:class:`ConvTokens`); net: ``num_layers``
    (0: the mixer removed), ``d_model``, ``num_heads``, ``dropout``; training: ``steps``,
    ``batch_size``, ``lr``, ``weight_decay``; ``ridge``: add the ridge head's probabilities.
    Fitted: ``classes_``, ``tokens_``, ``net_``, ``ridge_`` (None without), ``fit_time_``.
    """

    def __init__(self, segments: int = 16, features: int = 2000, quantiles: int = 9,
                 num_layers: int = 2, d_model: int = 64, num_heads: int = 4,
                 dropout: float = 0.1, steps: int = 600, batch_size: int = 32,
                 lr: float = 2e-3, weight_decay: float = 0.05, ridge: bool = True,
                 missing: str = "error", random_state: int = 0,
                 n_threads: int | None = None) -> None:
        self.segments, self.features, self.quantiles = segments, features, quantiles
        self.num_layers, self.d_model, self.num_heads = num_layers, d_model, num_heads
        self.dropout, self.steps, self.batch_size = dropout, steps, batch_size
        self.lr, self.weight_decay, self.ridge = lr, weight_decay, ridge
        self.missing, self.random_state, self.n_threads = missing, random_state, n_threads

    def _series(self, X, where: str) -> np.ndarray:
        X = np.asarray(X, dtype=np.float32)
        if X.ndim != 2:
            raise ValueError(f"{where}: X must have shape (n_series, length), got {X.shape}")
        return fill_nan_padding(X, "X", self.missing).astype(np.float32, copy=False)

    def _standardised(self, X) -> np.ndarray:
        return (self.tokens_.transform(X) - self.mean_) / self.scale_

    def _checked_params(self, where: str) -> int:
        """The parameters checked (one-line ValueError naming the first bad one); returns the
        seed (``random_state``, None meaning 0)."""
        for name, rule in PARAM_RULES.items():
            check_param(where, name, getattr(self, name), rule)
        if self.d_model % self.num_heads:
            raise ValueError(f"{where}: d_model ({self.d_model}) must be a multiple of "
                             f"num_heads ({self.num_heads})")
        return seed_of(self.random_state, where)

    def fit(self, X, y) -> ConvAttentionClassifier:
        t0 = time.perf_counter()
        seed = self._checked_params("ConvAttentionClassifier.fit")
        X = self._series(X, "ConvAttentionClassifier.fit")
        y = np.asarray(y)
        if y.ndim != 1 or len(y) != len(X):
            raise ValueError(f"ConvAttentionClassifier.fit: y must have shape ({len(X)},), "
                             f"got {y.shape}")
        check_classification_targets(y)
        self.classes_, codes = np.unique(y, return_inverse=True)
        if len(self.classes_) < 2:
            raise ValueError("ConvAttentionClassifier.fit: y has one class; need at least 2")
        with _ThreadLimit(self.n_threads):
            self.tokens_ = ConvTokens(self.segments, self.features, self.quantiles,
                                      random_state=seed).fit(X)
            T = self.tokens_.transform(X)
            self.mean_, self.scale_ = token_scaling(T)
            T = (T - self.mean_) / self.scale_
            self.ridge_ = (RidgeClassifierCV(alphas=RIDGE_ALPHAS).fit(T.mean(1), codes)
                           if self.ridge else None)
            self.net_ = train_token_net(
                T, codes, len(self.classes_), num_layers=self.num_layers,
                d_model=self.d_model, num_heads=self.num_heads, dropout=self.dropout,
                steps=self.steps, batch_size=self.batch_size, lr=self.lr,
                weight_decay=self.weight_decay, seed=seed)
        self.n_features_in_ = X.shape[1]
        self.fit_time_ = time.perf_counter() - t0
        return self

    def predict_proba(self, X) -> np.ndarray:
        """(n, n_classes): the net's probabilities, averaged with the ridge head's."""
        check_is_fitted(self, "net_")
        X = self._series(X, "ConvAttentionClassifier.predict_proba")
        with _ThreadLimit(self.n_threads):
            T = self._standardised(X)
            p = token_net_proba(self.net_, T)
            if self.ridge_ is not None:
                p = (p + ridge_proba(self.ridge_.decision_function(T.mean(1)),
                                     self.ridge_.classes_, len(self.classes_))) / 2
        return p

    def predict(self, X) -> np.ndarray:
        return self.classes_[self.predict_proba(X).argmax(1)]
