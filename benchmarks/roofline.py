"""Every compiled path against the core's own limit: float32 and bfloat16, one and two threads.

The limit is the core's multiply-add peak for the build and dtype
(:func:`linattn.profiling.core_peak`: float32 FMAs at the build's vector width; bfloat16 AMX
tile products ``tdpbf16ps`` where the build and the OS give the tiles, else dot products
``vdpbf16ps`` where the build has AVX512-BF16), measured again in this process (a peak
measured on a busy machine is only lower) and multiplied by the threads. Paths, each on the
compiled backend (``impl="native"``), forward and forward+backward:

* linear attention, 1 + elu, B = 1, H = 8, T = 65,536, d = Dv = 64 (``--la-T``): non-causal and
  causal. Useful FLOPs 4·B·H·T·d·Dv for a forward (φ(K)ᵀV and φ(Q)·state, as ``linattn bench``
  counts), three times that with the backward.
* GLA (one log-gate per token) and the gated delta rule (GDN: log-gate, β, q and k
  L2-normalised) prefill, B = 1, H = 16, T = 4,096, K = V = 64 (``--rec-T``). Useful FLOPs
  those of the recurrence token by token, a multiply-add counted as 2: GLA 4·K·V per token and
  head (the state's update k vᵀ and the read q·S; the decay's multiply not counted), GDN 6·K·V
  (Sᵀk, the rank-1 update and q·S); three times that with the backward. Both again on fla's
  (B, T, H, ·) layout through ``linattn.fla`` (``chunk_simple_gla``, ``chunk_gated_delta_rule``):
  a head's tokens H rows apart.

A bfloat16 row takes bfloat16 inputs (and outputs): where a path widens them to float32 and
computes in float32, its "of bf16 peak" column says how far that leaves the bf16 units idle. A
path that does not take bfloat16 (or gradients in it) prints why. Every cell: the median of
``--repeats`` calls after one warm-up call (a backward is given an output gradient made once,
outside the timed calls, as operator benchmarks do: a fresh ``torch.ones_like`` of the 128 MiB
output cost ~55 ms a call here, most of it the kernel handing out new pages); the 2-thread
column is the speed-up over the same row on one thread, measured in the same run (two threads
need both cores free).

    python benchmarks/roofline.py                  # the table, this CPU, the default build
    LINATTN_NATIVE_ISA=avx2 python benchmarks/roofline.py   # the AVX2 build on an AVX-512 CPU
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

import linattn
import linattn.fla
from linattn.ops import dispatch
from linattn.profiling import core_peak, cpu_description

Run = Callable[[], None]


def _linear_attention(T: int, causal: bool, dtype: torch.dtype, backward: bool) -> Run:
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 8, T, 64, generator=gen).to(dtype).requires_grad_(backward)
               for _ in range(3))

    g_out = torch.ones(1, 8, T, 64, dtype=dtype)  # made once: the op's time, not torch.ones'

    def run() -> None:
        o = linattn.linear_attention(q, k, v, is_causal=causal)
        if backward:
            o.backward(g_out)
            q.grad = k.grad = v.grad = None
    return run


def _recurrence(kind: str, T: int, dtype: torch.dtype, backward: bool, fla: bool = False
                ) -> Run:
    """GLA or GDN on (B, H, T, ·) tensors through linattn's own ops, or with ``fla`` on fla's
    (B, T, H, ·) layout through linattn.fla's front door (chunk_simple_gla,
    chunk_gated_delta_rule), the same values."""
    gen = torch.Generator().manual_seed(0)
    H, D = 16, 64
    q, k, v = (torch.randn(1, H, T, D, generator=gen) for _ in range(3))
    g = F.logsigmoid(torch.randn(1, H, T, generator=gen)) / 16
    beta = torch.rand(1, H, T, generator=gen)
    if fla:  # fla's layout, made contiguous once (as a model's projections give it)
        q, k, v = (x.transpose(1, 2).contiguous() for x in (q, k, v))
        g, beta = g.transpose(1, 2).contiguous(), beta.transpose(1, 2).contiguous()
    leaves = [x.to(dtype).requires_grad_(backward) for x in (q, k, v)]
    g, beta = g.to(dtype), beta.to(dtype)  # once, not in the timed calls
    g_out = torch.ones_like(leaves[2])

    def run() -> None:
        if kind == "gla" and fla:
            o = linattn.fla.chunk_simple_gla(*leaves, g=g)[0]
        elif kind == "gla":
            o = linattn.gated_linear_attention(*leaves, g=g)
        elif fla:
            o = linattn.fla.chunk_gated_delta_rule(*leaves, g, beta,
                                                   use_qk_l2norm_in_kernel=True)[0]
        else:
            o = linattn.delta_rule(*leaves, beta, g, qk_l2norm=True)
        if backward:
            o.backward(g_out)
            for x in leaves:
                x.grad = None
    return run


def _median_ms(run: Run, repeats: int) -> float:
    run()  # warm-up: builds, calibration, pages
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--la-T", type=int, default=65536, help="linear attention's T")
    p.add_argument("--rec-T", type=int, default=4096, help="GLA's and GDN's T")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    p.add_argument("--dtypes", default="float32,bfloat16")
    args = p.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    isa = os.environ.get("LINATTN_NATIVE_ISA", "native")
    peaks = {dt: core_peak(dt, isa, refresh=True) for dt in ("float32", "bfloat16")}
    print(f"{cpu_description()}; build {linattn.ops.native.describe(isa)}; "
          f"torch {torch.__version__}")
    print(f"core peak per thread: float32 {peaks['float32']:.0f} GFLOP/s, bfloat16 "
          f"{peaks['bfloat16']:.0f} GFLOP/s; medians of {args.repeats} calls\n")
    la, rec = args.la_T, args.rec_T
    paths = [  # name, form, useful GFLOP of a forward, builder(dtype, backward)
        ("linear attention", "non-causal", 4 * 8 * la * 64 * 64 / 1e9,
         lambda dt, bw: _linear_attention(la, False, dt, bw)),
        ("linear attention", "causal", 4 * 8 * la * 64 * 64 / 1e9,
         lambda dt, bw: _linear_attention(la, True, dt, bw)),
        ("GLA", "prefill", 4 * 16 * rec * 64 * 64 / 1e9,
         lambda dt, bw: _recurrence("gla", rec, dt, bw)),
        ("GDN", "prefill", 6 * 16 * rec * 64 * 64 / 1e9,
         lambda dt, bw: _recurrence("gdn", rec, dt, bw)),
        ("GLA", "prefill, fla's layout", 4 * 16 * rec * 64 * 64 / 1e9,
         lambda dt, bw: _recurrence("gla", rec, dt, bw, fla=True)),
        ("GDN", "prefill, fla's layout", 6 * 16 * rec * 64 * 64 / 1e9,
         lambda dt, bw: _recurrence("gdn", rec, dt, bw, fla=True)),
    ]
    head = " | ".join(f"{n} thr: ms, of fp32 peak, of dtype peak" for n in threads)
    print(f"| path | form | pass | dtype | {head} | speed-up {threads[-1]} thr |")
    print("|---|---|---|---|" + "---|" * (len(threads) + 1))
    for name, form, gflop, build in paths:
        for backward in (False, True):
            for dtype_name in args.dtypes.split(","):
                dtype = getattr(torch, dtype_name)
                useful = gflop * (3 if backward else 1)
                cells, ms = [], []
                for n in threads:
                    torch.set_num_threads(n)
                    try:
                        with dispatch.use(impl="native"):
                            t = _median_ms(build(dtype, backward), args.repeats)
                    except (RuntimeError, ValueError, TypeError, NotImplementedError) as err:
                        cells.append(f"n/a: {str(err).splitlines()[0][:100]}")
                        continue
                    ms.append(t)
                    rate = useful / (t / 1e3)
                    cells.append(f"{t:.1f} ms, {rate / (peaks['float32'] * n):.2f}, "
                                 f"{rate / (peaks[dtype_name] * n):.2f}")
                speedup = f"{ms[0] / ms[-1]:.2f}×" if len(ms) == len(threads) > 1 else "—"
                print(f"| {name} | {form} | {'fwd+bwd' if backward else 'forward'} | "
                      f"{dtype_name} | {' | '.join(cells)} | {speedup} |", flush=True)


if __name__ == "__main__":
    main()
