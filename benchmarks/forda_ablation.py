"""The seed's FordA ablation table, reproduced with the reference recipe (issue 15 §1).

For each configuration and seed this runs one ``linattn forda train --recipe reference``
(stage ``val``, then ``full`` and TEST once) into ``RUNS/NAME_sS``, one run at a time; a run
whose ``test.json`` exists is skipped and an interrupted one is continued with ``--resume``.
Then it prints a markdown table: the seed's figure, validation macro F1 (last line of
``val/metrics.jsonl``) and TEST macro F1 (``test.json``) per seed with mean ± std (ddof 1), and
seconds per epoch of the ``full`` stage (all of TRAIN). A cell without a finished run is "–".

    .venv/bin/python benchmarks/forda_ablation.py --data-dir /work/shared/data/FordA \\
        --runs-dir runs/h7 --configs ep40-noaug,ep40-aug,patch5 --seeds 0,1,2

``--collect`` only reads the finished runs and prints the table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

NO_AUG = ["--set", "shift=false", "--set", "scale_low=1.0", "--set", "scale_high=1.0"]
# name: (description, the seed's figure, arguments on top of ``--recipe reference``)
CONFIGS: dict[str, tuple[str, float, list[str]]] = {
    "ep40-noaug": ("40 epochs, no augmentation", 0.919, ["--epochs", "40", *NO_AUG]),
    "ep40-aug": ("40 epochs, with augmentation", 0.932, ["--epochs", "40"]),
    "patch5": ("patches of 5 / T = 100 (80 epochs)", 0.908, ["--set", "patch=5"]),
    "patch10": ("patches of 10 / T = 50 (the reference, 80 epochs)", 0.942, []),
}


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in CONFIGS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"expected some of {', '.join(CONFIGS)}, got {text!r}")
    return names


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        seeds = []
    if not seeds or min(seeds) < 0:
        raise argparse.ArgumentTypeError(f"expected non-negative integers, got {text!r}")
    return seeds


def train(out: Path, extra: list[str], seed: int, data_dir: Path | None) -> None:
    """One ``forda train`` run into ``out`` (continued with --resume if it was started)."""
    cmd = [sys.executable, "-m", "linattn", "forda", "train", "--out", str(out),
           "--threads", "1", "--quiet"]
    if data_dir is not None:
        cmd += ["--data-dir", str(data_dir)]
    if (out / "run.json").is_file():
        cmd.append("--resume")  # the run's parameters come from its run.json
    else:
        cmd += ["--recipe", "reference", *extra, "--seed", str(seed)]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def _last(path: Path) -> dict | None:
    lines = path.read_text().splitlines() if path.is_file() else []
    return json.loads(lines[-1]) if lines else None


def result(out: Path) -> tuple[float, float, float] | None:
    """(validation F1, TEST F1, s / epoch of the full stage) of a finished run, else None."""
    if not (out / "test.json").is_file():
        return None
    val, full = _last(out / "val" / "metrics.jsonl"), _last(out / "full" / "metrics.jsonl")
    test = json.loads((out / "test.json").read_text())
    return val["val_f1"], test["macro_f1"], full["time_s"] / full["epoch"]


def _cell(values: list[float | None]) -> str:
    """"mean ± std (v0, v1, …)" over the finished seeds; "–" for a seed not run."""
    done = [v for v in values if v is not None]
    each = ", ".join("–" if v is None else f"{v:.4f}" for v in values)
    if len(done) >= 2:
        return f"{statistics.mean(done):.4f} ± {statistics.stdev(done):.4f} ({each})"
    return f"({each})" if done else "–"


def table(runs_dir: Path, names: list[str], seeds: list[int]) -> str:
    rows = ["| configuration | seed's figure | validation F1, mean ± std (seeds "
            f"{', '.join(map(str, seeds))}) | TEST F1, mean ± std | s / epoch (full stage) |",
            "| --- | --- | --- | --- | --- |"]
    for name in names:
        desc, figure, _ = CONFIGS[name]
        res = [result(runs_dir / f"{name}_s{s}") for s in seeds]
        val, test, sec = ([None if r is None else r[i] for r in res] for i in range(3))
        done = [s for s in sec if s is not None]
        per_epoch = ", ".join(f"{s:.1f}" for s in done) if done else "–"
        rows.append(f"| {desc} (`{name}`) | {figure:.3f} | {_cell(val)} | {_cell(test)} | "
                    f"{per_epoch} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--configs", type=_names, default=list(CONFIGS),
                   help=f"comma-separated subset of {', '.join(CONFIGS)} (default: all)")
    p.add_argument("--seeds", type=_seeds, default=[0, 1, 2], help="default: 0,1,2")
    p.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "forda_ablation",
                   help="folder of the run folders (default: runs/forda_ablation)")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="FordA folder (default: linattn's own lookup)")
    p.add_argument("--collect", action="store_true", help="only read finished runs")
    p.add_argument("--start-within", type=float, default=None, metavar="MINUTES",
                   help="start no run after this many minutes (default: no limit)")
    args = p.parse_args(argv)
    if args.start_within is not None and not args.start_within > 0:
        p.error(f"--start-within: expected a positive number, got {args.start_within!r}")
    t0 = time.monotonic()
    todo = [] if args.collect else [(n, s) for n in args.configs for s in args.seeds]
    for name, seed in todo:
        out = args.runs_dir / f"{name}_s{seed}"
        if (out / "test.json").is_file():
            continue
        if args.start_within is not None and time.monotonic() - t0 > 60 * args.start_within:
            print(f"--start-within: {args.start_within} min passed, {out} not started",
                  flush=True)
            break
        train(out, CONFIGS[name][2], seed, args.data_dir)
    print(table(args.runs_dir, args.configs, args.seeds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
