"""Seconds per training step and peak memory of the byte-level LM, by attention kind (issue 25).

    flock /tmp/linattn-bench.lock python benchmarks/lm_step.py --threads 1
    python benchmarks/lm_step.py --kinds linear,gla --shapes 256x32 --rounds 3 --memory ""

The model is the one ``linattn lm train`` builds by default (d_model 128, 4 layers, 4 heads,
MLP 512, tied embeddings; ``--attention`` the kind), and a *step* is the trainer's own: a batch
of random windows of the stdlib corpus, forward, cross-entropy, backward, gradient clipping at
1, AdamW (``linattn.lm.training.LMTraining``'s optimiser step, subnormals flushed as in
``linattn lm train``). Nothing is timed that training does not do, nothing left out.

Time: for each shape ``CONTEXTxBATCH`` (default the demo's 256×32 and 4,096×2, the same 8,192
tokens a step) every kind gets a model and optimiser, ``--warmup`` untimed steps, then
``--rounds`` rounds in which each kind takes one step, the kinds in a rotating order (so that no
kind always follows the same one on a machine whose speed drifts). Printed per shape: each
kind's median and minimum seconds a step, and its ratio to the first kind (``linear``) as the
median of the per-round ratios (each ratio from one round, seconds apart).

Memory: the peak extra resident bytes of one training step at ``--memory`` contexts (default
4,096, 8,192, 16,384; batch ``--memory-batch``, default 1), each measured in a fresh process
(``linattn.profiling.PeakMemory``: Linux's VmHWM, reset before the step, after one untimed step
at the same shape so the optimiser's moments and the libraries are already resident). A
backward that keeps O(T) activations shows as a doubling per doubling of T.

The backend each attention op took during a step is printed (the dispatcher's choice, e.g. the
compiled ``native`` backward or the ``portable`` torch form), with the CPU, its vector ISA, the
thread count and the load average. ``--json`` writes everything.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

# idle OpenMP threads sleep rather than spin (before torch loads libgomp; children inherit it):
# on a shared machine a spinning partner thread makes small parallel regions wait
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from linattn.lm import LMConfig, TrainConfig, Trainer  # noqa: E402
from linattn.lm.data import stdlib_corpus  # noqa: E402
from linattn.lm.training import flushed_denormals  # noqa: E402
from linattn.ops import dispatch  # noqa: E402
from linattn.profiling import PeakMemory, cpu_flags, cpu_model  # noqa: E402

KINDS = ("linear", "gated_delta", "gla")
SHAPES = ((256, 32), (4096, 2))
MEMORY_CONTEXTS = (4096, 8192, 16384)
#: bytes of the stdlib corpus read (windows are drawn from it; 16,385 bytes is the longest)
CORPUS_BYTES = 1_000_000


#: the model of ``linattn lm train`` by default (its flags' defaults)
MODEL = {"vocab_size": 256, "d_model": 128, "num_layers": 4, "num_heads": 4}


def trainer(kind: str, context: int, batch: int, corpus: tuple,
            model: dict | None = None) -> Trainer:
    """The default ``linattn lm train`` model of ``kind`` (``model``: other
    :class:`~linattn.nn.LMConfig` sizes) and its training loop (seed 0, nothing written):
    ``trainer(...).loop`` steps as the command does."""
    return Trainer(LMConfig(**{**MODEL, **(model or {})}, attention=kind),
                   TrainConfig(context=context, batch_size=batch, steps=10**9,
                               corpus_bytes=CORPUS_BYTES),
                   corpus=corpus)


def step(t: Trainer) -> float:
    """One optimiser step of the run ``t`` (the next batch, as ``TrainLoop.run`` does it):
    its wall seconds."""
    t.model.train()
    with flushed_denormals():
        t0 = time.perf_counter()
        t.loop._optimizer_step()
        seconds = time.perf_counter() - t0
    t.loop.step += 1
    return seconds


@contextmanager
def recorded_choices() -> Iterator[set[tuple[str, str, str]]]:
    """The (op, form, backend[:isa]) choices the dispatcher made inside the block."""
    made: set[tuple[str, str, str]] = set()
    select = dispatch.select

    def recording(op, form, *args, **kwargs):
        choice = select(op, form, *args, **kwargs)
        made.add((op, form, choice.backend + (f":{choice.isa}" if choice.isa else "")))
        return choice

    dispatch.select = recording
    try:
        yield made
    finally:
        dispatch.select = select


def time_shape(kinds: list[str], context: int, batch: int, rounds: int, warmup: int,
               corpus: tuple, model: dict | None = None) -> dict:
    """Seconds a step per kind at one shape, interleaved rounds (module docstring): per kind
    the seconds of each round, their median and minimum, the median ratio to ``kinds[0]``,
    the dispatcher's choices during the warm-up steps and the parameter count."""
    runs = {k: trainer(k, context, batch, corpus, model) for k in kinds}
    backends = {}
    for k, t in runs.items():
        with recorded_choices() as made:
            for _ in range(warmup):
                step(t)
        backends[k] = sorted(made)
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(rounds):
        order = kinds[r % len(kinds):] + kinds[:r % len(kinds)]
        for k in order:
            times[k].append(step(runs[k]))
    base = kinds[0]
    out = {}
    for k in kinds:
        ratios = [a / b for a, b in zip(times[k], times[base], strict=True)]
        out[k] = {"seconds": times[k], "median_s": statistics.median(times[k]),
                  "min_s": min(times[k]), f"ratio_to_{base}": statistics.median(ratios),
                  "backends": [list(c) for c in backends[k]],
                  "parameters": runs[k].model.num_parameters()}
    return out


def peak_child(kind: str, context: int, batch: int) -> None:
    """In a fresh process: print the peak extra resident bytes of one training step of
    ``kind`` at (context, batch), after one untimed step ("None" without Linux's counters)."""
    t = trainer(kind, context, batch, stdlib_corpus(CORPUS_BYTES))
    step(t)  # the optimiser's moments, gradients' buffers and libraries become resident
    with PeakMemory() as mem:
        step(t)
    print(mem.extra_bytes)


def peak_bytes(kind: str, context: int, batch: int, threads: int) -> int | None:
    """Peak extra bytes of one step from a child process; None (reported) if it fails."""
    cmd = [sys.executable, os.path.abspath(__file__), "--threads", str(threads), "--child",
           kind, str(context), str(batch)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        print(f"memory child {kind} T={context} failed:\n{res.stderr[-2000:]}", file=sys.stderr)
        return None
    last = res.stdout.strip().splitlines()[-1]
    return None if last == "None" else int(last)


def _shape(text: str) -> tuple[int, int]:
    try:
        context, batch = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected CONTEXTxBATCH, got {text!r}") from None
    if context < 1 or batch < 1:
        raise argparse.ArgumentTypeError(f"expected positive sizes, got {text!r}")
    return context, batch


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got {text!r}"
                                         ) from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _kinds(text: str) -> list[str]:
    from linattn.nn.mixers import MIXERS

    kinds = [k.strip() for k in text.split(",") if k.strip()]
    bad = [k for k in kinds if k not in MIXERS]
    if not kinds or bad:
        raise argparse.ArgumentTypeError(f"expected kinds among {', '.join(MIXERS)}, got "
                                         f"{text!r}")
    return kinds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kinds", type=_kinds, default=list(KINDS),
                   help="attention kinds, the first the baseline of the ratios")
    p.add_argument("--shapes", type=lambda s: [_shape(x) for x in s.split(",") if x],
                   default=list(SHAPES), help="CONTEXTxBATCH,... (default 256x32,4096x2)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--memory", type=_ints, default=list(MEMORY_CONTEXTS),
                   help="contexts of the memory cells ('' for none)")
    p.add_argument("--memory-batch", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--child", nargs=3, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rounds < 1 or args.warmup < 0 or args.threads < 1 or args.memory_batch < 1:
        p.error("--rounds, --threads and --memory-batch must be positive, --warmup >= 0")
    torch.set_num_threads(args.threads)
    if args.child:
        kind, context, batch = args.child
        peak_child(kind, int(context), int(batch))
        return 0

    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    isa = "avx512f" if "avx512f" in cpu_flags() else "avx2" if "avx2" in cpu_flags() else "-"
    print(f"# {cpu_model()} ({isa}), {args.threads} thread(s), torch {torch.__version__}, "
          f"load average at start {load}")
    corpus = stdlib_corpus(CORPUS_BYTES)
    results: dict = {"cpu": cpu_model(), "isa": isa, "threads": args.threads,
                     "torch": torch.__version__, "load_start": load, "time": {}, "memory": {}}
    base = args.kinds[0]
    for context, batch in args.shapes:
        cell = time_shape(args.kinds, context, batch, args.rounds, args.warmup, corpus)
        results["time"][f"{context}x{batch}"] = cell
        print(f"\n## context {context}, batch {batch}: seconds a step ({args.rounds} "
              f"interleaved rounds)\n")
        print(f"| kind | parameters | median s | min s | ratio to {base} (median of rounds) |")
        print("| --- | ---: | ---: | ---: | ---: |")
        for k, r in cell.items():
            print(f"| {k} | {r['parameters']:,} | {r['median_s']:.3f} | {r['min_s']:.3f} | "
                  f"{r[f'ratio_to_{base}']:.2f} |")
        for k, r in cell.items():  # no choice: an op without backends (decay: torch chunked)
            print(f"  {k}: " + (", ".join("/".join(c) for c in r["backends"])
                                or "no dispatcher choice (torch)"))
    if args.memory:
        print(f"\n## peak extra memory of one training step, batch {args.memory_batch} (MiB)\n")
        print("| kind | " + " | ".join(f"T={t}" for t in args.memory) + " |")
        print("| --- |" + " ---: |" * len(args.memory))
        for k in args.kinds:
            row = [peak_bytes(k, t, args.memory_batch, args.threads) for t in args.memory]
            results["memory"][k] = dict(zip(map(str, args.memory), row, strict=True))
            print(f"| {k} | " + " | ".join("–" if b is None else f"{b / 2**20:.0f}"
                                            for b in row) + " |")
    print(f"\n# load average at end {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
