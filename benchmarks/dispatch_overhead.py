"""What the dispatcher, the argument checks and the custom-op plumbing cost on the smallest calls.

Two calls where that overhead is largest relative to the work (issue 23's targets: at most 10 %):

* a decoding step of the gated delta rule, B = 1, H = 16, K = V = 64, qk_l2norm, gated:
  ``linattn.delta_rule_step`` against its compiled kernel called directly (the ctypes call with
  a prebuilt argument struct and preallocated outputs: nothing but the kernel), and against
  the op's own implementation function (the kernel plus its output allocations);
* linear attention at T = 64 (B = 1, H = 8, d = 64, forward, causal and not):
  ``linattn.linear_attention`` against the backend function it dispatches to, called directly
  with the same arguments.

Each pair is timed in interleaved rounds (one batch of calls of each per round) on one thread;
the table gives medians per call and the ratio. Prints the CPU, the build each form took and
the ratios::

    python benchmarks/dispatch_overhead.py [--rounds 30] [--calls 200] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import linattn
from linattn.ops import dispatch
from linattn.ops.delta import native as delta_native
from linattn.ops.delta.op import OP as DELTA
from linattn.ops.linear import op as linear_op
from linattn.profiling import cpu_description


def interleaved(fns: dict, rounds: int, calls: int) -> dict[str, float]:
    """Median seconds per call of each function, timed in interleaved rounds."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for rnd in range(rounds + 1):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            if rnd:  # round 0 warms up
                times[name].append((time.perf_counter() - t0) / calls)
    return {name: statistics.median(t) for name, t in times.items()}


def step_case(rounds: int, calls: int) -> None:
    g = torch.Generator().manual_seed(0)
    H, K = 16, 64
    q, k, v = (torch.randn(1, H, K, generator=g) for _ in range(3))
    beta, gate = torch.rand(1, H, generator=g), -torch.rand(1, H, generator=g)
    S = torch.randn(1, H, K, K, generator=g) * 0.1
    choice = dispatch.select(DELTA, "step", torch.float32, "cpu", False, ("V:16",))
    if choice.backend != "native":
        print(f"decode step: the default path takes {choice.backend} on this machine (the "
              "compiled step did not win its calibration); comparing against that")
    isa = choice.isa or "native"
    fns = delta_native.kernels(isa)
    S_out, o = torch.empty_like(S), torch.empty(1, H, K)
    kernel = fns["gdr_step"]
    args = kernel.struct(
        q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), beta=beta.data_ptr(), g=gate.data_ptr(),
        N=H, K=K, V=K, scale=K ** -0.5, l2norm=1, S_in=S.data_ptr(), S_out=S_out.data_ptr(),
        o=o.data_ptr(), work=delta_native._work(fns, K).data_ptr())
    cases = {
        "kernel (prebuilt struct, outputs)": lambda: kernel.c_call(args),
        "op implementation (+ outputs, struct)":
            lambda: delta_native._step(q, k, v, beta, gate, S, K ** -0.5, True, isa),
        "linattn.delta_rule_step": lambda: linattn.delta_rule_step(q, k, v, beta, S, g_t=gate,
                                                                   qk_l2norm=True),
    }
    t = interleaved(cases, rounds, calls)
    base = t["kernel (prebuilt struct, outputs)"]
    print(f"\ndecode step, B=1 H={H} K=V={K}, gated, qk_l2norm; build {isa}\n")
    print("| call | median per call | vs the kernel |")
    print("|---|---|---|")
    for name, sec in t.items():
        print(f"| {name} | {sec * 1e6:.1f} µs | {sec / base:.3f}× |")


def linear_case(rounds: int, calls: int) -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 8, 64, 64, generator=g) for _ in range(3))
    print("\nlinear attention, B=1 H=8 T=64 d=Dv=64, forward (no gradient), 1 + elu\n")
    print("| form | backend (build) | direct call | linattn.linear_attention | overhead |")
    print("|---|---|---|---|---|")
    fmap = linattn.feature_maps.get_feature_map("elu")
    for is_causal in (False, True):
        form = f"{'causal' if is_causal else 'non-causal'} forward"
        choice = dispatch.select(linear_op.OP, form, torch.float32, "cpu", False,
                                 ("map:compiled", "map:tokenwise"), 64)
        pol = dispatch.policy()
        chunk = min(pol.chunk_size, 64)
        block = max(chunk, pol.block_size // chunk * chunk)

        def direct(choice=choice, is_causal=is_causal, chunk=chunk, block=block):
            with torch.no_grad():
                linear_op._run(choice, q, k, v, fmap, is_causal, None, fmap.eps, chunk, block,
                               None)

        def public(is_causal=is_causal):
            with torch.no_grad():
                linattn.linear_attention(q, k, v, is_causal=is_causal)

        t = interleaved({"direct": direct, "public": public}, rounds, calls)
        name = choice.backend + (f" ({choice.isa})" if choice.isa else "")
        print(f"| {form} | {name} | {t['direct'] * 1e6:.1f} µs | {t['public'] * 1e6:.1f} µs "
              f"| {t['public'] / t['direct'] - 1:+.1%} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{cpu_description()}; torch {torch.__version__}; {args.threads} thread(s); medians "
          f"of {args.rounds} interleaved rounds of {args.calls} calls")
    step_case(args.rounds, args.calls)
    linear_case(args.rounds, args.calls)


if __name__ == "__main__":
    main()
