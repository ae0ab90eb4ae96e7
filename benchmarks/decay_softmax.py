"""Softmax attention with the ALiBi bias ``(i − j)·log γ_h``: the fold into the flash kernel
(:func:`linattn.decay_softmax_attention`) against SDPA with a materialised float bias.

The language model's softmax baseline at its long-context shape (B = 2, H = 4, d = 32, the
decays of ``linattn.nn.lm.default_decays``), forward + backward of one layer, and the forward
alone for a KV-cache piece against a long cache. Subnormal flushing on and off, because the CPU
flash kernel's backward slows down 2–3× on subnormal exponentials (docs/lm.md)::

    python benchmarks/decay_softmax.py --threads 1
    python benchmarks/decay_softmax.py --lengths 1024,4096 --repeats 5

Prints a markdown table of medians (min) in ms; CPU and vector ISA in the heading.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
import torch.nn.functional as F

from linattn.lm.training import flushed_denormals
from linattn.nn.lm import default_decays
from linattn.ops.decay_softmax.op import decay_softmax_attention
from linattn.profiling import cpu_description


def float_bias_sdpa(q, k, v, gamma):
    """The obvious implementation: a (H, T, S) float bias with −∞ above the diagonal."""
    T, S = q.shape[-2], k.shape[-2]
    lag = (torch.arange(S - T, S)[:, None] - torch.arange(S)[None, :]).to(q.dtype)
    bias = torch.where(lag >= 0, lag * gamma.log()[:, None, None], -math.inf)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)


def timed(fn, repeats: int) -> tuple[float, float]:
    fn()  # warm-up
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts), min(ts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="1024,4096", help="T of the training cases")
    ap.add_argument("--cache", default="16384,65536", help="cached tokens of the piece cases")
    ap.add_argument("--piece", type=int, default=4096, help="queries of a piece")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    B, H, d = 2, 4, 32
    gamma = default_decays(H)
    print(f"CPU {cpu_description()}, {args.threads} thread(s), torch "
          f"{torch.__version__}; B = {B}, H = {H}, d = {d}, fp32; median (min) ms\n")
    print("| case | subnormals | float-bias SDPA | decay_softmax_attention | speed-up |")
    print("| --- | --- | ---: | ---: | ---: |")
    g = torch.Generator().manual_seed(0)
    cases = [("train", T, T) for T in map(int, args.lengths.split(","))]
    cases += [("piece", args.piece, args.piece + S) for S in map(int, args.cache.split(","))]
    for kind, T, S in cases:
        q = torch.randn(B, H, T, d, generator=g, requires_grad=kind == "train")
        k = torch.randn(B, H, S, d, generator=g, requires_grad=kind == "train")
        v = torch.randn(B, H, S, d, generator=g, requires_grad=kind == "train")

        def run(f, q=q, k=k, v=v, train=kind == "train"):
            if train:
                return lambda: f(q, k, v, gamma).sum().backward()
            return lambda: torch.no_grad()(f)(q, k, v, gamma)

        label = (f"fwd + bwd, T = {T:,}" if kind == "train"
                 else f"fwd, {T:,} queries after {S - T:,} cached")
        for flush in (False, True):
            if flush:
                with flushed_denormals():
                    base = timed(run(float_bias_sdpa), args.repeats)
                    fold = timed(run(decay_softmax_attention), args.repeats)
            else:
                base = timed(run(float_bias_sdpa), args.repeats)
                fold = timed(run(decay_softmax_attention), args.repeats)
            print(f"| {label} | {'flushed' if flush else 'kept'} | {base[0]:.0f} ({base[1]:.0f}) "
                  f"| {fold[0]:.0f} ({fold[1]:.0f}) | {base[0] / fold[0]:.1f}× |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
