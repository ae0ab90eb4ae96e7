"""The causal-conv1d package's names (Dao-AILab/causal-conv1d) on :mod:`linattn.ops.conv`;
gathered into :mod:`linattn.fla`.

The functions transformers' linear-attention layers call where the package is installed
(Mamba2, Qwen3-Next, Qwen3.5, OLMo-hybrid, Kimi-Linear, LFM2, ...), with its arguments, layout
(x (B, D, T), channel-major states (B, D, S)) and return convention:

* :func:`causal_conv1d_fn` — the prefill; ``seq_idx`` (B, T) keeps tokens of different
  sequence indices apart (each segment starts from zeros, as the package), and like the package
  it then takes no ``initial_states`` and returns no final state.
* :func:`causal_conv1d_update` — T ≥ 1 tokens in a row, ``conv_state`` (B, D, S ≥ W − 1)
  **updated in place**; ``cache_seqlens`` (a circular buffer) and ``conv_state_indices`` (the
  rows of a larger cache, as vLLM keeps it) are supported.

As every name of :mod:`linattn.fla`, unknown keyword arguments are accepted and ignored:
transformers passes its own keyword arguments through. Errors are one-line ValueError /
TypeError naming the argument (the package asserts or raises NotImplementedError for an
unknown activation).
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.ops._common import (
    check_flag,
    check_float_tensor,
    check_own_memory,
)
from linattn.ops._library import takes_inference_tensors
from linattn.ops.conv import op as conv_op
from linattn.ops.conv.op import check_activation

__all__ = ["causal_conv1d_fn", "causal_conv1d_update"]


def _tensor(x: object, name: str, ndims: tuple[int, ...], what: str) -> Tensor:
    check_float_tensor(x, name, dense=False)
    if x.dim() not in ndims:
        raise ValueError(f"{name}: expected shape {what}, got {tuple(x.shape)}")
    return x


def _index(x: object, name: str, shape: tuple[int, ...], device: torch.device) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected an integer torch.Tensor, got {type(x).__name__}")
    if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
        raise TypeError(f"{name}: expected an integer tensor, got {x.dtype}")
    if tuple(x.shape) != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {tuple(x.shape)}")
    if x.is_meta != (torch.device(device).type == "meta"):
        raise ValueError(f"{name}: expected a tensor on {device} (the inputs' device), got "
                         f"{x.device}: a meta tensor has no values to read")
    return x.to(device=device, dtype=torch.long)


@takes_inference_tensors(written=("final_states_out",))
def causal_conv1d_fn(x, weight, bias=None, seq_idx=None, initial_states=None,
                     return_final_states=False, final_states_out=None, activation=None,
                     **kwargs):
    """causal-conv1d's ``causal_conv1d_fn``: x (B, D, T), weight (D, W), bias (D,) or None,
    seq_idx (B, T) integer or None, initial_states (B, D, W − 1) or None, activation None /
    "silu" / "swish". Returns y (B, D, T) in x's dtype (a channel-last view: ``y.transpose(1,
    2)`` is contiguous), or (y, final_states (B, D, W − 1)) with ``return_final_states``
    (written into ``final_states_out`` when given, and that tensor returned). Other keyword
    arguments are ignored."""
    _tensor(x, "x", (3,), "(B, D, T)")
    xt = x.transpose(1, 2)  # (B, T, D): channel-last where x is a transposed projection
    B, T, D = xt.shape
    conv_op._weights(xt, weight, bias, D)
    silu = check_activation(activation)
    return_final_states = check_flag(return_final_states, "return_final_states")
    if seq_idx is not None:
        if initial_states is not None:
            raise ValueError("initial_states: must be None when seq_idx is given (as in "
                             "causal-conv1d)")
        if return_final_states:
            raise ValueError("return_final_states: must be False when seq_idx is given (as "
                             "in causal-conv1d)")
        seq = _index(seq_idx, "seq_idx", (B, T), x.device)
        return _with_seq_idx(xt, weight, bias, silu, seq).transpose(1, 2)
    W = weight.shape[1]
    S0 = conv_op._state(initial_states, "initial_states", (B, D, W - 1), xt)
    y, S = conv_op.prefill(xt, weight, bias, silu, S0, None)
    if not return_final_states:
        return y.transpose(1, 2)
    if final_states_out is not None:
        _tensor(final_states_out, "final_states_out", (3,), "(B, D, W - 1)")
        if tuple(final_states_out.shape) != (B, D, W - 1):
            raise ValueError(f"final_states_out: expected shape (B, D, W - 1) = "
                             f"{(B, D, W - 1)}, got {tuple(final_states_out.shape)}")
        check_own_memory(final_states_out, "final_states_out")
        final_states_out.copy_(S)
        S = final_states_out
    return y.transpose(1, 2), S


def _with_seq_idx(xt: Tensor, weight: Tensor, bias: Tensor | None, silu: bool, seq: Tensor
                  ) -> Tensor:
    """Tokens t − k and t mix only where seq[t − k] == seq[t] (the package's rule). Where each
    row's indices never decrease (packed sequences, as Mamba2 builds them) every run of equal
    indices is one sequence from zeros: the op's segments (the compiled kernel where it runs);
    else the masked sum, in torch."""
    B, T, D = xt.shape
    if xt.is_meta:  # shapes only: y is x's
        return torch.empty(B, T, D, dtype=xt.dtype, device="meta")
    if T == 0 or bool((seq[:, 1:] >= seq[:, :-1]).all()):
        starts = torch.ones(B, T, dtype=torch.bool, device=seq.device)
        starts[:, 1:] = seq[:, 1:] != seq[:, :-1]
        b, t0 = starts.nonzero(as_tuple=True)
        ends = torch.empty_like(t0)
        ends[:-1] = torch.where(b[1:] == b[:-1], t0[1:], T)
        ends[-1:] = T
        segs = torch.stack([b, t0, ends, torch.arange(len(b), device=seq.device)], dim=1)
        return conv_op.prefill(xt, weight, bias, silu, None, segs)[0]
    W = weight.shape[1]
    acc = torch.float64 if xt.dtype == torch.float64 else torch.float32
    xa = xt.to(acc)
    w = weight.to(acc)
    y = xa * w[:, W - 1]
    for j in range(W - 1):
        k = W - 1 - j  # tap j reads token t − k
        same = (seq[:, k:] == seq[:, :-k]).unsqueeze(-1) if k < T else None
        if same is None:
            continue
        y[:, k:] = y[:, k:] + torch.where(same, xa[:, :-k] * w[:, j], 0.0)
    if bias is not None:
        y = y + bias.to(acc)
    if silu:
        y = torch.nn.functional.silu(y)
    return y.to(xt.dtype)


@takes_inference_tensors(written=("conv_state",))
def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None,
                         conv_state_indices=None, **kwargs):
    """causal-conv1d's ``causal_conv1d_update``: x (B, D) or (B, D, T) (T tokens in a row),
    conv_state (B, D, S) with S ≥ W − 1 (the last inputs, oldest first) **updated in place**
    (shifted by T, x appended), weight (D, W), bias (D,) or None. Returns y of x's shape and
    dtype. ``conv_state_indices`` (B,) integers: the states are rows of a larger conv_state
    (N, D, S). ``cache_seqlens`` (B,) integers: each state is a circular buffer whose next
    column is ``cache_seqlens % S``. Other keyword arguments are ignored."""
    _tensor(x, "x", (2, 3), "(B, D) or (B, D, T)")
    if conv_state_indices is None and cache_seqlens is None and x.dim() == 2:
        fast = conv_op.lean_step(x, conv_state, weight, bias, activation, True)
        if fast is not None:
            return fast[0]
    _tensor(conv_state, "conv_state", (3,), "(B, D, S)")
    one = x.dim() == 2
    x3 = x.unsqueeze(-1) if one else x
    B, D, T = x3.shape
    W = conv_op._weights(x3.transpose(1, 2), weight, bias, D)
    silu = check_activation(activation)
    S = conv_state.shape[2]
    if conv_state.shape[1] != D or S < W - 1:
        raise ValueError(f"conv_state: expected shape (B, D, S) with D = {D}, S >= W - 1 = "
                         f"{W - 1}, got {tuple(conv_state.shape)}")
    check_own_memory(conv_state, "conv_state")  # updated in place
    if conv_state_indices is not None:
        idx = _index(conv_state_indices, "conv_state_indices", (B,), conv_state.device)
        if B and not idx.is_meta and (bool((idx < 0).any())
                                      or bool((idx >= conv_state.shape[0]).any())):
            raise ValueError(f"conv_state_indices: expected rows of conv_state in [0, "
                             f"{conv_state.shape[0]}), got {idx.tolist()}")
        if B > 1 and not idx.is_meta and torch.unique(idx).numel() < B:
            raise ValueError(f"conv_state_indices: a row of conv_state given twice, "
                             f"{idx.tolist()}: which update it keeps is undefined")
        rows = conv_state.index_select(0, idx)
        y = causal_conv1d_update(x, rows, weight, bias, activation, cache_seqlens)
        conv_state.index_copy_(0, idx, rows)
        return y
    if conv_state.shape[0] != B:
        raise ValueError(f"conv_state: expected {B} rows (x's batch), got shape "
                         f"{tuple(conv_state.shape)}")
    if cache_seqlens is not None:
        return _circular(x3, conv_state, weight, bias, silu, cache_seqlens, one)
    if T == 1:
        y, _ = conv_op.causal_conv1d_step(x3[..., 0], conv_state, weight, bias,
                                          activation=activation, inplace=True)
        return y if one else y.unsqueeze(-1)
    y = conv_op.prefill(x3.transpose(1, 2), weight, bias, silu,
                        conv_state[..., S - (W - 1):], None)[0]
    conv_state.copy_(torch.cat([conv_state, x3.to(conv_state.dtype)], dim=-1)[..., T:])
    return y.transpose(1, 2)


def _circular(x3: Tensor, conv_state: Tensor, weight: Tensor, bias: Tensor | None, silu: bool,
              cache_seqlens: object, one: bool) -> Tensor:
    """The package's circular buffer: the W − 1 columns before ``cache_seqlens % S`` are the
    history, the T new inputs are written from that column on (wrapping)."""
    B, D, T = x3.shape
    S = conv_state.shape[2]
    W = weight.shape[1]
    pos = _index(cache_seqlens, "cache_seqlens", (B,), conv_state.device)
    back = torch.arange(-(W - 1), 0, device=pos.device)
    hist_idx = torch.remainder(pos[:, None] + back, max(S, 1))
    history = conv_state.gather(2, hist_idx[:, None, :].expand(B, D, W - 1))
    y = conv_op.prefill(x3.transpose(1, 2), weight, bias, silu, history, None)[0]
    if S > 0:
        put = torch.remainder(pos[:, None] + torch.arange(T, device=pos.device), S)
        conv_state.scatter_(2, put[:, None, :].expand(B, D, T), x3.to(conv_state.dtype))
    y = y.transpose(1, 2)
    return y[..., 0] if one else y
