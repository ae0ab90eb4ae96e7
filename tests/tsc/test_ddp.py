"""Data-parallel FordA training: ``torchrun --nproc_per_node 2 -m linattn forda train`` on
gloo reaches the weights of the single-process run (dropout off, same global batches). FordA
comes from ``../shared/data/FordA`` where it exists, else from the subset committed under
``tests/data/FordA``."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sklearn")  # the forda extra
pytest.importorskip("safetensors")

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data" / "FordA"
DATA = SHARED if SHARED.is_dir() else ROOT / "tests" / "data" / "FordA"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(out: Path, nproc: int) -> subprocess.CompletedProcess:
    # 64 series in batches of 32: two optimiser steps per epoch, each split over the ranks
    args = ["forda", "train", "--subset", "64", "--epochs", "2", "--stages", "full",
            "--set", "dropout=0", "--set", "batch_size=32", "--out", str(out), "--data-dir",
            str(DATA), "--threads", "1", "--quiet"]
    if nproc == 1:
        cmd = [sys.executable, "-m", "linattn", *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
               "--master_addr", "127.0.0.1", "--master_port", str(_port()), "-m", "linattn",
               *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)


def test_two_ranks_match_one_process(tmp_path):
    from safetensors.torch import load_file

    one, two = _train(tmp_path / "one", 1), _train(tmp_path / "two", 2)
    assert one.returncode == 0, one.stderr[-2000:]
    assert two.returncode == 0, two.stderr[-2000:]
    assert two.stdout.count("TEST macro F1") == 1  # rank 0 alone reports
    a = load_file(str(tmp_path / "one" / "model" / "model.safetensors"))
    b = load_file(str(tmp_path / "two" / "model" / "model.safetensors"))
    assert a.keys() == b.keys()
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst < 1e-5, worst
    lines = (tmp_path / "two" / "full" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2  # one line per epoch, written once


@pytest.mark.parametrize("device,env,want", [
    ("cuda", {"WORLD_SIZE": "2", "LOCAL_RANK": "1"}, "cuda:1"),
    ("CUDA", {"WORLD_SIZE": "4", "LOCAL_RANK": "3"}, "cuda:3"),
    ("cuda:0", {"WORLD_SIZE": "2", "LOCAL_RANK": "1"}, "cuda:0"),  # an explicit index is kept
    ("cpu", {"WORLD_SIZE": "2", "LOCAL_RANK": "1"}, "cpu"),
    ("cuda", {}, "cuda"),  # not under torchrun
    ("cuda", {"WORLD_SIZE": "1", "LOCAL_RANK": "0"}, "cuda"),
])
def test_each_rank_gets_its_own_gpu(device, env, want):
    from linattn.cli.forda import process_group_backend, rank_device

    assert rank_device(device, env) == want
    assert process_group_backend(want) == ("nccl" if want.lower().startswith("cuda") else "gloo")
