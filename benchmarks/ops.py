"""Core ops: forward time and peak memory of linear vs softmax attention as T grows.

    python benchmarks/ops.py                 # B=1, H=8, D=64, float32, T = 1k ... 64k
    python benchmarks/ops.py --ts 1024 2048  # a quick look

Compares ``linattn.linear_attention`` (non-causal and chunked causal, ``elu`` map) with
``torch.nn.functional.scaled_dot_product_attention`` (softmax, non-causal and causal), and
``linattn.flowformer_attention`` (Flow-Attention, sigmoid map, non-causal and causal), and
prints a Markdown table plus the growth ratio per doubling of T.

Time: the median of several forward calls under ``torch.no_grad()`` in this process, after one
warm-up call of the same shape (at least 3 calls; more while a cell stays under ~3 s; no
warm-up for calls predicted over 2 s, whose kernels smaller T have already loaded).

Memory: the peak *extra* resident memory of one call, measured in a fresh child process per cell:
the child allocates q, k, v, runs a small warm-up call (so that libraries and kernels are loaded),
resets and reads its peak resident size (Linux ``VmHWM``), runs the measured call once and reads
the peak again. The difference is everything the call made resident at its peak: temporaries,
workspaces and the output, whatever allocator they came from (torch's, BLAS's, OpenMP's). It is
not blurred by an earlier, larger call because every cell gets a new process. (Not
``ru_maxrss``: a child's starts at its parent's resident size, which hides smaller growth.)
Resolution is a page; values under ~1 MiB are noise.

SDPA is quadratic in time: after each measured T its next time is extrapolated as
``t · (T_next / T)²``; when that exceeds ``--limit-s`` (default 30 s) the larger T are skipped.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import subprocess
import sys
import time

# Idle OpenMP threads sleep rather than spin (set before torch loads libgomp; children inherit
# it). On a shared, busy machine spinning makes every small parallel region wait for a
# descheduled partner thread: one 64k-token linattn call measured 0.6 s passive vs 9 s spinning
# at load 6. It is the same for every implementation; override by setting the variable.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import linattn  # noqa: E402

IMPLS = {  # name -> (label, is_causal, quadratic)
    "linear": ("linattn non-causal", False, False),
    "linear_causal": ("linattn causal", True, False),
    "sdpa": ("SDPA non-causal", False, True),
    "sdpa_causal": ("SDPA causal", True, True),
    "flow": ("flowformer non-causal", False, False),
    "flow_causal": ("flowformer causal", True, False),
}


def call(impl: str, q, k, v):
    _, is_causal, _ = IMPLS[impl]
    with torch.no_grad():
        if impl.startswith("linear"):
            return linattn.linear_attention(q, k, v, feature_map="elu", is_causal=is_causal)
        if impl.startswith("flow"):
            return linattn.flowformer_attention(q, k, v, is_causal=is_causal)
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)


def inputs(B: int, H: int, T: int, D: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, T, D, generator=g) for _ in range(3))


def time_cell(impl, q, k, v, warm_up=True, min_repeats=3, max_repeats=11, budget_s=3.0) -> float:
    """Median seconds of one forward call (after a warm-up call of the same shape, unless the
    call is long enough that kernels loaded by smaller T leave nothing to warm)."""
    if warm_up:
        call(impl, q, k, v)
    times = []
    while True:
        t0 = time.perf_counter()
        out = call(impl, q, k, v)
        times.append(time.perf_counter() - t0)
        del out
        n = len(times)
        if n >= max_repeats or (n >= min_repeats and sum(times) > budget_s):
            return statistics.median(times)


def peak_child(impl: str, B: int, H: int, T: int, D: int) -> None:
    """In a fresh process: print the peak extra resident bytes of one call ("None" where the
    Linux counters are missing). ``linattn.profiling.PeakMemory`` reads this process's own
    high-water mark (VmHWM, reset at entry), not ru_maxrss: an exec'd child's ru_maxrss starts
    at its *parent's* resident size, which would hide any growth smaller than the benchmark
    process itself."""
    from linattn.profiling import PeakMemory

    q, k, v = inputs(B, H, T, D)
    call(impl, *(t[..., :128, :].contiguous() for t in (q, k, v)))  # load kernels, not measured
    with PeakMemory() as mem:
        out = call(impl, q, k, v)
    assert out.shape == (B, H, T, D)
    print(mem.extra_bytes)


def peak_bytes(impl: str, B: int, H: int, T: int, D: int) -> int | None:
    """Peak extra bytes of one call, from a child process; None (reported) if the child fails."""
    script = os.path.abspath(__file__)
    cmd = [sys.executable, script, "--child", impl, *map(str, (B, H, T, D))]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        print(f"memory child for {impl} T={T} failed:\n{res.stderr[-2000:]}", file=sys.stderr)
        return None
    last = res.stdout.strip().splitlines()[-1]
    return None if last == "None" else int(last)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"{cpu}, {os.cpu_count()} CPUs visible, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads, OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}), "
        f"Python {platform.python_version()}; load average at start {load}"
    )


def fmt_ms(t: float | None) -> str:
    if t is None:
        return "skipped"
    return f"{t * 1e3:,.0f}" if t >= 0.1 else f"{t * 1e3:.1f}"


def fmt_mib(b: int | None) -> str:
    if b is None:
        return "–"
    return f"{b / 2**20:,.0f}" if b >= 10 * 2**20 else f"{b / 2**20:.1f}"


def growth(ts: list[int], vals: list[float | None], floor: float = 0.0) -> str:
    """Ratio per doubling of T: over the largest two measured points, and the fitted log-log
    slope over the upper half of the measured points (1 = linear, 2 = quadratic)."""
    pts = [(t, x) for t, x in zip(ts, vals, strict=True) if x is not None and x > floor]
    if len(pts) < 2:
        return "n/a"
    (t1, x1), (t2, x2) = pts[-2], pts[-1]
    last = (x2 / x1) ** (math.log(2) / math.log(t2 / t1))
    upper = pts[len(pts) // 2 - (len(pts) % 2 == 0) :] if len(pts) > 2 else pts
    xs = [math.log2(t) for t, _ in upper]
    ys = [math.log2(x) for _, x in upper]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((a - mx) * (b - my) for a, b in zip(xs, ys, strict=True)) / sum(
        (a - mx) ** 2 for a in xs
    )
    return f"×{last:.2f} ({pts[-2][0] // 1024}k→{pts[-1][0] // 1024}k), slope {slope:.2f}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ts", type=int, nargs="+", default=[2**i for i in range(10, 17)])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--limit-s", type=float, default=30.0, help="skip SDPA past this per call")
    p.add_argument("--impls", nargs="+", choices=list(IMPLS), default=list(IMPLS))
    p.add_argument("--no-memory", action="store_true", help="time only")
    p.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        impl, *dims = args.child
        peak_child(impl, *map(int, dims))
        return 0

    B, H, D = args.batch, args.heads, args.dim
    print(f"# B={B}, H={H}, D=Dv={D}, float32, forward only; {machine()}", flush=True)
    times = {i: [] for i in args.impls}
    mems = {i: [] for i in args.impls}
    predicted = dict.fromkeys(args.impls, 0.0)
    prev_t = None
    for T in args.ts:
        q, k, v = inputs(B, H, T, D)
        for impl in args.impls:
            quadratic = IMPLS[impl][2]
            if prev_t is not None and times[impl][-1] is not None:
                predicted[impl] = times[impl][-1] * (T / prev_t) ** (2 if quadratic else 1)
            if prev_t is not None and times[impl][-1] is None or predicted[impl] > args.limit_s:
                times[impl].append(None)
                mems[impl].append(None)
                why = f"skipped (predicted {predicted[impl]:.0f} s)"
                print(f"T={T:>6} {impl:>14}: {why}", flush=True)
                continue
            t = time_cell(impl, q, k, v, warm_up=predicted[impl] < 2.0)
            m = None if args.no_memory else peak_bytes(impl, B, H, T, D)
            times[impl].append(t)
            mems[impl].append(m)
            mem = "" if m is None else f", peak +{fmt_mib(m)} MiB"
            print(f"T={T:>6} {impl:>14}: {fmt_ms(t)} ms{mem}", flush=True)
        prev_t = T
        del q, k, v

    labels = [IMPLS[i][0] for i in args.impls]
    head = ["T", *(f"{lab} (ms)" for lab in labels)]
    if not args.no_memory:
        head += [f"{lab} (MiB)" for lab in labels]
    print()
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join(["---:"] * len(head)) + "|")
    for n, T in enumerate(args.ts):
        row = [f"{T:,}"] + [fmt_ms(times[i][n]) for i in args.impls]
        if not args.no_memory:
            row += [fmt_mib(mems[i][n]) for i in args.impls]
        print("| " + " | ".join(row) + " |")
    print()
    print(f"load average at end: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print("Growth per doubling of T (largest two measured T; log-log slope over the upper half):")
    for impl in args.impls:
        line = f"- {IMPLS[impl][0]}: time {growth(args.ts, times[impl])}"
        if not args.no_memory:
            line += f"; memory {growth(args.ts, mems[impl], floor=2**20)}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
