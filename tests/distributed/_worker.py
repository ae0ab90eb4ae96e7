"""One rank of a sequence-parallel check, run as a script by test_sequence_parallel.py.

argv[1]: JSON with rank, world, port, T, causal, seed, out (a .pt path), fail_rank, mask.
Builds the same global q, k, v on every rank (float64), keeps its slice, runs
sequence_parallel_linear_attention, backpropagates a fixed weighted sum and saves its output
slice and the gradients of its slices."""

import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from linattn.distributed import sequence_parallel_linear_attention


def _exit() -> None:
    """Leave without the interpreter's teardown: the results are saved and gloo is destroyed,
    and a gloo thread still unwinding at shutdown has aborted a finished worker with
    "terminate called without an active exception" (once in CI, exit status -6)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


cfg = json.loads(sys.argv[1])
dist.init_process_group(
    "gloo", init_method=f"tcp://127.0.0.1:{cfg['port']}", rank=cfg["rank"],
    world_size=cfg["world"], timeout=timedelta(seconds=cfg.get("timeout", 30)),
)
if cfg["rank"] == cfg.get("fail_rank"):
    raise SystemExit("rank failed on purpose before the collective")
g = torch.Generator().manual_seed(cfg["seed"])
T, B, H, D, Dv = cfg["T"], 2, 2, 3, 4
q, k = (torch.randn(B, H, T, D, generator=g, dtype=torch.float64) for _ in range(2))
v = torch.randn(B, H, T, Dv, generator=g, dtype=torch.float64)
w = torch.randn(B, H, T, Dv, generator=g, dtype=torch.float64)
mask = torch.rand(B, T, generator=g) < 0.2 if cfg.get("mask") else None
bounds = [T * r // cfg["world"] for r in range(cfg["world"] + 1)]
lo, hi = bounds[cfg["rank"]], bounds[cfg["rank"] + 1]
if cfg.get("module"):  # an encoder whose attention spans the ranks
    from linattn.nn import LinearTransformerEncoder

    torch.manual_seed(0)  # the same weights on every rank
    enc = LinearTransformerEncoder(2, 8, 2, mlp_dim=16, is_causal=cfg["causal"],
                                   sequence_parallel_group=dist.group.WORLD).double()
    x = torch.randn(B, T, 8, generator=g, dtype=torch.float64)
    xl = x[:, lo:hi].clone().requires_grad_(True)
    y = enc(xl)
    (y * w[:, 0, lo:hi, :1]).sum().backward()
    torch.save({"out": y.detach(), "dx": xl.grad, "lo": lo, "hi": hi}, cfg["out"])
    dist.barrier()  # no rank tears gloo down while a peer still talks to it
    dist.destroy_process_group()
    _exit()
ql, kl, vl = (t[..., lo:hi, :].clone().requires_grad_(True) for t in (q, k, v))
out = sequence_parallel_linear_attention(
    ql, kl, vl, is_causal=cfg["causal"],
    key_padding_mask=None if mask is None else mask[:, lo:hi],
)
(out * w[..., lo:hi, :]).sum().backward()
torch.save({"out": out.detach(), "dq": ql.grad, "dk": kl.grad, "dv": vl.grad, "lo": lo, "hi": hi},
           cfg["out"])
dist.barrier()
dist.destroy_process_group()
_exit()
