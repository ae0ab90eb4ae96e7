r"""The float64 reference of :func:`linattn.causal_conv1d`: a loop over the definition.

The ground truth of the tests: a Python loop over the tokens and taps by design; never call it
on a fast path. Standalone: torch only, nothing shared with the op it checks (SiLU is written
out, not torch's).
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.ops._reference_checks import inference_tensors_as_constants

__all__ = ["causal_conv1d"]


@inference_tensors_as_constants
def causal_conv1d(
    x: Tensor, weight: Tensor, bias: Tensor | None = None, *, activation: str | None = None,
    initial_state: Tensor | None = None, cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """``y[t, c] = act(bias[c] + Σ_{j<W} weight[c, j] · x[t − (W−1) + j, c])`` token by token in
    float64, the W − 1 inputs before a sequence's first token from its initial state (zeros
    without one); act the identity, or SiLU (``a / (1 + e^{−a})``) for "silu" / "swish".

    Arguments and shapes as :func:`linattn.ops.conv.op.causal_conv1d`. Returns (y, final
    states) as it does with ``return_state``, both float64."""
    f64 = torch.float64
    x, weight = x.to(f64), weight.to(f64)
    B, T, D = x.shape
    W = weight.shape[1]
    silu = activation in ("silu", "swish")
    if cu_seqlens is None:
        spans = [(b, 0, T) for b in range(B)]
    else:
        cu = [int(v) for v in cu_seqlens.tolist()]
        spans = [(0, cu[n], cu[n + 1]) for n in range(len(cu) - 1)]
    y = x.new_zeros(B, T, D)
    states = x.new_zeros(len(spans), D, W - 1)
    for n, (b, t0, t1) in enumerate(spans):
        # the sequence with its history in front: seq[W − 1 + t] is token t0 + t
        history = x.new_zeros(W - 1, D) if initial_state is None else initial_state[n].to(f64).T
        seq = torch.cat([history, x[b, t0:t1]], dim=0)
        for t in range(t1 - t0):
            acc = x.new_zeros(D) if bias is None else bias.to(f64).clone()
            for j in range(W):
                acc = acc + weight[:, j] * seq[t + j]
            y[b, t0 + t] = acc / (1 + torch.exp(-acc)) if silu else acc
        for k in range(W - 1):  # the last W − 1 entries of seq
            states[n, :, k] = seq[len(seq) - (W - 1) + k]
    return y, states
