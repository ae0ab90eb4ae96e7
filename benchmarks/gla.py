"""Gated linear attention on CPU, compiled against torch (issue 25): forward, forward+backward
and the decoding step, beside causal linear attention's forward+backward.

Shape: B = 1, H = 16, K = V = 64, float32, T = 4,096 and 1,024 (``--T``). GLA with a scalar
log-gate per token (``g``) and with per-key log-gates (``gk``), each on the compiled backend
(``impl="native"``: ops/gated/native.py, ``la_gla_forward`` / ``la_gla_backward``) and on the
torch chunked form (``impl="portable"``); causal linear attention
(``linattn.linear_attention(q, k, v, is_causal=True)``) on its default path. The issue's target:
GLA forward+backward at T = 4,096 ≤ 1.5× causal linear attention's in the same run.

Every candidate runs once per round, in a rotating order (a busy machine slows them alike),
``--repeats`` rounds after one warm-up round; printed: the median (and in parentheses the
minimum) in ms, and the ratio of GLA's median to linear attention's. The step: ``--steps``
decoding steps per candidate, medians, also rotating. ``--memory`` instead prints the peak
resident memory of one forward+backward of the compiled GLA (per-key gates) at T = 4,096,
8,192 and 16,384, each in a fresh process, less the resident memory before the call, beside
the inputs' size: linear in T if the ratio stays flat.

    flock /tmp/linattn-bench.lock python benchmarks/gla.py             # --threads 1,2
    flock /tmp/linattn-bench.lock python benchmarks/gla.py --memory
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

import linattn
from linattn.ops import dispatch
from linattn.profiling import cpu_flags, cpu_model

H, D = 16, 64
PORTABLE_GK_MAX = 1024


def _inputs(T: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """q, k, v (1, H, T, D) scaled so that states stay bounded; g (1, H, T) and gk (1, H, T, D)
    log-gates in the range GLA models produce (logsigmoid / 16, as fla's GLA layer does)."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, H, T, D, generator=gen) for _ in range(3))
    g = F.logsigmoid(torch.randn(1, H, T, generator=gen)) / 16
    gk = F.logsigmoid(torch.randn(1, H, T, D, generator=gen)) / 16
    return {"q": q, "k": k, "v": v, "g": g, "gk": gk}


def _gla(impl: str, gate: str, backward: bool) -> Callable[[dict], None]:
    """One GLA call (and its backward) on the ``impl`` backend with gate ``g`` or ``gk``."""
    def run(x: dict) -> None:
        leaves = {n: t.detach().requires_grad_(backward) for n, t in x.items()}
        with dispatch.use(impl=impl), torch.set_grad_enabled(backward):
            o = linattn.gated_linear_attention(leaves["q"], leaves["k"], leaves["v"],
                                               **{gate: leaves[gate]})
            if backward:
                o.backward(torch.ones_like(o))
    return run


def _linear(x: dict) -> None:
    """Causal linear attention forward+backward on its default path."""
    q, k, v = (x[n].detach().requires_grad_(True) for n in "qkv")
    o = linattn.linear_attention(q, k, v, is_causal=True)
    o.backward(torch.ones_like(o))


def candidates(T: int) -> dict[str, Callable[[dict], None]]:
    """name -> call. The torch form with per-key gates (a (K, C, C) segment sum per chunk)
    takes ~11 s for a forward+backward at T = 4,096: timed up to T = ``PORTABLE_GK_MAX`` only."""
    c: dict[str, Callable[[dict], None]] = {"linear fwd+bwd": _linear}
    for gate in ("g", "gk"):
        for impl in ("native", "portable"):
            if gate == "gk" and impl == "portable" and T > PORTABLE_GK_MAX:
                continue
            c[f"GLA {gate} {impl} fwd"] = _gla(impl, gate, False)
            c[f"GLA {gate} {impl} fwd+bwd"] = _gla(impl, gate, True)
    return c


def _rotating(fns: dict[str, Callable[[], None]], repeats: int) -> dict[str, list[float]]:
    """Seconds per call of each function: one warm-up round, then ``repeats`` rounds, each in
    an order rotated by one from the last."""
    names = list(fns)
    for n in names:
        fns[n]()
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        for n in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            fns[n]()
            times[n].append(time.perf_counter() - t0)
    return times


def prefill_table(T: int, repeats: int) -> dict[str, list[float]]:
    x = _inputs(T)
    return _rotating({n: (lambda f=f: f(x)) for n, f in candidates(T).items()}, repeats)


def step_table(steps: int) -> dict[str, list[float]]:
    """Seconds per decoding step (B = 1, H = 16) from a random state, per backend and gate."""
    x = {n: t[:, :, 0] for n, t in _inputs(1).items()}
    S = torch.randn(1, H, D, D, generator=torch.Generator().manual_seed(1)) * 0.1
    fns = {}
    for gate in ("g", "gk"):
        for impl in ("native", "portable"):
            def step(gate=gate, impl=impl):
                with dispatch.use(impl=impl):
                    linattn.gated_linear_attention_step(x["q"], x["k"], x["v"], S,
                                                        **{f"{gate}_t": x[gate]})
            fns[f"step {gate} {impl}"] = step
    with torch.no_grad():
        return _rotating(fns, steps)


def _ms(ts: list[float]) -> str:
    return f"{1e3 * statistics.median(ts):9.3f} ({1e3 * min(ts):.3f})"


def memory_child(T: int) -> None:
    """In a fresh process: peak RSS growth of one compiled GLA forward+backward (per-key gates)."""
    torch.set_num_threads(1)
    x = _inputs(T)
    _gla("native", "gk", True)(_inputs(64))  # build, calibrate, first-use allocations
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    _gla("native", "gk", True)(x)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    inputs = sum(t.numel() * t.element_size() for t in x.values())
    print(json.dumps({"T": T, "peak_kib": after - before, "inputs_kib": inputs // 1024}))


def memory_table(lengths: list[int]) -> None:
    print("peak memory of one compiled GLA forward+backward (gk), B=1 H=16 K=V=64, 1 thread")
    print(f"{'T':>6} {'peak growth MiB':>16} {'inputs MiB':>11} {'ratio':>6}")
    for T in lengths:
        out = subprocess.run([sys.executable, __file__, "--memory-child", str(T)],
                             check=True, capture_output=True, text=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        print(f"{T:6d} {r['peak_kib'] / 1024:16.1f} {r['inputs_kib'] / 1024:11.1f} "
              f"{r['peak_kib'] / max(r['inputs_kib'], 1):6.2f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", default="1,2")
    p.add_argument("--T", default="4096,1024", help="sequence lengths, comma-separated")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--memory", action="store_true")
    p.add_argument("--memory-child", type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.memory_child:
        memory_child(a.memory_child)
        return
    isa = "AVX-512" if "avx512f" in cpu_flags() else "AVX2" if "avx2" in cpu_flags() else "?"
    print(f"CPU: {cpu_model()} ({isa}); torch {torch.__version__}; B=1 H={H} K=V={D} float32")
    if a.memory:
        memory_table([4096, 8192, 16384])
        return
    for threads in (int(t) for t in a.threads.split(",")):
        torch.set_num_threads(threads)
        for T in (int(t) for t in a.T.split(",")):
            times = prefill_table(T, a.repeats)
            base = statistics.median(times["linear fwd+bwd"])
            print(f"\n{threads} thread(s), T={T}: ms, median (min) of {a.repeats}; "
                  "ratio to linear fwd+bwd")
            for n, ts in times.items():
                print(f"  {n:28s} {_ms(ts)}  {statistics.median(ts) / base:5.2f}x")
        print(f"\n{threads} thread(s), decoding step: ms, median (min) of {a.steps}")
        for n, ts in step_table(a.steps).items():
            print(f"  {n:28s} {_ms(ts)}")


if __name__ == "__main__":
    main()
