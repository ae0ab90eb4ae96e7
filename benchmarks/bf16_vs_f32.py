"""bfloat16 against float32 on the compiled path, side by side in one process.

The compiled one-pass forwards read and write bfloat16 and keep every sum in float32, so on a
CPU without bfloat16 dot products (AVX2) a bfloat16 call should cost at most what float32
costs. This prints the median of interleaved calls (forward, ``torch.no_grad()``) for both
dtypes and each form, and the ratio.

    .venv/bin/python benchmarks/bf16_vs_f32.py                        # this CPU's build
    LINATTN_NATIVE_ISA=avx2 .venv/bin/python benchmarks/bf16_vs_f32.py  # the AVX2 kernels
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

import linattn  # noqa: E402
from linattn.ops import dispatch, native  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-T", type=int, default=65536)
    p.add_argument("-H", type=int, default=8)
    p.add_argument("-d", type=int, default=64)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if native.load() is None:
        raise SystemExit(f"compiled path not available: {native.unavailable_reason()}")
    g = torch.Generator().manual_seed(0)
    f32 = [torch.randn(1, args.H, args.T, args.d, generator=g) * 0.5 for _ in range(3)]
    bf16 = [x.bfloat16() for x in f32]
    times: dict[tuple[bool, str], list[float]] = {}
    with torch.no_grad(), dispatch.use(impl="native"):
        for rep in range(args.repeats + 1):
            for causal in (False, True):
                for name, xs in (("float32", f32), ("bfloat16", bf16)):
                    t0 = time.perf_counter()
                    linattn.linear_attention(*xs, is_causal=causal)
                    if rep:  # the first round warms up
                        times.setdefault((causal, name), []).append(time.perf_counter() - t0)
    print(f"build {native.describe()}; B=1 H={args.H} T={args.T} d=Dv={args.d}, forward, "
          f"{args.threads} thread(s), median of {args.repeats} interleaved calls\n")
    print("| form | float32 | bfloat16 | bfloat16 / float32 |")
    print("|---|---|---|---|")
    for causal in (False, True):
        a, b = (statistics.median(times[causal, n]) for n in ("float32", "bfloat16"))
        print(f"| {'causal' if causal else 'non-causal'} | {a * 1e3:.0f} ms | {b * 1e3:.0f} ms "
              f"| {b / a:.2f} |")


if __name__ == "__main__":
    main()
