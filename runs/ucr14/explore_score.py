"""Round 14 exploration's table (runs/ucr14/explore.py; splits 1 and 2, already read): each
variant's validation mean per split and pooled, its difference from ``ridgeD+net@1/4`` (the
present defaults) and wins/ties/losses against it (a difference above 0.0005 counts)."""
import json
import sys

import numpy as np

SPLITS = (1, 2)
BASE = sys.argv[1] if len(sys.argv) > 1 else "ridgeD+net@1/4"
R = {s: json.load(open(f"runs/ucr14/explore{s}.json")) for s in SPLITS}
names = sorted(set.intersection(*(set(R[s]) for s in SPLITS)))
print(f"{len(names)} sets on both splits; against {BASE}")


def acc(s, v):
    return np.array([R[s][n]["accuracy"][v] for n in names])


print("| variant | split 1 | split 2 | pooled | Δ, points (split 1, split 2) | W/T/L |")
print("|---|--:|--:|--:|--:|---|")
for v in R[SPLITS[0]][names[0]]["accuracy"]:
    a = {s: acc(s, v) for s in SPLITS}
    d = {s: a[s] - acc(s, BASE) for s in SPLITS}
    dd = np.r_[d[1], d[2]]
    print(f"| {v} | {a[1].mean():.4f} | {a[2].mean():.4f} | {np.r_[a[1], a[2]].mean():.4f} | "
          f"{100 * dd.mean():+.2f} ({100 * d[1].mean():+.2f}, {100 * d[2].mean():+.2f}) | "
          f"{(dd > 5e-4).sum()}/{(abs(dd) <= 5e-4).sum()}/{(dd < -5e-4).sum()} |")
for key in ("ridgeD_s", "tokens_s", "attn_s"):
    print(key, {s: round(sum(R[s][n][key] for n in names) / 60, 1) for s in SPLITS}, "min")
