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
from linattn.ops.delta.kda import KDA_CHUNK, recurrent_form
from linattn.ops.delta.op import delta_rule, delta_rule_step, l2_normalised
from linattn.ops.linear import linear_attention
from linattn.profiling import PeakMemory, cpu_flags, cpu_model

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


# ------------------------------------------------------------ training (issue 25, part 1)
def _grad_inputs(T: int, H: int, d: int, seed: int = 0, per_key: bool = False) -> dict:
    """Leaf tensors of one fwd+bwd problem, B = 1: q, k, v (1, H, T, d), β (1, H, T), the
    log-gate (1, H, T) (per-key: (1, H, T, d), what Kimi Delta Attention's gate gives) and a
    fixed output gradient."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, H, T, d, generator=gen) for _ in range(3))
    beta = torch.rand(1, H, T, generator=gen)
    shape = (1, H, T, d) if per_key else (1, H, T)
    g = torch.nn.functional.logsigmoid(torch.randn(*shape, generator=gen)) * 0.1
    grad = torch.randn(1, H, T, d, generator=gen)
    return {"q": q, "k": k, "v": v, "beta": beta, "g": g, "grad": grad}


def _fwd_bwd(run, x: dict, names: tuple[str, ...]) -> list[torch.Tensor]:
    """One forward and backward of ``run(**leaves)`` -> o, o's gradient ``x["grad"]``: the
    gradients of the leaves ``names`` (fresh leaves per call, as a training step has)."""
    leaves = {n: t.detach().requires_grad_(n in names) for n, t in x.items() if n != "grad"}
    with torch.enable_grad():
        o = run(**leaves)
        return list(torch.autograd.grad(o, [leaves[n] for n in names], x["grad"]))


#: fwd+bwd implementations: name -> (dispatch policy, fn(q, k, v, beta, g) -> o, leaves)
TRAIN = {
    "gdn native": ("native", lambda q, k, v, beta, g: delta_rule(q, k, v, beta, g,
                                                                 qk_l2norm=True),
                   ("q", "k", "v", "beta", "g")),
    "gdn torch": ("torch", lambda q, k, v, beta, g: delta_rule(q, k, v, beta, g, qk_l2norm=True,
                                                               chunk_size=64),
                  ("q", "k", "v", "beta", "g")),
    "linear": ("auto", lambda q, k, v, beta, g: linear_attention(q, k, v, is_causal=True),
               ("q", "k", "v")),
}


def measure_train(threads: int, T: int, H: int, d: int, repeats: int) -> dict:
    """Median and minimum seconds of one fwd+bwd per implementation of :data:`TRAIN`, in
    rotating order per round; the two gated delta rule paths checked against each other."""
    torch.set_num_threads(threads)
    x = _grad_inputs(T, H, d)
    names = list(TRAIN)
    grads = {}
    for name in names:  # warm-up (and the linear op's calibration), agreement
        impl, run, leaves = TRAIN[name]
        with dispatch.use(impl=impl):
            grads[name] = _fwd_bwd(run, x, leaves)
    for a, b in zip(grads["gdn native"], grads["gdn torch"], strict=True):
        err = ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()
        if not err < 1e-3:
            raise SystemExit(f"native and torch gradients differ by {err:.2e} (relative)")
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            impl, run, leaves = TRAIN[name]
            with dispatch.use(impl=impl):
                t0 = time.perf_counter()
                _fwd_bwd(run, x, leaves)
                times[name].append(time.perf_counter() - t0)
    return {name: (1e3 * statistics.median(ts), 1e3 * min(ts)) for name, ts in times.items()}


def train_table(threads: list[int], T: int, H: int, d: int, repeats: int) -> None:
    print(f"fwd+bwd, B = 1, H = {H}, T = {T}, K = V = {d}, fp32; gradients of q, k, v, beta, g "
          f"(gated delta rule, qk_l2norm) or q, k, v (causal linear attention, elu, default "
          f"dispatch); median (min) of {repeats}, rotating order.")
    print()
    print("| threads | gated delta rule, compiled fwd+bwd, ms | gated delta rule, torch chunked "
          "(C = 64), ms | causal linear attention, ms | compiled GDN / linear | target <= 2x |")
    print("|---|---:|---:|---:|---:|---|")
    for th in threads:
        r = measure_train(th, T, H, d, repeats)
        n, t, lin = r["gdn native"], r["gdn torch"], r["linear"]
        ratio = n[0] / lin[0]
        print(f"| {th} | {n[0]:.0f} ({n[1]:.0f}) | {t[0]:.0f} ({t[1]:.0f}) | {lin[0]:.0f} "
              f"({lin[1]:.0f}) | {ratio:.2f}x | {'met' if ratio <= 2 else 'NOT met'} |",
              flush=True)
    print()


def _peak_child(name: str, T: int, H: int, d: int) -> None:
    """In a fresh process: the peak extra resident bytes of one fwd+bwd of ``name``."""
    torch.set_num_threads(1)
    impl, run, leaves = TRAIN[name]
    x = _grad_inputs(T, H, d)
    with dispatch.use(impl=impl):
        _fwd_bwd(run, _grad_inputs(64, H, d), leaves)  # the library loaded, the kernels built
        with PeakMemory() as m:
            _fwd_bwd(run, x, leaves)
    print(m.extra_bytes)


def memory_table(lengths: list[int], H: int, d: int) -> None:
    """Peak extra resident memory of one fwd+bwd, one fresh child process per cell (an
    allocator's freed pages from an earlier call would hide a smaller peak)."""
    import subprocess
    import sys
    print(f"peak extra resident memory of one fwd+bwd (Linux VmHWM, reset at entry; inputs and "
          f"output gradient excluded), B = 1, H = {H}, K = V = {d}, fp32, 1 thread, MiB; "
          f"in parentheses: per 1,024 tokens")
    print()
    names = ["gdn native", "linear"]
    print("| T | " + " | ".join(names) + " |")
    print("|---:|" + "---:|" * len(names))
    for T in lengths:
        cells = []
        for name in names:
            out = subprocess.run([sys.executable, __file__, "--peak-child", f"{name}:{T}:{H}:{d}"],
                                 capture_output=True, text=True, check=True).stdout.split()[-1]
            mib = None if out == "None" else int(out) / 2 ** 20
            cells.append("n/a" if mib is None else f"{mib:.0f} ({mib * 1024 / T:.1f})")
        print(f"| {T} | " + " | ".join(cells) + " |", flush=True)
    print()


def _kda_token_by_token(q, k, v, beta, g):
    """Per-key gates token by token (what ``delta_rule`` ran them as before the chunked form,
    through the step; here the leaner loop that per-value gates still take)."""
    q, k = l2_normalised(q), l2_normalised(k)
    S0 = q.new_zeros(*q.shape[:-2], q.shape[-1], v.shape[-1])
    return recurrent_form(q * q.shape[-1] ** -0.5, k, v, beta, None, g, None, S0)[0]


#: per-key gates: name -> fn(q, k, v, beta, gk) -> o
KDA = {"chunked": lambda q, k, v, beta, g: delta_rule(q, k, v, beta, None, g, qk_l2norm=True),
       "token by token": _kda_token_by_token}


def measure_kda(threads: int, T: int, H: int, d: int, repeats: int) -> dict:
    """(forward, fwd+bwd) -> name -> (median, min) ms, rotating order; outputs checked."""
    torch.set_num_threads(threads)
    x = _grad_inputs(T, H, d, per_key=True)
    leaves = ("q", "k", "v", "beta", "g")
    names = list(KDA)
    with torch.no_grad():
        outs = [KDA[n](*(x[a] for a in leaves)) for n in names]
    err = ((outs[0] - outs[1]).abs().max() / outs[1].abs().max()).item()
    if not err < 1e-4:
        raise SystemExit(f"chunked KDA differs from the token loop by {err:.2e} (relative)")
    result = {}
    for form in ("forward", "fwd+bwd"):
        times: dict[str, list[float]] = {n: [] for n in names}
        for r in range(repeats):
            for n in names[r % 2:] + names[:r % 2]:
                t0 = time.perf_counter()
                if form == "forward":
                    with torch.no_grad():
                        KDA[n](*(x[a] for a in leaves))
                else:
                    _fwd_bwd(lambda n=n, **kw: KDA[n](*(kw[a] for a in leaves)), x, leaves)
                times[n].append(time.perf_counter() - t0)
        result[form] = {n: (1e3 * statistics.median(ts), 1e3 * min(ts))
                        for n, ts in times.items()}
    return result


def kda_table(lengths: list[int], threads: list[int], H: int, d: int, repeats: int) -> None:
    print(f"per-key gates (KDA), B = 1, H = {H}, K = V = {d}, fp32, qk_l2norm, gk (1, H, T, K); "
          f"chunked: delta_rule(..., gk=gk), chunks of {KDA_CHUNK}; token by token: "
          f"kda.recurrent_form; fwd+bwd: gradients of q, k, v, beta, gk; median (min) of "
          f"{repeats}, rotating order, ms.")
    print()
    print("| threads | T | forward: chunked | forward: token by token | speed-up "
          "| fwd+bwd: chunked | fwd+bwd: token by token | speed-up |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for th in threads:
        for T in lengths:
            r = measure_kda(th, T, H, d, repeats)
            f, b = r["forward"], r["fwd+bwd"]
            c, t = "chunked", "token by token"
            print(f"| {th} | {T} | {f[c][0]:.0f} ({f[c][1]:.0f}) | {f[t][0]:.0f} ({f[t][1]:.0f}) "
                  f"| {f[t][0] / f[c][0]:.1f}x | {b[c][0]:.0f} ({b[c][1]:.0f}) "
                  f"| {b[t][0]:.0f} ({b[t][1]:.0f}) | {b[t][0] / b[c][0]:.1f}x |", flush=True)
    print()


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
    ap.add_argument("--train", action="store_true",
                    help="fwd+bwd: compiled and torch gated delta rule against causal linear "
                         "attention at --train-tokens (issue 25)")
    ap.add_argument("--train-tokens", type=int, default=4096)
    ap.add_argument("--memory", default=None, metavar="T1,T2,...",
                    help="peak memory of fwd+bwd at these lengths (1 thread, child processes)")
    ap.add_argument("--kda", default=None, metavar="T1,T2,...",
                    help="per-key gates (KDA): chunked against token by token at these lengths")
    ap.add_argument("--peak-child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.peak_child:
        name, *dims = args.peak_child.split(":")
        _peak_child(name, *map(int, dims))
        return
    reason = delta_native.unavailable()
    if reason is not None:
        raise SystemExit(f"the compiled path is not available: {reason}")
    print(cpu_line())
    threads = [int(t) for t in args.threads.split(",")]
    if args.train or args.memory or args.kda:  # the issue-25 sections only
        if args.train:
            train_table(threads, args.train_tokens, args.heads, args.dim, args.repeats)
        if args.memory:
            memory_table([int(t) for t in args.memory.split(",")], args.heads, args.dim)
        if args.kda:
            kda_table([int(t) for t in args.kda.split(",")], threads, args.heads, args.dim,
                      args.repeats)
        print("load average (1, 5, 15 min) after: "
              + " ".join(f"{x:.2f}" for x in os.getloadavg()))
        return
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
    for th in threads:
        r = results[th] = measure(th, args.tokens, args.heads, args.dim, args.steps,
                                       args.repeats, args.chunk)
        d, p = r["decode"], r["prefill"]
        dm, pm = r["decode_min"], r["prefill_min"]
        for name, label in names.items():
            print(f"| {th} | {label} | {d[name]:.3f} ({dm[name]:.3f}) | "
                  f"{p[name]:.1f} ({pm[name]:.1f}) |")
        print(f"| {th} | (c), decoding steps back to back (nothing between them) | "
              f"{d['native_alone']:.3f} ({dm['native_alone']:.3f}) | |")
        for a, b, label in (("loop", "torch", "(a) / (b)"), ("torch", "native", "(b) / (c)"),
                            ("loop", "native", "(a) / (c)")):
            print(f"| {th} | speed-up {label} | {d[a] / d[b]:.1f}x | {p[a] / p[b]:.1f}x |")
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
