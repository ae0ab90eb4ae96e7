r"""The gated RMSNorm at the output of linear-attention layers (Gated DeltaNet in Qwen3-Next and
Qwen3.5, Kimi Delta Attention, Mamba2, Falcon-H1; fla's ``FusedRMSNormGated``).

With ``rmsnorm(z) = z / sqrt(mean(z²) + eps)`` over the last dimension, or over each group of
``group_size`` channels of it:

.. math::
    y = \mathrm{rmsnorm}(x) \cdot w \cdot \mathrm{act}(g)\ \text{(norm before gate)}, \qquad
    y = \mathrm{rmsnorm}(x \cdot \mathrm{act}(g)) \cdot w\ \text{(gate before norm)},

act SiLU or the sigmoid. Computed in float32 (float64 for float64 inputs), rounded once to x's
dtype.

Backends (:mod:`linattn.ops.dispatch`, op "rms_norm_gated", forms "prefill" — many rows — and
"step" — a decoding step's few): the compiled kernel (:mod:`linattn.ops.norm.native`; CPU,
float32 / bfloat16 / float16, no gradient) and the torch form (:mod:`linattn.ops.norm.portable`;
every device and dtype, differentiable in x, the gate and the weight).
"""

from __future__ import annotations

import numbers

import torch
from torch import Tensor

from linattn._config import F32_MAX
from linattn.ops import dispatch
from linattn.ops._common import (
    check_eps,
    check_flag,
    check_float_tensor,
    is_bool,
    needs_grad,
    shown,
)
from linattn.ops._library import takes_inference_tensors, tracing
from linattn.ops.dispatch import Choice
from linattn.ops.native import DTYPE_CODES, scratch
from linattn.ops.norm import native as norm_native
from linattn.ops.norm.portable import torch_norm

__all__ = ["rms_norm_gated", "check_norm_activation", "OP", "STEP_MAX"]

#: The op's name in the dispatcher; its forms are "prefill" and "step".
OP = "rms_norm_gated"
#: A call of at most this many elements is a decoding step's ("step" form; lean path).
STEP_MAX = 1 << 14


def check_norm_activation(activation: object) -> bool:
    """Whether ``activation`` is the sigmoid ("sigmoid") rather than SiLU ("silu", "swish");
    anything else a TypeError / ValueError naming ``activation``."""
    if not isinstance(activation, str):
        raise TypeError(f"activation: expected 'silu', 'swish' or 'sigmoid', got "
                        f"{type(activation).__name__}")
    if activation not in ("silu", "swish", "sigmoid"):
        raise ValueError(f"activation: expected 'silu', 'swish' or 'sigmoid', got "
                         f"{activation!r}")
    return activation == "sigmoid"


@takes_inference_tensors()
def rms_norm_gated(
    x: Tensor,
    gate: Tensor | None,
    weight: Tensor | None = None,
    *,
    eps: float = 1e-6,
    activation: str = "silu",
    group_size: int | None = None,
    norm_before_gate: bool = True,
) -> Tensor:
    """Gated RMSNorm (module docstring for the maths).

    Args:
        x: (..., D), D ≥ 1.
        gate: (..., D) (any floating dtype), or None: a plain RMSNorm.
        weight: (D,) or None (no scale).
        eps: added to the mean square; a finite number ≥ 0 (at most float32's largest for
            inputs other than float64). An all-zero group gives zeros, also with eps = 0.
        activation: "silu" / "swish" (the same) or "sigmoid".
        group_size: the norm over groups of this many channels (a divisor of D); None: D.
        norm_before_gate: True: ``rmsnorm(x)·w·act(g)`` (Qwen3-Next, Qwen3.5, Kimi, fla);
            False: ``rmsnorm(x·act(g))·w`` (Mamba2, Falcon-H1).

    Returns:
        y (..., D) in x's dtype (contiguous on the compiled path).
    """
    fast = _lean(x, gate, weight, eps, activation, group_size, norm_before_gate)
    if fast is not None:
        return fast
    check_float_tensor(x, "x")
    if x.dim() < 1 or x.shape[-1] < 1:
        raise ValueError(f"x: expected shape (..., D) with D >= 1, got {tuple(x.shape)}")
    D = x.shape[-1]
    if gate is not None:
        check_float_tensor(gate, "gate")
        if gate.shape != x.shape:
            raise ValueError(f"gate: expected x's shape {tuple(x.shape)}, got "
                             f"{tuple(gate.shape)}")
        if gate.device != x.device:
            raise ValueError(f"gate: expected a tensor on {x.device}, got {gate.device}")
    if weight is not None:
        check_float_tensor(weight, "weight")
        if tuple(weight.shape) != (D,):
            raise ValueError(f"weight: expected shape (D,) = ({D},), got {tuple(weight.shape)}")
        if weight.device != x.device:
            raise ValueError(f"weight: expected a tensor on {x.device}, got {weight.device}")
    eps = check_eps(eps)
    if eps > F32_MAX and x.dtype != torch.float64:
        raise ValueError(f"eps: {shown(eps)} is more than float32 (the accumulation dtype of "
                         f"{x.dtype} inputs) holds ({F32_MAX:.8g}): every output would be 0")
    sigmoid = check_norm_activation(activation)
    G = _group(group_size, D)
    before = check_flag(norm_before_gate, "norm_before_gate")
    traced = tracing(x, gate, weight)
    grad = needs_grad(x, gate, weight)
    form = "step" if x.numel() <= STEP_MAX else "prefill"
    choice = dispatch.select(OP, form, x.dtype, x.device.type, grad, (), None, traced)
    if traced:
        return _run(choice, x, gate, weight, eps, sigmoid, G, before)
    with norm_native.one_thread(x):
        return _run(choice, x, gate, weight, eps, sigmoid, G, before)


def _group(group_size: object, D: int) -> int:
    if group_size is None:
        return D
    if is_bool(group_size) or not isinstance(group_size, numbers.Integral) or group_size < 1:
        raise ValueError(f"group_size: expected a positive integer or None, got "
                         f"{shown(group_size)}")
    if D % group_size:
        raise ValueError(f"group_size: expected a divisor of D = {D}, got {group_size}")
    return int(group_size)


def _run(choice: Choice, x, gate, weight, eps, sigmoid, G, before) -> Tensor:
    if choice.backend == "native":
        return norm_native.rms_norm_native(x, gate, weight, eps, sigmoid, G, before, choice.isa)
    return torch_norm(x, gate, weight, eps, sigmoid, G, before)


def _lean(x: object, gate: object, weight: object, eps: object, activation: object,
          group_size: object, norm_before_gate: object) -> Tensor | None:
    """A decoding step's call (at most :data:`STEP_MAX` elements), straight to the compiled
    kernel, or None when the call is anything else (the full checks then run and raise the
    errors): plain CPU tensors in float32 / bfloat16 / float16, x and the gate (..., D) of one
    shape, row-major with contiguous rows, weight (D,) contiguous or None, a float eps ≥ 0,
    a known activation, no groups, a bool flag, no gradient, not traced, and the dispatcher
    choosing the compiled backend. Comparisons of attributes only: the kernel itself takes
    ~1 µs at 16 rows of 128."""
    T = Tensor
    if not (type(x) is T and type(gate) is T and (weight is None or type(weight) is T)
            and group_size is None and (norm_before_gate is True or norm_before_gate is False)
            and type(eps) is float and 0 <= eps <= F32_MAX):
        return None
    if activation == "silu" or activation == "swish":
        sigmoid = False
    elif activation == "sigmoid":
        sigmoid = True
    else:
        return None
    codes = DTYPE_CODES
    if not (x.dtype in codes and gate.dtype in codes and (weight is None or weight.dtype in codes)):
        return None
    shape = x.shape
    if not (shape and shape[-1] and gate.shape == shape and x.numel() <= STEP_MAX
            and (weight is None or (weight.shape == shape[-1:] and weight.is_contiguous()))
            and x.is_contiguous() and gate.is_contiguous()
            and x.is_cpu and gate.is_cpu and (weight is None or weight.is_cpu)):
        return None
    if tracing() or (torch.is_grad_enabled() and (
            x.requires_grad or gate.requires_grad
            or (weight is not None and weight.requires_grad))):
        return None
    fns = dispatch.step_kernels(OP, x.dtype, norm_native.kernels_here)
    if fns is None:
        return None
    D = shape[-1]
    R = x.numel() // D
    y = torch.empty(shape, dtype=x.dtype)
    # (contiguous x, gate and y: rows of D, one call on this thread at this size)
    xdt = codes[x.dtype]
    if fns["norm_forward"](
            x=x.data_ptr(), xr=D, xdt=xdt, g=gate.data_ptr(), gr=D, gdt=codes[gate.dtype],
            y=y.data_ptr(), yr=D, ydt=xdt, w=None if weight is None else weight.data_ptr(),
            wdt=0 if weight is None else codes[weight.dtype], R=R, D=D, G=D, eps=eps,
            act=1 if sigmoid else 0, before=1 if norm_before_gate else 0,
            work=scratch(fns["work"](D)).data_ptr()):
        return None
    return y


# ------------------------------------------------------------------------------- backends
dispatch.register_compiled(OP, norm_native.unavailable)

#: The calibration problems, float32, rows of 128 (a head), SiLU, norm before gate, a weight:
#: a prefill of 4096 rows and 10 decoding steps of 16 rows.
CALIBRATION = {"prefill": (4096, 128), "step": (16, 128)}


def _problem(form: str, sizes: tuple[int, int], gen: torch.Generator):
    R, D = sizes
    x, g = (torch.randn(R, D, generator=gen, dtype=torch.float32) for _ in range(2))
    w = torch.rand(D, generator=gen, dtype=torch.float32) + 0.5
    reps = 1 if form == "prefill" else 10

    def run(choice: Choice):
        def calls():
            for _ in range(reps):
                _run(choice, x, g, w, 1e-6, False, D, True)
        return calls
    return run


dispatch.register_problems(OP, CALIBRATION, _problem)
