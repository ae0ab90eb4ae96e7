r"""Gated linear attention (GLA) for the causal models: per-key learned decays as a token mixer.

Per head h and token t (Yang et al., "Gated Linear Attention Transformers with
Hardware-Efficient Training", 2023; flash-linear-attention's ``GatedLinearAttention`` layer
without the short convolution):

* ``q_t, k_t, v_t = W_q x_t, W_k x_t, W_v x_t`` (no feature map: GLA uses q and k as they are);
* per-key log-gates ``gk_t = logsigmoid(W_2 W_1 x_t + b) / τ ∈ (−∞, 0]^d``: a low-rank
  projection (rank r = 16) gives one forget gate per key dimension, and the normaliser τ = 16
  keeps the decays ``e^{gk}`` near 1 at initialisation (``logsigmoid(0)/16 = −0.043``, a memory
  of ~23 tokens) so that early training sees a long context;
* the state update of :func:`linattn.gated_linear_attention`,
  ``S_t = diag(e^{gk_t}) S_{t−1} + k_t v_tᵀ``, ``o_t = S_tᵀ q_t / √d`` (S: (d, d) per head);
* the output: ``out_proj(RMSNorm(o_t) ⊙ SiLU(W_o x_t))`` (a per-head norm and a swish output
  gate, as in Gated DeltaNet: :mod:`linattn.nn.gated_delta`).

There is no scalar gate ``g_t``: the per-key gates contain it (``e^{g}·diag(e^{gk})`` is one
diagonal). The decoding state is the (d, d) matrix per head alone, the same size at every
position.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor, nn

from linattn._config import POSITIVE_INT, Check, Range
from linattn.nn.attention import MultiheadAttentionBase
from linattn.nn.mixers import StateDict
from linattn.ops.dispatch import DEFAULT_CHUNK_SIZE
from linattn.ops.gated.op import gated_linear_attention, gated_linear_attention_step

__all__ = ["GLAAttention", "GLAState", "GATE_RANK", "GATE_NORMALISER"]

#: The rank of the gate projection (fla's ``gate_low_rank_dim``).
GATE_RANK = 16
#: τ: the log-gates are ``logsigmoid(·) / τ`` (fla's ``gate_logit_normalizer``).
GATE_NORMALISER = 16.0
_POSITIVE = Check(float, Range(0.0, math.inf, False, False))


@dataclass(frozen=True)
class GLAState(StateDict):
    """The per-layer decoding state of :class:`GLAAttention`: ``kv`` (B, H, d, d), float32
    (float64 for a float64 model), the decayed sum of ``k_t v_tᵀ``. :meth:`to_dict` /
    :meth:`from_dict` save it as ``{"kv": kv}``; the field is not named ``S`` so that a saved
    state tells itself apart from Gated DeltaNet's (``LMState.from_dict`` needs no
    ``attention=``)."""

    kv: Tensor


class GLAAttention(MultiheadAttentionBase):
    """Causal gated linear attention mixing: (B, T, E) -> (B, T, E) with a :class:`GLAState`.

    ``forward(x, state, position)`` runs the chunked form
    (:func:`~linattn.gated_linear_attention`, the compiled backend where the dispatcher takes
    it) for T > 1 or without a state, the recurrent step for T = 1 with one; ``position`` is
    unused (the gates carry order). Parameters: the four projections of
    :class:`~linattn.nn.attention.MultiheadAttentionBase` (E×H·d each), the output gate ``W_o``
    (E×H·d), the gate projection ``W_1`` (E×r), ``W_2`` (r×H·d) and its bias (H·d), the norm's
    weight (d).

    Args:
        d_model: E. num_heads: H. head_dim: d (default E / H), for keys and values alike.
        chunk_size: the chunk of the chunked form. bias: biases on the four projections.
        dropout: dropout on the output projection.
        gate_rank: r, the rank of the gate projection. gate_normaliser: τ (see the module
            docstring).
    """

    def __init__(self, d_model: int, num_heads: int, head_dim: int | None = None, *,
                 chunk_size: int = DEFAULT_CHUNK_SIZE, bias: bool = False,
                 dropout: float = 0.0, gate_rank: int = GATE_RANK,
                 gate_normaliser: float = GATE_NORMALISER) -> None:
        super().__init__(d_model, num_heads, head_dim, bias=bias, dropout=dropout)
        gate_rank = int(POSITIVE_INT.check("gate_rank", gate_rank))
        gate_normaliser = _POSITIVE.check("gate_normaliser", gate_normaliser)
        inner = num_heads * self.head_dim
        self.chunk_size = chunk_size
        self.gate_normaliser = float(gate_normaliser)
        # low rank: per-key gates for every head cost E·r + r·H·d, not E·H·d
        self.gk_proj = nn.Sequential(nn.Linear(d_model, gate_rank, bias=False),
                                     nn.Linear(gate_rank, inner, bias=True))
        self.gate_proj = nn.Linear(d_model, inner, bias=False)
        self.norm = nn.RMSNorm(self.head_dim, eps=1e-5)

    def gates(self, x: Tensor) -> Tensor:
        """The per-key log-gates gk (B, H, T, d) ≤ 0 for x (B, T, E)."""
        # logsigmoid on a tensor laid out as (B, H, T, d): inside a compiled backward the fake
        # strides of an elementwise gradient follow its input, eager's its gradient, and the
        # two must agree (as softplus in linattn.nn.gated_delta)
        a = self._heads(self.gk_proj(x)).contiguous()
        return F.logsigmoid(a) / self.gate_normaliser

    def forward(self, x: Tensor, state: GLAState | None = None,
                position: int = 0) -> tuple[Tensor, GLAState]:
        """x: (B, T, E) after ``state`` (or none). Returns (out (B, T, E), new state)."""
        if state is not None and not isinstance(state, GLAState):
            raise TypeError(f"state: expected a GLAState, got {type(state).__name__}")
        # laid out as (B, H, T, d): the compiled kernels read them so (the op would copy
        # them anyway), and the fake (shape-only) gradients of linattn::gla_backward take the
        # inputs' strides while the kernel returns contiguous ones, which breaks a compiled
        # backward on the transposed views project() returns
        q, k, v = (t.contiguous() for t in self.project(x))  # (B, H, T, d) each
        gk = self.gates(x)
        S0 = None if state is None else state.kv
        if x.shape[1] == 1 and state is not None:  # a decoding step: O(d²) per head
            o, S = gated_linear_attention_step(q[:, :, 0], k[:, :, 0], v[:, :, 0], S0,
                                               gk_t=gk[:, :, 0])
            o = o.unsqueeze(2)
        else:
            o, S = gated_linear_attention(q, k, v, gk=gk, initial_state=S0, return_state=True,
                                          chunk_size=self.chunk_size)
        o = self.norm(o.to(x.dtype))  # (B, H, T, d)
        gate = F.silu(self._heads(self.gate_proj(x)))
        return self.merge(o * gate), GLAState(S)

    def extra_repr(self) -> str:
        return (super().extra_repr() + f", attention='gla', chunk_size={self.chunk_size}, "
                f"gate_rank={self.gk_proj[0].out_features}, "
                f"gate_normaliser={self.gate_normaliser}")
