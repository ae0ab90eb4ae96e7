"""sequence_parallel_linear_attention on gloo (127.0.0.1): outputs and gradients of q, k, v
equal the single-process result; a failing rank makes the others exit instead of hanging.

Each rank is this file run as a script (:func:`_rank`), one process per rank."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import linattn
from linattn.distributed import sequence_parallel_linear_attention

WORKER = Path(__file__)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(world: int, tmp_path: Path, **cfg) -> list[subprocess.Popen]:
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = []
    for rank in range(world):
        c = {"rank": rank, "world": world, "port": port, "out": str(tmp_path / f"r{rank}.pt"),
             **cfg}
        procs.append(subprocess.Popen([sys.executable, str(WORKER), json.dumps(c)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


def _inputs(T: int, seed: int) -> tuple[torch.Generator, torch.Tensor, ...]:
    """The global q, k, v and output weights w (B, H = 2, 2; D, Dv = 3, 4; float64), the same on
    every rank and in the single process, and the generator to draw the rest from."""
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(2, 2, T, 3, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(2, 2, T, 4, generator=g, dtype=torch.float64)
    w = torch.randn(2, 2, T, 4, generator=g, dtype=torch.float64)
    return g, q, k, v, w


def _rank(cfg: dict) -> None:
    """One rank of a check: cfg holds rank, world, port, T, causal, seed, out (a .pt path),
    fail_rank, mask, module. Keeps its slice of the global inputs, runs
    sequence_parallel_linear_attention (or, with module, an encoder whose attention spans the
    ranks), backpropagates a fixed weighted sum and saves its output slice and the gradients of
    its slices."""
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{cfg['port']}", rank=cfg["rank"],
        world_size=cfg["world"], timeout=timedelta(seconds=cfg.get("timeout", 30)),
    )
    if cfg["rank"] == cfg.get("fail_rank"):
        raise SystemExit("rank failed on purpose before the collective")
    T = cfg["T"]
    g, q, k, v, w = _inputs(T, cfg["seed"])
    mask = torch.rand(2, T, generator=g) < 0.2 if cfg.get("mask") else None
    bounds = [T * r // cfg["world"] for r in range(cfg["world"] + 1)]
    lo, hi = bounds[cfg["rank"]], bounds[cfg["rank"] + 1]
    if cfg.get("module"):
        torch.manual_seed(0)  # the same weights on every rank
        enc = linattn.nn.LinearTransformerEncoder(
            2, 8, 2, mlp_dim=16, is_causal=cfg["causal"],
            sequence_parallel_group=dist.group.WORLD).double()
        x = torch.randn(2, T, 8, generator=g, dtype=torch.float64)
        xl = x[:, lo:hi].clone().requires_grad_(True)
        y = enc(xl)
        (y * w[:, 0, lo:hi, :1]).sum().backward()
        saved = {"out": y.detach(), "dx": xl.grad}
    else:
        ql, kl, vl = (t[..., lo:hi, :].clone().requires_grad_(True) for t in (q, k, v))
        out = sequence_parallel_linear_attention(
            ql, kl, vl, is_causal=cfg["causal"],
            key_padding_mask=None if mask is None else mask[:, lo:hi],
        )
        (out * w[..., lo:hi, :]).sum().backward()
        saved = {"out": out.detach(), "dq": ql.grad, "dk": kl.grad, "dv": vl.grad}
    torch.save({**saved, "lo": lo, "hi": hi}, cfg["out"])
    dist.barrier()  # no rank tears gloo down while a peer still talks to it
    dist.destroy_process_group()
    # Leave without the interpreter's teardown: the results are saved and gloo is destroyed,
    # and a gloo thread still unwinding at shutdown has aborted a finished worker with
    # "terminate called without an active exception" (once in CI, exit status -6).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _single_process(T, causal, seed, mask):
    g, q, k, v, w = _inputs(T, seed)
    m = torch.rand(2, T, generator=g) < 0.2 if mask else None
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    out = linattn.linear_attention(q, k, v, is_causal=causal, key_padding_mask=m)
    (out * w).sum().backward()
    return out.detach(), q.grad, k.grad, v.grad


@pytest.mark.parametrize(
    "world, causal, mask",
    [(2, False, False), (2, True, False), (2, False, True), (2, True, True),
     (4, False, False), (4, True, True)],
)
def test_matches_single_process(tmp_path, world, causal, mask):
    T, seed = 21, 7  # uneven slices on purpose
    procs = _launch(world, tmp_path, T=T, causal=causal, seed=seed, mask=mask)
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
    out, dq, dk, dv = _single_process(T, causal, seed, mask)
    for rank in range(world):
        r = torch.load(tmp_path / f"r{rank}.pt")
        sl = slice(r["lo"], r["hi"])
        torch.testing.assert_close(r["out"], out[..., sl, :], rtol=1e-9, atol=1e-9)
        for name, full in (("dq", dq), ("dk", dk), ("dv", dv)):
            torch.testing.assert_close(r[name], full[..., sl, :], rtol=1e-9, atol=1e-9,
                                       msg=f"{name} on rank {rank}")


@pytest.mark.parametrize("causal", [False, True])
def test_encoder_with_sequence_parallel_group_matches_single_process(tmp_path, causal):
    T, seed = 13, 3
    procs = _launch(2, tmp_path, T=T, causal=causal, seed=seed, module=True)
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
    g, _q, _k, _v, w = _inputs(T, seed)  # x is drawn after them, as on the ranks
    torch.manual_seed(0)
    enc = linattn.nn.LinearTransformerEncoder(2, 8, 2, mlp_dim=16, is_causal=causal).double()
    x = torch.randn(2, T, 8, generator=g, dtype=torch.float64, requires_grad=True)
    y = enc(x)
    (y * w[:, 0, :, :1]).sum().backward()
    for rank in range(2):
        r = torch.load(tmp_path / f"r{rank}.pt")
        sl = slice(r["lo"], r["hi"])
        torch.testing.assert_close(r["out"], y.detach()[:, sl], rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(r["dx"], x.grad[:, sl], rtol=1e-9, atol=1e-9)


def test_sequence_parallel_module_rejects_relative_positions():
    with pytest.raises(ValueError, match="sequence_parallel_group"):
        linattn.nn.MultiheadLinearAttention(8, 2, max_len=4, sequence_parallel_group=object())


def test_failing_rank_makes_the_others_exit(tmp_path):
    procs = _launch(2, tmp_path, T=8, causal=True, seed=0, fail_rank=1, timeout=20)
    errs = [p.communicate(timeout=120)[1] for p in procs]  # a hang would time out here
    assert [p.returncode != 0 for p in procs] == [True, True]
    assert "failed on purpose" in errs[1]
    assert "Error" in errs[0]  # the survivor reports the broken collective, then exits
    assert not (tmp_path / "r0.pt").exists()


def test_needs_an_initialised_group():
    q = torch.randn(1, 4, 2)
    with pytest.raises(RuntimeError, match="not initialised"):
        sequence_parallel_linear_attention(q, q, q)


if __name__ == "__main__":
    _rank(json.loads(sys.argv[1]))
