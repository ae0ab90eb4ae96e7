r"""The short causal depthwise convolution of linear-attention layers (Mamba2, Gated DeltaNet in
Qwen3-Next and Qwen3.5, Kimi Delta Attention, LFM2's short convolutions).

For each channel c, with W taps and the W − 1 inputs before the first token from an initial
state (zeros without one):

.. math::
    y_{t,c} = \mathrm{act}\Big(b_c + \sum_{j<W} w_{c,j}\, x_{t-(W-1)+j,\,c}\Big),

act the identity or SiLU. Sums are float32 (float64 for float64 inputs), rounded once to x's
dtype. The state of a sequence is its last W − 1 inputs, channel-major (N, D, W − 1) as the
causal-conv1d package and transformers' caches keep it; a decoding step shifts it by one.

* :func:`causal_conv1d` — the whole sequence (prefill), x (B, T, D), any strides: a (B, D, T)
  tensor transposed, the layout those layers compute, is read in place.
* :func:`causal_conv1d_step` — one token.
* :func:`linattn.reference.causal_conv1d` — the float64 loop.

Backends (:mod:`linattn.ops.dispatch`, op "causal_conv1d", forms "prefill" and "step"): the
compiled kernels (:mod:`linattn.ops.conv.native`; CPU, float32 / bfloat16 / float16, no
gradient) and the torch form (:mod:`linattn.ops.conv.portable`; every device and dtype,
differentiable in x, the weights, the bias and the initial state).
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.ops import dispatch
from linattn.ops._common import (
    check_flag,
    check_float_tensor,
    check_own_memory,
    needs_grad,
    shares_memory,
)
from linattn.ops._library import takes_inference_tensors, tracing
from linattn.ops.conv import native as conv_native
from linattn.ops.conv.portable import torch_prefill, torch_step
from linattn.ops.dispatch import Choice
from linattn.ops.native import DTYPE_CODES, threads_for
from linattn.ops.varlen import check_cu_seqlens

__all__ = ["causal_conv1d", "causal_conv1d_step", "check_activation", "segments", "prefill",
           "OP"]

#: The op's name in the dispatcher; its forms are "prefill" and "step".
OP = "causal_conv1d"


# ------------------------------------------------------------------------------------ checks
def check_activation(activation: object) -> bool:
    """Whether ``activation`` asks for SiLU: None (identity), "silu" or "swish" (the same);
    anything else a TypeError / ValueError naming ``activation``."""
    if activation is None:
        return False
    if not isinstance(activation, str):
        raise TypeError(f"activation: expected None, 'silu' or 'swish', got "
                        f"{type(activation).__name__}")
    if activation not in ("silu", "swish"):
        raise ValueError(f"activation: expected None, 'silu' or 'swish', got {activation!r}")
    return True


def _tensor(t: object, name: str, ndim: int, what: str, like: Tensor | None = None) -> Tensor:
    """A floating-point tensor of ``ndim`` dimensions (``what`` names them), on ``like``'s
    device."""
    check_float_tensor(t, name)
    if t.dim() != ndim:
        raise ValueError(f"{name}: expected shape {what}, got {tuple(t.shape)}")
    if like is not None and t.device != like.device:
        raise ValueError(f"{name}: expected a tensor on {like.device}, got {t.device}")
    return t


def _weights(x: Tensor, weight: object, bias: object, D: int) -> int:
    """Check weight (D, W) with W ≥ 1 and bias (D,) or None; returns W."""
    _tensor(weight, "weight", 2, "(D, W)", x)
    if weight.shape[0] != D or weight.shape[1] < 1:
        raise ValueError(f"weight: expected shape (D, W) = ({D}, W) with W >= 1, got "
                         f"{tuple(weight.shape)}")
    if bias is not None:
        _tensor(bias, "bias", 1, f"(D,) = ({D},)", x)
        if bias.shape[0] != D:
            raise ValueError(f"bias: expected shape (D,) = ({D},), got {tuple(bias.shape)}")
    return weight.shape[1]


def _state(state: object, name: str, shape: tuple[int, ...], like: Tensor) -> Tensor | None:
    if state is None:
        return None
    _tensor(state, name, len(shape), str(shape), like)
    if tuple(state.shape) != shape:
        raise ValueError(f"{name}: expected shape (N, D, W - 1) = {shape}, got "
                         f"{tuple(state.shape)}")
    return state


def segments(cu: Tensor) -> Tensor:
    """The (N, 4) int64 rows (b, t0, t1, n) of the N sequences packed by checked cu_seqlens
    (batch row 0, state n): what the kernels and :func:`linattn.ops.conv.portable.torch_prefill`
    take."""
    N = cu.shape[0] - 1
    n = torch.arange(N, dtype=torch.long, device=cu.device)
    return torch.stack([torch.zeros_like(n), cu[:-1], cu[1:], n], dim=1)


# ------------------------------------------------------------------------------------ prefill
@takes_inference_tensors()
def causal_conv1d(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    *,
    activation: str | None = None,
    initial_state: Tensor | None = None,
    return_state: bool = False,
    cu_seqlens: Tensor | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """Short causal depthwise convolution over the tokens (module docstring for the maths).

    Args:
        x: (B, T, D), any strides; channel-last (contiguous channels) is the layout the
            compiled kernel reads in place, e.g. ``h.transpose(1, 2)`` of an h (B, D, T) that
            is a transposed (B, T, D) projection.
        weight: (D, W) taps, oldest first (``nn.Conv1d(D, D, W, groups=D).weight[:, 0]``).
        bias: (D,) or None.
        activation: None, or "silu" / "swish" (the same).
        initial_state: (B, D, W − 1), the W − 1 inputs before the first token (None: zeros);
            with ``cu_seqlens``, (N, D, W − 1), one per packed sequence.
        return_state: also return the final state.
        cu_seqlens: (N + 1,) cumulative lengths of N sequences packed along T (B = 1); each
            starts from its own initial state (or zeros), and none sees another's tokens.

    Returns:
        y (B, T, D) in x's dtype, contiguous; with ``return_state`` also the final state
        (B or N, D, W − 1) in x's dtype: each sequence's last W − 1 inputs (its initial state's
        last ones in front when it is shorter), a new tensor even at T = 0.
    """
    _tensor(x, "x", 3, "(B, T, D)")
    B, T, D = x.shape
    W = _weights(x, weight, bias, D)
    silu = check_activation(activation)
    return_state = check_flag(return_state, "return_state")
    segs = None
    if cu_seqlens is not None:
        if isinstance(cu_seqlens, Tensor) and B != 1:
            raise ValueError(f"cu_seqlens: packed sequences need batch size B = 1, got x of "
                             f"shape {tuple(x.shape)}; concatenate them to (1, sum of lengths, D)")
        cu = check_cu_seqlens(cu_seqlens, x)
        segs = segments(cu)
    N = B if segs is None else segs.shape[0]
    S0 = _state(initial_state, "initial_state", (N, D, W - 1), x)
    y, S = prefill(x, weight, bias, silu, S0, segs)
    return (y, S) if return_state else y


def prefill(x: Tensor, weight: Tensor, bias: Tensor | None, silu: bool, S0: Tensor | None,
            segs: Tensor | None) -> tuple[Tensor, Tensor]:
    """The chosen backend on checked arguments (see :func:`linattn.ops.conv.portable.
    torch_prefill` for ``segs``); what the public function and fla's front door call."""
    traced = tracing(x, weight, bias, S0)
    grad = needs_grad(x, weight, bias, S0)
    choice = dispatch.select(OP, "prefill", x.dtype, x.device.type, grad, (),
                             None if traced else x.shape[1], traced)
    if traced:
        return _prefill(choice, x, weight, bias, silu, S0, segs)
    with conv_native.one_thread(x):
        return _prefill(choice, x, weight, bias, silu, S0, segs)


def _prefill(choice: Choice, x, weight, bias, silu, S0, segs) -> tuple[Tensor, Tensor]:
    if choice.backend == "native":
        return conv_native.conv_prefill_native(x, weight, bias, S0, segs, silu, choice.isa)
    return torch_prefill(x, weight, bias, silu, S0, segs)


# --------------------------------------------------------------------------------------- step
@takes_inference_tensors(written_if_inplace=("state",))
def causal_conv1d_step(
    x_t: Tensor,
    state: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    *,
    activation: str | None = None,
    inplace: bool = False,
) -> tuple[Tensor, Tensor]:
    """One decoding step: x_t (B, D), state (B, D, S) with S ≥ W − 1 (the last inputs, oldest
    first; any floating dtype), weight (D, W), bias (D,) or None.

    ``y_t = act(bias + Σ_{j<W−1} weight[:, j] · state[..., S − (W−1) + j] + weight[:, W−1] ·
    x_t)``; the new state is the old one shifted left by one with x_t appended (in the state's
    dtype). Returns (y_t (B, D) in x_t's dtype, the new state). With ``inplace=True`` the new
    state is written into ``state``, which is returned (no new tensor per token: the cache of
    a model, as causal-conv1d's ``causal_conv1d_update``)."""
    fast = lean_step(x_t, state, weight, bias, activation, inplace)
    if fast is not None:
        return fast
    _tensor(x_t, "x_t", 2, "(B, D)")
    B, D = x_t.shape
    W = _weights(x_t, weight, bias, D)
    silu = check_activation(activation)
    inplace = check_flag(inplace, "inplace")
    _tensor(state, "state", 3, "(B, D, S)", x_t)
    if tuple(state.shape[:2]) != (B, D) or state.shape[2] < W - 1:
        raise ValueError(f"state: expected shape (B, D, S) = ({B}, {D}, S) with S >= W - 1 = "
                         f"{W - 1}, got {tuple(state.shape)}")
    if inplace:
        check_own_memory(state, "state")
    traced = tracing(x_t, state, weight, bias)
    grad = needs_grad(x_t, state, weight, bias)
    choice = dispatch.select(OP, "step", x_t.dtype, x_t.device.type, grad, (), None, traced)
    if choice.backend == "native":
        y, new = conv_native.conv_step_native(x_t, state, weight, bias, silu, choice.isa)
    else:
        y, new = torch_step(x_t, state, weight, bias, silu)
    if inplace:
        state.copy_(new)
        return y, state
    return y, new


def lean_step(x_t: object, state: object, weight: object, bias: object, activation: object,
              inplace: object) -> tuple[Tensor, Tensor] | None:
    """The common decoding step, straight to the compiled kernel, or None when the call is
    anything else (then the full checks run, and they raise the errors): plain CPU tensors in
    float32 / bfloat16 / float16, x_t (B, D) with contiguous channels, state (B, D, S) with
    S ≥ W − 1 and weight (D, W) and bias (D,) of any strides, a known activation, a bool
    ``inplace``, no gradient wanted, not traced, and the dispatcher choosing the compiled
    backend. Each check is a comparison of attributes, each attribute read once: a model's
    step is ~10 µs of kernel at D = 6144, and the general checks would cost as much again."""
    T = Tensor
    if not (type(x_t) is T and type(state) is T and type(weight) is T
            and (bias is None or type(bias) is T) and (inplace is True or inplace is False)):
        return None
    if activation is None:
        silu = False
    elif activation == "silu" or activation == "swish":
        silu = True
    else:
        return None
    codes = DTYPE_CODES
    xdt, sdt, wdt = codes.get(x_t.dtype), codes.get(state.dtype), codes.get(weight.dtype)
    bdt = 0 if bias is None else codes.get(bias.dtype)
    if xdt is None or sdt is None or wdt is None or bdt is None:
        return None
    xs, ss, ws = x_t.shape, state.shape, weight.shape
    if not (len(xs) == 2 and len(ss) == 3 and len(ws) == 2):
        return None
    B, D = xs
    width, slen = ws[1], ss[2]
    if not (ss[0] == B and ss[1] == D and ws[0] == D and width >= 1 and slen >= width - 1
            and (bias is None or bias.shape == ws[:1])):
        return None
    if not (x_t.is_cpu and state.is_cpu and weight.is_cpu and (bias is None or bias.is_cpu)
            and (x_t.stride(1) == 1 or D <= 1)):
        return None
    if tracing() or (torch.is_grad_enabled() and (
            x_t.requires_grad or state.requires_grad or weight.requires_grad
            or (bias is not None and bias.requires_grad))):
        return None
    if inplace and (shares_memory(state) or (state.is_inference()  # the full checks refuse
                                             and not torch.is_inference_mode_enabled())):
        return None
    fns = dispatch.step_kernels(OP, x_t.dtype, conv_native.kernels_here)
    if fns is None:
        return None
    y = torch.empty(xs, dtype=x_t.dtype)
    out = state if inplace else torch.empty(ss, dtype=state.dtype)
    if B > 1 and threads_for(B * D * width, B, conv_native.PARALLEL_MIN) > 1:
        rc = conv_native.step_into(fns, x_t, state, out, y, weight, bias, silu)
    else:  # one call on this thread: the struct built here, from each attribute read once
        sib, sic, sik = state.stride()
        sob, soc, sok = out.stride()
        wd, wj = weight.stride()
        rc = fns["conv_step"](
            x=x_t.data_ptr(), xb=x_t.stride(0), xdt=xdt, y=y.data_ptr(), yb=D, ydt=xdt, B=B,
            D=D, width=width, slen=slen, w=weight.data_ptr(), wd=wd, wj=wj, wdt=wdt,
            bias=None if bias is None else bias.data_ptr(),
            bs=0 if bias is None else bias.stride(0), bdt=bdt, act=1 if silu else 0,
            si=state.data_ptr(), sib=sib, sic=sic, sik=sik, so=out.data_ptr(), sob=sob,
            soc=soc, sok=sok, sdt=sdt)
    if rc:
        return None
    return y, out


# ------------------------------------------------------------------------------- backends
dispatch.register_compiled(OP, conv_native.unavailable)

#: The calibration problems, float32, W = 4, SiLU, a bias: a prefill of (1, 512, 2048) and
#: 10 decoding steps of (1, 2048) with a state of 4 (transformers' caches), a few ms in all.
CALIBRATION = {"prefill": (512, 2048), "step": (1, 2048)}


def _problem(form: str, sizes: tuple[int, int], gen: torch.Generator):
    T, D = sizes
    f32 = torch.float32
    weight = torch.randn(D, 4, generator=gen, dtype=f32) * 0.5
    bias = torch.randn(D, generator=gen, dtype=f32)
    if form == "prefill":
        x = torch.randn(1, T, D, generator=gen, dtype=f32)  # channel-last, as models

        def run(choice: Choice):
            return lambda: _prefill(choice, x, weight, bias, True, None, None)
        return run
    x = torch.randn(1, D, generator=gen, dtype=f32)
    state = torch.randn(1, D, 4, generator=gen, dtype=f32)
    return dispatch.decoding_steps(
        lambda isa: conv_native.conv_step_native(x, state, weight, bias, True, isa),
        lambda: torch_step(x, state, weight, bias, True))


dispatch.register_problems(OP, CALIBRATION, _problem)
