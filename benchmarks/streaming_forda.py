"""Streaming FordA: accuracy of the causal classifier against the fraction of the series seen.

Trains :class:`linattn.tsc.streaming.StreamingClassifier` on a stratified 80 % of FordA TRAIN
(the other 20 % picks the epoch), evaluates TEST once, checks on a few TEST series that
``stream()`` (one patch at a time, O(1) state) gives the offline numbers, and plots accuracy after
each patch. Writes docs/img/streaming_forda.png and prints a table.

    python benchmarks/streaming_forda.py --threads 1 --epochs 40
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from linattn.datasets import load_ucr
from linattn.tsc.data import encode_labels, validation_split
from linattn.tsc.streaming import StreamingClassifier, accuracy_by_fraction, train_streaming


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", help="folder with FordA_TRAIN/TEST.tsv[.gz]")
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plot", default="docs/img/streaming_forda.png")
    ap.add_argument("--json", default="runs/streaming_forda.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    Xtr, ytr, Xte, yte = load_ucr("FordA", data_dir=args.data_dir)
    classes, ytr = encode_labels(ytr)
    yte = np.searchsorted(classes, yte)
    tr, va = validation_split(ytr, seed=args.seed)
    model = StreamingClassifier(length=Xtr.shape[1], n_classes=len(classes))
    t0 = time.perf_counter()
    hist = train_streaming(model, Xtr[tr], ytr[tr], X_val=Xtr[va], y_val=ytr[va],
                           epochs=args.epochs, seed=args.seed)
    train_s = time.perf_counter() - t0
    model.eval()  # the offline comparison below must not use dropout
    best = max(hist, key=lambda r: r["val_acc_end"])
    acc = accuracy_by_fraction(model, Xte, yte)  # TEST, once
    T = len(acc)
    frac = np.arange(1, T + 1) / T

    # streaming == offline on a few test series, fed in uneven chunks
    x = torch.as_tensor(Xte[:8])
    with torch.no_grad():
        off = model(x)
    chunks = torch.split(x, [7, 33, 1, 59, 100, 300], dim=1)
    on = torch.stack(list(model.stream(chunks)), 1)
    max_diff = float((on - off).abs().max())

    rows = [(f, float(acc[round(f * T) - 1])) for f in (0.1, 0.25, 0.5, 0.75, 1.0)]
    print("| fraction seen | test accuracy |\n| --- | --- |")
    for f, a in rows:
        print(f"| {f:.2f} | {a:.4f} |")
    print(f"epochs {args.epochs}, best val epoch {best['epoch']} "
          f"(val acc at end {best['val_acc_end']:.4f}), train {train_s:.0f} s, "
          f"params {sum(p.numel() for p in model.parameters()):,}, "
          f"max |stream − offline| = {max_diff:.2e}")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot(frac, acc, marker=".", label="causal linear attention, streamed")
    ax.axhline(0.5, color="grey", lw=0.8, ls=":", label="chance")
    ax.set_xlabel("fraction of the series seen")
    ax.set_ylabel("FordA test accuracy")
    ax.set_title("Prediction after every patch (10 samples), O(1) state")
    ax.set_ylim(0.45, 1.0)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.plot, dpi=120)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({
        "accuracy": acc.tolist(), "history": hist, "train_s": train_s,
        "max_stream_offline_diff": max_diff}, indent=1))
    print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
