"""bfloat16 against float32 on the compiled path, side by side in one process.

The compiled one-pass forwards read and write bfloat16 and keep every sum in float32, so on a
CPU without bfloat16 dot products (AVX2) a bfloat16 call should cost at most what float32
costs. This prints the median of interleaved calls (forward, ``torch.no_grad()``) for both
dtypes and each form, and the ratio.

    .venv/bin/python benchmarks/bf16_vs_f32.py                        # this CPU's build
    LINATTN_NATIVE_ISA=avx2 .venv/bin/python benchmarks/bf16_vs_f32.py  # the AVX2 kernels

``--steps``: one decoding step of each recurrence instead, what a model's decoding loop pays
per layer and token: the gated delta rule (:func:`linattn.delta_rule_step`, in place and not;
``linattn.fla.fused_recurrent_gated_delta_rule``) and GLA
(:func:`linattn.ops.gated.gated_linear_attention_step`; ``linattn.fla.fused_recurrent_gla``
with per-key gates, ``fused_recurrent_simple_gla`` with scalar gates), at B = 1, ``-H`` heads,
K = V = ``-d``, from a float32 state (as fla keeps it), q, k, v and the gates in the row's
dtype; each call timed alone in interleaved rounds whose order rotates, after warm-up rounds;
median µs per call on each of ``--step-threads`` (torch's count, over which the compiled steps
split their heads from 2^15 state elements: ``linattn.ops.native.native_threads``). The public
functions only, so that ``PYTHONPATH=<an older checkout>/src`` times that checkout's steps the
same way (the before / after tables in docs/bench-recurrences.md)::

    .venv/bin/python benchmarks/bf16_vs_f32.py --steps -H 16 -d 64 [--step-threads 1,2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

# The forwards: OpenMP's threads asleep between calls (what a long call sees). The steps: as the
# user's environment has it (unset: spin a while, which the steps' hand-over relies on).
if "--steps" not in sys.argv[1:]:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import linattn  # noqa: E402
import linattn.fla as fla  # noqa: E402
from linattn.ops import dispatch, native  # noqa: E402
from linattn.ops.gated import gated_linear_attention_step  # noqa: E402
from linattn.profiling import cpu_description  # noqa: E402


def calls(H: int, D: int, dtype: torch.dtype, seed: int = 0) -> dict:
    """name -> a zero-argument call of one decoding step (inputs made once)."""
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(1, 1, H, D, generator=gen), dim=-1)
    k = F.normalize(torch.randn(1, 1, H, D, generator=gen), dim=-1)
    v = torch.randn(1, 1, H, D, generator=gen)
    beta = torch.rand(1, 1, H, generator=gen)
    g = F.logsigmoid(torch.randn(1, 1, H, generator=gen) + 3)
    gk = F.logsigmoid(torch.randn(1, 1, H, D, generator=gen) + 3)
    S = torch.randn(1, H, D, D, generator=gen) * 0.1
    kept = S.clone()  # the state a decoder keeps, written in place (it evolves, bounded)
    q, k, v, beta, g, gk = (x.to(dtype) for x in (q, k, v, beta, g, gk))
    qt, kt, vt, bt, gt, gkt = (x[:, 0] for x in (q, k, v, beta, g, gk))
    return {
        "GDN delta_rule_step": lambda: linattn.delta_rule_step(qt, kt, vt, bt, S, g_t=gt),
        "GDN delta_rule_step in place": lambda: linattn.delta_rule_step(
            qt, kt, vt, bt, kept, g_t=gt, inplace=True),
        "GDN fla fused_recurrent_gated_delta_rule": lambda: fla.fused_recurrent_gated_delta_rule(
            q, k, v, g=g, beta=beta, initial_state=S, output_final_state=True),
        "GLA gated_linear_attention_step (gk)": lambda: gated_linear_attention_step(
            qt, kt, vt, S, gk_t=gkt),
        "GLA fla fused_recurrent_gla (gk)": lambda: fla.fused_recurrent_gla(
            q, k, v, gk=gk, initial_state=S, output_final_state=True),
        "GLA fla fused_recurrent_simple_gla (g)": lambda: fla.fused_recurrent_simple_gla(
            q, k, v, g=g, initial_state=S, output_final_state=True),
    }


def interleaved(fns: dict, rounds: int, warmup: int = 200) -> dict[str, float]:
    """Median µs of each call, timed one at a time in rounds whose order rotates."""
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    clock = time.perf_counter
    for r in range(rounds):
        i = r % len(names)
        for name in names[i:] + names[:i]:
            f = fns[name]
            t0 = clock()
            f()
            times[name].append(clock() - t0)
    return {name: 1e6 * statistics.median(ts) for name, ts in times.items()}


def steps(args: argparse.Namespace) -> None:
    """The decoding-steps table (``--steps``)."""
    threads = [int(n) for n in args.step_threads.split(",")]
    results = {}
    with torch.no_grad():
        for n in threads:
            torch.set_num_threads(n)
            both = {f"{dt}|{name}": fn for dt in (torch.float32, torch.bfloat16)
                    for name, fn in calls(args.H, args.d, dt).items()}
            results[n] = interleaved(both, args.rounds)
    print(f"CPU: {cpu_description()}; torch {torch.__version__}; B=1, H={args.H}, "
          f"K=V={args.d}, float32 state; median µs of {args.rounds} interleaved rounds\n")
    head = "| step | " + " | ".join(f"{n} thr fp32 | {n} thr bf16 | bf16/fp32" for n in threads)
    print(head + " |")
    print("|---|" + "--:|--:|--:|" * len(threads))
    for name in calls(2, 16, torch.float32):
        cells = []
        for n in threads:
            f32 = results[n][f"{torch.float32}|{name}"]
            bf = results[n][f"{torch.bfloat16}|{name}"]
            cells.append(f"{f32:.1f} | {bf:.1f} | {bf / f32:.2f}")
        print(f"| {name} | " + " | ".join(cells) + " |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-T", type=int, default=65536)
    p.add_argument("-H", type=int, default=8)
    p.add_argument("-d", type=int, default=64)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", action="store_true", help="the decoding steps' table instead")
    p.add_argument("--step-threads", default="1,2", help="with --steps: thread counts")
    p.add_argument("--rounds", type=int, default=2000, help="with --steps: rounds")
    args = p.parse_args()
    if args.steps:
        steps(args)
        return
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
