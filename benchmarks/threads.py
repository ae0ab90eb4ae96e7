"""Threads that never hurt (issue 25): the gated delta rule's decoding step and short and long
prefills, and causal linear attention, on 1 and 2 threads, with the other core free and busy.

Shapes: B=1, H=16, K=V=64, float32 (``--heads``, ``--dim``). The calls:

* ``delta_rule_step``: one token from a state (:func:`linattn.delta_rule_step`, gated,
  qk_l2norm), and the same through fla's front door
  (:func:`linattn.fla.fused_recurrent_gated_delta_rule` at T = 1);
* ``delta_rule`` prefill of T tokens (``--delta-lengths``, default 64, 256, 2048);
* ``linear_attention`` causal, 1 + elu, T tokens (``--linear-lengths``, default 64, 256, 4096);
* ``gated_linear_attention_step`` and ``gated_linear_attention`` with per-key gates, T tokens
  (``--gla-lengths``, default 64, 256, 2048).

"Busy" runs a second process, ``python -c "while True: pass"``, for the whole of that half of
the run (not pinned: the scheduler places it), and kills it after. Each call is timed alone;
rounds interleave every (call, thread count) pair in a new random order each round (seeded), so
that each runs after different ones; the table gives the median (and minimum) per pair, in ms,
and the ratio 2 threads / 1 thread of the medians (above 1: the second thread hurts). The
thread count is torch's (``torch.set_num_threads``), which both torch's own operations and
linattn's compiled passes (:func:`linattn.ops.native.threads_for`) follow. OMP_WAIT_POLICY is
left as the user's environment has it (unset: OpenMP's default, spin a while then sleep).

    flock /tmp/linattn-bench.lock .venv/bin/python benchmarks/threads.py
    .venv/bin/python benchmarks/threads.py --rounds 20 --no-busy      # a quick look
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

import linattn
from linattn import fla


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def calls(H: int, d: int, delta_lengths: list[int], linear_lengths: list[int],
          gla_lengths: list[int] = ()) -> dict[str, Callable[[], object]]:
    """name -> a call with its inputs bound (float32, B = 1, no gradients)."""
    gen = torch.Generator().manual_seed(0)

    def r(*s):
        return torch.randn(*s, generator=gen)

    out: dict[str, Callable[[], object]] = {}
    q, k, v = r(1, H, d), F.normalize(r(1, H, d), dim=-1), r(1, H, d)
    beta, g = torch.rand(1, H, generator=gen), -torch.rand(1, H, generator=gen)
    S = r(1, H, d, d) * 0.1
    out["decode: delta_rule_step"] = lambda: linattn.delta_rule_step(q, k, v, beta, S, g_t=g,
                                                                     qk_l2norm=True)
    S_own = S.clone()
    out["decode: delta_rule_step inplace"] = lambda: linattn.delta_rule_step(
        q, k, v, beta, S_own, g_t=g, qk_l2norm=True, inplace=True)
    fq, fk, fv = q[:, None], k[:, None], v[:, None]
    fb, fg = beta[:, None], g[:, None]
    out["decode: fla front door"] = lambda: fla.fused_recurrent_gated_delta_rule(
        fq, fk, fv, fg, beta=fb, initial_state=S, output_final_state=True,
        use_qk_l2norm_in_kernel=True)
    for T in delta_lengths:
        x = [r(1, H, T, d) for _ in range(3)]
        b, gg = torch.rand(1, H, T, generator=gen), -torch.rand(1, H, T, generator=gen)
        out[f"delta_rule prefill T={T}"] = (
            lambda x=x, b=b, gg=gg: linattn.delta_rule(*x, b, gg, initial_state=S,
                                                       return_state=True, qk_l2norm=True))
    for T in linear_lengths:
        x = [r(1, H, T, d) for _ in range(3)]
        out[f"linear_attention causal T={T}"] = (
            lambda x=x: linattn.linear_attention(*x, is_causal=True))
    gk_t = F.logsigmoid(r(1, H, d))
    out["decode: gated_linear_attention_step (gk)"] = (
        lambda: linattn.gated_linear_attention_step(q, k, v, S, gk_t=gk_t))
    for T in gla_lengths:
        x = [r(1, H, T, d) for _ in range(3)]
        gk = F.logsigmoid(r(1, H, T, d))
        out[f"gated_linear_attention (gk) T={T}"] = (
            lambda x=x, gk=gk: linattn.gated_linear_attention(*x, gk=gk, initial_state=S,
                                                              return_state=True))
    return out


def measure(fns: dict[str, Callable[[], object]], threads: list[int], rounds: int,
            warmup: int = 3) -> dict[tuple[str, int], list[float]]:
    """Seconds per call for every (name, threads) pair: interleaved rounds, rotating order."""
    pairs = [(name, n) for name in fns for n in threads]
    times: dict[tuple[str, int], list[float]] = {p: [] for p in pairs}
    clock = time.perf_counter
    order = random.Random(0)
    with torch.no_grad():
        for i in range(warmup + rounds):
            # a new order each round: each call runs after different ones (a rotation would
            # keep every call's neighbour, and what it leaves in the caches, the same)
            for name, n in order.sample(pairs, len(pairs)):
                torch.set_num_threads(n)
                t0 = clock()
                fns[name]()
                dt = clock() - t0
                if i >= warmup:
                    times[(name, n)].append(dt)
    return times


def busy_process() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--delta-lengths", default="64,256,2048")
    ap.add_argument("--linear-lengths", default="64,256,4096")
    ap.add_argument("--gla-lengths", default="64,256,2048")
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--no-busy", action="store_true", help="only the free-core half")
    args = ap.parse_args(argv)
    lens = [[int(x) for x in s.split(",") if x] for s in (args.delta_lengths,
                                                           args.linear_lengths,
                                                           args.gla_lengths)]
    fns = calls(args.heads, args.dim, *lens)
    results = {}
    for load in ("free", "busy")[:1 if args.no_busy else 2]:
        proc = busy_process() if load == "busy" else None
        try:
            if proc is not None:
                time.sleep(0.5)  # let it start spinning
            results[load] = measure(fns, [1, 2], args.rounds)
        finally:
            if proc is not None:
                proc.kill()
                proc.wait()
    print(f"CPU: {cpu_name()}; torch {torch.__version__}; B=1, H={args.heads}, "
          f"K=V={args.dim}, float32; {args.rounds} rounds; median (min) ms per call\n")
    head = "| call |"
    rule = "|---|"
    for load in results:
        head += f" 1 thread, {load} | 2 threads, {load} | 2 / 1 |"
        rule += "---:|---:|---:|"
    print(head)
    print(rule)
    for name in fns:
        row = f"| {name} |"
        for times in results.values():
            med = {n: statistics.median(times[(name, n)]) * 1e3 for n in (1, 2)}
            mn = {n: min(times[(name, n)]) * 1e3 for n in (1, 2)}
            row += (f" {med[1]:.3f} ({mn[1]:.3f}) | {med[2]:.3f} ({mn[2]:.3f}) |"
                    f" {med[2] / med[1]:.2f} |")
        print(row)


if __name__ == "__main__":
    main()
