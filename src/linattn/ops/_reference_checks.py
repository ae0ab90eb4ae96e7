"""Argument checks of the references (``linattn/ops/<op>/reference.py``), and of nothing else.

The references are the ground truth of the ops, so they share no code with them: a bug in a
helper that both sides call would cancel out of every comparison. Seven references take the
same q, k, v, ``eps`` and padding-mask arguments and must refuse bad ones with the same
one-line errors as their ops (the tests hold both to the messages); restating these ~80 lines
in each module would invite the copies to drift apart, so they live here once. The ops have
their own checks (:mod:`linattn.ops._common`); no op may import this module.

Only the arguments live here: each check raises TypeError/ValueError naming the argument, or
returns the checked value (a float, or γ as a tensor), and :func:`kept_keys` reads a padding
mask the one way the API defines. What is done with the keys that are kept — features,
similarity matrices, masks of the attention pattern, normalisers (the maths the references exist
to state) — is written in each reference.
Imports: torch and the standard library only.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["check_qkv", "check_eps", "check_scale", "check_padding_mask", "check_gamma",
           "kept_keys", "shown", "inference_tensors_as_constants"]


def _is_bool(x: object) -> bool:
    """A Python or a NumPy bool (np.bool_ is no numbers.Number; a Python bool is Integral)."""
    return isinstance(x, bool) or (type(x).__module__ == "numpy"
                                   and type(x).__name__ in ("bool_", "bool"))


def shown(x: object) -> str:
    """repr(x) on one short line: a huge integer by its size, a tensor of more than a few
    numbers by its range."""
    if isinstance(x, numbers.Integral) and not _is_bool(x) and abs(int(x)) >= 10 ** 60:
        return f"{'-' if x < 0 else ''}an integer of {abs(int(x)).bit_length()} bits"
    if isinstance(x, Tensor):
        if x.dim() <= 1 and x.numel() <= 8:
            return repr(x.tolist())
        if x.numel() and not x.is_complex():
            y = x.detach().double()
            return f"a tensor of shape {tuple(x.shape)} with values in [{y.min().item():g}, " \
                   f"{y.max().item():g}]"
        return f"a tensor of shape {tuple(x.shape)}"
    return repr(x)


def _float(x: numbers.Real) -> float:
    """float(x), with an integer too large for a float as inf (refused by every caller)."""
    try:
        return float(x)
    except OverflowError:
        return math.inf


def check_qkv(q: Tensor, k: Tensor, v: Tensor, *, same_length: bool) -> None:
    """q: (..., Tq, D), k: (..., Tk, D), v: (..., Tk, Dv) floating-point tensors of one dtype and
    device, D ≥ 1; ``same_length`` also asks Tq == Tk (causal attention)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.is_nested or t.layout != torch.strided:
            got = "a nested tensor" if t.is_nested else t.layout
            raise TypeError(f"{name}: expected a dense (strided) tensor, got {got}")
        if not t.is_floating_point():
            raise TypeError(f"{name}: expected a floating-point tensor, got {t.dtype}")
        if t.dim() < 2:
            raise ValueError(f"{name}: expected shape (..., T, D), got {tuple(t.shape)}")
    if q.shape[-1] == 0:
        raise ValueError(f"q: expected a head dimension D >= 1, got shape {tuple(q.shape)}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k, v: expected one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.device != q.device or v.device != q.device:
        raise ValueError(f"q, k, v: expected one device, got {q.device}, {k.device}, {v.device}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"k: last dimension {k.shape[-1]} does not match q's {q.shape[-1]} "
                         f"(q {tuple(q.shape)}, k {tuple(k.shape)})")
    if k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"v: shape {tuple(v.shape)} does not match k {tuple(k.shape)} before "
                         f"the last dimension")
    if q.shape[:-2] != k.shape[:-2]:
        raise ValueError(f"k: batch dimensions {tuple(k.shape[:-2])} do not match q's "
                         f"{tuple(q.shape[:-2])}")
    if same_length and q.shape[-2] != k.shape[-2]:
        raise ValueError(f"k: causal attention needs as many keys as queries, got {k.shape[-2]} "
                         f"keys for {q.shape[-2]} queries")


def check_eps(eps: object, name: str = "eps") -> float:
    """``eps`` as a float: TypeError unless a real number (bool refused), ValueError unless finite
    and ≥ 0. ``name`` is what the errors call it (a feature map's default names its map)."""
    if _is_bool(eps) or not isinstance(eps, numbers.Real):
        raise TypeError(f"{name}: expected a real number, got {type(eps).__name__}")
    value = _float(eps)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name}: expected a finite number >= 0, got {shown(eps)}")
    return value


def map_eps(eps: object, fmap: object) -> float:
    """``eps`` checked as :func:`check_eps` does, or where None the default of the feature map
    ``fmap`` (its ``eps``; the errors name the map)."""
    if eps is None:
        return check_eps(fmap.eps, f"eps (the default of {type(fmap).__name__})")
    return check_eps(eps)


def check_scale(scale: object, default: float, *, positive: bool = False) -> float:
    """``scale`` as a float (None: ``default``): TypeError unless a real number (bools
    refused), ValueError unless finite (and > 0 if ``positive``)."""
    if scale is None:
        return default
    if _is_bool(scale) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale: expected a real number or None, got {type(scale).__name__}")
    value = _float(scale)
    if not math.isfinite(value) or (positive and not value > 0):
        what = "positive number" if positive else "real number"
        raise ValueError(f"scale: expected a finite {what}, got {shown(scale)}")
    return value


def check_padding_mask(mask: object, x: Tensor, name: str, x_name: str) -> None:
    """A padding mask (True = padding) for x of shape (B, ..., T, D): a bool tensor of shape
    (B, T), or (T,) when x is (T, D). ``name``/``x_name`` are the arguments the errors name."""
    if not isinstance(mask, Tensor):
        raise TypeError(f"{name}: expected a bool tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(f"{name}: expected dtype torch.bool, got {mask.dtype}")
    T = x.shape[-2]
    expected = (T,) if x.dim() == 2 else (x.shape[0], T)
    if tuple(mask.shape) != expected:
        raise ValueError(f"{name}: expected shape {expected} for {x_name} of shape "
                         f"{tuple(x.shape)}, got {tuple(mask.shape)}")


def check_gamma(gamma: object, batch: tuple[int, ...], dtype: torch.dtype,
                device: torch.device) -> Tensor:
    """Decays γ as a tensor of shape ``batch`` in ``dtype`` on ``device``: TypeError naming
    ``gamma`` unless real numbers (a number, a tensor, a list or an array of them; bools and
    strings refused), ValueError outside [0, 1] (nan included) or when it does not broadcast
    to ``batch``."""
    def refused(what: str) -> TypeError:
        return TypeError(f"gamma: expected a number or a tensor of real numbers, got {what}")

    if _is_bool(gamma) or isinstance(gamma, (str, bytes)) or gamma is None:
        raise refused(type(gamma).__name__)
    if isinstance(gamma, numbers.Real) and not isinstance(gamma, Tensor):
        value = _float(gamma)
        if not 0 <= value <= 1:
            raise ValueError(f"gamma: expected decays in [0, 1], got {shown(gamma)}")
        g = torch.tensor(value, dtype=dtype, device=device)
    else:
        try:
            g = torch.as_tensor(gamma)
        except (TypeError, ValueError, RuntimeError, OverflowError):
            raise refused(type(gamma).__name__) from None
        if g.dtype == torch.bool or g.is_complex():
            raise refused(f"a tensor of {g.dtype}")
        g = g.to(dtype=dtype, device=device)
    if g.isnan().any() or (g < 0).any() or (g > 1).any():
        raise ValueError(f"gamma: expected decays in [0, 1], got {shown(gamma)}")
    try:
        return g.broadcast_to(batch)
    except RuntimeError:
        raise ValueError(f"gamma: shape {tuple(g.shape)} does not broadcast to the batch shape "
                         f"{batch}") from None


def kept_keys(key_padding_mask: Tensor | None, k: Tensor) -> Tensor:
    """Which keys take part, as a bool tensor that broadcasts against a (..., Tk) row of
    similarities: (Tk,) all True without a mask; else ``~key_padding_mask`` (True = padding in
    the argument) shaped (B, 1, …, 1, Tk), one axis fewer than k (the mask is checked first)."""
    Tk = k.shape[-2]
    if key_padding_mask is None:
        return torch.ones(Tk, dtype=torch.bool, device=k.device)
    kept = ~key_padding_mask.to(k.device)
    return kept.reshape(k.shape[0], *[1] * (k.dim() - 3), Tk) if k.dim() > 2 else kept


def inference_tensors_as_constants(fn: Callable) -> Callable:
    """Decorator of a reference: tensors made under ``torch.inference_mode`` among its
    arguments, beside arguments (or a feature map's parameters) that require grad, are taken as
    the constants they are (a clone: torch cannot save an inference tensor for backward). The
    ops do the same with their own helper (references share no code with the ops)."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        if torch.is_grad_enabled() and not torch.compiler.is_compiling():
            values = [*args, *kwargs.values()]
            if (any(isinstance(x, Tensor) and x.is_inference() for x in values)
                    and any(x.requires_grad if isinstance(x, Tensor)
                            else isinstance(x, torch.nn.Module)
                            and any(p.requires_grad for p in x.parameters())
                            for x in values)):
                args = tuple(x.clone() if isinstance(x, Tensor) and x.is_inference() else x
                             for x in args)
                kwargs = {k: x.clone() if isinstance(x, Tensor) and x.is_inference() else x
                          for k, x in kwargs.items()}
        return fn(*args, **kwargs)

    return call
