r"""Sliding-window softmax plus linear attention over the older keys, in one normaliser.

With :math:`s_{ij} = q_i\cdot k_j/\sqrt{D}` (D the head dimension), φ the feature map and
:math:`\kappa_{ij} = \varphi(q_i)\cdot\varphi(k_j)`, row i of the output is

.. math::
    o_i = \frac{\sum_{j\in W(i)} e^{s_{ij}}\, v_j + \sum_{j\in F(i)} \kappa_{ij}\, v_j}
               {\sum_{j\in W(i)} e^{s_{ij}} + \sum_{j\in F(i)} \kappa_{ij} + \varepsilon}

(Based / LoLCATs style): exact softmax attention on the near keys W(i), linear attention on the
far keys F(i), both in one normaliser, so the exact part and the linear part compete for weight.

* causal (the default): ``W(i) = {j : i − w < j ≤ i}`` (the last w keys, the query's own
  included) and ``F(i) = {j : j ≤ i − w}``;
* non-causal: a band, ``W(i) = {j : |i − j| < w}`` (2w − 1 keys) and ``F(i) = {j : |i − j| ≥ w}``.

``window`` w ≥ 1; w ≥ T is softmax attention, and w = 1 (causal) is linear attention over
j < i plus the query's own key weighted exactly. Keys marked in ``key_padding_mask`` are absent
from every sum; a row with no key left gives zeros.

Numerical stability. Write :math:`N_F, D_F` for the linear numerator and normaliser and
:math:`\lambda_i = \log|D_F + \varepsilon|` (−∞ when it is 0). With
:math:`m_i = \max(\max_{j\in W(i)} s_{ij},\ \lambda_i)` both numerator and normaliser are
multiplied by :math:`e^{-m_i}`: each window term becomes :math:`e^{s_{ij} - m_i} \le 1`, and the
linear sums *and ε* are scaled by the same factor, entering as
:math:`a_i\,N_F/(D_F + \varepsilon)` and :math:`a_i` with
:math:`a_i = (D_F + \varepsilon)\,e^{-m_i}`, :math:`|a_i| = e^{\lambda_i - m_i} \le 1`. The
quotient is exactly the function above, the largest term is 1, and nothing can overflow:
:math:`N_F/(D_F + \varepsilon)` is plain linear attention's own quotient, and
:math:`e^{-m_i}` itself is never formed. Limits: scores of +10⁴ give :math:`a_i = 0` (the row is
the softmax of its window); scores of −10⁴ give window terms 0 when there are far keys (the row
is linear attention over them) and the exact window softmax when there are none (the first w
tokens). Clamping :math:`m_i` at 0 instead would be simpler but wrong there: a first token whose
only score is −200 would underflow to a zero row in float32. :math:`m_i` is a constant of the
function (it cancels), so no gradient flows through it. A row with no key at all gives zeros.

Forms, held together by tests:

* :func:`window_linear_attention` — the chunked form, O(T·(w + C)·D + T·ℓ·(C + Dv)) time for
  chunk size C, O(T·(w + C)) memory per batch slice (never T×T). Window part: each block of C
  queries scores the C + w − 1 keys (C + 2w − 2 non-causal) that can fall in its windows. Linear
  part: causal linear attention over the keys *delayed by w* (key j moved to position j + w),
  which is exactly Σ_{j ≤ i−w}; the non-causal part adds the same on the reversed sequence
  (Σ_{j ≥ i+w}), so nothing is computed as a difference.
* :func:`window_linear_attention_step` — one decoding token with a
  :class:`WindowLinearAttentionState`: the linear state (S, z) of the keys that left the window,
  a ring buffer of the last w keys and values, and the count of tokens seen; its size does not
  depend on the count.
* :func:`linattn.reference.window_linear_attention` — the explicit T×T weights, the ground truth.

Prefill with ``return_state=True``, then steps (or another prefill with ``initial_state``),
equals the whole sequence in one call.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor

from linattn.feature_maps import FeatureMap
from linattn.ops import dispatch
from linattn.ops._common import (
    accumulation_dtype,
    causal_chunked,
    check_chunk_size,
    check_dense,
    check_flag,
    check_positive_int,
    check_qkv,
    check_state_sizes,
    check_step_inputs,
    clamped_chunk,
    features,
    key_mask_for,
    normalise,
    resolve,
    shown,
    to_chunks,
    values_with_ones,
    zero_padded,
)
from linattn.ops._library import takes_inference_tensors
from linattn.ops.linear.recurrent import check_float_parts

__all__ = [
    "WindowLinearAttentionState",
    "window_linear_attention",
    "window_linear_attention_step",
    "check_window",
    "check_state_window",
    "MAX_STATE_WINDOW",
]

#: The largest window a :class:`WindowLinearAttentionState` takes: the state keeps a ring
#: buffer of ``window`` keys and values, so a window is memory there (the stateless op takes any
#: positive integer: a window longer than the sequence is the same as one of its length).
MAX_STATE_WINDOW = 2 ** 31 - 1


def check_window(window: object) -> int:
    """``window`` as an int; ValueError naming it unless a positive integer (of any size)."""
    return check_positive_int(window, "window")


def check_state_window(window: object) -> int:
    """:func:`check_window`, and at most :data:`MAX_STATE_WINDOW` (a state's ring buffer holds
    ``window`` keys): ValueError naming ``window`` above it."""
    w = check_window(window)
    if w > MAX_STATE_WINDOW:
        raise ValueError(f"window: a state keeps the last `window` keys: expected at most "
                         f"{MAX_STATE_WINDOW}, got {shown(window)}")
    return w


@dataclass(frozen=True)
class WindowLinearAttentionState:
    """Decoding state of causal :func:`window_linear_attention` after ``count`` tokens.

    S: (..., ℓ, Dv) = Σ_{j ≤ count−1−w} φ(k_j) v_jᵀ and z: (..., ℓ) = Σ φ(k_j): the keys that
    have left the window, in the accumulation dtype (float32 at least).
    k: (..., w, D), v: (..., w, Dv): a ring buffer of the last min(count, w) keys and values, in
    the inputs' dtype; token p sits in slot p mod w, slots ≥ count are unused (zeros).
    count: the number of tokens seen. Immutable: steps return a new state."""

    S: Tensor
    z: Tensor
    k: Tensor
    v: Tensor
    count: int

    @property
    def window(self) -> int:
        return self.k.shape[-2]

    @classmethod
    def zeros(
        cls,
        batch_shape: tuple[int, ...] | torch.Size,
        num_features: int,
        head_dim: int,
        value_dim: int,
        window: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> WindowLinearAttentionState:
        """The empty state (no token seen yet); errors name the argument."""
        w = check_state_window(window)
        b, n = check_state_sizes(batch_shape, dtype, num_features=num_features,
                                 head_dim=head_dim, value_dim=value_dim)
        acc = accumulation_dtype(dtype)
        L, D, Dv = n["num_features"], n["head_dim"], n["value_dim"]
        return cls(
            S=torch.zeros(*b, L, Dv, dtype=acc, device=device),
            z=torch.zeros(*b, L, dtype=acc, device=device),
            k=torch.zeros(*b, w, D, dtype=dtype, device=device),
            v=torch.zeros(*b, w, Dv, dtype=dtype, device=device),
            count=0,
        )

    def check(self, name: str, batch_shape: tuple[int, ...], num_features: int, head_dim: int,
              value_dim: int, window: int, device: torch.device | None = None) -> None:
        """Raise TypeError/ValueError naming ``name`` unless the parts fit these sizes."""
        parts = ("S", "z", "k", "v")
        check_float_parts(self, parts, name)
        for part in parts:
            t = getattr(self, part)
            if device is not None and t.device != device:
                raise ValueError(f"{name}: expected {part} on the inputs' device {device}, "
                                 f"got {t.device}")
        c = self.count
        if isinstance(c, bool) or not isinstance(c, numbers.Integral) or c < 0:
            raise TypeError(f"{name}: expected count to be an integer >= 0, got {c!r}")
        b = tuple(batch_shape)
        want = {"S": (*b, num_features, value_dim), "z": (*b, num_features),
                "k": (*b, window, head_dim), "v": (*b, window, value_dim)}
        got = {part: tuple(getattr(self, part).shape) for part in want}
        if got != want:
            raise ValueError(f"{name}: expected shapes {want} (window {window}), got {got}")


def _checked_state(state: object, name: str, q: Tensor, v: Tensor, num_features: int,
                   window: int) -> WindowLinearAttentionState:
    if not isinstance(state, WindowLinearAttentionState):
        raise TypeError(
            f"{name}: expected a WindowLinearAttentionState, got {type(state).__name__}"
        )
    state.check(name, tuple(q.shape[:-2]), num_features, q.shape[-1], v.shape[-1], window,
                q.device)
    return state


def _delayed(x: Tensor, w: int) -> Tensor:
    """(..., T, F) with row j moved to row j + w (rows 0 … w−1 zero, the last w dropped)."""
    T = x.shape[-2]
    return F.pad(x, (0, 0, min(w, T), 0))[..., :T, :]


def _band(q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, lam: Tensor, w: int,
          is_causal: bool, chunk: int) -> tuple[Tensor, Tensor, Tensor]:
    """The window part, stabilised: Σ_{j∈W(i)} e^{s_ij − m_i}[v_j, 1] and m_i.

    q, k: (..., T, D), v: (..., T, Dv) in the accumulation dtype, padded keys and values zeroed;
    keep: bool broadcastable to (..., T) or None; lam: (..., T) the log of the linear part's
    normaliser (:func:`_log_far`). Returns num (..., T, Dv), den (..., T) and m (..., T),
    m_i = max(max_{j∈W(i)} s_ij, lam_i) (0 where both are −∞), detached. Blocks of C queries
    against the C + left + right keys their windows can reach: O(T·(C + w)) scores, not T×T."""
    T, D = q.shape[-2], q.shape[-1]
    n = -(-T // chunk)
    left = min(w, T) - 1  # lags ≥ T never occur: a window longer than T costs nothing extra
    right = 0 if is_causal else left
    width = chunk + left + right
    pad = (left, n * chunk - T + right)
    qb = to_chunks(q, chunk)  # (..., n, C, D)
    kb = F.pad(k, (0, 0, *pad)).unfold(-2, width, chunk)  # (..., n, D, width)
    vb = F.pad(v, (0, 0, *pad)).unfold(-2, width, chunk).transpose(-1, -2)  # (..., n, width, Dv)
    s = (qb @ kb) * (1.0 / math.sqrt(D))  # (..., n, C, width)

    r = torch.arange(chunk, device=q.device)
    c = torch.arange(width, device=q.device)
    lag = r[:, None] - c[None, :] + left  # i − j: query t0 + r, key t0 − left + c
    valid = (lag >= 0) & (lag < w) if is_causal else lag.abs() < w  # (C, width)
    j = torch.arange(n, device=q.device)[:, None] * chunk - left + c  # (n, width)
    valid = valid & ((j >= 0) & (j < T))[:, None, :]  # (n, C, width): keys inside [0, T)
    if keep is not None:
        kp = F.pad(keep.to(q.dtype), pad).unfold(-1, width, chunk) > 0  # (..., n, width)
        valid = valid & kp.unsqueeze(-2)
    s = torch.where(valid, s, float("-inf"))
    m = _row_max(s, to_chunks(lam.unsqueeze(-1), chunk).squeeze(-1))
    e = torch.exp(s - m.unsqueeze(-1))  # exactly 0 outside the window
    # every size explicit: an empty batch (B or H = 0) cannot infer a -1
    num = (e @ vb).reshape(*q.shape[:-2], n * chunk, vb.shape[-1])[..., :T, :]
    den = e.sum(-1).reshape(*q.shape[:-2], n * chunk)[..., :T]
    return num, den, m.reshape(*q.shape[:-2], n * chunk)[..., :T]


def _log_far(far_den: Tensor) -> tuple[Tensor, Tensor]:
    """λ = log|D_F + ε| (−∞ where 0, detached) and |D_F + ε| with its zeros replaced by 1 (so
    that the log's gradient stays finite where it is not used). far_den: D_F + ε, (..., T)."""
    nz = far_den != 0
    absd = torch.where(nz, far_den.abs(), torch.ones_like(far_den))
    return torch.where(nz, absd.detach().log(), float("-inf")), absd


def _row_max(s: Tensor, lam: Tensor) -> Tensor:
    """m = max(max of s over the last dimension, lam), detached; 0 where both are −∞."""
    m = torch.maximum(s.detach().amax(-1), lam)
    return torch.where(m == float("-inf"), torch.zeros_like(m), m)


def _combine(num_w: Tensor, den_w: Tensor, far: Tensor, far_den: Tensor, absd: Tensor,
             m: Tensor) -> Tensor:
    """(Σ_W e^{s−m}v + a·N_F/(D_F + ε)) / (Σ_W e^{s−m} + a), a = (D_F + ε)·e^{−m} formed as
    sign·e^{log|D_F + ε| − m} (|a| ≤ 1; e^{−m} alone could overflow). far: N_F (..., T, Dv),
    far_den: D_F + ε (..., T), absd from :func:`_log_far`, m from :func:`_row_max`."""
    nz = far_den != 0
    a = torch.where(nz, far_den.sign() * torch.exp(absd.log() - m), torch.zeros_like(m))
    lin = far / torch.where(nz, far_den, torch.ones_like(far_den)).unsqueeze(-1)
    return normalise(num_w + a.unsqueeze(-1) * lin, den_w + a, 0.0)


def _far(fq: Tensor, fk: Tensor, v1: Tensor, w: int, is_causal: bool, chunk: int,
         S0: Tensor | None) -> tuple[Tensor, Tensor]:
    """The linear part Σ_{j∈F(i)} φ(q_i)·φ(k_j)[v_j, 1] (..., T, Dv+1), and (causal) the state
    of the keys outside the last query's window, S0 + Σ_{j ≤ T−1−w} φ(k_j)[v_j, 1]ᵀ."""
    T = fq.shape[-2]
    if T <= w:  # no key has left any window yet
        out = fq @ S0 if S0 is not None else fq.new_zeros(*fq.shape[:-1], v1.shape[-1])
        return out, (S0 if S0 is not None else fq.new_zeros(*fk.shape[:-2], fk.shape[-1],
                                                             v1.shape[-1]))
    out, total = causal_chunked(fq, _delayed(fk, w), _delayed(v1, w), chunk, S0)
    if not is_causal:  # j ≥ i + w: the same on the reversed sequence
        back, _ = causal_chunked(fq.flip(-2), _delayed(fk.flip(-2), w),
                                 _delayed(v1.flip(-2), w), chunk, None)
        out = out + back.flip(-2)
    return out, total


def _empty_output(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The (..., 0, Dv) output of T = 0 in q's dtype, on the autograd graph of q, k and v as the
    other ops' empty outputs are (a detached one fails ``out.sum().backward()``)."""
    return (q[..., :0, :1] * k[..., :0, :1] * v[..., :0, :]).to(q.dtype)


@takes_inference_tensors()
def window_linear_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    window: int,
    feature_map: str | FeatureMap = "elu",
    is_causal: bool = True,
    key_padding_mask: Tensor | None = None,
    eps: float | None = None,
    chunk_size: int | None = None,
    initial_state: WindowLinearAttentionState | None = None,
    return_state: bool = False,
) -> Tensor | tuple[Tensor, WindowLinearAttentionState]:
    """Exact softmax over the window, linear attention outside it, one normaliser (module doc).

    Args:
        q, k: (..., T, D); v: (..., T, Dv). Leading dimensions usually (B, H).
        window: w ≥ 1. Causal: keys i − w < j ≤ i are exact; non-causal: |i − j| < w. Any
            positive integer (w ≥ T is softmax attention); with ``initial_state`` or
            ``return_state`` at most :data:`MAX_STATE_WINDOW` (the state's ring buffer).
        feature_map, eps: as in :func:`linattn.linear_attention` (``eps`` None: the map's
            default); the softmax scale is 1/√D.
        is_causal: the causal window (default) or the band of ±w.
        key_padding_mask: bool (B, T), True = padding: that key is absent from every sum.
            Not with ``initial_state``/``return_state`` (the ring buffer holds no mask).
        chunk_size: C, queries per block (default
            the policy's, :data:`linattn.ops.dispatch.DEFAULT_CHUNK_SIZE`).
        initial_state: causal only: the state after an earlier prefix.
        return_state: causal only: also return the state after the last token.

    Returns:
        (..., T, Dv) in q's dtype (and the final :class:`WindowLinearAttentionState`).
        Sums run in float32 at least (float64 for float64 inputs).
    """
    if isinstance(q, Tensor) and isinstance(k, Tensor):
        check_dense(q, "q")
        check_dense(k, "k")
        if q.shape[-2:-1] != k.shape[-2:-1]:
            raise ValueError(f"k: window attention needs as many keys as queries, got "
                             f"{k.shape[-2]} keys for {q.shape[-2]} queries")
    check_qkv(q, k, v, same_length=True)
    is_causal = check_flag(is_causal, "is_causal")
    return_state = check_flag(return_state, "return_state")
    stateful = initial_state is not None or return_state
    w = check_state_window(window) if stateful else check_window(window)
    fmap, eps = resolve(feature_map, eps)
    chunk = check_chunk_size(chunk_size, dispatch.policy().chunk_size)
    if stateful and not is_causal:
        raise ValueError("initial_state/return_state: only defined for is_causal=True")
    if stateful and key_padding_mask is not None:
        raise ValueError("key_padding_mask: not supported with initial_state/return_state "
                         "(the window's ring buffer keeps no mask)")
    keep = key_mask_for(key_padding_mask, k)
    acc = accumulation_dtype(q.dtype)
    L = fmap.num_features(q.shape[-1])
    T = q.shape[-2]

    P, count, S0 = 0, 0, None
    if initial_state is not None:  # the buffered keys become a context prepended to k and v
        st = _checked_state(initial_state, "initial_state", q, v, L, w)
        count = int(st.count)
        P = min(count, w)
        start = (count - P) % w  # the slot of the oldest buffered token
        ctx_k = st.k.roll(-start, -2)[..., :P, :].to(q.dtype)
        ctx_v = st.v.roll(-start, -2)[..., :P, :].to(v.dtype)
        q = torch.cat([q.new_zeros(*q.shape[:-2], P, q.shape[-1]), q], -2)  # rows dropped
        k, v = torch.cat([ctx_k, k], -2), torch.cat([ctx_v, v], -2)
        S0 = torch.cat([st.S, st.z.unsqueeze(-1)], -1).to(acc)

    if T == 0:  # nothing to attend: an empty output, the state as it was (in new tensors)
        o = _empty_output(q, k, v)
        if not return_state:
            return o
        if initial_state is not None:
            return o, replace(st, S=st.S.clone(), z=st.z.clone(), k=st.k.clone(),
                              v=st.v.clone())
        return o, WindowLinearAttentionState.zeros(q.shape[:-2], L, q.shape[-1], v.shape[-1],
                                                   w, dtype=q.dtype, device=q.device)
    N = P + T
    chunk = clamped_chunk(chunk, N)
    fq, fk = features(fmap, q, k, keep)
    v1 = values_with_ones(v, acc, keep)
    wn = min(w, N)  # no lag reaches N: a longer window is the same function (and any int)
    far, total = _far(fq, fk, v1, wn, is_causal, chunk, S0)
    far_den = far[..., -1] + eps
    lam, absd = _log_far(far_den)
    kz = zero_padded(k.to(acc), keep)
    num, den, m = _band(q.to(acc), kz, v1[..., :-1], None if keep is None else keep[..., 0],
                        lam, wn, is_causal, chunk)
    o = _combine(num, den, far[..., :-1], far_den, absd, m)[..., P:, :].to(q.dtype)
    if not return_state:
        return o
    n_keep = min(N, w)  # the last min(N, w) tokens fill the ring buffer, token p in slot p % w
    shift = (count + T - n_keep) % w
    pad = (0, 0, 0, w - n_keep)
    buf_k = F.pad(k[..., N - n_keep:, :], pad).roll(shift, -2)
    buf_v = F.pad(v[..., N - n_keep:, :], pad).roll(shift, -2)
    state = WindowLinearAttentionState(S=total[..., :-1], z=total[..., -1], k=buf_k, v=buf_v,
                                       count=count + T)
    return o, state


@takes_inference_tensors()
def window_linear_attention_step(
    q_t: Tensor,
    k_t: Tensor,
    v_t: Tensor,
    state: WindowLinearAttentionState,
    *,
    window: int,
    feature_map: str | FeatureMap = "elu",
    eps: float | None = None,
) -> tuple[Tensor, WindowLinearAttentionState]:
    """One causal decoding step. q_t, k_t: (..., D); v_t: (..., Dv); state for batch ``...``.

    The token in slot ``count mod w`` leaves the window (φ(k)[v, 1] added to S, z), the new
    key and value take its slot, and the query attends exactly to the buffer and linearly to S,
    z: O(w·(D + Dv) + ℓ·Dv) per token. Returns o_t (..., Dv) in q_t's dtype and the new state
    (the old one untouched)."""
    check_step_inputs(q_t, k_t, v_t)
    w = check_state_window(window)
    fmap, eps = resolve(feature_map, eps)
    fq, fk = features(fmap, q_t, k_t)
    acc = fq.dtype
    st = _checked_state(state, "state", q_t.unsqueeze(-2), v_t.unsqueeze(-2), fk.shape[-1], w)
    count = int(st.count)
    slot = count % w
    S, z = st.S.to(acc), st.z.to(acc)
    if count >= w:  # the oldest token leaves the window for the linear state
        old_k = st.k[..., slot, :]
        old_v = st.v[..., slot, :].to(acc)
        f_old = fmap.forward_keys(old_k.to(acc))
        S = S + f_old.unsqueeze(-1) * old_v.unsqueeze(-2)
        z = z + f_old
    buf_k, buf_v = st.k.clone(), st.v.clone()  # new tensors: the old state stays as it was
    buf_k[..., slot, :] = k_t
    buf_v[..., slot, :] = v_t

    s = (buf_k.to(acc) @ q_t.to(acc).unsqueeze(-1)).squeeze(-1) * (1.0 / math.sqrt(q_t.shape[-1]))
    if count + 1 < w:  # slots count + 1 … w − 1 are still unused
        s = F.pad(s[..., : count + 1], (0, w - count - 1), value=float("-inf"))
    far = (fq.unsqueeze(-2) @ S).squeeze(-2)
    far_den = (fq * z).sum(-1) + eps
    lam, absd = _log_far(far_den)
    m = _row_max(s, lam)
    e = torch.exp(s - m.unsqueeze(-1))  # (..., w)
    num = (e.unsqueeze(-2) @ buf_v.to(acc)).squeeze(-2)
    o = _combine(num, e.sum(-1), far, far_den, absd, m).to(q_t.dtype)
    return o, WindowLinearAttentionState(S=S, z=z, k=buf_k, v=buf_v, count=count + 1)
