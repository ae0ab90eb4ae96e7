"""benchmarks/walk.py, and the target it prints (issue 50): a compiled linear_attention call
walks from op.py to its C kernel through at most 6 files, none of them twice."""

from __future__ import annotations

import pytest
import torch

import linattn
from linattn.ops import dispatch
from linattn.ops.linear import passes

pytestmark = [pytest.mark.usefixtures("single_thread"),
              pytest.mark.skipif(passes.kernels() is None,
                                 reason=f"compiled path: {passes.unavailable()}")]


@pytest.mark.parametrize("is_causal", [False, True])
def test_the_walk_to_the_kernel_is_six_files_none_twice(load_benchmark, is_causal):
    walk = load_benchmark("walk")
    q, k, v = (torch.randn(1, 2, 64, 16) for _ in range(3))

    def call():
        linattn.linear_attention(q, k, v, is_causal=is_causal)

    with dispatch.use(impl="native"), torch.no_grad():
        call()
        walks, ran = walk.trace(call)
    assert walks == [("ops/linear/op.py", "ops/linear/native.py", "ops/_library.py",
                      "ops/linear/passes.py", "ops/native/abi.py", "kernels.c")]
    assert "ops/_common.py" in ran and "ops/dispatch.py" in ran
