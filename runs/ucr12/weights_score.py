# after round 12 (exploration): each join's validation mean over the splits of rounds 10 and 11,
# and a check that the weights 0 and 1/2 reproduce round 12's ridgeD and long_ridgeD
import json
import numpy as np
W = {s: json.load(open(f"runs/ucr12/weights{s}.json")) for s in (1, 2)}
R = {s: json.load(open(f"runs/ucr12/split{s}.json")) for s in (1, 2)}
for s in W:
    for n, r in W[s].items():
        assert r["accuracy"]["ridgeD+net@0.00"] == R[s][n]["accuracy"]["ridgeD"], (s, n)
        assert r["accuracy"]["ridgeD+net@0.50"] == R[s][n]["accuracy"]["long_ridgeD"], (s, n)
        assert r["accuracy"]["ridge+net@0.50"] == R[s][n]["accuracy"]["saved_long"], (s, n)
base = {s: np.array([r["accuracy"]["ridge+net@0.50"] for r in W[s].values()]) for s in W}
print("| join (net weight) | split 1 | split 2 | pooled | Δ vs long, points | W/T/L (100) |")
print("|---|--:|--:|--:|--:|---|")
for v in next(iter(W[1].values()))["accuracy"]:
    a = {s: np.array([r["accuracy"][v] for r in W[s].values()]) for s in W}
    d = np.r_[a[1] - base[1], a[2] - base[2]]
    print(f"| {v} | {a[1].mean():.4f} | {a[2].mean():.4f} | {np.r_[a[1], a[2]].mean():.4f} | "
          f"{100 * d.mean():+.2f} | {(d > 5e-4).sum()}/{(abs(d) <= 5e-4).sum()}/{(d < -5e-4).sum()} |")
