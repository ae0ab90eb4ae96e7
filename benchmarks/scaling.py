"""Sequence-parallel linear attention on P CPU ranks (gloo on 127.0.0.1): time and bytes.

Each rank holds T/P tokens of one (B, H, T, d) problem and runs forward + backward of
``sequence_parallel_linear_attention``; P = 1 is the single-process baseline. Bytes are counted
at the collectives: the payload each rank hands to all_reduce / all_gather, and what a ring
algorithm puts on the wire per rank for it (all-reduce 2(P−1)/P·n, all-gather (P−1)·n for an
n-byte contribution). Every rank gets ``--threads`` intra-op threads; on a 2-core machine P = 4
oversubscribes the cores, so compare the bytes, and read the times as an upper bound.

    python benchmarks/scaling.py [-T 16384] [--ranks 1 2 4] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from linattn import distributed as sp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, cfg: dict, results) -> None:
    torch.set_num_threads(cfg["threads"])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    payload = {"all_reduce": 0, "all_gather": 0}
    wire = {"n": 0.0}
    real_reduce, real_gather = dist.all_reduce, dist.all_gather

    def counting_reduce(t, *a, **kw):
        n = t.numel() * t.element_size()
        payload["all_reduce"] += n
        wire["n"] += 2 * (world - 1) / world * n
        return real_reduce(t, *a, **kw)

    def counting_gather(parts, t, *a, **kw):
        n = t.numel() * t.element_size()
        payload["all_gather"] += n
        wire["n"] += (world - 1) * n
        return real_gather(parts, t, *a, **kw)

    sp.dist.all_reduce, sp.dist.all_gather = counting_reduce, counting_gather
    B, H, T, d = cfg["B"], cfg["H"], cfg["T"], cfg["d"]
    lo, hi = T * rank // world, T * (rank + 1) // world
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, hi - lo, d, generator=g).requires_grad_(True) for _ in range(3))
    times = []
    for it in range(cfg["repeats"] + 1):
        if it == 1:  # count one measured iteration's bytes, after the warm-up
            payload.update(all_reduce=0, all_gather=0)
            wire["n"] = 0.0
        dist.barrier()
        t0 = time.perf_counter()
        out = sp.sequence_parallel_linear_attention(q, k, v, is_causal=cfg["causal"])
        out.sum().backward()
        dist.barrier()
        times.append(time.perf_counter() - t0)
        if it == 1:
            counted = (dict(payload), wire["n"])
    if rank == 0:
        results.put({"time": statistics.median(times[1:]), "payload": counted[0],
                     "wire": counted[1]})
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-T", type=int, default=16384)
    ap.add_argument("-B", type=int, default=1)
    ap.add_argument("-H", type=int, default=8)
    ap.add_argument("-d", type=int, default=64)
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    print(f"B={args.B} H={args.H} T={args.T} d=Dv=ℓ={args.d}, float32, forward+backward, "
          f"{args.threads} thread(s) per rank, gloo on 127.0.0.1\n")
    print("| P | form | time (median) | collective payload / rank | ring wire bytes / rank |")
    print("|---|---|---|---|---|")
    ctx = mp.get_context("spawn")
    for causal in (False, True):
        for world in args.ranks:
            cfg = {**vars(args), "causal": causal}
            results = ctx.SimpleQueue()
            mp.start_processes(_worker, args=(world, _free_port(), cfg, results), nprocs=world,
                               start_method="spawn")
            r = results.get()
            payload = sum(r["payload"].values())
            kinds = ", ".join(f"{k} {v / 2**10:.0f} KiB" for k, v in r["payload"].items() if v)
            print(f"| {world} | {'causal' if causal else 'non-causal'} | "
                  f"{r['time'] * 1e3:.0f} ms | {payload / 2**10:.0f} KiB ({kinds or '—'}) | "
                  f"{r['wire'] / 2**10:.0f} KiB |", flush=True)
    print("\n" + json.dumps({"note": "payload counts both forward and backward collectives"}))


if __name__ == "__main__":
    main()
