r"""Causal cosFormer attention for the causal models: ReLU features re-weighted by position.

Per head and token (Qin et al., "cosFormer: Rethinking Softmax in Attention", 2022; the causal
form): with ``q_t, k_t, v_t = W_q x_t, W_k x_t, W_v x_t`` and the angle
``a_t = π/2 · t / M`` of the absolute position t,

.. math:: o_i = \frac{\sum_{j \le i} \mathrm{relu}(q_i)\cdot\mathrm{relu}(k_j)\,
          \cos(a_i - a_j)\, v_j}{\sum_{j \le i} \mathrm{relu}(q_i)\cdot\mathrm{relu}(k_j)\,
          \cos(a_i - a_j) + ε}

and ``cos(a_i − a_j) = cos a_i cos a_j + sin a_i sin a_j``, so the weight is the dot product of
the 2d features ``[relu(x_t) cos a_t, relu(x_t) sin a_t]``: linear attention with those features
(one numerator, one normaliser), the same form as :func:`linattn.cosformer_attention`.

**The horizon M.** The op re-weights with M = T, the length of the sequence it is given; a
causal model that decodes one token at a time does not know the final length, so here M is a
constant, the ``horizon`` (default :data:`DEFAULT_HORIZON`). The weight of a lag i − j is
``cos(π/2 · (i − j)/M)``: 1 for the token itself, falling to 0 at a lag of M. Past the horizon
the cosine turns negative and the normaliser may vanish or change sign, so the module refuses
positions ≥ M (a ValueError): a model decodes at most ``horizon`` tokens in all, as a model with
absolute position embeddings does at most its maximum length. With M equal to the length of a
sequence at position 0 the module computes what :func:`linattn.cosformer_attention` computes
(``is_causal=True``) on its projections.

**The state.** The running sums of the 2d features, ``Σ_j φ(k_j) v_jᵀ`` (the cos and the sin
halves, (2d, d) per head) and ``Σ_j φ(k_j)`` (2d): the same size at every position. The angle of
a new token is read from ``position`` (the tokens before it), which the model passes.

The output is ``out_proj(o)``, as in the paper (no norm or gate).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from linattn._config import POSITIVE_INT
from linattn.nn.attention import MultiheadAttentionBase
from linattn.nn.mixers import COSFORMER_HORIZON, StateDict
from linattn.ops._common import accumulation_dtype, causal_chunked, clamped_chunk, normalise
from linattn.ops.cosformer.op import CosFormerFeatures
from linattn.ops.dispatch import DEFAULT_CHUNK_SIZE

__all__ = ["CosFormerAttention", "CosFormerState", "DEFAULT_HORIZON", "cosformer_features",
           "cosformer_chunked", "cosformer_step"]

#: M, the lag at which the cosine weight reaches 0, and the most tokens a model decodes: 1024,
#: four times the language model's default context (``linattn lm train --context 256``), so
#: that a lag of a whole training context still weighs cos(π/8) ≈ 0.92. Declared torch-free
#: with the kinds (the commands check a context against it before torch is loaded).
DEFAULT_HORIZON = COSFORMER_HORIZON
#: ε of the normaliser: the op's (relu features can give a zero normaliser).
EPS = CosFormerFeatures.eps


@dataclass(frozen=True)
class CosFormerState(StateDict):
    """The per-layer decoding state of :class:`CosFormerAttention`, float32 (float64 for a
    float64 model): ``kv`` (B, H, 2d, d) = Σ_j φ(k_j) v_jᵀ and ``k_sum`` (B, H, 2d) = Σ_j φ(k_j)
    over the tokens so far, φ the 2d cos/sin features (rows 0…d−1 the cos half, d…2d−1 the
    sin half). :meth:`to_dict` / :meth:`from_dict` save it as ``{"kv": …, "k_sum": …}``."""

    kv: Tensor
    k_sum: Tensor


def cosformer_features(x: Tensor, position: int, horizon: int) -> Tensor:
    """[relu(x_t) cos a_t, relu(x_t) sin a_t] for x (..., T, d) at the absolute positions
    ``position`` … ``position + T − 1``, a_t = π/2 · t / horizon: (..., T, 2d), in x's dtype."""
    T = x.shape[-2]
    a = (torch.arange(T, device=x.device, dtype=x.dtype) + position) * (math.pi / (2 * horizon))
    r = F.relu(x)
    return torch.cat([r * a.cos().unsqueeze(-1), r * a.sin().unsqueeze(-1)], dim=-1)


def cosformer_chunked(q: Tensor, k: Tensor, v: Tensor, state: CosFormerState | None,
                      position: int, horizon: int, chunk: int) -> tuple[Tensor, CosFormerState]:
    """The causal form over q, k, v (B, H, T, d) after ``state`` (``position`` tokens), the
    product in chunks of ``chunk`` continuing the state's sums. Returns (o (B, H, T, d) in the
    accumulation dtype, the state after the T tokens)."""
    acc = accumulation_dtype(q.dtype)
    fq = cosformer_features(q.to(acc), position, horizon)
    fk = cosformer_features(k.to(acc), position, horizon)
    # [v, 1]: the numerator and the normaliser in one product (the state's last column is
    # Σ φ(k), kept as its own field)
    v1 = torch.cat([v.to(acc), v.new_ones(*v.shape[:-1], 1, dtype=acc)], -1)
    S0 = None if state is None else torch.cat([state.kv, state.k_sum.unsqueeze(-1)], -1)
    out, S = causal_chunked(fq, fk, v1, clamped_chunk(chunk, q.shape[-2]), S0)
    o = normalise(out[..., :-1], out[..., -1], EPS)
    return o, CosFormerState(S[..., :-1].contiguous(), S[..., -1].contiguous())


def cosformer_step(q_t: Tensor, k_t: Tensor, v_t: Tensor, state: CosFormerState | None,
                   position: int, horizon: int) -> tuple[Tensor, CosFormerState]:
    """One decoding step at absolute position ``position``: q_t, k_t, v_t (B, H, d) ->
    (o_t (B, H, d) in the accumulation dtype, the new state): :func:`cosformer_chunked` over
    one token, O(d²) per head."""
    o, new = cosformer_chunked(q_t.unsqueeze(-2), k_t.unsqueeze(-2), v_t.unsqueeze(-2), state,
                               position, horizon, 1)
    return o[..., 0, :], new


class CosFormerAttention(MultiheadAttentionBase):
    """Causal cosFormer mixing: (B, T, E) -> (B, T, E) with a :class:`CosFormerState`.

    ``forward(x, state, position)``: the chunked causal form (:func:`cosformer_chunked`,
    chunks of ``chunk_size``) continuing ``state``, one token or many. ``position`` (the tokens
    before x) sets the angles; ValueError when ``position + T`` exceeds ``horizon``.
    Parameters: the four projections of :class:`~linattn.nn.attention.MultiheadAttentionBase`
    (its ``feature_map`` is unused: the features are relu with the cos/sin weights).

    Args:
        d_model: E. num_heads: H. head_dim: d (default E / H).
        chunk_size: the chunk of the chunked form. bias: biases on the four projections.
        dropout: dropout on the output projection.
        horizon: M (module docstring), a positive int; default :data:`DEFAULT_HORIZON`.
    """

    def __init__(self, d_model: int, num_heads: int, head_dim: int | None = None, *,
                 chunk_size: int = DEFAULT_CHUNK_SIZE, bias: bool = False,
                 dropout: float = 0.0, horizon: int = DEFAULT_HORIZON) -> None:
        super().__init__(d_model, num_heads, head_dim, bias=bias, dropout=dropout)
        self.chunk_size = chunk_size
        self.horizon = int(POSITIVE_INT.check("horizon", horizon))

    def forward(self, x: Tensor, state: CosFormerState | None = None,
                position: int = 0) -> tuple[Tensor, CosFormerState]:
        """x: (B, T, E) after ``state`` (``position`` tokens, or none). Returns (out (B, T, E),
        new state)."""
        if state is not None and not isinstance(state, CosFormerState):
            raise TypeError(f"state: expected a CosFormerState, got {type(state).__name__}")
        T = x.shape[1]
        if position + T > self.horizon:
            raise ValueError(
                f"position: cosFormer's weights hold for {self.horizon} positions (horizon), got "
                f"tokens {position} … {position + T - 1}")
        q, k, v = self.project(x)  # (B, H, T, d) each
        # one form for every T: a decoding step (T = 1 with a state) is O(d²) per head
        o, new = cosformer_chunked(q, k, v, state, position, self.horizon, self.chunk_size)
        return self.merge(o.to(x.dtype)), new

    def extra_repr(self) -> str:
        return (super().extra_repr() + f", attention='cosformer', chunk_size={self.chunk_size}, "
                f"horizon={self.horizon}")
