"""Round 15 exploration's table (runs/ucr15/explore.py, split 3, already read by round 13):
on the sets both lanes finished, the net on top of the ridge with its mixer and without,
against the defaults (round 13's kept heads: 1/4 · net + 3/4 · ridgeD) and the ridge alone;
mean, Δ in points, wins/ties/losses (a difference above 0.0005 counts)."""
import json

import numpy as np

lanes = {k: json.load(open(f"runs/ucr15/split3_layers{k}.json")) for k in (2, 0)}
names = sorted(n for n in set(lanes[2]) & set(lanes[0]) if "skipped" not in lanes[2][n])
acc = {"defaults (net@1/4 + ridgeD)": [], "ridgeD": [], "on top, mixer": [],
       "on top, no mixer": []}
for n in names:
    kept = np.load(f"runs/ucr13/split3_heads/{n}.npz")
    mine = {k: np.load(f"runs/ucr15/split3_layers{k}_heads/{n}.npz") for k in (2, 0)}
    assert np.array_equal(kept["y"], mine[2]["y"]) and np.allclose(kept["ridgeD"],
                                                                    mine[2]["ridgeD"])
    y = kept["y"]
    for key, p in (("defaults (net@1/4 + ridgeD)", 0.25 * kept["net"] + 0.75 * kept["ridgeD"]),
                   ("ridgeD", kept["ridgeD"]), ("on top, mixer", mine[2]["on_top"]),
                   ("on top, no mixer", mine[0]["on_top"])):
        acc[key].append(float((p.argmax(1) == y).mean()))
acc = {k: np.array(v) for k, v in acc.items()}
skipped = sorted(n for n in set(lanes[2]) & set(lanes[0]) if "skipped" in lanes[2][n])
print(f"{len(names)} sets on both lanes" + (f"; skipped {skipped}" if skipped else ""))


def versus(a, b):
    d = a - b
    return (f"{100 * d.mean():+.2f} ({(d > 5e-4).sum()}/{(abs(d) <= 5e-4).sum()}/"
            f"{(d < -5e-4).sum()})")


base, nomix = acc["defaults (net@1/4 + ridgeD)"], acc["on top, no mixer"]
print("| variant | mean | Δ vs defaults (W/T/L) | Δ vs on top, no mixer (W/T/L) |")
print("|---|--:|--:|--:|")
for k, v in acc.items():
    print(f"| {k} | {v.mean():.4f} | {versus(v, base)} | {versus(v, nomix)} |")
for k in (2, 0):
    print(f"layers {k}: net {sum(lanes[k][n]['net_s'] for n in names) / 60:.1f} min, ridge "
          f"{sum(lanes[k][n]['ridge_s'] for n in names) / 60:.1f} min of one process")
