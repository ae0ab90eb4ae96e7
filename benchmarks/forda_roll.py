"""How much a FordA model's validation predictions depend on where each series starts.

Rolls every series of the standard validation split by ``patch·k`` samples (k = 1 … T−1) and
prints, per model, the validation macro F1 unrolled and over the rolls (min / mean / max), the
number of predictions that flip and the largest change of a class probability. A model with no
absolute-position cue at all would flip nothing. docs/forda.md (circular windows) quotes it:

    .venv/bin/python benchmarks/forda_roll.py runs/h6/zero_s0/val/model runs/h6/circ_s0/val/model \
        --data-dir ../shared/data/FordA
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from linattn.datasets import load_ucr
from linattn.tsc import LinearAttentionClassifier
from linattn.tsc.data import encode_labels, validation_split
from linattn.tsc.metrics import macro_f1


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="+", help="saved model folders (e.g. RUN/val/model)")
    p.add_argument("--data-dir", help="folder with FordA_TRAIN/TEST (default: load_ucr's search)")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    X, y, _, _ = load_ucr("FordA", data_dir=args.data_dir)
    codes = encode_labels(y)[1]
    va = validation_split(codes)[1]  # the split every val-stage model was scored on
    Xv, yv = X[va], codes[va]
    for path in args.models:
        est = LinearAttentionClassifier.load(path)
        patch, tokens = est.model_.config.patch, est.model_.config.tokens
        p0 = est.predict_proba(Xv)[:, 1]
        f1s, dmax, flips = [], 0.0, 0
        for k in range(1, tokens):
            p = est.predict_proba(np.roll(Xv, patch * k, axis=1))[:, 1]
            f1s.append(macro_f1(yv, (p > 0.5).astype(int), 2))
            dmax = max(dmax, float(np.abs(p - p0).max()))
            flips += int(((p > 0.5) != (p0 > 0.5)).sum())
        print(f"{path}: val F1 unrolled {macro_f1(yv, (p0 > 0.5).astype(int), 2):.4f}; rolled by "
              f"{patch}k (k=1..{tokens - 1}): F1 min {min(f1s):.4f} mean {np.mean(f1s):.4f} "
              f"max {max(f1s):.4f}; prediction flips {flips} of {(tokens - 1) * len(yv)}; "
              f"max |dp| {dmax:.4f}")


if __name__ == "__main__":
    main()
