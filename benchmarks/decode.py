"""Per-token decoding latency and state memory against context length: recurrent linear attention,
the sliding-window + linear hybrid, and softmax attention (SDPA) with a KV cache.

Both models are :class:`linattn.nn.LinearTransformerLM` with the same weights' shapes (default:
the ``linattn lm train`` model, d_model 128, 4 layers, 4 heads, byte vocabulary), batch 1,
float32. For each context length L (1k … 128k):

* linear: the state after L real tokens, reached by prefilling chunk after chunk (the chunked
  parallel form, O(L) in total), then decoding steps through the recurrence;
* hybrid (``attention="hybrid"``, ``--window`` w, default 64): the same, through
  :mod:`linattn.ops.window` — a step attends exactly to a ring buffer of the last w keys and
  values and linearly to the state of the older ones, so its cost and state are constant too;
* softmax: a KV cache of L random keys/values per layer (a decode step's cost does not depend
  on the values; prefilling 128k tokens through softmax would take O(L²)), then decoding steps
  through SDPA over the whole cache. The cache grows by ``torch.cat`` each step, as in
  :class:`linattn.nn.lm.KVCache`; a preallocated cache would copy less but still read O(L).
  The column "SDPA floor" times only the attention kernels of one step (one query against the
  L cached keys/values in every layer, no copy, no projections): what no KV-cache
  implementation can go below.

Latency is the median of ``--steps`` single-token steps. Memory is the bytes of decoding state
(LMState.nbytes: S and z per layer, plus the w-token ring buffer for the hybrid, or K and V per
layer). Prints a markdown table and writes
docs/img/decode.png.

    python benchmarks/decode.py --threads 1
    python benchmarks/decode.py --threads 1 --contexts 1024,4096 --steps 5   # a quick look
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from linattn.nn import LinearTransformerLM, LMState
from linattn.nn.lm import KVCache


def _time_steps(model, state, steps: int, gen: torch.Generator) -> tuple[float, LMState]:
    times = []
    tok = torch.randint(0, model.vocab_size, (1, 1), generator=gen)
    for _ in range(steps):
        t0 = time.perf_counter()
        logits, state = model(tok, state, return_state=True)
        tok = logits[:, -1].argmax(-1, keepdim=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), state


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--contexts", default="1024,2048,4096,8192,16384,32768,65536,131072")
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--num-layers", "--layers", dest="num_layers", type=int, default=4)
    ap.add_argument("--num-heads", "--heads", dest="num_heads", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20, help="timed decoding steps per point")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--window", type=int, default=64, help="the hybrid's exact window w")
    ap.add_argument("--plot", default="docs/img/decode.png")
    ap.add_argument("--json", default="runs/decode.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    contexts = [int(c) for c in args.contexts.split(",")]
    gen = torch.Generator().manual_seed(0)
    kw = dict(vocab_size=256, d_model=args.d_model, num_layers=args.num_layers,
              num_heads=args.num_heads)
    torch.manual_seed(0)
    lin = LinearTransformerLM(**kw, attention="linear", chunk_size=256).eval()
    soft = LinearTransformerLM(**kw, attention="softmax").eval()
    hyb = LinearTransformerLM(**kw, attention="hybrid", window=args.window,
                              chunk_size=256).eval()
    H, d = args.num_heads, args.d_model // args.num_heads
    rows = []
    with torch.no_grad():
        state, hstate, seen = None, None, 0
        for L in contexts:
            while seen < L:  # prefill the real text up to L, 4096 tokens at a time
                n = min(4096, L - seen)
                ids = torch.randint(0, 256, (1, n), generator=gen)
                _, state = lin(ids, state, return_state=True)
                _, hstate = hyb(ids, hstate, return_state=True)
                seen += n
            lin_s, _ = _time_steps(lin, state, args.steps, gen)  # the state is not mutated
            hyb_s, _ = _time_steps(hyb, hstate, args.steps, gen)
            cache = LMState([KVCache(torch.randn(1, H, L, d, generator=gen),
                                     torch.randn(1, H, L, d, generator=gen))
                             for _ in range(args.num_layers)], L)
            soft_s, _ = _time_steps(soft, cache, args.steps, gen)
            q = torch.randn(1, H, 1, d, generator=gen)
            floor = []
            for _ in range(args.steps):
                t0 = time.perf_counter()
                for st in cache.layers:
                    F.scaled_dot_product_attention(q, st.k, st.v)
                floor.append(time.perf_counter() - t0)
            rows.append({"context": L, "linear_ms": lin_s * 1e3, "hybrid_ms": hyb_s * 1e3,
                         "softmax_ms": soft_s * 1e3,
                         "sdpa_floor_ms": statistics.median(floor) * 1e3,
                         "linear_state_bytes": state.nbytes(),
                         "hybrid_state_bytes": hstate.nbytes(),
                         "kv_cache_bytes": cache.nbytes()})
            r = rows[-1]
            print(f"L={L}: linear {r['linear_ms']:.2f} ms, hybrid {r['hybrid_ms']:.2f} ms, "
                  f"softmax {r['softmax_ms']:.2f} ms", flush=True)
            del cache

    print(f"\nd_model {args.d_model}, {args.num_layers} layers, {args.num_heads} heads, batch 1, "
          f"float32, {args.threads} thread(s), median of {args.steps} steps, "
          f"hybrid window {args.window}\n")
    print("| context | linear ms/token | hybrid ms/token | softmax+KV ms/token | SDPA floor ms "
          "| linear state | hybrid state | KV cache |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['context']:,} | {r['linear_ms']:.2f} | {r['hybrid_ms']:.2f} | "
              f"{r['softmax_ms']:.2f} | {r['sdpa_floor_ms']:.2f} | "
              f"{r['linear_state_bytes'] / 2**10:.0f} KiB | "
              f"{r['hybrid_state_bytes'] / 2**10:.0f} KiB | "
              f"{r['kv_cache_bytes'] / 2**20:.1f} MiB |")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [r["context"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    a.plot(xs, [r["linear_ms"] for r in rows], "o-", label="linear attention, recurrent state")
    a.plot(xs, [r["hybrid_ms"] for r in rows], "d-",
           label=f"hybrid (window {args.window} + linear)")
    a.plot(xs, [r["softmax_ms"] for r in rows], "s-", label="softmax (SDPA) + KV cache")
    a.plot(xs, [r["sdpa_floor_ms"] for r in rows], "^:", label="SDPA over the cache only")
    a.set(xscale="log", yscale="log", xlabel="context length (tokens)",
          ylabel="ms per generated token", title="Decoding latency")
    b.plot(xs, [r["linear_state_bytes"] for r in rows], "o-", label="linear state (S, z)")
    b.plot(xs, [r["hybrid_state_bytes"] for r in rows], "d-",
           label=f"hybrid state (S, z, {args.window} k/v)")
    b.plot(xs, [r["kv_cache_bytes"] for r in rows], "s-", label="KV cache (K, V)")
    b.set(xscale="log", yscale="log", xlabel="context length (tokens)",
          ylabel="bytes of decoding state", title="Decoding memory")
    for ax in (a, b):
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3, which="both")
        ax.legend()
    fig.tight_layout()
    Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.plot, dpi=120)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(rows, indent=1))
    print(f"\nwrote {args.plot}")


if __name__ == "__main__":
    main()
