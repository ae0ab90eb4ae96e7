r"""Causal Flowformer (Flow-Attention) for the causal models: linear attention normalised by
conserved flows, as a token mixer.

Per head, with ``q_t, k_t, v_t = W_q x_t, W_k x_t, W_v x_t`` and φ = sigmoid (the paper's map),
the causal form of :func:`linattn.flowformer_attention` (Wu et al., "Flowformer: Linearizing
Transformers with Conservation Flows", 2022; its docstring has the formulas): with positions
counted from 1, N(t) = t tokens up to t, and ε the authors' stabiliser
(:data:`~linattn.ops.flowformer.op.FLOW_EPS`),

* incoming and outgoing flows ``N·I_t = (φ(q_t)+ε)·(Σ_{j≤t} φ(k_j)+ε)``,
  ``N·O_t = (φ(k_t)+ε)·(Σ_{i≤t} φ(q_i)+ε)``;
* conserved flows ``Î_t = (φ(q_t)+ε)·(Σ_{j≤t} φ(k_j)/O_j+ε) / N``,
  ``Ô_t = clamp((φ(k_t)+ε)·(Σ_{i≤t} φ(q_i)/I_i+ε) / N, −1, 1)``;
* competition ``c_t = N·exp(Ô_t) / Σ_{j≤t} exp(Ô_j)``;
* ``o_t = σ(Î_t)·φ(q_t)ᵀ Σ_{j≤t} φ(k_j) c_j v_jᵀ / (N·I_t)``, then ``out_proj(o_t)``.

Every quantity of token t is a function of token t and of running sums over the tokens up to
it, so the causal form is a recurrence. **The state** holds those sums, per head (ℓ = d):
``k_sum`` Σ φ(k_j), ``q_sum`` Σ φ(q_i), ``source_sum`` Σ φ(k_j)/O_j, ``sink_sum``
Σ φ(q_i)/I_i (ℓ each), ``e_sum`` Σ exp(Ô_j) (a scalar) and ``kv`` Σ φ(k_j) c_j v_jᵀ (ℓ, d):
the same size at every position. The count N is read from ``position`` (the tokens before the
call), which the model passes.

One form serves every length (:func:`flow_chunked`): the four flow sums as prefix sums
(``cumsum``) continuing the state's and the product as
:func:`linattn.ops._common.causal_chunked`; a decoding step is its one-token case
(:func:`flowformer_step`). From an empty state at
position 0 the module computes what :func:`linattn.flowformer_attention` (``is_causal=True``)
computes on its projections.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from linattn.nn.attention import MultiheadAttentionBase
from linattn.nn.mixers import StateDict
from linattn.ops._common import accumulation_dtype, causal_chunked, clamped_chunk, guarded
from linattn.ops.dispatch import DEFAULT_CHUNK_SIZE
from linattn.ops.flowformer.op import FLOW_EPS

__all__ = ["FlowformerAttention", "FlowState", "flow_chunked", "flowformer_step"]


@dataclass(frozen=True)
class FlowState(StateDict):
    """The per-layer decoding state of :class:`FlowformerAttention` (module docstring), float32
    (float64 for a float64 model), over the tokens so far: ``k_sum``, ``q_sum``,
    ``source_sum``, ``sink_sum`` (B, H, d) each, ``e_sum`` (B, H) and ``kv`` (B, H, d, d).
    :meth:`to_dict` / :meth:`from_dict` save it as a dict of those six entries."""

    k_sum: Tensor
    q_sum: Tensor
    source_sum: Tensor
    sink_sum: Tensor
    e_sum: Tensor
    kv: Tensor


def _flow(a: Tensor, x: Tensor, eps: float) -> Tensor:
    """(a + ε)·(x + ε) over the last dimension: a (..., ℓ), x (..., ℓ) broadcastable."""
    return torch.einsum("...l,...l->...", a + eps, x + eps)


def flow_chunked(fq: Tensor, fk: Tensor, v: Tensor, state: FlowState | None, position: int,
                 chunk: int, eps: float = FLOW_EPS) -> tuple[Tensor, FlowState]:
    """The causal form over T tokens after ``state``: fq = φ(q), fk = φ(k) (B, H, T, ℓ) and v
    (B, H, T, d), all in the accumulation dtype, after ``position`` tokens. Prefix sums start
    from the state's sums, counts N(t) = position + t (t = 1 … T); the product runs in chunks
    of ``chunk``. Returns (o (B, H, T, d), the state after the T tokens)."""
    T = fq.shape[-2]
    n = torch.arange(1, T + 1, device=fq.device, dtype=fq.dtype) + position  # (T,)

    def prefix(x: Tensor, start: Tensor | None) -> Tensor:  # Σ_{s ≤ t} x_s (+ the state's)
        s = x.cumsum(-2)
        return s if start is None else s + start.unsqueeze(-2)

    st = state
    k_sum = prefix(fk, None if st is None else st.k_sum)  # (B, H, T, ℓ)
    q_sum = prefix(fq, None if st is None else st.q_sum)
    raw_in = guarded(_flow(fq, k_sum, eps), 0.0)  # N·I: (B, H, T)
    raw_out = guarded(_flow(fk, q_sum, eps), 0.0)  # N·O
    source_sum = prefix(fk * (n / raw_out).unsqueeze(-1), None if st is None else st.source_sum)
    sink_sum = prefix(fq * (n / raw_in).unsqueeze(-1), None if st is None else st.sink_sum)
    conserved_sink = _flow(fq, source_sum, eps) / n
    conserved_source = (_flow(fk, sink_sum, eps) / n).clamp(-1.0, 1.0)
    e = conserved_source.exp()  # Ô ≤ 1: bounded, no max to subtract
    e_sum = e.cumsum(-1) if st is None else e.cumsum(-1) + st.e_sum.unsqueeze(-1)
    competition = e * n / guarded(e_sum, 0.0)  # c_t: (B, H, T)
    out, kv = causal_chunked(fq / raw_in.unsqueeze(-1), fk, v * competition.unsqueeze(-1),
                             clamped_chunk(chunk, T), None if st is None else st.kv)
    o = out * torch.sigmoid(conserved_sink).unsqueeze(-1)
    last = (k_sum[..., -1, :], q_sum[..., -1, :], source_sum[..., -1, :],
            sink_sum[..., -1, :], e_sum[..., -1])
    return o, FlowState(*(t.contiguous() for t in last), kv)


def flowformer_step(fq: Tensor, fk: Tensor, v: Tensor, state: FlowState | None, count: int,
                    eps: float = FLOW_EPS) -> tuple[Tensor, FlowState]:
    """One decoding step: the features fq = φ(q_t), fk = φ(k_t) (B, H, ℓ) and v_t (B, H, d),
    all in the accumulation dtype, of the ``count``-th token (counted from 1). Returns
    (o_t (B, H, d), the new state): :func:`flow_chunked` over one token, O(ℓ·d) per head."""
    o, new = flow_chunked(fq.unsqueeze(-2), fk.unsqueeze(-2), v.unsqueeze(-2), state,
                          count - 1, 1, eps)
    return o[..., 0, :], new


class FlowformerAttention(MultiheadAttentionBase):
    """Causal Flow-Attention mixing: (B, T, E) -> (B, T, E) with a :class:`FlowState`.

    ``forward(x, state, position)``: the causal form (:func:`flow_chunked`) continuing
    ``state``, one token or many; ``position`` (the tokens before x) gives the counts N.
    Parameters: the four projections of :class:`~linattn.nn.attention.MultiheadAttentionBase`
    (its ``feature_map`` is unused: φ is sigmoid).

    Args:
        d_model: E. num_heads: H. head_dim: d (default E / H).
        chunk_size: the chunk of the causal product. bias: biases on the four projections.
        dropout: dropout on the output projection.
    """

    def __init__(self, d_model: int, num_heads: int, head_dim: int | None = None, *,
                 chunk_size: int = DEFAULT_CHUNK_SIZE, bias: bool = False,
                 dropout: float = 0.0) -> None:
        super().__init__(d_model, num_heads, head_dim, bias=bias, dropout=dropout)
        self.chunk_size = chunk_size
        self.eps = FLOW_EPS

    def forward(self, x: Tensor, state: FlowState | None = None,
                position: int = 0) -> tuple[Tensor, FlowState]:
        """x: (B, T, E) after ``state`` (``position`` tokens, or none). Returns (out (B, T, E),
        new state)."""
        if state is not None and not isinstance(state, FlowState):
            raise TypeError(f"state: expected a FlowState, got {type(state).__name__}")
        q, k, v = self.project(x)  # (B, H, T, d) each
        acc = accumulation_dtype(x.dtype)
        fq, fk, v = torch.sigmoid(q.to(acc)), torch.sigmoid(k.to(acc)), v.to(acc)
        # one form for every T: a decoding step (T = 1 with a state) is O(d²) per head
        o, new = flow_chunked(fq, fk, v, state, position, self.chunk_size, self.eps)
        return self.merge(o.to(x.dtype)), new

    def extra_repr(self) -> str:
        return super().extra_repr() + f", attention='flowformer', chunk_size={self.chunk_size}"
