"""Round 14 exploration (validation only, TRAIN series alone, not a decision): does a ridge
that also reads random linear-attention features (``linattn.tsc.attention_features``) over
the estimator's tokens beat round 12's ``ridgeD``, alone and joined with the kept net head at
1/4? On the splits of rounds 10 and 11 (seeds 1 and 2), already read by earlier rounds: this
chooses a candidate and decides nothing.

Usage, from the repository root: ``explore.py SPLIT_SEED OUT NAME...``; each dataset's row
goes to OUT (rewritten atomically after every dataset; a rerun skips the sets already there)
and the ridges' validation probabilities to OUT's ``_heads`` folder."""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ucr12"))
import ridge_diff_weights as W  # noqa: E402  (it puts benchmarks/ on the path)

from linattn.tsc.attention_features import RandomAttentionFeatures  # noqa: E402
from linattn.tsc.conv_tokens import ConvTokens  # noqa: E402

U = W.R.U  # benchmarks/ucr_tokens.py
NET_WEIGHT = 0.25
#: the variants' attention features; "pool" is sharpness 0: every weight equal, the ablation
VARIANTS = {"attn": dict(sharpness=1.0), "attn2": dict(sharpness=2.0),
            "causal": dict(sharpness=1.0, causal=True), "pool": dict(sharpness=0.0)}
KEPT = {1: "runs/ucr_tokens/round10_{}_heads", 2: "runs/ucr_tokens/round11_{}_heads"}


def study(split_seed: int, name: str) -> tuple[dict, dict]:
    X, y, classes, tr, va, row = U._inner_data(name, split_seed)
    n_classes = len(classes)
    half = "A" if os.path.exists(KEPT[split_seed].format("A") + f"/{name}.npz") else "B"
    kept = np.load(KEPT[split_seed].format(half) + f"/{name}.npz")
    assert np.array_equal(kept["y"], y[va])
    t0 = time.perf_counter()
    parts = W.ridge_d_parts(X, tr, va)
    heads = {"ridgeD": W.ridge_fit(parts, y[tr], n_classes)[0]}
    row["ridgeD_s"] = round(time.perf_counter() - t0, 2)
    t0 = time.perf_counter()
    T = U._scaled_tokens(ConvTokens(16, 2000, 9, random_state=0), X, tr, va)
    row["tokens_s"] = round(time.perf_counter() - t0, 2)
    for label, kw in VARIANTS.items():
        t0 = time.perf_counter()
        a = RandomAttentionFeatures(random_state=0, **kw).fit(T[0])
        A = U._standardised(a.transform(T[0]), a.transform(T[1]))
        heads[label] = W.ridge_fit([*parts, A], y[tr], n_classes)[0]
        row[f"{label}_s"] = round(time.perf_counter() - t0, 2)
    joins = {f"{k}+net@1/4": U.weighted_join(kept["net"], v, NET_WEIGHT)
             for k, v in heads.items()}
    row["accuracy"] = U._scored({**heads, **joins, "net": kept["net"]}, y[va])
    return row, {"y": y[va], **heads}


def main(argv: list[str]) -> None:
    split_seed = int(argv[0])
    W.resumable(argv[1], argv[2:], lambda name: study(split_seed, name))


if __name__ == "__main__":
    main(sys.argv[1:])
