"""Round 13 (``runs/ucr13/DECISION.md``; validation only, TRAIN series alone): the estimator at
its defaults on a fresh inner split, its net head joined with round 12's ``ridgeD`` (the ridge
that also reads the PPV of the first differences) at net weight 1/4.

Usage, from the repository root: ``round13.py SPLIT_SEED OUT NAME...``. Each dataset's row goes
to OUT (rewritten atomically after every dataset; a rerun skips the sets already there) and its
validation probabilities of every head to OUT's ``_heads`` folder."""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ucr12"))
import ridge_diff_weights as W  # noqa: E402  (it puts benchmarks/ on the path)

from linattn.tsc.conv_classifier import joined_heads  # noqa: E402

U = W.R.U  # benchmarks/ucr_tokens.py
NET_WEIGHT = 0.25  # the candidate's weight on the net head


def variants(net: np.ndarray, ridge: np.ndarray, ridge_d: np.ndarray) -> dict:
    """The round's joins: ``long`` (the estimator's own, net and ridge at 1/2), the candidate
    ``ridgeD+net@1/4``, and beside it ``ridge+net@1/4``, ``ridgeD+net@1/2`` and each head."""
    return {"long": joined_heads(net, ridge),
            "ridgeD+net@1/4": U.weighted_join(net, ridge_d, NET_WEIGHT),
            "ridge+net@1/4": U.weighted_join(net, ridge, NET_WEIGHT),
            "ridgeD+net@1/2": joined_heads(net, ridge_d),
            "ridgeD": ridge_d, "ridge": ridge, "net": net}


def study(split_seed: int, name: str) -> tuple[dict, dict]:
    X, y, classes, tr, va, row = U._inner_data(name, split_seed)
    net, ridge, _ = U._estimator_heads(row, "fit_s", X, y, tr, va, len(classes),
                                       random_state=0)
    t0 = time.perf_counter()
    ridge_d = W.ridge_d_proba(X, y, tr, va, len(classes))
    row["ridgeD_s"] = round(time.perf_counter() - t0, 2)
    row["accuracy"] = U._scored(variants(net, ridge, ridge_d), y[va])
    return row, {"y": y[va], "net": net, "ridge": ridge, "ridgeD": ridge_d}


def main(argv: list[str]) -> None:
    split_seed = int(argv[0])
    W.resumable(argv[1], argv[2:], lambda name: study(split_seed, name))


if __name__ == "__main__":
    main(sys.argv[1:])
