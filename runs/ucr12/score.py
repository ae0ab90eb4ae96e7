# round 12's rule: runs/ucr12/split{1,2}.json, each variant against the kept joined heads
import json
import numpy as np
S = {s: json.load(open(f"runs/ucr12/split{s}.json")) for s in (1, 2)}
V = ["long_ridgeED", "long_ridgeE", "long_ridgeD", "long_ridge", "ridge", "ridgeE", "ridgeD", "ridgeED"]
print("| variant | split 1 mean | split 2 mean | pooled | Δ vs long (points) | W/T/L (100) |")
print("|---|--:|--:|--:|--:|---|")
base = {s: np.array([r["accuracy"]["saved_long"] for r in S[s].values()]) for s in S}
print(f"| long (kept) | {base[1].mean():.4f} | {base[2].mean():.4f} | {np.r_[base[1], base[2]].mean():.4f} | — | — |")
for v in V:
    a = {s: np.array([r["accuracy"][v] for r in S[s].values()]) for s in S}
    d = np.r_[a[1] - base[1], a[2] - base[2]]
    print(f"| {v} | {a[1].mean():.4f} | {a[2].mean():.4f} | {np.r_[a[1], a[2]].mean():.4f} | "
          f"{100 * d.mean():+.2f} ({100 * (a[1] - base[1]).mean():+.2f}, {100 * (a[2] - base[2]).mean():+.2f}) | "
          f"{(d > 5e-4).sum()}/{(abs(d) <= 5e-4).sum()}/{(d < -5e-4).sum()} |")
t = {k: sum(r[k] for s in S for r in S[s].values()) / 2 for k in ("t_base", "t_extra", "t_diff", "t_fit_ridge", "t_fit_ridgeED")}
print("seconds per split (mean of the two):", {k: round(v) for k, v in t.items()})
d = {n: S[1][n]["accuracy"]["long_ridgeED"] - S[1][n]["accuracy"]["saved_long"] + S[2][n]["accuracy"]["long_ridgeED"] - S[2][n]["accuracy"]["saved_long"] for n in S[1]}
o = sorted(d, key=d.get)
print("largest losses:", [(n, round(d[n] / 2, 3)) for n in o[:5]])
print("largest gains:", [(n, round(d[n] / 2, 3)) for n in o[-6:]])
