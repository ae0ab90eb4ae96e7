"""Argument checks and the pieces every op shares: dtypes, masks, feature maps, the normaliser."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from linattn.feature_maps import FEATURE_MAPS, FeatureMap, get_feature_map
from linattn.ops._library import tracing
from linattn.ops.native.threads import torch_on_one_thread


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """States and sums are kept in at least float32; float64 stays float64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def check_dense(t: Tensor, name: str) -> None:
    """TypeError naming ``t`` unless it is an ordinary (strided) tensor: sparse and nested ones
    have few of the operations the ops use (reshape, expand), and fail inside them."""
    if t.is_nested or t.layout != torch.strided:
        got = "a nested tensor" if t.is_nested else t.layout
        raise TypeError(f"{name}: expected a dense (strided) tensor, got {got}")


def check_float_tensor(t: object, name: str, *, dense: bool = True) -> Tensor:
    """``t`` if it is a floating-point tensor (with ``dense``, also an ordinary strided one:
    :func:`check_dense`); else TypeError naming ``name``."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if dense:
        check_dense(t, name)
    if not t.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor, got {t.dtype}")
    return t


def check_qkv(q: Tensor, k: Tensor, v: Tensor, *, same_length: bool) -> None:
    """Raise TypeError/ValueError naming the argument when q, k, v do not fit together.

    q: (..., Tq, D), k: (..., Tk, D), v: (..., Tk, Dv); ``same_length`` also asks Tq == Tk.
    Valid inputs pass a few cheap comparisons first (short calls are dominated by checks)."""
    if (isinstance(q, Tensor) and isinstance(k, Tensor) and isinstance(v, Tensor)
            and q.layout == k.layout == v.layout == torch.strided
            and not (q.is_nested or k.is_nested or v.is_nested)
            and q.dtype == k.dtype == v.dtype and q.is_floating_point() and q.dim() >= 2
            and q.shape[-1] > 0 and q.shape[-1] == k.shape[-1] and q.shape[:-2] == k.shape[:-2]
            and k.shape[:-1] == v.shape[:-1] and (not same_length or q.shape[-2] == k.shape[-2])
            and q.device == k.device == v.device):
        return
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_float_tensor(t, name)
        if t.dim() < 2:
            raise ValueError(f"{name}: expected shape (..., T, D), got {tuple(t.shape)}")
    if q.shape[-1] == 0:  # no feature map is defined on R^0 (cosFormer's reshapes fail there)
        raise ValueError(f"q: expected a head dimension D >= 1, got shape {tuple(q.shape)}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k, v: expected one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.device != q.device or v.device != q.device:
        raise ValueError(f"q, k, v: expected one device, got {q.device}, {k.device}, {v.device}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"k: last dimension {k.shape[-1]} does not match q's {q.shape[-1]} "
            f"(q {tuple(q.shape)}, k {tuple(k.shape)})"
        )
    if k.shape[:-1] != v.shape[:-1]:
        raise ValueError(
            f"v: shape {tuple(v.shape)} does not match k {tuple(k.shape)} before the last dimension"
        )
    if q.shape[:-2] != k.shape[:-2]:
        raise ValueError(
            f"k: batch dimensions {tuple(k.shape[:-2])} do not match q's {tuple(q.shape[:-2])}"
        )
    if same_length and q.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"k: causal attention needs as many keys as queries, got {k.shape[-2]} keys "
            f"for {q.shape[-2]} queries"
        )


def key_mask_for(key_padding_mask: Tensor | None, k: Tensor,
                 name: str = "key_padding_mask") -> Tensor | None:
    """A (B, T) padding mask (True = padding) as a keep-multiplier broadcastable to φ(k).

    For k of shape (B, ..., T, D) the mask has shape (B, T); for k of shape (T, D), (T,).
    Returns a bool tensor of shape (B, 1, ..., 1, T, 1) that is True where the row is kept.
    ``name`` is the argument named in errors (Flowformer masks queries with the same rule)."""
    if key_padding_mask is None:
        return None
    if not isinstance(key_padding_mask, Tensor):
        raise TypeError(f"{name}: expected a bool tensor, got {type(key_padding_mask).__name__}")
    if key_padding_mask.dtype != torch.bool:
        raise TypeError(f"{name}: expected dtype torch.bool, got {key_padding_mask.dtype}")
    T = k.shape[-2]
    expected = (T,) if k.dim() == 2 else (k.shape[0], T)
    if tuple(key_padding_mask.shape) != expected:
        raise ValueError(
            f"{name}: expected shape {expected} for {'q' if name.startswith('query') else 'k'} "
            f"of shape {tuple(k.shape)}, got {tuple(key_padding_mask.shape)}"
        )
    keep = ~key_padding_mask.to(k.device)
    if k.dim() > 2:
        keep = keep.reshape(k.shape[0], *([1] * (k.dim() - 3)), T)
    return keep.unsqueeze(-1)


def check_step_inputs(q_t: Tensor, k_t: Tensor, v_t: Tensor) -> None:
    """:func:`check_qkv` for one decoding step: q_t, k_t (..., D), v_t (..., Dv).

    Valid inputs pass a few cheap comparisons (this is on every decoding step); anything else
    goes through :func:`check_qkv`, which says what is wrong."""
    if (isinstance(q_t, Tensor) and isinstance(k_t, Tensor) and isinstance(v_t, Tensor)
            and q_t.layout == k_t.layout == v_t.layout == torch.strided
            and not (q_t.is_nested or k_t.is_nested or v_t.is_nested)
            and q_t.dtype == k_t.dtype == v_t.dtype and q_t.is_floating_point()
            and q_t.dim() >= 1 and q_t.shape == k_t.shape and q_t.shape[-1] > 0
            and v_t.dim() == q_t.dim() and q_t.shape[:-1] == v_t.shape[:-1]
            and q_t.device == k_t.device == v_t.device):
        return
    for name, t in (("q_t", q_t), ("k_t", k_t), ("v_t", v_t)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        check_dense(t, name)
        if t.dim() == 0:  # asked before the unsqueeze below, which a 0-D tensor fails
            raise ValueError(f"{name}: expected shape (..., D), got ()")
    check_qkv(q_t.unsqueeze(-2), k_t.unsqueeze(-2), v_t.unsqueeze(-2), same_length=True)


def is_bool(x: object) -> bool:
    """Whether ``x`` is a Python or a NumPy bool. A Python bool is a ``numbers.Integral`` and
    ``np.bool_`` is no ``numbers.Number`` at all, so each check of a number or a flag asks this
    first. (NumPy is not imported: its scalar types are recognised by name.)"""
    return isinstance(x, bool) or (type(x).__module__ == "numpy"
                                   and type(x).__name__ in ("bool_", "bool"))


def shown(x: object) -> str:
    """``repr(x)`` for an error message, one short line: an integer too long to print (Python
    refuses to print more than 4,300 digits) is given by its size, a tensor of more than a few
    numbers by its range (a tensor's repr spans lines)."""
    if isinstance(x, numbers.Integral) and not is_bool(x) and abs(int(x)) >= 10 ** 60:
        return f"{'-' if x < 0 else ''}an integer of {abs(int(x)).bit_length()} bits"
    if isinstance(x, Tensor) and not tracing(x):
        if x.dim() <= 1 and x.numel() <= 8:
            return repr(x.tolist())
        if x.numel() and not x.is_complex():
            y = x.detach().double()
            return f"a tensor of shape {tuple(x.shape)} with values in [{y.min().item():g}, " \
                   f"{y.max().item():g}]"
        return f"a tensor of shape {tuple(x.shape)}"
    return repr(x)


def check_flag(x: object, name: str) -> bool:
    """``x`` as a bool; TypeError naming ``name`` unless a Python or a NumPy bool (a flag taken
    by its truth value would make ``is_causal="no"`` causal)."""
    if x is True or x is False:
        return x
    if is_bool(x):
        return bool(x)
    raise TypeError(f"{name}: expected a bool, got {type(x).__name__}")


def _finite_float(x: numbers.Real) -> float | None:
    """float(x), or None when x is not finite (an integer too large for a float included)."""
    try:
        value = float(x)
    except OverflowError:
        return None
    # (comparisons rather than math.isfinite, which a graph traced with dynamic shapes cannot
    # evaluate on a symbolic float)
    return None if value != value or value in (math.inf, -math.inf) else value


#: The magnitudes each input dtype's computation carries (that of its accumulation dtype,
#: :func:`accumulation_dtype`): (smallest normal, largest finite) number.
_CARRIED: dict[torch.dtype, tuple[float, float]] = {
    dt: (torch.finfo(accumulation_dtype(dt)).tiny, torch.finfo(accumulation_dtype(dt)).max)
    for dt in (torch.float16, torch.bfloat16, torch.float32, torch.float64)}


def check_scale(scale: object, K: int, *, positive: bool = False,
                dtype: torch.dtype | None = None) -> float:
    """``scale`` as a float, or the default ``K**-0.5`` for None; TypeError naming ``scale``
    unless a real number (bools refused; NumPy numbers taken), ValueError unless finite (and
    > 0 if ``positive``). With the inputs' ``dtype``, also a ValueError for a scale that the
    op's computation in that dtype cannot carry: a magnitude beyond its accumulation dtype's
    largest number (1e300 with float32 inputs: ±inf outputs) or below its smallest normal one
    (1e-39: subnormal, 1e-46: 0 in float32, a silently wrong output)."""
    if scale is None:
        return K ** -0.5
    if type(scale) is float and scale - scale == 0 and (scale > 0 or not positive):
        value = scale  # the common case, on every decoding step: finite (inf − inf is nan)
    else:
        if is_bool(scale) or not isinstance(scale, numbers.Real):
            raise TypeError(f"scale: expected a real number or None, got {type(scale).__name__}")
        value = _finite_float(scale)
        if value is None or (positive and not value > 0):
            what = "positive number" if positive else "real number"
            raise ValueError(f"scale: expected a finite {what}, got {shown(scale)}")
    if dtype is not None and value != 0:
        lo, hi = _CARRIED.get(dtype, _CARRIED[torch.float64])
        if not lo <= abs(value) <= hi:
            raise ValueError(f"scale: {value:g} is out of the range {dtype} inputs carry "
                             f"(magnitudes {lo:.3g} to {hi:.3g}, or 0)")
    return value


def split_scale(s: float) -> tuple[float, float]:
    """A query scale ``s`` as ``(m, p)``, ``s = m·p``: ``(s, 1.0)`` for ``|s| < 2``, else
    ``1 <= |m| < 2`` and ``p`` a power of two. The ops whose output is ``s·(Sᵀq)`` (the gated
    and delta-rule recurrences) run with ``m`` and multiply the output by ``p``, which is
    exact: ``s·q`` alone can overflow where the output does not (issue 51, second probe:
    scale=1e38 gave NaN outputs that float32 holds)."""
    if -2.0 < s < 2.0:
        return s, 1.0
    m, e = math.frexp(s)  # s = m·2^e, 1/2 <= |m| < 1
    return 2.0 * m, 2.0 ** (e - 1)


def check_eps(eps: object, name: str = "eps") -> float:
    """``eps`` as a float; TypeError unless a real number, ValueError unless finite and >= 0.

    0 is allowed: it is the default of every strictly positive feature map. A nan would turn
    every output into nan, inf every output into 0, and a negative value can cancel the
    normaliser, so each is refused rather than computed."""
    if is_bool(eps) or not isinstance(eps, numbers.Real):
        raise TypeError(f"{name}: expected a real number, got {type(eps).__name__}")
    value = _finite_float(eps)
    if value is None or value < 0:
        raise ValueError(f"{name}: expected a finite number >= 0, got {shown(eps)}")
    return value


def shares_memory(t: Tensor) -> bool:
    """Whether elements of ``t`` surely share memory (an expanded view: a stride of 0 over a
    dimension longer than 1, or strides that overlap), as torch's own check sees it."""
    return torch._debug_has_internal_overlap(t) == 1


def check_own_memory(t: Tensor, name: str) -> None:
    """ValueError naming ``name`` for a tensor written in place whose elements share memory:
    the compiled kernels would write one row over another (float32 states came back wrong,
    silently) and torch's ``copy_`` raises its own RuntimeError. An inference tensor (made
    under ``torch.inference_mode``) may change only inside inference mode (torch's rule,
    which the compiled kernels would bypass): refused outside it. Not checked while traced."""
    if tracing():
        return
    if t.is_inference() and not torch.is_inference_mode_enabled():
        raise ValueError(f"{name}: written in place, but it was made under "
                         "torch.inference_mode and may change only inside it; pass a clone, "
                         "or call under torch.inference_mode()")
    if shares_memory(t):
        raise ValueError(f"{name}: written in place, but its elements share memory (an "
                         f"expanded view, shape {tuple(t.shape)}, strides {t.stride()}); pass "
                         "a tensor of its own (.clone())")


def check_positive_int(x: object, name: str) -> int:
    """``x`` as an int; ValueError naming ``name`` unless a positive integer (NumPy integers
    taken, bools and integral floats refused). Any size: callers clamp what they allocate."""
    if is_bool(x) or not isinstance(x, numbers.Integral) or x < 1:
        raise ValueError(f"{name}: expected a positive integer, got {shown(x)}")
    return int(x)


def check_size(x: object, name: str) -> int:
    """A tensor size: ``x`` as an int; ValueError naming ``name`` unless an integer in
    [0, 2**63) (what a torch size can hold)."""
    if is_bool(x) or not isinstance(x, numbers.Integral) or not 0 <= x < 2 ** 63:
        raise ValueError(f"{name}: expected an integer >= 0, got {shown(x)}")
    return int(x)


def check_state_sizes(batch_shape: object, dtype: object, **sizes: object
                      ) -> tuple[tuple[int, ...], dict[str, int]]:
    """The arguments of a state's ``zeros()``: ``batch_shape`` a sequence of sizes, ``dtype`` a
    floating-point torch.dtype and each of ``sizes`` a size (:func:`check_size`); errors name
    the argument. Returns the batch shape as a tuple and the sizes as ints."""
    if isinstance(batch_shape, (str, bytes, Tensor)) or not hasattr(batch_shape, "__iter__"):
        raise TypeError(f"batch_shape: expected a tuple of integers, got "
                        f"{type(batch_shape).__name__}")
    shape = tuple(check_size(n, "batch_shape") for n in batch_shape)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype: expected a floating-point torch.dtype, got {dtype!r}")
    return shape, {name: check_size(n, name) for name, n in sizes.items()}


def check_chunk_size(chunk_size: object, default: int) -> int:
    """``chunk_size`` (None: ``default``) as an int; ValueError unless a positive integer."""
    if chunk_size is None:
        return default
    return check_positive_int(chunk_size, "chunk_size")


def check_values(x: Tensor, test: Callable[[Tensor], Tensor], message: str,
                 detail: Callable[[], str] | None = None) -> None:
    """Raise ValueError(``message`` + ``detail()``) unless the element-wise ``test(x)`` holds
    everywhere; on the calling thread up to 2²⁰ elements (torch's second thread woke too late:
    2.3 ms of a 13.6 ms GLA forward, AMD Zen 4). Traced: an assertion node of the graph (raises
    RuntimeError with ``message`` when it runs). A meta tensor: nothing to check."""
    if tracing(x):
        torch._assert_async(test(x).all(), message)
        return
    if x.is_meta:  # shapes only, no values to check (as linear_attention has always run)
        return
    with torch_on_one_thread(x.numel() <= 1 << 20):
        ok = bool(test(x).all())
    if not ok:
        raise ValueError(message + ("" if detail is None else detail()))


def within(x: Tensor, lo: float, hi: float, *, open_ends: bool = False) -> bool:
    """Every value of ``x`` (readable) in [lo, hi], or (lo, hi) with ``open_ends``; nan never: one
    min-max reduction on the calling thread, ~8 µs for 32,768 floats (test and ``all()``: ~70)."""
    if not x.numel():
        return True
    with torch_on_one_thread(x.numel() <= 1 << 20):  # (detached: values, not a graph; a
        # scalar read of a tensor that requires grad warns)
        least, most = (float(t) for t in dense_elements(x.detach()).aminmax())
    return lo < least and most < hi if open_ends else lo <= least and most <= hi


def dense_elements(x: Tensor) -> Tensor:
    """``x``'s elements as one contiguous run when they fill one in some order (a transposed or
    permuted contiguous tensor: fla's (B, T, H) gates seen as (B, H, T)), else ``x``: for
    order-free reductions, which read a strided view at a third of the speed (25 against 9 µs
    for 32,768 floats, Intel Xeon family 6)."""
    if x.is_contiguous():
        return x
    order = sorted(range(x.dim()), key=lambda d: (-x.stride(d), -x.shape[d]))
    y = x.permute(order)
    return y.view(-1) if y.is_contiguous() else x


def all_finite(x: Tensor) -> bool:
    return within(x, -math.inf, math.inf, open_ends=True)


def check_range(x: Tensor, lo: float, hi: float, message: str,
                detail: Callable[[], str] | None = None, *, open_ends: bool = False) -> None:
    """:func:`check_values` for "every value in [lo, hi]" (or (lo, hi)), by :func:`within`
    where the values can be read (check_values then only raises, or traces the test)."""
    if tracing(x) or x.is_meta or not within(x, lo, hi, open_ends=open_ends):
        check_values(x, lambda y: (y > lo) & (y < hi) if open_ends else (y >= lo) & (y <= hi),
                     message, detail)


def nonfinite(x: Tensor) -> str:
    """Which of nan, inf, -inf occur in ``x`` (for an error message; reads the values)."""
    found = [name for name, bad in (("nan", x.isnan()), ("inf", x == math.inf),
                                    ("-inf", x == -math.inf)) if bool(bad.any())]
    return " and ".join(found) or "none"


def gamma_tensor(gamma: object, dtype: torch.dtype, device: torch.device) -> Tensor:
    """γ as a tensor in ``dtype`` on ``device``: a real number, a tensor, or what
    ``torch.as_tensor`` takes (a list, a NumPy array) of real numbers; TypeError naming
    ``gamma`` for anything else (a string, None, a bool, complex numbers, a bool tensor), and
    ValueError for a number too large for a float (out of [0, 1] anyway)."""
    def refused(what: str) -> TypeError:
        return TypeError(f"gamma: expected a number or a tensor of real numbers, got {what}")

    if isinstance(gamma, Tensor):
        g = gamma
    elif is_bool(gamma) or isinstance(gamma, (str, bytes)) or gamma is None:
        raise refused(type(gamma).__name__)
    elif isinstance(gamma, numbers.Real):
        value = _finite_float(gamma)
        if value is None and not isinstance(gamma, numbers.Integral):
            value = float(gamma)  # nan or ±inf: refused with the range below
        if value is None:
            raise ValueError(f"gamma: expected decays in [0, 1], got {shown(gamma)}")
        return torch.tensor(value, dtype=dtype, device=device)
    else:
        try:
            g = torch.as_tensor(gamma)
        except (TypeError, ValueError, RuntimeError, OverflowError):
            raise refused(type(gamma).__name__) from None
    if g.dtype == torch.bool or g.is_complex():
        raise refused(f"a tensor of {g.dtype}")
    return g.to(dtype=dtype, device=device)


def check_gamma(gamma: object, batch: tuple[int, ...], like: Tensor) -> Tensor:
    """Decays γ as a tensor of shape ``batch`` in ``like``'s dtype and device; TypeError naming
    ``gamma`` unless numbers (:func:`gamma_tensor`), ValueError outside [0, 1] or when it does
    not broadcast to ``batch``."""
    g = gamma_tensor(gamma, like.dtype, like.device)
    check_range(g, 0.0, 1.0, "gamma: expected decays in [0, 1]", lambda: f", got {shown(gamma)}")
    try:
        return g.broadcast_to(batch)
    except RuntimeError:
        raise ValueError(
            f"gamma: shape {tuple(g.shape)} does not broadcast to the batch shape {batch}"
        ) from None


#: One shared instance per feature-map name (the named maps hold no parameters): building an
#: nn.Module per call cost more than a short call's arithmetic.
_NAMED_MAPS: dict[str, FeatureMap] = {name: cls() for name, cls in FEATURE_MAPS.items()}


def resolve(feature_map: str | FeatureMap, eps: object) -> tuple[FeatureMap, float]:
    """The feature map and the checked ``eps`` (None: the map's own default)."""
    fmap = _NAMED_MAPS.get(feature_map) if isinstance(feature_map, str) else None
    if fmap is None:
        fmap = get_feature_map(feature_map)
    if eps is None:
        return fmap, check_eps(fmap.eps, f"eps (the default of {type(fmap).__name__})")
    return fmap, check_eps(eps)


def features(
    fmap: FeatureMap, q: Tensor, k: Tensor, keep: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """φ(q), φ(k) in the accumulation dtype, with padded keys zeroed (absent from every sum).

    Values of padded keys must be zeroed too (:func:`zero_padded`)."""
    acc = accumulation_dtype(q.dtype)
    fq = fmap.forward_queries(traced_contiguous(q.to(acc)))
    return fq, masked_key_features(fmap, k.to(acc), keep)


def masked_key_features(fmap: FeatureMap, k: Tensor, keep: Tensor | None) -> Tensor:
    """φ(k) with the rows of padded keys 0. A padded key may hold nan or inf: it is replaced by
    0 *before* φ, so that the backward never forms 0·φ'(nan) = nan and its gradient is exactly
    0; its feature row is zeroed after φ too, since φ(0) ≠ 0 for most maps."""
    return zero_padded(fmap.forward_keys(traced_contiguous(zero_padded(k, keep))), keep)


def traced_contiguous(x: Tensor) -> Tensor:
    """``x``, made contiguous inside a traced graph only. torch 2.13 predicts the strides of the
    gradient of ``elu`` (and ``softplus``) from a non-contiguous input differently from what
    eager kernels produce, and a graph traced on a transposed view (q, k as (B, H, T, D) views
    of (B, T, H, D) projections) then fails in its backward (a ``view`` of a gradient that is
    not laid out as predicted) when the graph runs without Inductor (``aot_eager``). In eager
    the copy would cost memory traffic for nothing."""
    return x.contiguous() if tracing(x) else x


def zero_padded(x: Tensor, keep: Tensor | None) -> Tensor:
    """x with the rows of padded keys set to 0 (x: (..., T, F), keep from :func:`key_mask_for`).

    ``torch.where``, not a product: a padded key or value may hold anything, inf and nan
    included, and must still contribute exactly nothing (0·inf would be nan)."""
    return x if keep is None else torch.where(keep, x, x.new_zeros(()))


def values_with_ones(v: Tensor, dtype: torch.dtype, keep: Tensor | None = None) -> Tensor:
    """[V, 1] in ``dtype`` with padded rows zeroed: (..., T, Dv) -> (..., T, Dv + 1).

    One product with φ(K)ᵀ (or with lag features) then yields numerator and normaliser."""
    return zero_padded(F.pad(v.to(dtype), (0, 1), value=1.0), keep)


def normalise(num: Tensor, den: Tensor, eps: float) -> Tensor:
    """num / (den + eps) with a zero normaliser (every key padded) giving a zero output.

    num: (..., T, Dv), den: (..., T)."""
    return num / guarded(den, eps).unsqueeze(-1)


def guarded(den: Tensor, eps: float) -> Tensor:
    """den + eps, with exact zeros (no key to attend to) replaced by 1 so that they give a zero
    output rather than 0/0."""
    den = den + eps
    return torch.where(den == 0, torch.ones_like(den), den)


def split_normalised(out: Tensor, eps: float) -> Tensor:
    """(..., T, Dv + 1) of [numerator, normaliser] -> the normalised (..., T, Dv)."""
    return normalise(out[..., :-1], out[..., -1], eps)


def causal_mask(n: int, device: torch.device | str | None = None) -> Tensor:
    """Bool (n, n), True where j ≤ i. Built by comparison rather than ``tril``: tril opens a
    thread-parallel region however small the matrix, which costs milliseconds when the
    cores are busy."""
    pos = torch.arange(n, device=device)
    return pos.unsqueeze(1) >= pos.unsqueeze(0)


def block_ranges(T: int, size: int) -> list[tuple[int, int]]:
    """(t0, t1) of consecutive blocks of ``size`` tokens covering [0, T), the last one short."""
    return [(t0, min(t0 + size, T)) for t0 in range(0, T, size)]


def needs_grad(*tensors: Tensor | None) -> bool:
    """Whether autograd will want gradients of any of ``tensors`` (None entries ignored)."""
    return torch.is_grad_enabled() and any(isinstance(t, Tensor) and t.requires_grad
                                           for t in tensors)


def clamped_chunk(chunk: int, T: int) -> int:
    """A causal chunk no longer than the sequence needs: a chunk of C costs C×C scores per
    head (T = 5 with chunk_size=65536 must not ask for gigabytes). Multiples of 16 stay
    multiples of 16 (the compiled kernels' vector tiles)."""
    if chunk <= T:
        return chunk
    return -(-max(T, 1) // 16) * 16 if chunk % 16 == 0 else max(T, 1)


def flatten_heads(
    q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None
) -> tuple[torch.Size, list[Tensor], Tensor | None]:
    """(..., T, ·) -> (N, T, ·), N the product of the batch dimensions, for the chunked CPU paths.

    Returns the batch shape, [q, k, v] flattened, and keep (bool, broadcastable to (..., T, 1))
    as (N, T, 1) or None."""
    batch = q.shape[:-2]
    N = math.prod(batch)  # explicit: reshape(-1, 0, D) of an empty tensor cannot infer N
    flat = [x.reshape(N, *x.shape[-2:]) for x in (q, k, v)]
    if keep is not None:
        keep = keep.expand(*batch, k.shape[-2], 1).reshape(N, k.shape[-2], 1)
    return batch, flat, keep


def to_chunks(x: Tensor, chunk: int) -> Tensor:
    """(..., T, F) -> (..., n, C, F), zero padded to whole chunks: padded positions have zero
    features and zero values, so they add nothing to any sum."""
    T = x.shape[-2]
    n = -(-T // chunk)
    if n * chunk != T:
        x = F.pad(x, (0, 0, 0, n * chunk - T))
    return x.reshape(*x.shape[:-2], n, chunk, x.shape[-1])


def causal_chunked(
    fq: Tensor, fk: Tensor, v1: Tensor, chunk: int, S0: Tensor | None
) -> tuple[Tensor, Tensor]:
    """Chunked causal sums. fq, fk: (..., T, L), v1: (..., T, Dv+1), S0: (..., L, Dv+1) or None.

    Inside each chunk of C tokens a dense masked (C, C) block; across chunks the exclusive
    prefix of the chunk states φ(k)ᵀ[v, 1]. Returns ([numerator, normaliser]: (..., T, Dv+1),
    final state (..., L, Dv+1)). Products go through 3-D ``bmm`` so transposed operands reach
    BLAS as flags instead of being copied (``matmul`` on 4-D operands would copy them)."""
    *batch, T, L = fq.shape
    Dv1 = v1.shape[-1]
    fq, fk, v1 = (to_chunks(x, chunk) for x in (fq, fk, v1))
    n = fq.shape[-3]
    nb = math.prod(batch) * n  # explicit: a -1 of an empty v1 (Dv1 = 0) cannot be inferred
    fq3, fk3, v13 = fq.reshape(nb, chunk, L), fk.reshape(nb, chunk, L), v1.reshape(nb, chunk, Dv1)

    states = torch.bmm(fk3.transpose(1, 2), v13).view(*batch, n, L, Dv1)  # each chunk's own
    total = states.sum(-3)
    # exclusive prefix (the chunks strictly before) as the inclusive prefix shifted by one, not
    # as cumsum − states: that difference, and its backward (a reverse cumsum minus the chunk's
    # own gradient), cancel catastrophically when one chunk's gradient is huge (a query whose
    # keys so far have no feature: 1/eps); causal cosFormer's float32 key gradients were 1-3 %
    # off float64 (issue 51)
    before = torch.cat([torch.zeros_like(states[..., :1, :, :]), states.cumsum(-3)], -3)
    before = before[..., :n, :, :]
    if S0 is not None:
        before = before + S0.unsqueeze(-3)
        total = total + S0
    scores = torch.bmm(fq3, fk3.transpose(1, 2)).mul_(causal_mask(chunk, fq.device))
    out = torch.baddbmm(torch.bmm(fq3, before.reshape(nb, L, Dv1)), scores, v13)
    out = out.view(*batch, n * chunk, Dv1)[..., :T, :]
    return out, total


def graph_grads(
    outputs: list[Tensor], grads: list[Tensor | None], inputs: list[Tensor], needs: list[bool]
) -> list[Tensor | None]:
    """∂(Σ outputs·grads)/∂inputs with the graph kept (``create_graph``), for the inputs that
    ``needs``; None for the others, zeros for needed inputs the outputs do not reach. A custom
    Function's backward returns this when the caller asked for a differentiable gradient."""
    pairs = [(o, g) for o, g in zip(outputs, grads, strict=True) if g is not None]
    wanted = [i for i, need in enumerate(needs) if need]
    got = torch.autograd.grad([o for o, _ in pairs], [inputs[i] for i in wanted],
                              [g for _, g in pairs], create_graph=True, allow_unused=True)
    result: list[Tensor | None] = [None] * len(inputs)
    for i, g in zip(wanted, got, strict=True):
        result[i] = torch.zeros_like(inputs[i]) if g is None else g
    return result
