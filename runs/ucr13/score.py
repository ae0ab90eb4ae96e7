"""Round 13's table (runs/ucr13/DECISION.md): each variant's validation mean on splits 3 and 4
and pooled, its difference from ``long`` and wins/ties/losses against it (a difference above
0.0005 counts), the rule's three conditions, and the time check."""
import json

import numpy as np

SPLITS = (3, 4)
R = {s: json.load(open(f"runs/ucr13/split{s}.json")) for s in SPLITS}
names = sorted(set.intersection(*(set(R[s]) for s in SPLITS)))
print(f"{len(names)} sets on both splits")


def acc(s, v):
    return np.array([R[s][n]["accuracy"][v] for n in names])


print("| variant | split 3 | split 4 | pooled | Δ vs long, points (split 3, split 4) | W/T/L |")
print("|---|--:|--:|--:|--:|---|")
for v in R[SPLITS[0]][names[0]]["accuracy"]:
    a = {s: acc(s, v) for s in SPLITS}
    d = {s: a[s] - acc(s, "long") for s in SPLITS}
    dd = np.r_[d[3], d[4]]
    print(f"| {v} | {a[3].mean():.4f} | {a[4].mean():.4f} | {np.r_[a[3], a[4]].mean():.4f} | "
          f"{100 * dd.mean():+.2f} ({100 * d[3].mean():+.2f}, {100 * d[4].mean():+.2f}) | "
          f"{(dd > 5e-4).sum()}/{(abs(dd) <= 5e-4).sum()}/{(dd < -5e-4).sum()} |")
c = "ridgeD+net@1/4"
d = {s: acc(s, c) - acc(s, "long") for s in SPLITS}
dd = np.r_[d[3], d[4]]
wins, losses = int((dd > 5e-4).sum()), int((dd < -5e-4).sum())
fit = {s: sum(R[s][n]["fit_s"] for n in names) for s in SPLITS}
extra = {s: sum(R[s][n]["ridgeD_s"] for n in names) for s in SPLITS}
bound = max(119 * (fit[s] + extra[s]) / fit[s] / 2 for s in SPLITS)
print(f"1. pooled {100 * dd.mean():+.2f} points (>= +0.30), split 3 {100 * d[3].mean():+.2f}, "
      f"split 4 {100 * d[4].mean():+.2f} (each > 0): "
      f"{dd.mean() >= 0.003 and min(d[3].mean(), d[4].mean()) > 0}")
print(f"2. wins - losses {wins} - {losses} = {wins - losses} (>= 10): {wins - losses >= 10}")
print(f"3. TEST bound {bound:.0f} min on two processes (<= 120): {bound <= 120}")
for s in SPLITS:
    print(f"split {s}: fit {fit[s] / 60:.0f} min, ridgeD {extra[s] / 60:.1f} min of one process")
per_set = sorted((np.mean([R[s][n]["accuracy"][c] - R[s][n]["accuracy"]["long"]
                           for s in SPLITS]), n) for n in names)
print("largest losses:", ", ".join(f"{n} {x:+.3f}" for x, n in per_set[:4]))
print("largest gains:", ", ".join(f"{n} {x:+.3f}" for x, n in per_set[::-1][:4]))
