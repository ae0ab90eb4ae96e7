"""Relative-position linear attention: time and peak memory against T.

Prints two tables (Markdown):

1. the FFT form (O(T log T)) against the direct form and the quadratic reference, which both
   build T×T terms, at B=1, H=4, D=Dv=16, forward, float32, T = 1k … 64k;
2. the crossover between the direct and the FFT form at training size (B=64, H=4, D=16,
   forward+backward), which sets ``linattn.ops.relative.DIRECT_MAX_T``.

Each configuration runs in a fresh child process, so the peak-memory figure (growth of the
peak resident set during its first call, ``linattn.profiling.PeakMemory``) belongs to that
call alone. Times are medians.

With ``--init``, instead: the score variances at initialisation of MultiheadLinearAttention
with relative vectors, per (E, H): σ² (the key-coordinate variance the relative vectors are
drawn with), Var(q·k) beside its prediction d·σ_q²·σ_k², Var(q·r), and the variance of the sum
q·k + q·r (twice either term). docs/theory.md §8 quotes this output.

    python benchmarks/relative.py [--threads N] [--repeats 3] [--max-T 65536]
    python benchmarks/relative.py --init
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys

CHILD = r"""
import json, sys, time, torch
cfg = json.loads(sys.argv[1])
torch.set_num_threads(cfg["threads"])
import linattn
from linattn.ops.relative.op import relative_linear_attention
torch.manual_seed(0)
B, H, T, D = cfg["B"], cfg["H"], cfg["T"], cfg["D"]
q, k, v = (torch.randn(B, H, T, D) for _ in range(3))
r = torch.randn(H, 2 * T - 1, D)
grad = cfg["backward"]
if grad:
    for t in (q, k, v, r):
        t.requires_grad_(True)
if cfg["method"] == "reference":
    fn = lambda: linattn.reference.relative_linear_attention(q, k, v, r)
else:
    fn = lambda: relative_linear_attention(q, k, v, r, method=cfg["method"])
def call():
    out = fn()
    if grad:
        out.sum().backward()
from linattn.profiling import PeakMemory
with PeakMemory() as mem:  # warm-up: thread pools, allocator, FFT plans; the peak, not the time
    call()
times = []
for _ in range(cfg["repeats"]):
    t0 = time.perf_counter(); call(); times.append(time.perf_counter() - t0)
peak = mem.extra_bytes
times.sort()
print(json.dumps({"time": times[len(times) // 2], "peak": peak}))
"""


def measure(cfg: dict, timeout: float) -> dict | None:
    """Run one configuration in a child process; None if it failed or ran out of time/memory."""
    try:
        res = subprocess.run(
            [sys.executable, "-c", CHILD, json.dumps(cfg)],
            capture_output=True, text=True, timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return None
    if res.returncode != 0:
        return None
    return json.loads(res.stdout.strip().splitlines()[-1])


def fmt_time(x: float | None) -> str:
    return "—" if x is None else (f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.2f} s")


def fmt_mem(x: float | None) -> str:
    return "—" if x is None else f"{x / 2**20:.0f} MiB"


def init_variances() -> None:
    """The --init table (seed 0, 4096 unit-normal inputs)."""
    import torch

    from linattn.nn import MultiheadLinearAttention

    print("| E | H | d | σ² | Var(q·k) | d·σ_q²·σ_k² | Var(q·r) | Var(q·k + q·r) |")
    print("|---|---|---|---|---|---|---|---|")
    for E, H in ((64, 4), (512, 8)):
        torch.manual_seed(0)
        m = MultiheadLinearAttention(E, H, max_len=50)
        d = E // H
        with torch.no_grad():
            x = torch.randn(4096, E)  # unit-variance inputs, as after a LayerNorm
            q, k = m.q_proj(x).view(-1, H, d), m.k_proj(x).view(-1, H, d)
            qk = (q * k.roll(1, 0)).sum(-1)  # pairs of different tokens: independent q and k
            qr = (q * m.rel[:, 0]).sum(-1)
        print(f"| {E} | {H} | {d} | {m.key_std() ** 2:.3f} | {qk.var():.2f} | "
              f"{d * q.var() * k.var():.2f} | {qr.var():.2f} | {(qk + qr).var():.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-T", type=int, default=65536)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--init", action="store_true",
                    help="print the score variances at initialisation instead")
    args = ap.parse_args()
    if args.init:
        init_variances()
        return
    base = {"threads": args.threads, "repeats": args.repeats, "backward": False}

    # Quadratic forms stop where their (T, T) terms would not fit comfortably: the reference
    # gathers (H, T, T, ℓ) lag features, the direct form (B, H, T, T) scores.
    limits = {"reference": 2048, "direct": 8192}
    print(f"## Forward, B=1, H=4, D=Dv=16, float32, {args.threads} thread(s)\n")
    print("| T | FFT time | FFT peak | growth vs T/2 (T log T predicts) "
          "| direct time | direct peak | reference time | reference peak |")
    print("|---|---|---|---|---|---|---|---|")
    prev = None
    T = 1024
    while T <= args.max_T:
        row = {}
        for method in ("fft", "direct", "reference"):
            if method in limits and T > limits[method]:
                row[method] = None
                continue
            row[method] = measure({**base, "B": 1, "H": 4, "T": T, "D": 16, "method": method},
                                  args.timeout)
        fft = row["fft"]
        growth = "—"
        if prev and fft:
            predicted = 2 * math.log(T) / math.log(T / 2)
            growth = f"{fft['time'] / prev['time']:.2f}× ({predicted:.2f}×)"
        cells = [str(T), fmt_time(fft and fft["time"]), fmt_mem(fft and fft["peak"]), growth]
        for method in ("direct", "reference"):
            m = row[method]
            cells += [fmt_time(m and m["time"]), fmt_mem(m and m["peak"])]
        print("| " + " | ".join(cells) + " |", flush=True)
        prev = fft
        T *= 2

    print(f"\n## Crossover, forward+backward, B=64, H=4, D=16, float32, {args.threads} thread(s)\n")
    print("| T | direct | FFT | FFT / direct |")
    print("|---|---|---|---|")
    for T in (32, 64, 128, 256, 512, 1024, 2048):
        cfg = {**base, "backward": True, "B": 64, "H": 4, "T": T, "D": 16}
        d = measure({**cfg, "method": "direct"}, args.timeout)
        f = measure({**cfg, "method": "fft"}, args.timeout)
        ratio = f"{f['time'] / d['time']:.2f}" if d and f else "—"
        print(f"| {T} | {fmt_time(d and d['time'])} | {fmt_time(f and f['time'])} | {ratio} |",
              flush=True)


if __name__ == "__main__":
    main()
