"""A training step eager against ``torch.compile`` (default mode), side by side in one process.

Models: the FordA classifier of the ``final`` recipe (500 samples, 25 tokens, 3 layers of width
64; batch 64, the recipe's) and the language model of ``linattn lm train`` at its demo shape
(width 128, 4 layers, 4 heads; batch 32 × context 256) for each ``attention=`` kind asked for;
``--context 4096`` gives the long-context shape. A step is forward, cross-entropy, backward and
an AdamW step; the compiled sides compile the model (``torch.compile(model)``, default mode;
the optimizer step stays eager, as a user writes it), once as it is and once with
``options={"fallback_random": True}``: Inductor's own random numbers for dropout cost about
three times aten's on CPU (measured here: the FordA forward's nine dropouts take longer than
the rest of its compiled forward), and that option keeps aten's. Compilation times are reported
apart. The steps are timed in interleaved rounds (one step of each per round, after warm-up
rounds); the table gives medians and compiled / eager (< 1: compiled faster)::

    python benchmarks/compiled_step.py [--rounds 10] [--threads 1] [--lm linear gated_delta]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from linattn.nn import LinearTransformerLM
from linattn.profiling import cpu_description
from linattn.tsc.model import FordATransformer, ModelConfig

ROOT = Path(__file__).resolve().parents[1]


def forda(batch: int):
    cfg = json.loads((ROOT / "models" / "forda" / "config.json").read_text())["model"]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, cfg["length"], generator=g)
    y = torch.randint(0, cfg["n_classes"], (batch,), generator=g)
    return (lambda: FordATransformer(ModelConfig(**cfg))), x, y


def lm(kind: str, batch: int, context: int):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 256, (batch, context + 1), generator=g)
    kw = {"window": 64} if kind == "hybrid" else {}
    return (lambda: LinearTransformerLM(256, 128, 4, 4, attention=kind, **kw)), ids[:, :-1], \
        ids[:, 1:]


def step_fn(model, opt, x, y):
    def step():
        opt.zero_grad(set_to_none=True)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()
    return step


def compare(name: str, make, x, y, rounds: int, warmup: int) -> None:
    models = {}
    for side in ("eager", "compiled", "compiled, fallback_random"):
        torch.manual_seed(0)
        models[side] = make().train()
    base = models["eager"].state_dict()
    steps, compile_s = {}, {}
    for side, model in models.items():
        model.load_state_dict(base)
        run = model if side == "eager" else torch.compile(
            model, options={"fallback_random": True} if "fallback" in side else None)
        steps[side] = step_fn(run, torch.optim.AdamW(model.parameters()), x, y)
        t0 = time.perf_counter()
        steps[side]()  # the first call compiles the forward and the backward
        compile_s[side] = time.perf_counter() - t0
    times: dict[str, list[float]] = {k: [] for k in steps}
    for rnd in range(warmup + rounds):
        for k, fn in steps.items():
            t0 = time.perf_counter()
            fn()
            if rnd >= warmup:
                times[k].append(time.perf_counter() - t0)
    e, c, f = (statistics.median(times[k]) for k in steps)
    print(f"| {name} | {e * 1e3:.0f} ms | {c * 1e3:.0f} ms ({c / e:.2f}) | {f * 1e3:.0f} ms "
          f"({f / e:.2f}) | {compile_s['compiled']:.0f} s |", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--lm", nargs="*", default=["linear", "gated_delta"],
                   help="attention kinds of the LM rows (linear, softmax, hybrid, gated_delta)")
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--lm-batch", type=int, default=32)
    p.add_argument("--no-forda", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{cpu_description()}; torch {torch.__version__}; {args.threads} thread(s); medians "
          f"of {args.rounds} interleaved steps after {args.warmup} warm-up rounds\n")
    print("| model | eager step | compiled (/ eager) | compiled, fallback_random (/ eager) "
          "| compile time |")
    print("|---|---|---|---|---|")
    if not args.no_forda:
        make, x, y = forda(64)
        compare("FordA final (batch 64)", make, x, y, args.rounds, args.warmup)
    for kind in args.lm:
        make, x, y = lm(kind, args.lm_batch, args.context)
        compare(f"LM {kind} (batch {args.lm_batch} × {args.context})", make, x, y,
                args.rounds, args.warmup)


if __name__ == "__main__":
    main()
