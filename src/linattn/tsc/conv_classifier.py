"""``ConvAttentionClassifier``: linear attention over random-convolution tokens, with a ridge
head beside it (issue 27).

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
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.linear_model import RidgeClassifierCV
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted

from linattn._config import Check, Range
from linattn._io import write_atomic, write_json
from linattn._memory import check_fits
from linattn.train_loop import CheckpointError, first_non_finite
from linattn.tsc.competing import CompetingKernels
from linattn.tsc.conv_tokens import ConvTokens, TokenNet, at_least, check_param
from linattn.tsc.data import MISSING, fill_nan_padding, real_series
from linattn.tsc.estimator import (
    _check_threads,
    _plain,
    _read_classes,
    _ThreadLimit,
    open_saved_model,
    seed_of,
)
from linattn.tsc.stem import StemNet

__all__ = ["ConvAttentionClassifier", "RidgeHead", "train_token_net", "token_net_proba",
           "train_stem_net", "stem_net_proba", "fit_net", "net_proba", "ridge_proba",
           "joined_heads", "Heads", "CONV_FORMAT"]

#: The parameters the memory of a fit grows with (:func:`_fit_bytes`).
_FEATURE_SIZES = ("segments", "features", "global_features", "difference_features")


def _fit_bytes(p: dict) -> int:
    """A lower bound of the bytes a fit on ``p["n"]`` series needs: the float32 features of
    every series (the tokens' ``segments × features``, the global and the differences'
    features), each also standardised (a second copy)."""
    per_series = p["segments"] * p["features"] + p["global_features"] + p["difference_features"]
    return 8 * p["n"] * per_series


#: The ``format`` field of a saved ConvAttentionClassifier's config.json.
CONV_FORMAT = "linattn.tsc.ConvAttentionClassifier/1"

RIDGE_ALPHAS = np.logspace(-3, 3, 10)
#: Each parameter's rule (:func:`~linattn.tsc.conv_tokens.check_param`).
PARAM_RULES = {
    **{name: at_least(low) for name, low in (
        ("segments", 1), ("features", 1), ("quantiles", 0), ("num_layers", 0), ("d_model", 1),
        ("num_heads", 1), ("steps", 1), ("batch_size", 1), ("global_features", 0),
        ("n_nets", 1), ("competing_groups", 0), ("difference_features", 0), ("n_members", 1))},
    "net_weight": (Check(float, Range(0.0, 1.0, True, True)), "a finite number in [0, 1]"),
    "dropout": (Check(float, Range(0.0, 1.0)), "a finite number in [0, 1)"),
    "lr": (Check(float, Range(0.0, math.inf, False)), "a finite number > 0"),
    "weight_decay": (Check(float, Range(0.0, math.inf)), "a finite number >= 0"),
    "ridge_temperature": (Check(float, Range(0.0, math.inf, False)), "a finite number > 0"),
}
#: Sharpness of the ridge's softmax. For two classes the columns are (−d, d), so a decision
#: value of ±1 (the ridge's targets) becomes 0.998 / 0.002 and one of ±0.2 becomes 0.77 / 0.23:
#: the ridge outvotes the net where it is sure, the net decides where the ridge is near 0.
#: Chosen with the rest on the TRAIN-only validation study.
RIDGE_TEMPERATURE = 3.0
#: The nets' optimiser steps: 1,800 since round 7 of the TRAIN-only study (600 before; three
#: times as many scored 0.8361 against 0.8359 on validation, 12 sets won and 10 lost, by the
#: rule written before the round ran; docs/experiments.md, round 7).
NET_STEPS = 1800
#: The first differences' PPV features the ridge reads, and the nets' weight in the join: the
#: fifth configuration, round 13 of the TRAIN-only study (0 and 1/2 before; on two fresh
#: splits +0.72 points on validation, 35 dataset-splits won and 11 lost, by the rule written
#: before the round ran; docs/experiments.md, round 13).
DIFFERENCE_FEATURES = 5000
NET_WEIGHT = 0.25


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


def fit_net(net: torch.nn.Module, inputs: list[torch.Tensor | None], y: np.ndarray, *,
            steps: int = NET_STEPS, batch_size: int = 32, lr: float = 2e-3,
            weight_decay: float = 0.05) -> torch.nn.Module:
    """Train ``net`` (called as ``net(*batch of each input)``, a None input passed as None)
    on labels 0..n_classes−1: ``ceil(steps / batches per epoch)`` epochs of shuffled batches,
    AdamW, one-cycle lr, label smoothing 0.1; returned in eval mode. The caller seeds torch
    before building the net, so that one seed fixes both the weights and the batches."""
    t = torch.from_numpy(np.asarray(y, dtype=np.int64))
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=weight_decay)
    batch = min(batch_size, len(t))
    per_epoch = math.ceil(len(t) / batch)
    epochs = max(1, math.ceil(steps / per_epoch))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, lr, total_steps=epochs * per_epoch)
    net.train()
    for _ in range(epochs):
        order = torch.randperm(len(t))
        for i in range(0, len(t), batch):
            b = order[i:i + batch]
            logits = net(*(None if x is None else x[b] for x in inputs))
            loss = F.cross_entropy(logits, t[b], label_smoothing=0.1)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    return net.eval()


def net_proba(net: torch.nn.Module, inputs: list[torch.Tensor | None],
              batch: int = 512) -> np.ndarray:
    """Class probabilities (n, n_classes) of a trained net over its inputs, ``batch`` rows at
    a time (a None input passed as None)."""
    n = len(next(x for x in inputs if x is not None))
    with torch.no_grad():
        return torch.cat([net(*(None if x is None else x[i:i + batch] for x in inputs))
                          .softmax(1) for i in range(0, n, batch)]).numpy()


def train_token_net(tokens: np.ndarray, y: np.ndarray, n_classes: int, *, num_layers: int = 2,
                    d_model: int = 64, num_heads: int = 4, dropout: float = 0.1, seed: int = 0,
                    global_features: np.ndarray | None = None, **training) -> TokenNet:
    """A :class:`TokenNet` fitted on tokens (n, S, F) float32 (and, when given, global
    features (n, G) float32 for a global token) and labels 0..n_classes−1 by
    :func:`fit_net` (``training``: its ``steps``, ``batch_size``, ``lr``,
    ``weight_decay``)."""
    torch.manual_seed(seed)
    x = torch.from_numpy(tokens)
    g = None if global_features is None else torch.from_numpy(global_features)
    net = TokenNet(x.shape[2], x.shape[1], n_classes, d_model=d_model, num_layers=num_layers,
                   num_heads=num_heads, dropout=dropout,
                   global_features=0 if g is None else g.shape[1])
    return fit_net(net, [x, g], y, **training)


def token_net_proba(net: TokenNet, tokens: np.ndarray, batch: int = 512,
                    global_features: np.ndarray | None = None) -> np.ndarray:
    """Class probabilities (n, n_classes) of tokens (n, S, F) (and global features (n, G) for
    a net with a global token)."""
    g = None if global_features is None else torch.from_numpy(global_features)
    return net_proba(net, [torch.from_numpy(tokens), g], batch)


def train_stem_net(X: np.ndarray, y: np.ndarray, n_classes: int, *, num_layers: int = 2,
                   d_model: int = 64, num_heads: int = 4, dropout: float = 0.1, seed: int = 0,
                   **training) -> StemNet:
    """A :class:`~linattn.tsc.stem.StemNet` fitted on series X (n, L) float32 and labels
    0..n_classes−1 by :func:`fit_net`, the token nets' training (``training``: its
    ``steps``, ``batch_size``, ``lr``, ``weight_decay``)."""
    torch.manual_seed(seed)
    net = StemNet(X.shape[1], n_classes, d_model=d_model, num_layers=num_layers,
                  num_heads=num_heads, dropout=dropout)
    return fit_net(net, [torch.from_numpy(X)], y, **training)


def stem_net_proba(net: StemNet, X: np.ndarray, batch: int = 512) -> np.ndarray:
    """Class probabilities (n, n_classes) of series X (n, L) float32."""
    return net_proba(net, [torch.from_numpy(X)], batch)


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
                 ridge_temperature: float = 5.0, competing_groups: int = 64,
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

    def _series(self, X, where: str) -> np.ndarray:
        X = np.asarray(real_series(X, where), dtype=np.float32)
        if X.ndim != 2:
            raise ValueError(f"{where}: X must have shape (n_series, length), got {X.shape}")
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
        _check_threads(self.n_threads, where)
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
                             "needs at least 2")
        self._check_memory(len(X), "ConvAttentionClassifier.fit")
        y = np.asarray(y)
        if y.ndim != 1 or len(y) != len(X):
            raise ValueError(f"ConvAttentionClassifier.fit: y must have shape ({len(X)},), "
                             f"got {y.shape}")
        check_classification_targets(y)
        self.classes_, codes = np.unique(y, return_inverse=True)
        if len(self.classes_) < 2:
            raise ValueError("ConvAttentionClassifier.fit: y has one class; need at least 2")
        if self.stem and X.shape[1] < 2:  # one sample has no spread to normalise by
            raise ValueError("ConvAttentionClassifier.fit: stem=True needs series of at least "
                             f"2 samples, got {X.shape[1]}")
        if self._uses_difference and X.shape[1] < 2:  # one sample has no difference
            raise ValueError("ConvAttentionClassifier.fit: difference_features > 0 needs series "
                             f"of at least 2 samples, got {X.shape[1]}")
        self.n_features_in_ = X.shape[1]
        with _ThreadLimit(self.n_threads):
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
        X = self._series(X, where)
        with _ThreadLimit(self.n_threads):
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

    # -- persistence ---------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> Path:
        """Write ``config.json`` (parameters, classes) and ``model.safetensors`` (the fitted
        tokens' thresholds, the scalings, the ridge head, the nets' weights, the stem net's,
        each member's behind ``members.M.``) into folder
        ``path`` (created); each file is written atomically."""
        from safetensors.torch import save

        check_is_fitted(self, "nets_")
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        t = self._tensors()
        for m, member in enumerate(self.members_, 1):
            t.update(member._tensors(f"members.{m}."))
        write_atomic(path / "model.safetensors", save(t))
        write_json(path / "config.json", {
            "format": CONV_FORMAT,
            "params": {k: _plain(v) for k, v in self.get_params().items()},
            "classes": self.classes_.tolist(), "classes_dtype": self.classes_.dtype.str,
            "n_features_in": int(self.n_features_in_),
            "ridge_alpha": None if self.ridge_ is None else self.ridge_.alpha_,
            **({"member_ridge_alphas": [None if m.ridge_ is None else m.ridge_.alpha_
                                        for m in self.members_]} if self.members_ else {}),
        })
        return path

    def _tensors(self, prefix: str = "") -> dict:
        """This model's fitted tensors (not its members'), each name behind ``prefix``."""
        t = {**self.tokens_.state("tokens."), "tokens.mean": torch.from_numpy(self.mean_),
             "tokens.scale": torch.from_numpy(self.scale_)}
        if self.global_tokens_ is not None:
            t.update({**self.global_tokens_.state("global_tokens."),
                      "global_tokens.mean": torch.from_numpy(self.global_mean_),
                      "global_tokens.scale": torch.from_numpy(self.global_scale_)})
        if self.competing_ is not None:
            t.update({**self.competing_.state("competing."),
                      "competing.mean": torch.from_numpy(self.competing_mean_),
                      "competing.scale": torch.from_numpy(self.competing_scale_)})
        if self.difference_tokens_ is not None:
            t.update({**self.difference_tokens_.state("difference_tokens."),
                      "difference_tokens.mean": torch.from_numpy(self.difference_mean_),
                      "difference_tokens.scale": torch.from_numpy(self.difference_scale_)})
        if self.ridge_ is not None:
            t.update({"ridge.coef": torch.from_numpy(np.ascontiguousarray(self.ridge_.coef)),
                      "ridge.intercept": torch.from_numpy(self.ridge_.intercept),
                      "ridge.classes": torch.from_numpy(self.ridge_.classes_.astype(np.int64))})
        for i, net in enumerate(self.nets_):
            t.update(_net_state(net, f"nets.{i}."))
        if self.stem_net_ is not None:
            t.update(_net_state(self.stem_net_, "stem."))
        return {prefix + k: v for k, v in t.items()}

    @classmethod
    def load(cls, path: str | os.PathLike) -> ConvAttentionClassifier:
        """Restore an estimator written by :meth:`save`. A missing folder or file, a corrupt
        file, a parameter out of range or a tensor that is missing or does not fit raise
        :class:`~linattn.train_loop.CheckpointError` (a ValueError) in one line naming the
        file and what is wrong."""
        cfg, cfg_path, w_path = open_saved_model(path, CONV_FORMAT, cls.__name__)
        try:
            est, alphas = cls._from_config(cfg, cfg_path)
        except (KeyError, TypeError, ValueError, OverflowError) as err:
            msg = f"missing key {err}" if isinstance(err, KeyError) else str(err)
            raise CheckpointError(msg if msg.startswith(str(cfg_path))
                                  else f"{cfg_path}: {msg}") from None
        try:
            est._restore(_read_tensors(w_path), alphas)
        except CheckpointError:
            raise
        except (KeyError, TypeError, ValueError, RuntimeError, OverflowError) as err:
            raise CheckpointError(f"{w_path}: {str(err).splitlines()[0]}") from None
        return est

    @classmethod
    def _from_config(cls, cfg: dict, cfg_path: Path
                     ) -> tuple[ConvAttentionClassifier, list[float | None]]:
        """The estimator (parameters, classes, n_features_in_) and the ridge's alpha of each
        member, its own first."""
        params = cfg["params"]
        if not isinstance(params, dict):
            raise ValueError(f"{cfg_path}: params: expected an object")
        # files saved before competing_groups (n_members, stem, difference_features,
        # net_weight) existed had no competing-kernel counts (one model, no stem net, no
        # differences, an even join): 0 (1, False, 0, 0.5) is what they mean
        params = {"competing_groups": 0, "n_members": 1, "stem": False,
                  "difference_features": 0, "net_weight": 0.5, **params}
        names = set(cls().get_params())
        for what, keys in (("unknown", set(params) - names), ("missing", names - set(params))):
            if keys:  # a missing key would silently take its default: another model
                raise ValueError(f"{cfg_path}: params: {what} keys {sorted(keys)}")
        est = cls(**params)
        est._checked_params(f"{cfg_path}: params")
        n = cfg["n_features_in"]
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{cfg_path}: n_features_in must be an integer >= 1, got {n!r}")
        if est._uses_difference and n < 2:
            raise ValueError(f"{cfg_path}: n_features_in must be >= 2 with difference_features "
                             f"> 0, got {n}")
        classes = cfg["classes"]
        if not isinstance(classes, list) or len(classes) < 2:
            raise ValueError(f"{cfg_path}: classes must be a list of at least 2 labels, got "
                             f"{classes!r}")
        est.classes_ = _read_classes(cfg, len(classes), cfg_path)
        alphas = [cfg["ridge_alpha"]]
        if est.n_members > 1:
            more = cfg["member_ridge_alphas"]
            if not isinstance(more, list) or len(more) != est.n_members - 1:
                raise ValueError(f"{cfg_path}: member_ridge_alphas must be a list of "
                                 f"{est.n_members - 1} (n_members - 1), got {more!r}")
            alphas += more
        elif "member_ridge_alphas" in cfg:  # another model's file, or an edited one
            raise ValueError(f"{cfg_path}: member_ridge_alphas given but n_members is 1")
        for m, alpha in enumerate(alphas):
            key = "ridge_alpha" if m == 0 else f"member_ridge_alphas[{m - 1}]"
            if est.ridge:  # a number > 0
                check_param(str(cfg_path), key, alpha, PARAM_RULES["lr"])
            elif alpha is not None:
                raise ValueError(f"{cfg_path}: {key} must be null without a ridge head, got "
                                 f"{alpha!r}")
        est.n_features_in_ = n
        return est, alphas

    def _restore(self, t: dict, alphas: list[float | None]) -> None:
        """The fitted state, members too, from the weights file's tensors (``load``);
        ValueError or RuntimeError naming what does not fit."""
        bad = first_non_finite(t)
        if bad is not None:  # a damaged model would predict one class, silently
            raise ValueError(f"{bad} holds non-finite values (NaN or infinity)")
        self._restore_one({k: v for k, v in t.items() if not k.startswith("members.")},
                          alphas[0])
        seed = seed_of(self.random_state, "ConvAttentionClassifier.load")
        self.members_ = []
        for m in range(1, self.n_members):
            prefix = f"members.{m}."
            member = self._member(seed + m)
            try:
                member._restore_one({k[len(prefix):]: v for k, v in t.items()
                                     if k.startswith(prefix)}, alphas[m])
            except (KeyError, TypeError, ValueError, RuntimeError) as err:
                # the member's own tensor names, behind its prefix
                raise ValueError(f"member {m} (tensors {prefix}*): "
                                 f"{str(err).splitlines()[0]}") from None
            self.members_.append(member)
        known = {f"members.{m}." for m in range(1, self.n_members)}
        extra = sorted(k for k in t if k.startswith("members.")
                       and not any(k.startswith(p) for p in known))
        if extra:
            raise ValueError(f"unexpected tensor {extra[0]} (not of a model with these params)")

    def _restore_one(self, t: dict, alpha: float | None) -> None:
        """One model's fitted state (not its members') from its tensors."""
        n_cls, L = len(self.classes_), self.n_features_in_
        self.tokens_ = ConvTokens(self.segments, self.features, self.quantiles).load_state(
            t, "tokens.", L)
        self.mean_, self.scale_ = _scaling(t, "tokens.", self.tokens_.n_features)
        self.global_tokens_ = self.global_mean_ = self.global_scale_ = self.ridge_ = None
        if self._uses_global:
            self.global_tokens_ = ConvTokens(1, self.global_features, self.quantiles).load_state(
                t, "global_tokens.", L)
            self.global_mean_, self.global_scale_ = _scaling(t, "global_tokens.",
                                                           self.global_tokens_.n_features)
        self.competing_ = self.competing_mean_ = self.competing_scale_ = None
        if self._uses_competing:
            self.competing_ = CompetingKernels(self.competing_groups).load_state(
                t, "competing.", L)
            self.competing_mean_, self.competing_scale_ = _scaling(t, "competing.",
                                                                 self.competing_.n_features)
        self.difference_tokens_ = self.difference_mean_ = self.difference_scale_ = None
        if self._uses_difference:
            self.difference_tokens_ = ConvTokens(1, self.difference_features, 0).load_state(
                t, "difference_tokens.", L - 1)
            self.difference_mean_, self.difference_scale_ = _scaling(
                t, "difference_tokens.", self.difference_tokens_.n_features)
        if self.ridge:
            n_in = (self.tokens_ if self.global_tokens_ is None else self.global_tokens_).n_features
            n_in += sum(0 if f is None else f.n_features
                        for f in (self.competing_, self.difference_tokens_))
            rows = 1 if n_cls == 2 else n_cls  # fit sees every class: two make one column
            coef, icpt, seen = (t.get(f"ridge.{k}") for k in ("coef", "intercept", "classes"))
            if coef is None or icpt is None or seen is None:
                raise ValueError("missing tensor ridge.coef, ridge.intercept or ridge.classes")
            if coef.dtype != torch.float32 or coef.shape != (rows, n_in) \
                    or icpt.dtype != torch.float32 or icpt.shape != (rows,) \
                    or seen.dtype != torch.int64 or seen.shape != (n_cls,) \
                    or not bool((seen == torch.arange(n_cls)).all()):
                raise ValueError(f"ridge.*: expected float32 coef ({rows}, {n_in}) and "
                                 f"intercept ({rows},), and classes 0..{n_cls - 1} (int64)")
            self.ridge_ = RidgeHead(coef.numpy(), icpt.numpy(), seen.numpy(), float(alpha))
        self.nets_ = []
        for i in range(self.n_nets):
            prefix = f"nets.{i}."
            embed = t.get(prefix + "embed.1.weight")  # checked before a net is built: a
            if embed is None or embed.shape != (self.d_model, self.tokens_.n_features):
                raise ValueError(f"{prefix}embed.1.weight: expected shape "  # tampered d_model
                                 f"({self.d_model}, {self.tokens_.n_features})")  # allocates
            net = TokenNet(self.tokens_.n_features, len(self.tokens_.edges_) - 1, n_cls,
                           d_model=self.d_model, num_layers=self.num_layers,
                           num_heads=self.num_heads, dropout=self.dropout,
                           global_features=(self.global_tokens_.n_features
                                            if self.global_token else 0))
            self.nets_.append(_loaded(net, t, prefix))
        self.stem_net_ = None
        if self.stem:
            self.stem_net_ = _loaded(StemNet(L, n_cls, d_model=self.d_model,
                                             num_layers=self.num_layers,
                                             num_heads=self.num_heads, dropout=self.dropout),
                                     t, "stem.")
        # every tensor a saved model of these parameters has is one that _tensors writes
        extra = sorted(set(t) - set(self._tensors()))
        if extra:
            raise ValueError(f"unexpected tensor {extra[0]} (not of a model with these params)")


def _first_differences(X: np.ndarray) -> np.ndarray:
    """``x[t+1] − x[t]`` of each series: (n, L) -> (n, L − 1), contiguous float32."""
    return np.ascontiguousarray(np.diff(X, axis=1), dtype=np.float32)


def _net_state(net: torch.nn.Module, prefix: str) -> dict:
    """A net's weights and buffers as named tensors, each name behind ``prefix``."""
    return {prefix + k: v.detach().contiguous() for k, v in net.state_dict().items()}


def _loaded(net: torch.nn.Module, t: dict, prefix: str) -> torch.nn.Module:
    """``net`` with the weights file's tensors ``prefix`` + each of its state's names, in
    eval mode; ValueError naming the first tensor that is missing, does not fit or is not of
    such a net."""
    want = net.state_dict()
    for k, v in want.items():  # name the first tensor that does not fit
        got = t.get(prefix + k)
        if got is None or got.shape != v.shape or got.dtype != v.dtype:
            raise ValueError(f"{prefix + k}: expected {v.dtype} of shape {tuple(v.shape)}, got "
                             + ("nothing" if got is None else
                                f"{got.dtype} of shape {tuple(got.shape)}"))
    extra = sorted(k for k in t if k.startswith(prefix) and k[len(prefix):] not in want)
    if extra:
        raise ValueError(f"unexpected tensor {extra[0]} (not of a model with these params)")
    net.load_state_dict({k: t[prefix + k] for k in want})
    return net.eval()


def _read_tensors(w_path: Path) -> dict:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(w_path))
    except (OSError, SafetensorError, ValueError, RuntimeError) as err:
        raise CheckpointError(f"{w_path}: corrupt weights file ({err})") from None


def _scaling(t: dict, prefix: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(mean, scale) of one token transform, each (n,) float32 with the scale positive."""
    mean, scale = t.get(prefix + "mean"), t.get(prefix + "scale")
    if mean is None or scale is None or mean.shape != (n,) or scale.shape != (n,) \
            or mean.dtype != torch.float32 or scale.dtype != torch.float32 \
            or not bool((scale > 0).all()):
        raise ValueError(f"{prefix}mean, {prefix}scale: expected float32 ({n},), scale > 0")
    return mean.numpy(), scale.numpy()
