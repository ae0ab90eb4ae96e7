r"""Gated DeltaNet attention for the causal models: the gated delta rule as a token mixer.

Per head h and token t (Yang et al., "Gated Delta Networks", 2025, without the short
convolution):

* ``q_t, k_t = L2norm(SiLU(W_q x_t)), L2norm(SiLU(W_k x_t))``, ``v_t = W_v x_t``;
* a write strength ``β_t = sigmoid(w_β·x_t)`` and a log-decay
  ``g_t = −exp(A_h)·softplus(w_a·x_t + b_h) ≤ 0`` (Mamba-2's parameterisation: A_h and b_h
  learned, initialised so that the decays span short and long memories);
* the state update of :func:`linattn.ops.delta.delta_rule`,
  ``S_t = e^{g_t} S_{t−1} + k_t β_t (v_t − e^{g_t} S_{t−1}ᵀk_t)ᵀ``, ``o_t = S_tᵀ q_t / √d``;
* the output: ``out_proj(RMSNorm(o_t) ⊙ SiLU(W_o x_t))`` (a per-head norm and an output gate).

The state is one (d, d) matrix per head, the same size at every position. The published model
also runs a short causal convolution over q, k and v; it is left out here so that the decoding
state is the delta-rule state alone.

DeltaNet (``attention="deltanet"``; Yang et al., "Parallelizing Linear Transformers with the
Delta Rule over Sequence Length", 2024) is the same module with ``gated=False``: no decay
(``g_t = 0``, α = 1), so ``S_t = S_{t−1} + k_t β_t (v_t − S_{t−1}ᵀk_t)ᵀ``; the state forgets only
by overwriting. It has no decay parameters (``w_a``, A_h, b_h) and keeps the rest: SiLU and
L2-normalised q, k, the write strength β, the per-head norm and the output gate. Both kinds
return a :class:`DeltaRuleState`; a saved state does not say which kind wrote it (nor does it
need to: the field is the same (d, d) matrix).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linattn.nn.attention import MultiheadAttentionBase
from linattn.nn.mixers import StateDict
from linattn.ops.delta.op import delta_rule, delta_rule_step
from linattn.ops.dispatch import DEFAULT_CHUNK_SIZE

__all__ = ["GatedDeltaAttention", "DeltaRuleState"]


@dataclass(frozen=True)
class DeltaRuleState(StateDict):
    """The per-layer decoding state of :class:`GatedDeltaAttention`: S (B, H, d, d), float32;
    :meth:`to_dict` / :meth:`from_dict` save it as ``{"S": S}``."""

    S: Tensor


class GatedDeltaAttention(MultiheadAttentionBase):
    """Causal (Gated) DeltaNet mixing: (B, T, E) -> (B, T, E) with a :class:`DeltaRuleState`.

    ``forward(x, state, position)`` runs the chunked form (:func:`~linattn.ops.delta.delta_rule`)
    for T > 1 or without a state, the recurrent step for T = 1 with one; ``position`` is unused
    (the decays, or the order of the writes, carry order). Parameters: the four projections of
    :class:`~linattn.nn.attention.MultiheadAttentionBase`, the output gate ``W_o`` (E×H·d), and
    per head ``w_β`` (E), and with ``gated`` ``w_a`` (E), A_h and b_h.

    Args:
        gated: the gated delta rule (Gated DeltaNet, the default); False: the plain delta rule
            (DeltaNet), without the decay parameters (module docstring).
    """

    def __init__(self, d_model: int, num_heads: int, head_dim: int | None = None, *,
                 chunk_size: int = DEFAULT_CHUNK_SIZE, bias: bool = False,
                 dropout: float = 0.0, gated: bool = True) -> None:
        super().__init__(d_model, num_heads, head_dim, bias=bias, dropout=dropout)
        if not isinstance(gated, bool):
            raise TypeError(f"gated: expected a bool, got {type(gated).__name__}")
        H, inner = num_heads, num_heads * self.head_dim
        self.chunk_size, self.gated = chunk_size, gated
        self.beta_proj = nn.Linear(d_model, H, bias=True)
        if gated:  # DeltaNet has no decay: no parameters that nothing would train
            self.decay_proj = nn.Linear(d_model, H, bias=False)
        self.gate_proj = nn.Linear(d_model, inner, bias=False)
        self.norm = nn.RMSNorm(self.head_dim, eps=1e-5)
        if gated:
            # A_h: rates spread over [1, 16] (log-uniform); b_h: softplus(b_h) = Δ_h in
            # [1e-3, 1e-1] (log-uniform), so e^{g} starts between ~0.2 and ~0.999 per token.
            rates = torch.exp(torch.linspace(math.log(1.0), math.log(16.0), H))
            deltas = torch.exp(torch.linspace(math.log(1e-3), math.log(1e-1), H))
            self.A_log = nn.Parameter(rates.log())
            self.dt_bias = nn.Parameter(deltas + torch.log(-torch.expm1(-deltas)))  # softplus⁻¹

    def gates(self, x: Tensor) -> tuple[Tensor, Tensor | None]:
        """β (B, H, T) in (0, 1) and g (B, H, T) ≤ 0 for x (B, T, E); g is None when not
        ``gated`` (the ops' plain delta rule)."""
        beta = torch.sigmoid(self.beta_proj(x)).transpose(1, 2)
        if not self.gated:
            return beta, None
        # softplus on a (B, H, T) tensor laid out as such: torch 2.13's fake strides of
        # softplus_backward follow its input and eager's its gradient, so a compiled backward
        # with the two in different layouts fails on a view
        a = (self.decay_proj(x) + self.dt_bias).transpose(1, 2).contiguous()
        return beta, -self.A_log.exp()[:, None] * F.softplus(a)

    def forward(self, x: Tensor, state: DeltaRuleState | None = None,
                position: int = 0) -> tuple[Tensor, DeltaRuleState]:
        """x: (B, T, E) after ``state`` (or none). Returns (out (B, T, E), new state)."""
        if state is not None and not isinstance(state, DeltaRuleState):
            raise TypeError(f"state: expected a DeltaRuleState, got {type(state).__name__}")
        q, k, v = self.project(x)
        q, k = F.silu(q), F.silu(k)
        beta, g = self.gates(x)
        S0 = None if state is None else state.S
        if x.shape[1] == 1 and state is not None:  # a decoding step: O(d²) per head
            o, S = delta_rule_step(q[:, :, 0], k[:, :, 0], v[:, :, 0], beta[..., 0], S0,
                                   g_t=None if g is None else g[..., 0], qk_l2norm=True)
            o = o.unsqueeze(2)
        else:
            o, S = delta_rule(q, k, v, beta, g, initial_state=S0, return_state=True,
                              chunk_size=self.chunk_size, qk_l2norm=True)
        o = self.norm(o.to(x.dtype))  # (B, H, T, d)
        gate = F.silu(self._heads(self.gate_proj(x)))
        return self.merge(o * gate), DeltaRuleState(S)

    def extra_repr(self) -> str:
        kind = "gated_delta" if self.gated else "deltanet"
        return super().extra_repr() + f", attention={kind!r}, chunk_size={self.chunk_size}"
