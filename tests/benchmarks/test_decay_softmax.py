"""benchmarks/decay_softmax.py: its baseline is the same function as the op it is timed
against, and a tiny run prints a full table."""

from __future__ import annotations

import pytest
import torch

from linattn.nn.lm import default_decays
from linattn.ops.decay_softmax.op import decay_softmax_attention

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark("decay_softmax")


@pytest.mark.parametrize("T,S", [(20, 20), (7, 30)])
def test_baseline_is_the_same_function(bench, T, S):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, T, 8, generator=g)
    k, v = (torch.randn(2, 4, S, 8, generator=g) for _ in range(2))
    gamma = default_decays(4)
    torch.testing.assert_close(bench.float_bias_sdpa(q, k, v, gamma),
                               decay_softmax_attention(q, k, v, gamma, block_size=4),
                               rtol=1e-5, atol=1e-5)


def test_tiny_run_prints_every_row(bench, capsys):
    assert bench.main(["--lengths", "64", "--cache", "96", "--piece", "16", "--repeats", "1"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| f")]
    assert len(rows) == 4 and all(line.endswith("× |") for line in rows)
