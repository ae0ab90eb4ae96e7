"""TRAIN-only selection of a default step/batch rule (issue 15 §3). Each development dataset's
TRAIN split is cut into a stratified 70/30 inner train/validation (seed 0; a class with one
example stays in the inner train); every candidate rule is fitted on the inner train and scored
on the inner validation. No TEST split is read. Results: runs/ucr2/select.json (resumable).

    nice -n 19 .venv/bin/python benchmarks/ucr_select.py
"""

from __future__ import annotations

import json
import math
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from linattn.datasets import load_ucr
from linattn.tsc import LinearAttentionClassifier

DEV = ["Coffee", "CBF", "ECGFiveDays", "Fish", "Adiac", "ChlorineConcentration"]
OUT = Path("runs/ucr2/select.json")


def split(y, seed=0, frac=0.3):
    rng = np.random.default_rng(seed)
    val = []
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        rng.shuffle(idx)
        k = min(int(round(frac * len(idx))), len(idx) - 1)
        val.extend(idx[:k].tolist())
    mask = np.zeros(len(y), bool)
    mask[val] = True
    return ~mask, mask


def small_batch(n):
    return min(64, max(8, n // 4))


def rule(name, n):
    if name == "A_old":      # the first run's rule: ~400 steps, at most 80 epochs, batch 64
        b = 64
        return b, min(80, math.ceil(400 / math.ceil(n / b)))
    S, b = {"B_min1000": (1000, 64), "C_min1000_sb": (1000, small_batch(n)),
            "D_min400_sb": (400, small_batch(n)), "E_min2000_sb": (2000, small_batch(n))}[name]
    return b, max(80, math.ceil(S / math.ceil(n / b)))


def main(cands):
    torch.set_num_threads(1)
    res = json.loads(OUT.read_text()) if OUT.exists() else {}
    for cand in cands:
        for ds in DEV:
            key = f"{cand}/{ds}"
            if key in res:
                continue
            X, y, _, _ = load_ucr(ds, download=False)  # TRAIN only
            tr, va = split(y)
            n = int(tr.sum())
            b, ep = rule(cand, n)
            same = [v for k, v in res.items() if k.endswith("/" + ds) and v["batch"] == b
                    and v["epochs"] == ep]
            if same:
                res[key] = {**same[0], "reused": True}
            else:
                clf = LinearAttentionClassifier(epochs=ep, batch_size=b,
                                                patch=max(1, math.ceil(X.shape[1] / 50)),
                                                missing="interpolate", random_state=0,
                                                n_threads=1)
                t0 = time.perf_counter()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    clf.fit(X[tr], y[tr])
                fit_s = time.perf_counter() - t0
                res[key] = {"n_inner": n, "n_val": int(va.sum()), "batch": b, "epochs": ep,
                            "steps": ep * math.ceil(n / b),
                            "val_acc": float(np.mean(clf.predict(X[va]) == y[va])),
                            "inner_train_acc": float(np.mean(clf.predict(X[tr]) == y[tr])),
                            "fit_s": round(fit_s, 1)}
            r = res[key]
            print(f"{key:<40} n {r['n_inner']:>4} b {r['batch']:>2} ep {r['epochs']:>4} steps "
                  f"{r['steps']:>5} val {r['val_acc']:.3f} train {r['inner_train_acc']:.3f} "
                  f"{r['fit_s']:6.1f} s{' (reused)' if r.get('reused') else ''}", flush=True)
            OUT.write_text(json.dumps(res, indent=1))
    for cand in cands:
        v = [res[f"{cand}/{d}"]["val_acc"] for d in DEV if f"{cand}/{d}" in res]
        print(f"{cand:<14} mean inner-val acc {np.mean(v):.4f} over {len(v)}")


if __name__ == "__main__":
    main(sys.argv[1].split(","))
