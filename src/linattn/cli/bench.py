"""``linattn bench``: how close linear attention runs to the machine's matmul throughput.

Efficiency = useful FLOPs / time / roofline, where the roofline is the GFLOP/s of a 2048×2048
matmul in the same dtype measured in the same process, and the useful FLOPs of a forward are
4·B·H·T·ℓ·Dv (φ(K)ᵀV and φ(Q)·state), three times that for forward+backward. "Of peak" divides
the same useful GFLOP/s by the core's own limit times the threads: its multiply-add peak for the
build and dtype (float32 FMAs; bfloat16 AMX tile products where the CPU has them, else dot
products where the build has AVX512-BF16),
measured once per machine and cached (:func:`linattn.profiling.core_peak`). torch's matmul
reaches well under that peak on some cores (~0.4 of it on AMD Zen 5), so an efficiency above 1
can still be far from the core's limit. Rows:

* ``default``: what a call runs by default (``impl="auto"``: the backend and build the dispatcher
  chose from its calibration; the table before it says which, per op and form);
* ``native <isa>``: the compiled path, one row group per build variant asked for with ``--isa``
  (``native`` = this CPU's widest ISA; ``avx2`` on an AVX-512 CPU measures the AVX2 kernels);
* ``torch``: what runs with ``LINATTN_NATIVE=0`` (the chunked torch path at long T), with the
  compiled path's speed-up over it in the native rows;
* ``portable``: the whole-tensor torch form (``--no-portable`` skips it).

The paths of a form are timed side by side in one process (with the roofline in the same
rounds); each path's peak memory is measured in a fresh process. Then, over a range of T, the
times of linear and softmax attention (SDPA), the crossover and a log-log plot.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from functools import partial
from pathlib import Path

from linattn._config import FEATURE_MAP, POSITIVE_INT, THREADS, Check, Range
from linattn._io import atomic_path
from linattn._memory import check_fits, num_features
from linattn.cli import path_arg

DTYPES = ("float32", "bfloat16", "float64")
#: Timed calls per measurement: the median of at most 1,000 (a larger count only runs longer:
#: 10**12 ran for ever).
REPEATS = Check(int, Range(1, 1000, True, True))
# torch is imported inside the functions: registering this command must stay cheap, since
# every `linattn` invocation (`linattn solve` included) builds all the subcommand parsers.


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="measure linear attention against the matmul roofline")
    size = POSITIVE_INT.parse
    p.add_argument("-T", type=size, default=65536, help="sequence length (default 65536)")
    p.add_argument("-B", type=size, default=1)
    p.add_argument("-H", type=size, default=8)
    p.add_argument("-d", type=size, default=64, help="head dimension, also Dv")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--feature-map", type=FEATURE_MAP.parse, default="elu",
                   help=f"one of {', '.join(FEATURE_MAP.choices)} (default: %(default)s)")
    p.add_argument("--repeats", type=REPEATS.parse, default=3,
                   help="timed calls per measurement, at most 1000 (default 3)")
    p.add_argument("--threads", type=THREADS.parse, default=None,
                   help="torch intra-op threads (capped at the CPUs available)")
    p.add_argument("--no-portable", action="store_true", help="skip the portable-path rows")
    p.add_argument("--isa", nargs="+", default=["native"], metavar="ISA",
                   help="compiled-path builds to measure: native (default), avx512, avx2, "
                        "generic, scalar")
    cross = p.add_mutually_exclusive_group()
    cross.add_argument("--crossover", type=size, nargs="*", default=None, metavar="T",
                       help="sequence lengths for the SDPA comparison (default 256 … 16384)")
    cross.add_argument("--no-crossover", action="store_true")
    p.add_argument("--plot", default="bench.png", type=path_arg,
                   help="log-log plot of the crossover (PNG)")
    p.set_defaults(func=run)


def _inputs(B, H, T, d, dtype, grad=False):
    import torch

    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, H, T, d, generator=g).to(dtype).requires_grad_(grad) for _ in range(3)]


def _forward(fn, q, k, v, is_causal):
    import torch

    with torch.no_grad():
        return fn(q, k, v, is_causal)


def _forward_backward(fn, q, k, v, is_causal):
    for t in (q, k, v):
        t.grad = None
    fn(q, k, v, is_causal).sum().backward()


def _linear(feature_map):
    from linattn import linear_attention

    return lambda q, k, v, c: linear_attention(q, k, v, feature_map=feature_map, is_causal=c)


def _sdpa(q, k, v, c):
    import torch.nn.functional as F

    return F.scaled_dot_product_attention(q, k, v, is_causal=c)


def _set_isa(isa: str | None) -> None:
    if isa is None:
        os.environ.pop("LINATTN_NATIVE_ISA", None)
    else:
        os.environ["LINATTN_NATIVE_ISA"] = isa


def _timing_cell(spec: dict) -> dict:
    """Median times of every path for one form, side by side in one process: rounds that call
    each path once in turn (in rotating order), then one 2048² matmul of the same dtype (the
    roofline). On a shared machine whose speed comes in phases, the paths and their roofline
    are then measured in the same phases. Round 0 warms up (kernels, buffers, pages)."""
    import torch

    from linattn.ops import dispatch

    torch.set_num_threads(spec["threads"])
    dtype = getattr(torch, spec["dtype"])
    runner = _forward_backward if spec["backward"] else _forward
    fn = _linear(spec["feature_map"])
    q, k, v = _inputs(*spec["shape"], dtype, spec["backward"])
    a, b = torch.randn(2048, 2048, dtype=dtype), torch.randn(2048, 2048, dtype=dtype)
    times: dict[str, list[float]] = {label: [] for label, _, _ in spec["paths"]}
    roof: list[float] = []
    paths = spec["paths"]
    for rnd in range(spec["repeats"] + 1):
        # rotating order: a call pays for what the previous one left behind (freed pages
        # returned to the system, a cold cache): up to 2x after the portable path's gigabyte
        shift = rnd % len(paths)
        for label, impl, isa in paths[shift:] + paths[:shift]:
            _set_isa(isa)
            with dispatch.use(impl=impl):
                t0 = time.perf_counter()
                runner(fn, q, k, v, spec["causal"])
                dt = time.perf_counter() - t0
            if rnd:
                times[label].append(dt)
        t0 = time.perf_counter()
        a @ b
        if rnd:
            roof.append(2 * 2048**3 / (time.perf_counter() - t0) / 1e9)
    return {"times": {label: statistics.median(t) for label, t in times.items()},
            "roofline": statistics.median(roof)}


def _memory_cell(spec: dict) -> int | None:
    """Peak extra resident memory of one call, in a fresh process so that it is its own: memory
    freed by an earlier call stays resident and would hide a later call's growth."""
    import torch

    from linattn.ops import dispatch
    from linattn.profiling import PeakMemory

    torch.set_num_threads(spec["threads"])
    _set_isa(spec["isa"])
    runner = _forward_backward if spec["backward"] else _forward
    q, k, v = _inputs(*spec["shape"], getattr(torch, spec["dtype"]), spec["backward"])
    with dispatch.use(impl=spec["impl"]), PeakMemory() as mem:
        runner(_linear(spec["feature_map"]), q, k, v, spec["causal"])
    return mem.extra_bytes


def _in_child(fn, spec: dict):
    """fn(spec) in a fresh spawned process (its own peak memory and thread settings)."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
        return pool.submit(fn, spec).result()


def selection_table() -> None:
    """Which backend and build the default path takes for each op and form on this machine
    (the dispatcher's calibration, measured now if it was not yet)."""
    import torch

    import linattn.ops.delta.op  # noqa: F401 - the ops register their backends on import
    import linattn.ops.linear.op  # noqa: F401
    from linattn.ops import dispatch

    print(f"default path (impl='auto'), {torch.get_num_threads()} thread(s): what each form "
          "takes, from the dispatcher's calibration (the fastest of 5 calls per candidate, ms)\n")
    print("| op | form | takes | build | calibration |")
    print("|---|---|---|---|---|")
    for r in dispatch.report():
        times = ", ".join(f"{k} {v:g}" for k, v in (r["times"] or {}).items()) or r["why"]
        print(f"| {r['op']} | {r['form']} | {r['backend']} | {r['isa'] or '-'} | {times} |")
    print()


def efficiency_table(args, dtype) -> None:
    import torch

    from linattn.feature_maps import get_feature_map
    from linattn.ops import native
    from linattn.profiling import PEAK_KINDS, core_peak, peak_kind

    B, H, T, d = args.B, args.H, args.T, args.d
    ell = get_feature_map(args.feature_map).num_features(d)
    useful = 4 * B * H * T * ell * d / 1e9
    io_bytes = 4 * B * H * T * d * torch.finfo(dtype).bits // 8  # q, k, v and the output
    threads = torch.get_num_threads()
    isas = [isa for isa in args.isa if native.load(isa) is not None]
    for isa in args.isa:
        print(f"compiled build {native.describe(isa)}")
    print(f"shape: B={B} H={H} T={T} d=Dv={d} ℓ={ell}, {args.dtype}, map {args.feature_map}; "
          f"q, k, v, o = {io_bytes / 2**20:.0f} MiB; {threads} thread(s)")
    print(f"roofline: a 2048×2048 {args.dtype} matmul timed in the same rounds as the paths "
          f"(median of {args.repeats}); times: median of {args.repeats} interleaved calls")
    # the core's own limit: what "of peak" divides by, times the threads; the rows without a
    # build of their own (torch, portable) run the native ISA's instructions at best. Measured
    # again here (under a second per build) and the larger figure kept: a peak cached while the
    # machine was busy is too low, and would put a path above 1.0 of it
    peaks = {isa: core_peak(args.dtype, isa, refresh=True) for isa in ["native", *isas]}
    for isa, peak in peaks.items():
        what = PEAK_KINDS[peak_kind(args.dtype, isa)][1]
        print(f"core peak, {isa} build: " + ("n/a (no compiled build)" if peak is None
                                             else f"{peak:.0f} GFLOP/s per core ({what})"))
    print()
    print("| path | form | pass | median time | useful GFLOP | roofline | efficiency | of peak "
          "| vs torch | peak extra | peak / (q,k,v,o) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    # (row label, dispatch impl, compiled build); "torch": what runs without the compiled path,
    # "fast": the compiled path wherever it applies (bfloat16 with gradients: widened to float32)
    paths = [("default", "auto", None), ("torch", "torch", None)]
    paths += [(f"native {isa}", "fast", isa) for isa in isas]
    paths += [] if args.no_portable else [("portable", "portable", None)]
    for causal in (False, True):
        for name, mult in (("forward", 1), ("fwd+bwd", 3)):
            spec = {"threads": threads, "backward": mult == 3, "feature_map": args.feature_map,
                    "shape": (B, H, T, d), "dtype": args.dtype, "causal": causal,
                    "repeats": args.repeats}
            cell = _in_child(_timing_cell, {**spec, "paths": paths})
            roof = cell["roofline"]
            for label, impl, isa in paths:
                t = cell["times"][label]
                extra = _in_child(_memory_cell, {**spec, "impl": impl, "isa": isa})
                peak, ratio = "n/a", "n/a"
                if extra is not None:
                    peak, ratio = f"{extra / 2**20:.0f} MiB", f"{extra / io_bytes:.2f}"
                speedup = cell["times"]["torch"] / t
                core = peaks.get(isa or "native")
                of_peak = "n/a" if core is None else f"{mult * useful / t / (core * threads):.2f}"
                print(f"| {label} | {'causal' if causal else 'non-causal'} | {name} | "
                      f"{t * 1e3:.0f} ms | {mult * useful:.1f} | {roof:.0f} GFLOP/s | "
                      f"{mult * useful / t / max(roof, 1e-9):.2f} | {of_peak} | {speedup:.2f}× "
                      f"| {peak} | {ratio} |", flush=True)


def crossover(args, dtype, lengths) -> dict:
    from linattn.profiling import median_time

    fn = _linear(args.feature_map)
    print(f"\nLinear vs softmax (SDPA): B={args.B} H={args.H} d={args.d}, {args.dtype}\n")
    print("| T | pass | form | linattn | SDPA | SDPA / linattn |")
    print("|---|---|---|---|---|---|")
    results: dict = {}
    for T in lengths:
        for name, runner, grad in (("forward", _forward, False),
                                   ("fwd+bwd", _forward_backward, True)):
            for causal in (False, True):
                q, k, v = _inputs(args.B, args.H, T, args.d, dtype, grad)
                tl = median_time(partial(runner, fn, q, k, v, causal), args.repeats)
                ts = median_time(partial(runner, _sdpa, q, k, v, causal), args.repeats)
                form = "causal" if causal else "non-causal"
                results.setdefault((name, form), []).append((T, tl, ts))
                print(f"| {T} | {name} | {form} | {tl * 1e3:.1f} ms | {ts * 1e3:.1f} ms "
                      f"| {ts / tl:.2f} |", flush=True)
    print()
    for (name, form), rows in results.items():
        wins = [T for T, tl, ts in rows if tl < ts]
        first = f"T = {wins[0]}" if wins else f"not within T ≤ {lengths[-1]}"
        print(f"crossover, {name} {form}: linattn faster from {first}")
    return results


def plot(results: dict, path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib not installed: no plot; pip install 'linattn[plot]')")
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, name in zip(axes, ("forward", "fwd+bwd"), strict=True):
        for (n, form), rows in results.items():
            if n != name:
                continue
            Ts = [r[0] for r in rows]
            ax.plot(Ts, [r[1] for r in rows], "o-", label=f"linattn {form}")
            ax.plot(Ts, [r[2] for r in rows], "s--", label=f"SDPA {form}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(name)
        ax.set_xlabel("sequence length T")
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel("time per call (s)")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=110)
    print(f"plot: {path}")
    return path


#: The defaults of the sizes (and the crossover's lengths, None) a benchmark's memory grows
#: with, by flag (:func:`bench_bytes`).
SIZE_DEFAULTS = {"-T": 65536, "-B": 1, "-H": 8, "-d": 64, "--crossover": None}
DEFAULT_CROSSOVER = [256, 512, 1024, 2048, 4096, 8192, 16384]
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float64": 8}


def bench_bytes(v: dict) -> int:
    """A lower bound of the bytes the benchmark needs (``v``: its sizes by flag, ``dtype``,
    ``feature_map``, ``crossover_on``): the efficiency table's q, k, v, output and their
    gradients, the state φ(K)ᵀV of every head and the roofline's two 2048² matrices; the
    crossover's q, k, v, output and gradients at its longest length (each once)."""
    B, H, T, d = v["-B"], v["-H"], v["-T"], v["-d"]
    size = _DTYPE_BYTES[v["dtype"]]
    state = B * H * num_features(v["feature_map"], d) * d * max(size, 4)
    table = 8 * B * H * T * d * size + state + 2 * 2048 * 2048 * size
    if not v["crossover_on"]:
        return table
    longest = max(v["--crossover"] or DEFAULT_CROSSOVER)
    return max(table, 8 * B * H * longest * d * size)


def run(args: argparse.Namespace) -> int:
    from linattn.cli import UserError, probe_output_file

    sizes = {"-T": args.T, "-B": args.B, "-H": args.H, "-d": args.d,
             "--crossover": args.crossover, "dtype": args.dtype,
             "feature_map": args.feature_map, "crossover_on": not args.no_crossover}
    try:  # absurd sizes refused before anything is allocated (or minutes of measuring)
        check_fits(bench_bytes, sizes, SIZE_DEFAULTS, "this benchmark")
    except ValueError as err:
        raise UserError(str(err)) from None
    out = Path(args.plot)
    if not args.no_crossover:
        probe_output_file(out, "--plot")  # writable, before minutes of measuring
    from linattn.ops.native import ISA_FLAGS  # imports torch

    for isa in args.isa:
        if isa not in ISA_FLAGS:
            raise UserError(f"--isa: expected one of {', '.join(ISA_FLAGS)}, got {isa!r}")
    # Measuring children inherit this: idle OpenMP threads that spin instead of sleeping make
    # small parallel regions crawl when other work shares the cores (set it to override).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch

    from linattn import _cbuild
    from linattn.cli import start_work

    start_work(args.threads)
    for name in _cbuild.check_environment():  # refused and warned once: not in every child
        os.environ.pop(name, None)

    dtype = getattr(torch, args.dtype)
    selection_table()
    efficiency_table(args, dtype)
    if not args.no_crossover:
        lengths = args.crossover or DEFAULT_CROSSOVER
        plot(crossover(args, dtype, sorted(lengths)), out)
    return 0
