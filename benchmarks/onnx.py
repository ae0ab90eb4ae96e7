"""onnxruntime against linattn eager on the same exported models: prefill and decoding (issue 52).

    flock /tmp/linattn-bench.lock python benchmarks/onnx.py            # the full table
    python benchmarks/onnx.py --quick                                  # a smoke run, seconds

Needs the ``onnx`` extra. For each LM kind whose mixers export as ONNX ``LinearAttention``
nodes (``--kinds``; default linear, gated_delta, deltanet, gla, hybrid, flowformer; cosFormer
holds only 1,024 positions) one model is built
(``--d-model`` 256, ``--layers`` 4, ``--heads`` 4, MLP 4×, vocabulary 256, seed 0; the hybrid's
window its default 64), exported once with
:func:`linattn.onnx.export` (dynamic T) and run

* as a *prefill* of ``--prefill`` tokens (batch 1): the ORT session against ``model(ids,
  return_state=True)`` in eager PyTorch (``torch.no_grad``, linattn's dispatcher's default
  choice: the compiled kernels where the calibration chose them);
* as *decoding*: ``--steps`` tokens one at a time after a 64-token prompt (its prefill not
  timed), the state carried
  (ORT: the ``past_*`` inputs fed from the previous ``present_*`` outputs; PyTorch: the
  ``LMState``), per-token time;

at every thread count of ``--threads`` (ORT's intra-op threads and torch's). Both paths are
interleaved (ORT then torch, ``--rounds`` times) and the medians are printed, with their
ratio (ORT / linattn: above 1, ORT is slower), the CPU and its ISA. ``--op`` also times the
issue's single node: gated_delta, B = 1, T = 2,048, 16 heads, D = 64, a graph of one
``LinearAttention`` node against ``linattn.fla.chunk_gated_delta_rule``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# run as a script, this file's folder comes first on sys.path and this file would shadow the
# onnx package: the folder is dropped before anything imports onnx
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

import numpy as np  # noqa: E402
import torch  # noqa: E402

from linattn.nn import LinearTransformerLM  # noqa: E402
from linattn.onnx.exporter import export  # noqa: E402
from linattn.onnx.runtime import LMSession, session  # noqa: E402
from linattn.profiling import cpu_description  # noqa: E402

KINDS = ("linear", "gated_delta", "deltanet", "gla", "hybrid", "flowformer")


def _interleaved(fns, rounds: int) -> list[float]:
    """Median seconds of each of ``fns``, run alternately ``rounds`` times (after one warm-up).
    A function that returns a number has timed itself (its untimed set-up left out)."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            t = time.perf_counter()
            own = fn()
            times[i].append(own if isinstance(own, float) else time.perf_counter() - t)
    return [statistics.median(t) for t in times]


def bench_kind(kind: str, args, folder: Path) -> list[tuple]:
    torch.manual_seed(0)
    model = LinearTransformerLM(256, args.d_model, args.layers, args.heads,
                                attention=kind).eval()
    path = export(model, torch.randint(0, 256, (1, 16)), folder / f"{kind}.onnx")
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 256, (1, args.prefill), generator=gen)
    prompt = torch.randint(0, 256, (1, 64), generator=gen)
    steps = torch.randint(0, 256, (1, args.steps), generator=gen)
    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        lm = LMSession(path, threads=threads)

        def ort_prefill(lm=lm):
            lm.reset()
            lm(ids.numpy())

        def torch_prefill():
            with torch.no_grad():
                model(ids, return_state=True)

        def ort_decode(lm=lm) -> float:  # the prompt's prefill untimed, then the steps
            lm.reset()
            lm(prompt.numpy())
            t = time.perf_counter()
            for i in range(steps.shape[1]):
                lm(steps[:, i:i + 1].numpy())
            return time.perf_counter() - t

        def torch_decode() -> float:
            with torch.no_grad():
                _, st = model(prompt, return_state=True)
                t = time.perf_counter()
                for i in range(steps.shape[1]):
                    _, st = model(steps[:, i:i + 1], st, return_state=True)
                return time.perf_counter() - t

        p_ort, p_torch = _interleaved([ort_prefill, torch_prefill], args.rounds)
        d_ort, d_torch = _interleaved([ort_decode, torch_decode], args.rounds)
        n = steps.shape[1]
        d_ort, d_torch = d_ort / n, d_torch / n  # per token
        rows.append((kind, threads, p_ort, p_torch, d_ort, d_torch))
    return rows


def bench_op(args, folder: Path) -> list[tuple]:
    """The issue's single node: gated_delta, B=1, T=2048, H=16, D=64."""
    from linattn import fla

    class One(torch.nn.Module):
        def forward(self, q, k, v, s, g, b):
            return torch.ops.linattn.onnx_linear_attention(q, k, v, s, g, b, "gated_delta",
                                                           16, 0.125)

    B, T, H, D = 1, args.op_length, 16, 64
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(B, T, H, D, generator=gen)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, D, generator=gen), dim=-1)
    v = torch.randn(B, T, H, D, generator=gen)
    g = -torch.rand(B, T, H, generator=gen) * 0.1
    b = torch.rand(B, T, H, generator=gen)
    s = torch.zeros(B, H, D, D)
    packed = (q.reshape(B, T, H * D), k.reshape(B, T, H * D), v.reshape(B, T, H * D), s, g, b)
    path = export(One(), packed, folder / "op.onnx", dynamic=False)
    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        sess = session(path, threads)
        feed = {f"input.{i}": a.numpy() for i, a in enumerate(packed)}
        out = sess.run(None, feed)[0].reshape(B, T, H, D)

        def linattn_op():
            with torch.no_grad():
                return fla.chunk_gated_delta_rule(q, k, v, g, b, scale=0.125,
                                                  output_final_state=True)

        ref = linattn_op()[0]
        err = float(np.abs(out - ref.numpy()).max() / ref.abs().max())
        def ort_op(sess=sess, feed=feed):
            return sess.run(None, feed)

        t_ort, t_lin = _interleaved([ort_op, linattn_op], args.rounds)
        rows.append((threads, t_ort, t_lin, err))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: d_model 64, 2 layers, prefill 128, 8 steps, 3 rounds, "
                        "the single op at T = 256")
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--prefill", type=int, default=2048)
    p.add_argument("--steps", type=int, default=128)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--op", action=argparse.BooleanOptionalAction, default=True,
                   help="also time the issue's single LinearAttention node")
    p.add_argument("--op-length", type=int, default=2048)
    args = p.parse_args(argv)
    try:
        args.threads = [int(t) for t in args.threads.split(",")]
        kinds = args.kinds.split(",")
        bad = [k for k in kinds if k not in KINDS]
        if bad or min(args.threads) < 1:
            raise ValueError
    except ValueError:
        print(f"onnx.py: --kinds takes {','.join(KINDS)}, --threads positive integers",
              file=sys.stderr)
        return 2
    if args.quick:
        args.d_model, args.layers, args.prefill, args.steps, args.rounds = 64, 2, 128, 8, 3
        args.op_length = 256
    print(f"# {cpu_description()}; torch {torch.__version__}; onnxruntime "
          f"{__import__('onnxruntime').__version__}")
    print(f"# LM d_model {args.d_model}, {args.layers} layers, {args.heads} heads; prefill "
          f"B=1 T={args.prefill}; decoding {args.steps} tokens after 64; medians of "
          f"{args.rounds} interleaved rounds")
    print(f"{'kind':<12} {'thr':>3} {'prefill ORT ms':>15} {'linattn ms':>11} {'ratio':>6} "
          f"{'step ORT µs':>12} {'linattn µs':>11} {'ratio':>6}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for kind in kinds:
            for kind_, th, po, pt, do, dt in bench_kind(kind, args, folder):
                print(f"{kind_:<12} {th:>3} {po * 1e3:>15.2f} {pt * 1e3:>11.2f} "
                      f"{po / pt:>6.2f} {do * 1e6:>12.1f} {dt * 1e6:>11.1f} {do / dt:>6.2f}",
                      flush=True)
        if args.op:
            print(f"\n# one LinearAttention node, gated_delta, B=1 T={args.op_length} H=16 "
                  "D=64, against linattn.fla.chunk_gated_delta_rule")
            print(f"{'thr':>3} {'ORT ms':>9} {'linattn ms':>11} {'ratio':>6} {'rel err':>9}")
            for th, to, tl, err in bench_op(args, folder):
                print(f"{th:>3} {to * 1e3:>9.2f} {tl * 1e3:>11.2f} {to / tl:>6.2f} {err:>9.1e}",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
