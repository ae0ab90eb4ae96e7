"""The torch forms of the short causal convolution: every device, every floating dtype,
differentiable (the ``portable`` backend, and what the compiled ops compute where no C compiler
is available)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from linattn.ops._common import accumulation_dtype

__all__ = ["torch_prefill", "torch_step"]


def _rows(x: Tensor, weight: Tensor, bias: Tensor | None, silu: bool, S0: Tensor | None
          ) -> tuple[Tensor, Tensor]:
    """Each row of x (B, T, D) one sequence, from S0 (B, D, W − 1) or zeros: W shifted
    products of the history-padded sequence (channel-last, as the data lies: no transposes)."""
    B, T, D = x.shape
    W = weight.shape[1]
    acc = accumulation_dtype(x.dtype)
    if S0 is None:
        history = x.new_zeros(B, W - 1, D, dtype=acc)
    else:
        history = S0.to(acc).transpose(1, 2)
    xx = torch.cat([history, x.to(acc)], dim=1)  # (B, W − 1 + T, D): token t at W − 1 + t
    w = weight.to(acc)
    y = xx[:, W - 1:] * w[:, W - 1]
    for j in range(W - 1):
        y = y + xx[:, j:j + T] * w[:, j]
    if bias is not None:
        y = y + bias.to(acc)
    if silu:
        y = F.silu(y)
    S = xx[:, xx.shape[1] - (W - 1):].transpose(1, 2).to(x.dtype)
    return y.to(x.dtype), S.contiguous()


def torch_prefill(x: Tensor, weight: Tensor, bias: Tensor | None, silu: bool,
                  S0: Tensor | None, segs: Tensor | None) -> tuple[Tensor, Tensor]:
    """x (B, T, D), weight (D, W), bias (D,) or None; without ``segs`` each row a sequence
    from S0[b] (S0 (B, D, W − 1) or None: zeros); with ``segs`` (N, 4) rows (b, t0, t1, n),
    tokens [t0, t1) of row b one sequence from S0[n] (in the order of the tokens, covering
    them all). Returns y (B, T, D) in x's dtype and the final states (B or N, D, W − 1), x's
    dtype."""
    if segs is None:
        return _rows(x, weight, bias, silu, S0)
    B, T, D = x.shape
    if segs.is_meta:  # shapes only: y is x's, a state per sequence
        return (torch.empty(B, T, D, dtype=x.dtype, device="meta"),
                torch.empty(segs.shape[0], D, weight.shape[1] - 1, dtype=x.dtype,
                            device="meta"))
    pieces, states = [], []
    for b, t0, t1, n in segs.tolist():
        y, S = _rows(x[b:b + 1, t0:t1], weight, bias, silu,
                     None if S0 is None else S0[n:n + 1])
        pieces.append(y[0])
        states.append(S)
    y = torch.cat(pieces, dim=0).view(B, T, D) if pieces else x.new_empty(B, T, D)
    W = weight.shape[1]
    S = torch.cat(states, dim=0) if states else x.new_empty(0, D, W - 1)
    return y, S


def torch_step(x_t: Tensor, state: Tensor, weight: Tensor, bias: Tensor | None, silu: bool
               ) -> tuple[Tensor, Tensor]:
    """One token: x_t (B, D), state (B, D, S) with S ≥ W − 1. Returns y (B, D) in x_t's
    dtype and the new state (the old one shifted left by one, x_t appended; state's dtype)."""
    S_len = state.shape[-1]
    W = weight.shape[1]
    acc = accumulation_dtype(x_t.dtype)
    window = torch.cat([state[..., S_len - (W - 1):].to(acc), x_t.to(acc).unsqueeze(-1)], -1)
    y = (window * weight.to(acc)).sum(-1)
    if bias is not None:
        y = y + bias.to(acc)
    if silu:
        y = F.silu(y)
    if S_len == 0:
        new = state.clone()
    else:
        new = torch.cat([state[..., 1:], x_t.unsqueeze(-1).to(state.dtype)], dim=-1)
    return y.to(x_t.dtype), new
