"""After round 12 (exploration, validation only, not a decision): the ridge with the difference
series' PPV (round 12's ``ridgeD``) joined with the kept net heads at several net weights.
Usage: ridge_diff_weights.py SEED OUT NAME...; the ridge's probabilities go to OUT's folder."""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import ridge_extras as R  # noqa: E402

from linattn._io import write_json  # noqa: E402
from linattn.tsc.competing import CompetingKernels  # noqa: E402
from linattn.tsc.conv_classifier import RidgeHead, ridge_proba  # noqa: E402
from linattn.tsc.conv_tokens import ConvTokens  # noqa: E402

WEIGHTS = (0.0, 0.25, 1 / 3, 0.5)  # the net's weight in the join; 0.5 is the estimator's


def scaled(t, X, tr, va):
    """``t`` fitted on X[tr], both parts standardised (ucr_tokens' ``_standardised``), a
    one-segment ConvTokens' (n, 1, F) read as (n, F)."""
    t.fit(X[tr])

    def flat(F):
        return F[:, 0] if F.ndim == 3 else F
    return R.U._standardised(flat(t.transform(X[tr])), flat(t.transform(X[va])))


def ridge_d_parts(X, tr, va, seed=0):
    """Round 12's ``ridgeD`` features as (train, validation) pairs, fitted on X[tr]: the
    estimator's ridge features (global PPV and quantiles, competing kernels) and the PPV of
    the first differences. Rounds 13 to 15 reuse them."""
    G = scaled(ConvTokens(1, 10000, 9, random_state=seed), X, tr, va)
    H = scaled(CompetingKernels(64, random_state=seed), X, tr, va)
    dX = np.ascontiguousarray(np.diff(X, axis=1), dtype=np.float32)
    D = scaled(ConvTokens(1, 5000, 0, random_state=seed), dX, tr, va)
    return [G, H, D]


def ridge_fit(parts, y_tr, n_classes):
    """(validation probabilities on class codes, the fitted :class:`RidgeHead`, its
    validation decision values) of a ridge on the (train, validation) feature pairs
    ``parts`` side by side."""
    r = RidgeHead.fit(np.hstack([p[0] for p in parts]), y_tr)
    d = r.decision_function(np.hstack([p[1] for p in parts]))
    return ridge_proba(d, r.classes_, n_classes, 5.0), r, d


def ridge_d_proba(X, y, tr, va, n_classes):
    """Validation probabilities (on class codes) of round 12's ``ridgeD``
    (:func:`ridge_d_parts`), fitted on X[tr]."""
    return ridge_fit(ridge_d_parts(X, tr, va), y[tr], n_classes)[0]


def resumable(out, names, study, suffix="_heads"):
    """For each of ``names`` not yet in OUT, ``study(name)`` -> (row, arrays): the arrays to
    OUT's ``suffix`` folder, the row to OUT (rewritten atomically after every dataset), so a
    rerun skips the sets done. Rounds 13 to 15's scripts run through it."""
    folder = out.removesuffix(".json") + suffix
    os.makedirs(folder, exist_ok=True)
    results = json.load(open(out)) if os.path.exists(out) else {}
    for name in names:
        if name in results:
            continue
        row, arrays = study(name)
        np.savez(f"{folder}/{name}.npz", **arrays)
        results[name] = row
        print(name, json.dumps(row), flush=True)
        write_json(out, results)


def run(seed, name, heads):
    X, y, classes, tr, va, _ = R.U._inner_data(name, seed)
    p = ridge_d_proba(X, y, tr, va, len(classes))
    kept = np.load(heads)
    assert np.array_equal(kept["y"], y[va])
    acc = {f"ridgeD+net@{w:.2f}": float((((1 - w) * p + w * kept["net"]).argmax(1) == y[va]).mean())
           for w in WEIGHTS}
    acc.update({f"ridge+net@{w:.2f}": float((((1 - w) * kept["ridge"] + w * kept["net"]).argmax(1)
                                             == y[va]).mean()) for w in WEIGHTS})
    return p, y[va], acc


if __name__ == "__main__":
    seed, out = int(sys.argv[1]), sys.argv[2]
    folder = out.removesuffix(".json") + "_heads"
    os.makedirs(folder, exist_ok=True)
    results = json.load(open(out)) if os.path.exists(out) else {}
    kept = {1: "runs/ucr_tokens/round10_{}_heads", 2: "runs/ucr_tokens/round11_{}_heads"}[seed]
    for name in sys.argv[3:]:
        if name in results:
            continue
        half = "A" if os.path.exists(kept.format("A") + f"/{name}.npz") else "B"
        p, y, acc = run(seed, name, kept.format(half) + f"/{name}.npz")
        np.savez(f"{folder}/{name}.npz", y=y, ridgeD=p)
        results[name] = {"split_seed": seed, "accuracy": acc}
        print(name, json.dumps(acc), flush=True)
        with open(out + ".tmp", "w") as f:
            json.dump(results, f, indent=1)
        os.replace(out + ".tmp", out)
