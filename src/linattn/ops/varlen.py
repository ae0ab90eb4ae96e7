"""Variable-length packed batches (``cu_seqlens``), as flash-linear-attention takes them.

N sequences of lengths L_n are concatenated along time into one batch row: q (1, ..., T, K) with
T = Σ L_n and ``cu_seqlens = [0, L_0, L_0 + L_1, ..., T]``. The causal ops here run them as a
zero-padded batch (N, ..., max L_n, ·): padding *after* a sequence's last token cannot reach its
outputs (causality), and zero keys and values with a zero log-gate leave its state unchanged, so
the final state of row n is that of sequence n exactly. Each op calls :func:`packed` on its
inputs and :func:`unpacked` on its output.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["check_cu_seqlens", "packed", "unpacked"]


def check_cu_seqlens(cu_seqlens: object, q: Tensor) -> Tensor:
    """``cu_seqlens`` as an int64 tensor on q's device; TypeError/ValueError naming it unless a
    1-D integer tensor starting at 0, non-decreasing, ending at q's length, with q's batch
    dimension 1."""
    if not isinstance(cu_seqlens, Tensor):
        raise TypeError("cu_seqlens: expected an integer torch.Tensor, "
                        f"got {type(cu_seqlens).__name__}")
    if cu_seqlens.is_floating_point() or cu_seqlens.is_complex() or cu_seqlens.dtype == torch.bool:
        raise TypeError(f"cu_seqlens: expected an integer tensor, got {cu_seqlens.dtype}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError("cu_seqlens: expected shape (N + 1,) with N >= 1, "
                         f"got {tuple(cu_seqlens.shape)}")
    if q.dim() < 3 or q.shape[0] != 1:
        raise ValueError("cu_seqlens: packed sequences need a batch dimension of 1, "
                         f"got q of shape {tuple(q.shape)}")
    if cu_seqlens.is_meta != q.is_meta:
        raise ValueError(f"cu_seqlens: expected q's device ({q.device}), got "
                         f"{cu_seqlens.device}: a meta tensor has no values to read")
    cu = cu_seqlens.to(device=q.device, dtype=torch.long)
    T = q.shape[-2]
    if cu.is_meta:  # shapes only (a model on the meta device): no offsets to check
        return cu
    if cu[0].item() != 0 or cu[-1].item() != T or (cu[1:] < cu[:-1]).any():
        raise ValueError(f"cu_seqlens: expected non-decreasing offsets from 0 to T = {T}, "
                         f"got {cu_seqlens.tolist()}")
    return cu


def _index(cu: Tensor, T: int) -> tuple[Tensor, Tensor]:
    """Gather positions (N, Lmax) into the packed time axis and the keep mask (N, Lmax). On
    the meta device (no lengths to read) Lmax is T, the longest a sequence can be."""
    if cu.is_meta:
        N = cu.shape[0] - 1
        return (torch.empty(N, T, dtype=torch.long, device="meta"),
                torch.empty(N, T, dtype=torch.bool, device="meta"))
    lengths = cu[1:] - cu[:-1]
    L = int(lengths.max().item())
    t = torch.arange(L, device=cu.device)
    keep = t < lengths[:, None]
    idx = torch.where(keep, cu[:-1, None] + t, torch.zeros((), dtype=torch.long, device=cu.device))
    return idx, keep


def packed(xs: list[Tensor | None], cu: Tensor) -> tuple[list[Tensor | None], Tensor]:
    """Packed tensors (1, ..., T, F) or gates (1, ..., T) -> zero-padded (N, ..., Lmax[, F]).

    ``xs[0]`` must be a (1, ..., T, F) tensor: an entry with one dimension less is a gate.
    None entries stay None. Returns the padded list and the keep mask (N, Lmax), True on real
    tokens."""
    idx, keep = _index(cu, xs[0].shape[-2])
    N, L = idx.shape
    out: list[Tensor | None] = []
    for x in xs:
        if x is None:
            out.append(None)
            continue
        gate = x.dim() == xs[0].dim() - 1  # (1, ..., T): no feature dimension
        y = (x.unsqueeze(-1) if gate else x)[0]  # (..., T, F)
        y = y.index_select(-2, idx.reshape(-1)).unflatten(-2, (N, L))  # (..., N, L, F)
        y = y.movedim(-3, 0)  # (N, ..., L, F)
        mask = keep.reshape(N, *([1] * (y.dim() - 3)), L, 1)
        y = torch.where(mask, y, y.new_zeros(()))
        out.append(y.squeeze(-1) if gate else y)
    return out, keep


def unpacked(o: Tensor, cu: Tensor, keep: Tensor) -> Tensor:
    """The inverse of :func:`packed` for an output (N, ..., Lmax, F) -> (1, ..., T, F)."""
    N, L = keep.shape
    flat = o.movedim(0, -3).flatten(-3, -2)  # (..., N·L, F)
    if keep.is_meta:  # L = T there (_index): the T tokens' shape
        return flat.narrow(-2, 0, L).unsqueeze(0)
    return flat.index_select(-2, keep.reshape(-1).nonzero().squeeze(-1)).unsqueeze(0)
