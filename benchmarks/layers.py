"""The layers around the recurrences on CPU: the short causal convolution and the gated RMSNorm,
linattn's compiled kernels against what transformers runs without its CUDA kernels.

Shapes of a Qwen3.5-style Gated DeltaNet layer (D = 6144 convolution channels: q, k, v of
16 heads; the norm over heads of 128), fp32 unless ``--dtype``:

* conv prefill (B = 1, T = ``--tokens``, D, W = 4, SiLU), x the (B, D, T) transpose of the
  projection as the layer holds it: :func:`linattn.fla.causal_conv1d_fn` (the compiled kernel
  through the package's front door), ``F.silu(F.conv1d(...))`` (the depthwise convolution
  transformers' fallback computes), transformers' fallback itself
  (``transformers.models.qwen3_5.modeling_qwen3_5.causal_conv1d_fn.__wrapped__``), and a
  ``clone()`` of x (a fresh tensor of the output's size: what memory alone costs);
* conv decode step (B = 1, D, state of W columns, in place):
  :func:`linattn.fla.causal_conv1d_update` against transformers' ``causal_conv1d_update``
  fallback;
* gated norm (SiLU, norm before gate) on (T·16, 128) and on a decoding step's (16, 128):
  :func:`linattn.rms_norm_gated` against ``Qwen3_5RMSNormGated``.

Every call through the public function with its checks. Implementations of a row run
round-robin in one process (a busy machine slows them alike); the median of ``--repeats``
(prefill, norm) or ``--steps`` (decode) calls, the minimum in parentheses. Without
transformers its columns say "n/a".

    flock /tmp/linattn-bench.lock python benchmarks/layers.py          # --threads 1,2
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import linattn
from linattn import fla
from linattn.ops import dispatch
from linattn.profiling import cpu_flags, cpu_model


def _transformers():
    try:
        from transformers.models.qwen3_5 import modeling_qwen3_5 as m
    except ImportError:
        return None
    return m


def _round_robin(fns: dict, n: int) -> dict:
    """name -> (median, min) in ms, the functions called in turn, n times each."""
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    for _ in range(n):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: (1e3 * statistics.median(ts), 1e3 * min(ts)) for name, ts in times.items()}


def measure(threads: int, T: int, D: int, dtype: torch.dtype, repeats: int, steps: int) -> list:
    torch.set_num_threads(threads)
    m = _transformers()
    gen = torch.Generator().manual_seed(0)
    W = 4
    h = torch.randn(1, T, D, generator=gen).to(dtype)  # the projection (B, T, D)
    x = h.transpose(1, 2)  # (B, D, T) as the layer holds it
    w = (torch.randn(D, W, generator=gen) * 0.5).to(dtype)
    b = torch.randn(D, generator=gen).to(dtype)
    rows = []
    prefill = {
        "linattn": lambda: fla.causal_conv1d_fn(x, w, b, activation="silu"),
        "F.conv1d+silu": lambda: F.silu(F.conv1d(x, w.unsqueeze(1), b, padding=W - 1,
                                                 groups=D)[..., :T]),
        "clone": lambda: x.clone(),
    }
    if m is not None:
        fn_t = m.causal_conv1d_fn.__wrapped__
        prefill["transformers"] = lambda: fn_t(x, w, b, activation="silu")
    rows.append(("conv prefill", _round_robin(prefill, repeats)))
    x1 = torch.randn(1, D, generator=gen).to(dtype)
    st_a = torch.randn(1, D, W, generator=gen).to(dtype)
    st_b = st_a.clone()
    step = {"linattn": lambda: fla.causal_conv1d_update(x1, st_a, w, b, "silu")}
    if m is not None:
        up_t = m.causal_conv1d_update.__wrapped__
        x13 = x1.unsqueeze(-1)
        step["transformers"] = lambda: up_t(x13, st_b, w, b, "silu")
    rows.append(("conv decode step", _round_robin(step, steps)))
    for R in (T * 16, 16):
        xn = torch.randn(R, 128, generator=gen).to(dtype)
        gn = torch.randn(R, 128, generator=gen).to(dtype)
        wn = (torch.rand(128, generator=gen) + 0.5).to(dtype)
        norm = {"linattn": lambda xn=xn, gn=gn, wn=wn: linattn.rms_norm_gated(xn, gn, wn)}
        if m is not None:
            mod = m.Qwen3_5RMSNormGated(128).to(dtype)
            with torch.no_grad():
                mod.weight.copy_(wn)
            norm["transformers"] = lambda xn=xn, gn=gn, mod=mod: mod(xn, gn)
        with torch.no_grad():
            rows.append((f"gated norm ({R}, 128)", _round_robin(norm, repeats if R > 16
                                                                else steps)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--channels", type=int, default=6144)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--repeats", type=int, default=7, help="prefill and norm calls (median)")
    ap.add_argument("--steps", type=int, default=300, help="decoding steps (median)")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    flags = " ".join(f for f in ("avx512f", "avx2") if f in cpu_flags())
    print(f"CPU: {cpu_model()} ({flags}); torch {torch.__version__}; {args.dtype}; "
          f"T = {args.tokens}, D = {args.channels}, W = 4")
    with torch.inference_mode(), dispatch.use(impl="auto"):
        for threads in (int(t) for t in args.threads.split(",")):
            rows = measure(threads, args.tokens, args.channels, dtype, args.repeats, args.steps)
            print(f"\n{threads} thread(s): median ms (min)")
            for name, res in rows:
                base = res["linattn"][0]
                cells = "  ".join(f"{k} {v[0]:.4g} ({v[1]:.4g})"
                                  + ("" if k == "linattn" else f" = {v[0] / base:.3g}x")
                                  for k, v in res.items())
                print(f"  {name:24s} {cells}")


if __name__ == "__main__":
    main()
