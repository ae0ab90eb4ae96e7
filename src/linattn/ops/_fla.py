"""flash-linear-attention's conventions, shared by every op's ``fla.py``: argument checks with
fla's names, fla's (B, T, H, ...) layout to linattn's head-first one and back, and a
token-by-token scan for the variants that have no chunked form here. See :mod:`linattn.fla`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import Tensor

from linattn.ops._common import (
    accumulation_dtype,
    all_finite,
    check_float_tensor,
    check_scale,
    is_bool,
    nonfinite,
)
from linattn.ops.varlen import check_cu_seqlens

# ----------------------------------------------------------------------------- validation


def _tensor(name: str, x: object, ndim: int) -> Tensor:
    check_float_tensor(x, name)
    if x.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(x.shape)}")
    return x


def _qkv(q: object, k: object, v: object, *, gva: bool = False) -> tuple[int, int, int, int, int]:
    """Check fla's q, k (B, T, H, K) and v (B, T, HV, V); HV == H unless ``gva`` (HV % H == 0).
    Returns B, T, H, HV, K."""
    q = _tensor("q", q, 4)
    k = _tensor("k", k, 4)
    v = _tensor("v", v, 4)
    B, T, H, K = q.shape
    if tuple(k.shape) != tuple(q.shape):
        raise ValueError(f"k: expected q's shape (B, T, H, K) = {tuple(q.shape)}, "
                         f"got {tuple(k.shape)}")
    if tuple(v.shape[:2]) != (B, T):
        raise ValueError(f"v: expected shape (B, T, H, V) with (B, T) = {(B, T)}, "
                         f"got {tuple(v.shape)}")
    HV = v.shape[2]
    if gva:
        if H == 0 or HV % H != 0:
            raise ValueError(f"v: its {HV} heads must be a multiple of q's {H} heads")
    elif HV != H:
        raise ValueError(f"v: expected {H} heads (B, T, H, V), got shape {tuple(v.shape)}")
    if K == 0:
        raise ValueError(f"q: expected a head dimension K >= 1, got shape {tuple(q.shape)}")
    return B, T, H, HV, K


def _gate(name: str, g: object, shape: tuple[int, ...]) -> Tensor | None:
    """A log-decay gate of exactly ``shape`` (or None): finite or −∞, ≤ 0."""
    if g is None:
        return None
    g = _tensor(name, g, len(shape))
    if tuple(g.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(g.shape)}")
    # one reduction (nan propagates through max): ~1.5 µs where isnan().any() and
    # (g > 0).any() took ~15, a decoding step's worth of the front door
    if g.numel() and not g.is_meta and not g.max().item() <= 0:
        raise ValueError(f"{name}: expected log decays <= 0 (the state is multiplied by "
                         f"exp({name})), got values in [{g.min().item():g}, {g.max().item():g}]")
    return g


def _beta(beta: object, B: int, T: int, H: int, V: int, *, per_value: bool,
          logits: bool = False) -> Tensor:
    """beta (B, T, H), or also (B, T, H, V) if ``per_value``: finite (nan or ±inf make every
    later output nan), or with ``logits`` (use_beta_sigmoid_in_kernel) not nan (a logit of ±inf
    is a sigmoid of 1 or 0)."""
    if not isinstance(beta, Tensor) or not beta.is_floating_point():
        raise TypeError(f"beta: expected a floating-point tensor, got "
                        f"{beta.dtype if isinstance(beta, Tensor) else type(beta).__name__}")
    ok = [(B, T, H)] + ([(B, T, H, V)] if per_value else [])
    if tuple(beta.shape) not in ok:
        want = " or ".join(str(s) for s in ok)
        raise ValueError(f"beta: expected shape {want}, got {tuple(beta.shape)}")
    if beta.is_meta:  # shapes only: no values to check
        return beta
    if logits:
        if beta.numel() and beta.isnan().any():
            raise ValueError("beta: expected logits that are not nan "
                             "(use_beta_sigmoid_in_kernel=True), got nan")
    elif not all_finite(beta):
        raise ValueError(f"beta: expected finite values, got {nonfinite(beta)}")
    return beta


def _scale(scale: object, K: int, *, positive: bool = False) -> float:
    """scale (None: ``K**-0.5``): a finite real number (NumPy numbers and one-element tensors
    taken, bools refused), > 0 if ``positive``."""
    if isinstance(scale, Tensor) and scale.numel() == 1 and scale.dtype != torch.bool:
        scale = scale.item()
    return check_scale(scale, K, positive=positive)


def _varlen(cu_seqlens: object, q: Tensor) -> Tensor | None:
    """cu_seqlens checked against fla-layout q (B must be 1), as an int64 tensor, or None."""
    if cu_seqlens is None:
        return None
    if isinstance(cu_seqlens, Tensor) and q.shape[0] != 1:
        raise ValueError(f"cu_seqlens: packed sequences need batch size B = 1, got q of shape "
                         f"{tuple(q.shape)}; flatten them to (1, sum of lengths, H, K)")
    return check_cu_seqlens(cu_seqlens, q.transpose(1, 2))


def _state(name: str, x: object, N: int, H: int, K: int, V: int,
           state_v_first: bool) -> Tensor | None:
    """An initial state (N, H, K, V) ((N, H, V, K) if ``state_v_first``) -> (N, H, K, V)."""
    if x is None:
        return None
    x = _tensor(name, x, 4)
    want = (N, H, V, K) if state_v_first else (N, H, K, V)
    if tuple(x.shape) != want:
        what = "(N, H, V, K)" if state_v_first else "(N, H, K, V)"
        raise ValueError(f"{name}: expected shape {what} = {want}, got {tuple(x.shape)}")
    return x.transpose(-1, -2) if state_v_first else x


def _sequences(cu_seqlens: object, q: Tensor, initial_state: object, H: int, K: int, V: int,
               state_v_first: bool) -> tuple[Tensor | None, Tensor | None]:
    """The checked ``cu_seqlens`` (:func:`_varlen`) and the initial state of its N sequences
    (N = B without it; :func:`_state`), as (N, H, K, V)."""
    cu = _varlen(cu_seqlens, q)
    N = q.shape[0] if cu is None else len(cu) - 1
    return cu, _state("initial_state", initial_state, N, H, K, V, state_v_first)


def _flag(name: str, x: object) -> bool:
    """A Python or NumPy bool; never a number (docs/design.md, "Scalars and flags")."""
    if is_bool(x):
        return bool(x)
    raise ValueError(f"{name}: expected a bool, got {x!r}")


def _kwargs(fn: str, kwargs: dict, allowed: tuple[str, ...] = ()) -> dict:
    """fla's extra keyword arguments, which every function takes (``**kwargs``): the ones in
    ``allowed`` (and ``transpose_state_layout``, fla's deprecated name of state_v_first) are
    returned; any other name is ignored, as fla ignores it, because callers such as
    transformers' linear-attention layers pass their own keyword arguments through
    (``use_cache``, ``position_ids``, ...). One exception: ``head_first`` (removed in fla, which
    now ignores it) is a ValueError, because ignoring it would silently read (B, H, T, ...)
    inputs as (B, T, H, ...)."""
    if "head_first" in kwargs:
        raise ValueError("head_first: removed (in fla too); inputs are (B, T, H, ...)")
    keep = (*allowed, "transpose_state_layout")
    return {name: value for name, value in kwargs.items() if name in keep}


def _state_v_first(state_v_first: object, kwargs: dict) -> bool:
    if "transpose_state_layout" in kwargs:
        if state_v_first:
            raise ValueError("transpose_state_layout: cannot be passed with state_v_first "
                             "(its new name)")
        warnings.warn("transpose_state_layout is deprecated (in fla too); use state_v_first",
                      DeprecationWarning, stacklevel=3)
        state_v_first = kwargs.pop("transpose_state_layout")
    return _flag("state_v_first", state_v_first)


def _no_cp(cp_context: object) -> None:
    if cp_context is not None:
        raise NotImplementedError("cp_context: context parallelism is not supported by linattn.fla")


# ----------------------------------------------------------------------------- layout helpers


def _one_token_each(T: int, cu: Tensor | None) -> bool:
    """Whether every sequence is one token: T = 1, or checked ``cu_seqlens`` 0, 1, ..., T
    (a packed batch of decoding steps, as a server sends them)."""
    if cu is None:
        return T == 1
    return T > 0 and cu.numel() == T + 1 and bool(torch.equal(cu, torch.arange(T + 1)))


def _hf(x: Tensor | None) -> Tensor | None:
    """fla layout (B, T, H, ...) -> head-first (B, H, T, ...)."""
    return None if x is None else x.transpose(1, 2)


def _flip_time(xs: list[Tensor | None]) -> list[Tensor | None]:
    return [None if x is None else x.flip(1) for x in xs]


def _reversed_cu(cu: Tensor) -> Tensor:
    """Offsets of the packed batch flipped in time: sequence order and each sequence reversed."""
    return (cu[-1] - cu).flip(0)


def _finish(o: Tensor, S: Tensor, output_final_state: bool, state_v_first: bool,
            ) -> tuple[Tensor, Tensor | None]:
    """Head-first o -> fla layout; the state in fla's layout or None."""
    o = o.transpose(1, 2)
    if not output_final_state:
        return o, None
    return o, (S.transpose(-1, -2).contiguous() if state_v_first else S)


def _scan(step: Callable, q: Tensor, k: Tensor, v: Tensor, per_token: dict[str, Tensor | None],
          S0: Tensor | None, cu: Tensor | None) -> tuple[Tensor, Tensor]:
    """The recurrence token by token: ``step(q_t, k_t, v_t, S, **x_t) -> (o_t, S)`` over head-first
    q, k (B, H, T, K), v (B, H, T, V) and ``per_token`` tensors (B, H, T, ...). With ``cu`` (B = 1)
    each sequence n starts from S0[n] (or zeros). Returns o (B, H, T, V) and the final states."""
    B, H, T, K = q.shape
    V = v.shape[-1]
    acc = accumulation_dtype(q.dtype)
    extras = {name: x for name, x in per_token.items() if x is not None}
    spans = [(0, T)] if cu is None else list(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True))
    outs, states = [], []
    for n, (a, b) in enumerate(spans):
        if S0 is None:
            S = torch.zeros(q.shape[0] if cu is None else 1, H, K, V, dtype=acc, device=q.device)
        else:
            S = (S0 if cu is None else S0[n:n + 1]).to(acc)
        for t in range(a, b):
            o_t, S = step(q[:, :, t], k[:, :, t], v[:, :, t], S,
                          **{name: x[:, :, t] for name, x in extras.items()})
            outs.append(o_t)
        states.append(S)
    o = torch.stack(outs, dim=2) if outs else v.new_zeros(B, H, 0, V).to(q.dtype)
    return o, torch.cat(states, dim=0)


