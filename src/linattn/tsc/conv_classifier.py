"""``ConvAttentionClassifier``: plainly, a convolution-kernel ridge classifier (random dilated
kernels: their PPV over the series and its first differences, and competing-kernel counts)
joined with a linear-attention net at 1/4 weight. The accuracy comes from the kernels and the
ridge: without the net's attention (``num_layers=0``) the model scores 0.07 points less on 50
UCR sets and meets every target as well (docs/timeseries.md). The heads and their join are in
:mod:`linattn.tsc.heads`, the nets' training in :mod:`linattn.tsc.nets`, saving and loading
in :mod:`linattn.tsc.conv_io`.

A series becomes :class:`~linattn.tsc.conv_tokens.ConvTokens` (per time segment, the
proportion of positions where each of many fixed dilated kernels exceeds its threshold, and
interval quantiles), standardised with the training tokens' mean and spread. Two heads read
them, and their class probabilities are added:

* :class:`~linattn.tsc.conv_tokens.TokenNet`: linear-attention encoder blocks with relative
  positions over the tokens, trained with AdamW, label smoothing and a one-cycle schedule for
  at least ``steps`` steps (default 1,800: so small sets get many epochs and large ones a
  few);
* a ridge classifier (``RidgeClassifierCV``, alphas ``logspace(-3, 3, 10)`` chosen by
  leave-one-out on the training series) on global features: with ``global_features=0`` the
  tokens' mean (the global proportions), otherwise a second, richer
  :class:`~linattn.tsc.conv_tokens.ConvTokens` of one segment and about ``global_features``
  features (default 10,000, MiniRocket's budget), standardised the same way, and beside them
  ``competing_groups`` (default 64) groups of Hydra-style
  :class:`~linattn.tsc.competing.CompetingKernels` counts; its decision values become
  probabilities by a softmax of ``ridge_temperature`` (default 5) × them, sharp enough that
  the ridge decides where it is confident, soft enough that a confident net can overrule a
  hesitant ridge.

The ridge also reads the PPV features of the series' first differences (``x[t+1] − x[t]``; a
one-segment :class:`~linattn.tsc.conv_tokens.ConvTokens` of about ``difference_features``
features, default 5,000, no quantiles; 0: none), standardised the same way: MultiRocket's
second representation. ``net_weight`` (default 1/4) is the nets' weight in their join with the
ridge: ``net_weight · nets + (1 − net_weight) · ridge``. Both were chosen on fresh validation
splits (round 13, docs/experiments.md); 0 and 1/2 give the fourth configuration.

With ``global_token=True`` (the default) each net also reads those global features as one more
token after the segments, so that attention relates every segment to the whole series.

``n_nets`` nets (seeds ``random_state``, ``random_state + 1``, …) average their probabilities
before the ridge's are added. ``n_members`` whole models (tokens, global features, competing
kernels, ridge and nets; member ``m`` fitted exactly as the estimator at ``random_state + m``)
average their probabilities: an ensemble over the random draws, at ``n_members`` times the
cost.

With ``stem=True`` a third head, a :class:`~linattn.tsc.stem.StemNet` (learned convolutions
over the raw series, max-pooled into tokens that linear attention relates; trained like the
token nets, at ``random_state``), joins them: the probabilities are then the mean of the
nets-and-ridge mean and the stem net's (:func:`joined_heads`).

``num_layers=0`` removes the mixer (the ablation: a linear model of the pooled tokens beside
the ridge, and a stem net without attention). The defaults were chosen on inner validation
splits of the UCR TRAIN sets only (docs/experiments.md: each round's question, rule, result
and the commit that holds its scripts).
"""

from __future__ import annotations

import inspect
import math
import os
import time
from pathlib import Path

import numpy as np
from scipy.sparse import issparse
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, column_or_1d

from linattn._config import Check, Range
from linattn._memory import check_fits
from linattn.tsc import conv_io
from linattn.tsc.competing import CompetingKernels
from linattn.tsc.conv_io import CONV_FORMAT
from linattn.tsc.conv_tokens import ConvTokens, TokenNet, at_least, check_param
from linattn.tsc.data import MISSING, fill_nan_padding, real_series
from linattn.tsc.heads import (
    RIDGE_ALPHAS,
    RIDGE_TEMPERATURE,
    Heads,
    RidgeHead,
    fit_scaling,
    joined_heads,
    ridge_proba,
)
from linattn.tsc.nets import (
    NET_STEPS,
    fit_net,
    net_proba,
    stem_net_proba,
    token_net_proba,
    train_stem_net,
    train_token_net,
)
from linattn.tsc.shared import ThreadLimit, check_threads, seed_of

# The heads' and nets' names stay importable from here, where they were first defined.
__all__ = ["ConvAttentionClassifier", "RidgeHead", "train_token_net", "token_net_proba",
           "train_stem_net", "stem_net_proba", "fit_net", "net_proba", "ridge_proba",
           "joined_heads", "Heads", "CONV_FORMAT", "RIDGE_ALPHAS", "RIDGE_TEMPERATURE",
           "NET_STEPS"]

#: The parameters the memory of a fit grows with (:func:`_fit_bytes`).
_FEATURE_SIZES = ("segments", "features", "global_features", "difference_features")


def _fit_bytes(p: dict) -> int:
    """A lower bound of the bytes a fit on ``p["n"]`` series needs: the float32 features of
    every series (the tokens' ``segments × features``, the global and the differences'
    features), each also standardised (a second copy)."""
    per_series = p["segments"] * p["features"] + p["global_features"] + p["difference_features"]
    return 8 * p["n"] * per_series


#: Each parameter's rule (:func:`~linattn.tsc.conv_tokens.check_param`).
PARAM_RULES = {
    **{name: at_least(low) for name, low in (
        ("segments", 1), ("features", 1), ("quantiles", 0), ("num_layers", 0), ("d_model", 1),
        ("num_heads", 1), ("steps", 1), ("batch_size", 1), ("global_features", 0),
        ("n_nets", 1), ("competing_groups", 0), ("difference_features", 0), ("n_members", 1))},
    "net_weight": (Check(float, Range(0.0, 1.0, True, True)), "a finite number in [0, 1]"),
    "dropout": (Check(float, Range(0.0, 1.0)), "a finite number in [0, 1)"),
    "lr": (Check(float, Range(0.0, math.inf, False), float32=True),
           "a finite number > 0 that float32 holds"),
    "weight_decay": (Check(float, Range(0.0, math.inf), float32=True),
                     "a finite number >= 0 that float32 holds"),
    "ridge_temperature": (Check(float, Range(0.0, math.inf, False)), "a finite number > 0"),
}
#: The first differences' PPV features the ridge reads, and the nets' weight in the join: the
#: fifth configuration, round 13 of the TRAIN-only study (0 and 1/2 before; on two fresh
#: splits +0.72 points on validation, 35 dataset-splits won and 11 lost, by the rule written
#: before the round ran; docs/experiments.md, round 13).
DIFFERENCE_FEATURES = 5000
NET_WEIGHT = 0.25


class ConvAttentionClassifier(ClassifierMixin, BaseEstimator):
    """Linear attention over random-convolution tokens plus a ridge head (module docstring).

    ``X``: (n_series, length) float, NaN refused unless ``missing="interpolate"`` (trailing NaN
    padding becomes zeros, inner NaN is interpolated); ``y``: any labels. Token parameters:
    ``segments``, ``features``, ``quantiles`` (:class:`ConvTokens`); net: ``num_layers``
    (0: the mixer removed), ``d_model``, ``num_heads``, ``dropout``; training: ``steps``,
    ``batch_size``, ``lr``, ``weight_decay``, ``n_nets``; ``n_members`` whole models at seeds
    ``random_state``, ``random_state + 1``, … averaged (the first is this estimator's own
    fitted state, the others ``members_``); global features:
    ``global_features`` (about how many, from a one-segment :class:`ConvTokens`; 0: none, the
    ridge then reads the tokens' mean), ``global_token`` (the nets also read them, as one more
    token); ``competing_groups`` (groups of competing kernels whose counts the ridge reads
    too; 0: none; even); ``difference_features`` (about how many PPV features of the first
    differences the ridge reads too; 0: none); ``ridge``: add the ridge head's probabilities,
    sharpened by ``ridge_temperature``, the nets' weighing ``net_weight`` in the join;
    ``stem``: add a :class:`~linattn.tsc.stem.StemNet` head. Fitted:
    ``classes_``, ``tokens_``, ``nets_`` (``net_`` the first),
    ``ridge_`` (a :class:`RidgeHead`, None without), ``global_tokens_``, ``competing_`` and
    ``difference_tokens_`` (None when unused), ``stem_net_`` (None without),
    ``fit_time_``. ``save(dir)`` writes ``config.json`` and ``model.safetensors`` (no pickle);
    ``ConvAttentionClassifier.load(dir)`` restores the same predictions.
    """

    def __init__(self, segments: int = 16, features: int = 2000, quantiles: int = 9,
                 num_layers: int = 2, d_model: int = 64, num_heads: int = 4,
                 dropout: float = 0.1, steps: int = NET_STEPS, batch_size: int = 32,
                 lr: float = 2e-3, weight_decay: float = 0.05, ridge: bool = True,
                 global_features: int = 10000, global_token: bool = True, n_nets: int = 1,
                 ridge_temperature: float = RIDGE_TEMPERATURE, competing_groups: int = 64,
                 difference_features: int = DIFFERENCE_FEATURES,
                 net_weight: float = NET_WEIGHT, stem: bool = False,
                 n_members: int = 1, missing: str = "error",
                 random_state: int = 0, n_threads: int | None = None) -> None:
        self.segments, self.features, self.quantiles = segments, features, quantiles
        self.num_layers, self.d_model, self.num_heads = num_layers, d_model, num_heads
        self.dropout, self.steps, self.batch_size = dropout, steps, batch_size
        self.lr, self.weight_decay, self.ridge = lr, weight_decay, ridge
        self.global_features, self.global_token = global_features, global_token
        self.n_nets, self.ridge_temperature = n_nets, ridge_temperature
        self.competing_groups, self.stem, self.n_members = competing_groups, stem, n_members
        self.difference_features, self.net_weight = difference_features, net_weight
        self.missing, self.random_state, self.n_threads = missing, random_state, n_threads

    def _series(self, X, where: str, fitted: bool = False) -> np.ndarray:
        """X as contiguous float32 (n_series, length), NaN handled by ``missing``; one-line
        errors in the words scikit-learn's estimator checks look for (sparse input, one
        series of shape (length,), series of 0 samples, and with ``fitted`` a length other
        than the one the model was fitted on)."""
        if issparse(X):
            raise TypeError(f"{where}: X is a sparse matrix; sparse input is not supported "
                            "(pass the series as a dense array)")
        X = np.asarray(real_series(X, where), dtype=np.float32)
        if X.ndim != 2:
            raise ValueError(f"{where}: X must have shape (n_series, length), got {X.shape} "
                             "(Reshape your data: X.reshape(1, -1) for one series)")
        if X.shape[1] == 0:
            raise ValueError(f"{where}: X's series have no samples: found array with 0 "
                             f"feature(s) (shape={X.shape}) while a minimum of 1 is required.")
        if fitted and X.shape[1] != self.n_features_in_:
            raise ValueError(f"{where}: X has {X.shape[1]} features, but {type(self).__name__} "
                             f"is expecting {self.n_features_in_} features as input (the "
                             "length of the series it was fitted on)")
        # contiguous: torch.from_numpy (the stem net's input) refuses a reversed view
        return np.ascontiguousarray(fill_nan_padding(X, "X", self.missing), dtype=np.float32)

    @property
    def _uses_global(self) -> bool:
        """Whether a global transform is fitted: global features read by the ridge or nets."""
        return bool(self.global_features) and bool(self.ridge or self.global_token)

    @property
    def _uses_competing(self) -> bool:
        """Whether competing-kernel counts are fitted: only the ridge head reads them."""
        return bool(self.competing_groups) and bool(self.ridge)

    @property
    def _uses_difference(self) -> bool:
        """Whether the first differences' features are fitted: only the ridge head reads them."""
        return bool(self.difference_features) and bool(self.ridge)

    @property
    def net_(self) -> TokenNet:
        """The first net (the only one with ``n_nets=1``)."""
        return self.nets_[0]

    def _standardised(self, X) -> np.ndarray:
        return (self.tokens_.transform(X) - self.mean_) / self.scale_

    def _global(self, X) -> np.ndarray | None:
        """Standardised global features (n, G) of series X, None when the model has none."""
        if self.global_tokens_ is None:
            return None
        return (self.global_tokens_.transform(X)[:, 0] - self.global_mean_) / self.global_scale_

    def _competing(self, X) -> np.ndarray | None:
        """Standardised competing-kernel counts (n, H) of series X, None when unused."""
        if self.competing_ is None:
            return None
        return (self.competing_.transform(X) - self.competing_mean_) / self.competing_scale_

    def _difference(self, X) -> np.ndarray | None:
        """Standardised PPV features (n, D) of the first differences of series X, None when
        unused."""
        if self.difference_tokens_ is None:
            return None
        D = self.difference_tokens_.transform(_first_differences(X))[:, 0]
        return (D - self.difference_mean_) / self.difference_scale_

    @staticmethod
    def _ridge_input(T: np.ndarray, G: np.ndarray | None, H: np.ndarray | None,
                     D: np.ndarray | None = None) -> np.ndarray:
        """What the ridge head reads: the global features G (the tokens' mean T.mean(1)
        without them), then the competing-kernel counts H and the first differences'
        features D beside them when the model has those."""
        parts = [T.mean(1) if G is None else G, H, D]
        parts = [p for p in parts if p is not None]
        return parts[0] if len(parts) == 1 else np.hstack(parts)

    def _checked_params(self, where: str) -> int:
        """The parameters checked (one-line ValueError naming the first bad one); returns the
        seed (``random_state``, None meaning 0)."""
        for name, rule in PARAM_RULES.items():
            check_param(where, name, getattr(self, name), rule)
        for name in ("ridge", "global_token", "stem"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise ValueError(f"{where}: {name} must be True or False, got "
                                 f"{getattr(self, name)!r}")
        if self.missing not in MISSING:
            raise ValueError(f"{where}: missing must be one of {', '.join(MISSING)}, got "
                             f"{self.missing!r}")
        check_threads(self.n_threads, where)
        if self.global_token and not self.global_features:
            raise ValueError(f"{where}: global_token needs global_features > 0")
        if self.competing_groups % 2:
            raise ValueError(f"{where}: competing_groups must be 0 or even (half the groups read "
                             f"the difference), got {self.competing_groups}")
        if self.d_model % self.num_heads:
            raise ValueError(f"{where}: d_model ({self.d_model}) must be a multiple of "
                             f"num_heads ({self.num_heads})")
        return seed_of(self.random_state, where)

    def _check_memory(self, n: int, where: str) -> None:
        """ValueError naming the parameter when fitting ``n`` series cannot fit in the memory
        available: before this, ``features=10**12`` allocated until the OOM killer came."""
        defaults = {name: inspect.signature(type(self)).parameters[name].default
                    for name in _FEATURE_SIZES}
        try:
            check_fits(_fit_bytes, {"n": n, **{k: getattr(self, k) for k in _FEATURE_SIZES}},
                       defaults, "fitting this model")
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None

    def fit(self, X, y) -> ConvAttentionClassifier:
        t0 = time.perf_counter()
        seed = self._checked_params("ConvAttentionClassifier.fit")
        X = self._series(X, "ConvAttentionClassifier.fit")
        if len(X) < 2:  # said "y has one class" of no series at all
            raise ValueError(f"ConvAttentionClassifier.fit: X has {len(X)} series; fitting "
                             f"needs at least 2 (found {len(X)} sample(s))")
        self._check_memory(len(X), "ConvAttentionClassifier.fit")
        if y is None:
            raise ValueError("ConvAttentionClassifier.fit requires y to be passed, but the "
                             "target y is None")
        y = np.asarray(y)
        if y.ndim == 2 and y.shape[1] == 1:  # a column: scikit-learn's warning, then 1-D
            y = column_or_1d(y, warn=True)
        if y.ndim != 1 or len(y) != len(X):
            raise ValueError(f"ConvAttentionClassifier.fit: y must have shape ({len(X)},), "
                             f"got {y.shape}")
        check_classification_targets(y)
        self.classes_, codes = np.unique(y, return_inverse=True)
        if len(self.classes_) < 2:
            raise ValueError("ConvAttentionClassifier.fit: y has one class; need at least 2")
        if self.stem and X.shape[1] < 2:  # one sample has no spread to normalise by
            raise ValueError("ConvAttentionClassifier.fit: stem=True needs series of at least "
                             f"2 samples, got {X.shape[1]} (n_features = {X.shape[1]})")
        if self._uses_difference and X.shape[1] < 2:  # one sample has no difference
            raise ValueError("ConvAttentionClassifier.fit: difference_features > 0 needs series "
                             f"of at least 2 samples, got {X.shape[1]} (n_features = "
                             f"{X.shape[1]})")
        self.n_features_in_ = X.shape[1]
        with ThreadLimit(self.n_threads):
            self._fit_one(X, codes, seed)
            self.members_ = []
            for m in range(1, self.n_members):
                member = self._member(seed + m)
                member._fit_one(X, codes, seed + m)
                self.members_.append(member)
        self.fit_time_ = time.perf_counter() - t0
        return self

    def _member(self, seed: int) -> ConvAttentionClassifier:
        """An unfitted model of these parameters at ``seed``, alone (``n_members=1``), with
        this estimator's classes and series length."""
        member = type(self)(**{**self.get_params(), "n_members": 1, "random_state": seed})
        member.classes_, member.n_features_in_ = self.classes_, self.n_features_in_
        member.members_ = []  # a member is a whole estimator: it predicts and saves alone
        return member

    def _fit_one(self, X: np.ndarray, codes: np.ndarray, seed: int) -> None:
        """One whole model at ``seed``: its tokens, global features, counts, ridge, nets."""
        self.tokens_ = ConvTokens(self.segments, self.features, self.quantiles,
                                  random_state=seed).fit(X)
        T, self.mean_, self.scale_ = fit_scaling(self.tokens_.transform(X))
        self.global_tokens_ = self.global_mean_ = self.global_scale_ = self.ridge_ = None
        if self._uses_global:
            # the same seed as the tokens': the same drawn series give the thresholds, so
            # the global features refine the pooled tokens' rather than replace them
            self.global_tokens_ = ConvTokens(1, self.global_features, self.quantiles,
                                             random_state=seed).fit(X)
            G, self.global_mean_, self.global_scale_ = fit_scaling(
                self.global_tokens_.transform(X)[:, 0])  # transformed once
        else:
            G = None
        self.competing_ = self.competing_mean_ = self.competing_scale_ = H = None
        if self._uses_competing:
            self.competing_ = CompetingKernels(self.competing_groups,
                                               random_state=seed).fit(X)
            H, self.competing_mean_, self.competing_scale_ = fit_scaling(
                self.competing_.transform(X))
        self.difference_tokens_ = self.difference_mean_ = self.difference_scale_ = D = None
        if self._uses_difference:
            dX = _first_differences(X)
            # no quantiles: the differences' PPV is what MultiRocket adds and what round 12
            # measured
            self.difference_tokens_ = ConvTokens(1, self.difference_features, 0,
                                                 random_state=seed).fit(dX)
            D, self.difference_mean_, self.difference_scale_ = fit_scaling(
                self.difference_tokens_.transform(dX)[:, 0])
        if self.ridge:
            self.ridge_ = RidgeHead.fit(self._ridge_input(T, G, H, D), codes)
        # both kinds of net train alike: the same shape parameters and training
        net = {k: getattr(self, k) for k in ("num_layers", "d_model", "num_heads", "dropout",
                                             "steps", "batch_size", "lr", "weight_decay")}
        self.nets_ = [train_token_net(T, codes, len(self.classes_), seed=seed + i,
                                      global_features=G if self.global_token else None, **net)
                      for i in range(self.n_nets)]
        self.stem_net_ = (train_stem_net(X, codes, len(self.classes_), seed=seed, **net)
                          if self.stem else None)

    def head_probas(self, X, where: str = "ConvAttentionClassifier.head_probas") -> Heads:
        """The heads apart (:class:`Heads`): the token nets' mean probabilities (n,
        n_classes), the ridge head's (None with ``ridge=False``) and the stem net's (None with
        ``stem=False``), each averaged over the members; ``predict_proba`` joins them
        (:func:`joined_heads`)."""
        check_is_fitted(self, "nets_")
        X = self._series(X, where, fitted=True)
        with ThreadLimit(self.n_threads):
            heads = [model._own_head_probas(X) for model in (self, *self.members_)]
        return Heads(*(None if h[0] is None else sum(h) / len(h)
                       for h in zip(*heads, strict=True)))

    def _own_head_probas(self, X: np.ndarray) -> Heads:
        """:meth:`head_probas` of this model alone (not its members), X checked."""
        T, G = self._standardised(X), self._global(X)
        net_g = G if self.global_token else None
        nets = sum(token_net_proba(net, T, global_features=net_g)
                   for net in self.nets_) / len(self.nets_)
        stem = None if self.stem_net_ is None else stem_net_proba(self.stem_net_, X)
        if self.ridge_ is None:
            return Heads(nets, None, stem)
        d = self.ridge_.decision_function(self._ridge_input(T, G, self._competing(X),
                                                            self._difference(X)))
        return Heads(nets, ridge_proba(d, self.ridge_.classes_, len(self.classes_),
                                       self.ridge_temperature), stem)

    def predict_proba(self, X) -> np.ndarray:
        """(n, n_classes): the heads joined by :func:`joined_heads` at ``net_weight``."""
        return joined_heads(*self.head_probas(X, "ConvAttentionClassifier.predict_proba"),
                            net_weight=self.net_weight)

    def predict(self, X) -> np.ndarray:
        proba = self.predict_proba(X)  # first: an unfitted model is NotFittedError there
        return self.classes_[proba.argmax(1)]

    # -- persistence (linattn.tsc.conv_io) ----------------------------------------------
    def save(self, path: str | os.PathLike) -> Path:
        """Write ``config.json`` (parameters, classes) and ``model.safetensors`` (the fitted
        tokens' thresholds, the scalings, the ridge head, the nets' weights, the stem net's,
        each member's behind ``members.M.``) into folder ``path`` (created); each file is
        written atomically."""
        return conv_io.save(self, path)

    def _tensors(self, prefix: str = "") -> dict:
        """This model's fitted tensors (not its members'), each name behind ``prefix``."""
        return conv_io.tensors(self, prefix)

    @classmethod
    def load(cls, path: str | os.PathLike) -> ConvAttentionClassifier:
        """Restore an estimator written by :meth:`save`. A missing folder or file, a corrupt
        file, a parameter out of range or a tensor that is missing or does not fit raise
        :class:`~linattn.train_loop.CheckpointError` (a ValueError) in one line naming the
        file and what is wrong."""
        return conv_io.load(cls, path)


def _first_differences(X: np.ndarray) -> np.ndarray:
    """``x[t+1] − x[t]`` of each series: (n, L) -> (n, L − 1), contiguous float32."""
    return np.ascontiguousarray(np.diff(X, axis=1), dtype=np.float32)


