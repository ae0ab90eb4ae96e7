"""The gated delta rule on CPU (issue 17): a decoding step and a 2,048-token prefill, fp32.

Shape: B = 1, H = 16, K = V = 64, qk_l2norm, log-gates g ≤ 0 (the Gated DeltaNet layer
of the MNN anchor). Three implementations, measured side by side in one process (round-robin,
so that a busy machine slows them alike), for each ``--threads`` count:

* (a) the per-token pure-PyTorch loop users fall back to today, written here plainly the way a
  transformers fallback (``torch_recurrent_gated_delta_rule``) is: L2-normalise, scale, then a
  Python loop of a few torch ops per token; a decoding step is that function on one token;
* (b) linattn's torch path: :func:`linattn.delta_rule` chunked (WY / UT form, chunk
  ``--chunk``) and :func:`linattn.delta_rule_step` under ``dispatch.use(impl="torch")`` (what
  ``LINATTN_NATIVE=0`` runs);
* (c) linattn's compiled path (ops/delta/native.py, ``la_gdr_forward`` in ops/delta/kernels.c),
  forced (``impl="native"``; the default takes it where its calibration measured it faster).

Decode: the median of ``--steps`` steps per implementation, each from the state the previous
step returned, every call through the public function with its argument checks; round-robin
too (the other implementations run between two steps of one, as other layers would in a
model), then the compiled step once more back to back. Prefill: the median of ``--repeats``
calls. Times in parentheses: the minimum (the machine undisturbed). Also printed: the MNN
AVX-512 anchor (quoted from its publication, not measured here) and the issue's targets.

    python benchmarks/delta.py                 # --threads 1,2
    LINATTN_NATIVE_ISA=avx2 python benchmarks/delta.py   # the AVX2 build on an AVX-512 CPU
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from linattn.ops import dispatch, native
from linattn.ops.delta import native as delta_native
from linattn.ops.delta.op import delta_rule, delta_rule_step
from linattn.profiling import cpu_flags, cpu_model

#: The published CPU anchor: MNN's AVX-512 gated delta rule, 16 heads, d = 64, on 4 pinned Xeon
#: cores (quoted, not measured here).
MNN = {"decode_ms": 0.069, "prefill_ms": 14.4}
#: The issue's targets on the project's 2 cores at this shape.
TARGETS = {"decode_ms": 0.1, "prefill_ms": 20.0, "speedup_vs_loop": 20.0}


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def torch_recurrent_gated_delta_rule(q, k, v, g, beta, state=None):
    """(a): the pure-PyTorch per-token loop, as a transformers fallback writes it.

    q, k: (B, H, T, K); v: (B, H, T, V); g, beta: (B, H, T). Returns (o, final state)."""
    q, k = l2norm(q), l2norm(k)
    B, H, T, K = k.shape
    V = v.shape[-1]
    q = q * K ** -0.5
    out = torch.zeros(B, H, T, V, dtype=v.dtype)
    S = torch.zeros(B, H, K, V, dtype=v.dtype) if state is None else state
    for t in range(T):
        q_t, k_t, v_t = q[:, :, t], k[:, :, t], v[:, :, t]
        S = S * g[:, :, t].exp()[..., None, None]
        kv_mem = (S * k_t.unsqueeze(-1)).sum(dim=-2)
        delta = (v_t - kv_mem) * beta[:, :, t].unsqueeze(-1)
        S = S + k_t.unsqueeze(-1) * delta.unsqueeze(-2)
        out[:, :, t] = (S * q_t.unsqueeze(-1)).sum(dim=-2)
    return out, S


def _inputs(T: int, H: int, d: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, H, T, d, generator=gen) for _ in range(3))
    beta = torch.rand(1, H, T, generator=gen)
    g = torch.nn.functional.logsigmoid(torch.randn(1, H, T, generator=gen)) * 0.1
    return q, k, v, beta, g


def _loop_prefill(q, k, v, beta, g, chunk=None):
    return torch_recurrent_gated_delta_rule(q, k, v, g, beta)[0]


def _loop_step(q, k, v, beta, g, S):
    o, S = torch_recurrent_gated_delta_rule(q[:, :, None], k[:, :, None], v[:, :, None],
                                            g[:, :, None], beta[:, :, None], S)
    return o[:, :, 0], S


#: name -> (dispatch policy the call runs under (entered outside the timed region), prefill
#: fn(q, k, v, beta, g), step fn(q_t, k_t, v_t, beta_t, g_t, S) -> (o_t, S)).
IMPLS = {
    "loop": ("torch", _loop_prefill, _loop_step),
    "torch": ("torch",
              lambda q, k, v, beta, g, chunk=64: delta_rule(q, k, v, beta, g, qk_l2norm=True,
                                                           chunk_size=chunk),
              lambda q, k, v, beta, g, S: delta_rule_step(q, k, v, beta, S, g_t=g,
                                                          qk_l2norm=True)),
    "native": ("native",
               lambda q, k, v, beta, g, chunk=64: delta_rule(q, k, v, beta, g, qk_l2norm=True),
               lambda q, k, v, beta, g, S: delta_rule_step(q, k, v, beta, S, g_t=g,
                                                           qk_l2norm=True)),
}


def _timed(impl: str, fn, *args):
    """(seconds, result) of one call under the implementation's dispatch policy."""
    with dispatch.use(impl=impl):
        t0 = time.perf_counter()
        out = fn(*args)
        return time.perf_counter() - t0, out


def measure(threads: int, T: int, H: int, d: int, steps: int, repeats: int, chunk: int) -> dict:
    torch.set_num_threads(threads)
    x = _inputs(T, H, d)
    with torch.no_grad():
        outs = {name: _timed(impl, pre, *x, chunk)[1]  # warm-up, and agreement
                for name, (impl, pre, _) in IMPLS.items()}
        for name in ("torch", "native"):
            err = (outs[name] - outs["loop"]).abs().max().item()
            if not err < 1e-3:
                raise SystemExit(f"{name} prefill differs from the loop by {err:.2e}")
        times = {name: [] for name in IMPLS}
        for _ in range(repeats):  # round-robin
            for name, (impl, pre, _) in IMPLS.items():
                times[name].append(_timed(impl, pre, *x, chunk)[0])
        prefill = {name: 1e3 * statistics.median(ts) for name, ts in times.items()}
        prefill_min = {name: 1e3 * min(ts) for name, ts in times.items()}
        toks = _inputs(steps + 10, H, d, seed=1)
        states = {name: torch.zeros(1, H, d, d) for name in IMPLS}
        times = {name: [] for name in IMPLS}
        for t in range(steps + 10):
            xt = [a[:, :, t].contiguous() for a in toks]  # as fresh projections are
            for name, (impl, _, step) in IMPLS.items():
                dt, (_, states[name]) = _timed(impl, step, *xt, states[name])
                if t >= 10:  # the first steps warm up
                    times[name].append(dt)
        for name in ("torch", "native"):
            err = (states[name] - states["loop"]).abs().max().item()
            if not err < 1e-3:
                raise SystemExit(f"{name} decode state differs from the loop by {err:.2e}")
        # the compiled step again, back to back: nothing else runs between two steps
        impl, _, step = IMPLS["native"]
        S, times["native_alone"] = torch.zeros(1, H, d, d), []
        xs = [[a[:, :, t].contiguous() for a in toks] for t in range(steps + 10)]
        with dispatch.use(impl=impl):
            for t, xt in enumerate(xs):
                t0 = time.perf_counter()
                _, S = step(*xt, S)
                if t >= 10:
                    times["native_alone"].append(time.perf_counter() - t0)
        decode = {name: 1e3 * statistics.median(ts) for name, ts in times.items()}
        decode_min = {name: 1e3 * min(ts) for name, ts in times.items()}
    return {"prefill": prefill, "decode": decode, "prefill_min": prefill_min,
            "decode_min": decode_min}


def cpu_line() -> str:
    model, flags = cpu_model(), cpu_flags()
    isa = [f for f in ("avx512f", "avx512_bf16", "avx2", "fma") if f in flags]
    return (f"CPU: {model}, {os.cpu_count()} logical CPUs; ISA flags: {' '.join(isa) or 'n/a'}; "
            f"compiled path: {native.describe()}; torch {torch.__version__}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--tokens", type=int, default=2048, help="prefill length")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dim", type=int, default=64, help="K = V")
    ap.add_argument("--steps", type=int, default=300, help="decoding steps (median)")
    ap.add_argument("--repeats", type=int, default=7, help="prefill calls (median)")
    ap.add_argument("--chunk", type=int, default=64, help="chunk of the torch chunked form")
    args = ap.parse_args()
    reason = delta_native.unavailable()
    if reason is not None:
        raise SystemExit(f"the compiled path is not available: {reason}")
    print(cpu_line())
    try:
        print("load average (1, 5, 15 min) before: "
              + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    except OSError:
        pass
    print()
    print(f"B = 1, H = {args.heads}, K = V = {args.dim}, fp32, qk_l2norm, gated; decode: median "
          f"of {args.steps} steps; prefill: {args.tokens} tokens, median of {args.repeats}.")
    print()
    print("| threads | implementation | decode step, ms: median (min) "
          "| prefill, ms: median (min) |")
    print("|---|---|---:|---:|")
    names = {"loop": "(a) per-token PyTorch loop (transformers-style fallback)",
             "torch": f"(b) linattn torch: chunked prefill (C = {args.chunk}), torch step",
             "native": "(c) linattn compiled (la_gdr_forward)"}
    results = {}
    for threads in (int(t) for t in args.threads.split(",")):
        r = results[threads] = measure(threads, args.tokens, args.heads, args.dim, args.steps,
                                       args.repeats, args.chunk)
        d, p = r["decode"], r["prefill"]
        dm, pm = r["decode_min"], r["prefill_min"]
        for name, label in names.items():
            print(f"| {threads} | {label} | {d[name]:.3f} ({dm[name]:.3f}) | "
                  f"{p[name]:.1f} ({pm[name]:.1f}) |")
        print(f"| {threads} | (c), decoding steps back to back (nothing between them) | "
              f"{d['native_alone']:.3f} ({dm['native_alone']:.3f}) | |")
        for a, b, label in (("loop", "torch", "(a) / (b)"), ("torch", "native", "(b) / (c)"),
                            ("loop", "native", "(a) / (c)")):
            print(f"| {threads} | speed-up {label} | {d[a] / d[b]:.1f}x | {p[a] / p[b]:.1f}x |")
    print(f"| 4 pinned Xeon cores | MNN AVX-512 (quoted, not measured) | {MNN['decode_ms']} | "
          f"{MNN['prefill_ms']} |")
    print()
    print("load average (1, 5, 15 min) after: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    for threads, r in results.items():
        d, alone = r["decode"]["native"], r["decode"]["native_alone"]
        p, speed = r["prefill"]["native"], r["prefill"]["loop"] / r["prefill"]["native"]
        met = lambda ok: "met" if ok else "NOT met"  # noqa: E731
        print(f"targets, {threads} thread(s): decode <= {TARGETS['decode_ms']} ms: "
              f"{met(d <= TARGETS['decode_ms'])} round-robin ({d:.3f}), "
              f"{met(alone <= TARGETS['decode_ms'])} back to back ({alone:.3f}); prefill <= "
              f"{TARGETS['prefill_ms']:g} ms: {met(p <= TARGETS['prefill_ms'])} ({p:.1f}); "
              f"compiled prefill >= 20x the loop: {met(speed >= TARGETS['speedup_vs_loop'])} "
              f"({speed:.0f}x)")

if __name__ == "__main__":
    main()
