r"""Flow-Attention (Flowformer; Wu et al., ICML 2022): linear attention normalised by flows.

Queries are *sinks*, keys are *sources*, φ is a non-negative feature map (sigmoid by default, as
in the paper). With n queries, m keys and ε the stabiliser of the authors' code (``eps``,
default 1e-6, added as they add it):

* incoming flow of sink i, outgoing flow of source j

  .. math:: I_i = (\varphi(q_i)+ε)\cdot\bigl(\textstyle\sum_j \varphi(k_j) + ε\bigr), \qquad
            O_j = (\varphi(k_j)+ε)\cdot\bigl(\textstyle\sum_i \varphi(q_i) + ε\bigr);

* conserved flows (each side's flow computed with the other side's flow normalised to 1)

  .. math:: \hat I_i = (\varphi(q_i)+ε)\cdot\bigl(\textstyle\sum_j \varphi(k_j)/O_j + ε\bigr),
            \qquad \hat O_j = \mathrm{clamp}\bigl((\varphi(k_j)+ε)\cdot
            (\textstyle\sum_i \varphi(q_i)/I_i + ε),\ -1,\ 1\bigr);

* sources compete, sinks are allocated, and

  .. math:: o_i = \sigma\!\bigl(\hat I_i\,\tfrac{n}{m}\bigr)\;
            \frac{\varphi(q_i)^\top \sum_j \varphi(k_j)\,
            \bigl(m\,\mathrm{softmax}_j(\hat O)_j\bigr)\, v_j^\top}{I_i}.

ε enters the four flows only (as ``φ + ε`` and ``Σ + ε``), never the final product, exactly
where the authors' code puts it; ``eps=0`` is the paper's formula. Ô is clamped to [−1, 1] as
in their code ("for stability"): a clamped Ô has zero gradient, and because the softmax then
only sees exp(Ô) ∈ [e⁻¹, e], it needs no max subtraction.

**Causal form** (``is_causal=True``, n = m = T, positions counted from 1). Every sum becomes a
prefix sum, and every flow is divided by the number of terms it sums — the authors' "normalised
by position". With N_k(t), N_q(t) the numbers of unpadded keys and queries at positions ≤ t
(padded positions are not counted; without padding both are t):

.. math::
    I_i &= (\varphi(q_i)+ε)\cdot\bigl(\textstyle\sum_{j\le i}\varphi(k_j)+ε\bigr) / N_k(i), &
    O_j &= (\varphi(k_j)+ε)\cdot\bigl(\textstyle\sum_{i\le j}\varphi(q_i)+ε\bigr) / N_q(j), \\
    \hat I_i &= (\varphi(q_i)+ε)\cdot\bigl(\textstyle\sum_{j\le i}\varphi(k_j)/O_j+ε\bigr)
        / N_k(i), &
    \hat O_j &= \mathrm{clamp}\bigl((\varphi(k_j)+ε)\cdot
        (\textstyle\sum_{i\le j}\varphi(q_i)/I_i+ε) / N_q(j),\ -1,\ 1\bigr), \\
    c_j &= N_k(j)\,\exp(\hat O_j) / \textstyle\sum_{j'\le j}\exp(\hat O_{j'}), &
    o_i &= \sigma(\hat I_i)\;\varphi(q_i)^\top
        \textstyle\sum_{j\le i}\varphi(k_j)\,c_j\,v_j^\top \,/\, (N_k(i)\, I_i).

As in the authors' causal code: (a) the outgoing flow of source j sums the sinks *up to* it
(i ≤ j), not those that will see it (i ≥ j), so that nothing depends on the future; (b) the
competition ``c_j`` is source j's softmax over the running sum up to j itself (its own
position), a fixed weight per source, not a softmax renormalised for every sink i; (c) the
allocation is σ(Î_i) with no n/m factor (the position counts already normalise it); (d) the
output divides by the *un-normalised* incoming flow N_k(i)·I_i. At i = T the prefix sums are
the whole sums, but (b) and the counts make the last row differ from the non-causal form.

**Padding.** ``key_padding_mask`` (True = padding) removes keys: a padded key is no source, it
is absent from every key sum and from m / N_k, and its value is never read (it may hold inf or
nan). ``query_padding_mask`` removes sinks the same way: a padded query takes no part in any
query sum nor in n / N_q, so the other rows do not depend on it; its own row is still computed
from the flows of the others (a probe). Unlike plain linear attention, Flow-Attention couples
the rows through the query sums, so self-attention over a padded batch passes the same mask as
both (:class:`~linattn.nn.MultiheadLinearAttention` with ``attention="flow"`` does): the output
on the real tokens is then that of the unpadded sequence. A row with no source gives zeros, as
in every op.

**Guards.** A flow that is exactly 0 (only with ``eps=0`` and a map with zero features) divides
as 1; counts divide as max(N, 1).

**Cost.** Non-causal: four matrix-vector products over (…, T, ℓ) features and one product
φ(K)ᵀ[c ⊙ V] — O(T·ℓ·Dv) time, O(T·(ℓ + Dv)) memory. Causal: four prefix sums of (…, T, ℓ)
features (blocked: a triangular (32, 32) product per block plus the blocks before), then the
chunked causal product of :func:`linattn.ops._common.causal_chunked` with queries
φ(q_i)/(N_k(i)·I_i) and values c_j v_j — O(T·C·(ℓ + Dv)) time, O(T·(ℓ + Dv + C)) memory,
nothing T×T and no (T, ℓ, Dv) prefix of outer products.
Sums accumulate in float32 at least. The quadratic ground truth is
:func:`linattn.reference.flowformer_attention`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.feature_maps import FEATURE_MAPS, FeatureMap, get_feature_map
from linattn.ops import dispatch
from linattn.ops._common import (
    accumulation_dtype,
    causal_chunked,
    causal_mask,
    check_chunk_size,
    check_eps,
    check_flag,
    check_qkv,
    clamped_chunk,
    guarded,
    key_mask_for,
    masked_key_features,
    to_chunks,
    traced_contiguous,
    zero_padded,
)
from linattn.ops._library import takes_inference_tensors

__all__ = ["flowformer_attention", "SigmoidFeatures", "FLOW_EPS", "flow_feature_map"]

#: The default ``eps`` of Flow-Attention: the authors' stabiliser, whatever the feature map.
FLOW_EPS = 1e-6


class SigmoidFeatures(FeatureMap):
    """φ(x) = sigmoid(x), elementwise, ℓ = d: Flowformer's map (positive, bounded by 1)."""

    def num_features(self, head_dim: int) -> int:
        return head_dim

    def forward_features(self, x: Tensor) -> Tensor:
        return torch.sigmoid(x)


def flow_feature_map(feature_map: str | FeatureMap) -> FeatureMap:
    """``"sigmoid"`` (:class:`SigmoidFeatures`), any other name of
    :data:`linattn.feature_maps.FEATURE_MAPS`, or a :class:`FeatureMap` passed through."""
    if isinstance(feature_map, str):
        if feature_map.lower() == "sigmoid":
            return SigmoidFeatures()
        if feature_map.lower() not in FEATURE_MAPS:
            names = ", ".join(sorted([*FEATURE_MAPS, "sigmoid"]))
            raise ValueError(f"feature_map: unknown name {feature_map!r}; choose from {names}")
    return get_feature_map(feature_map)


def flow_eps(eps: object) -> float:
    """``eps`` checked; None gives :data:`FLOW_EPS`."""
    return FLOW_EPS if eps is None else check_eps(eps)


def query_mask_for(query_padding_mask: Tensor | None, q: Tensor) -> Tensor | None:
    """A (B, Tq) query padding mask (True = padding) as a keep-mask (B, 1, …, 1, Tq, 1) for q of
    shape (B, …, Tq, D) ((Tq,) -> (Tq, 1) for 2-D q); None stays None."""
    return key_mask_for(query_padding_mask, q, name="query_padding_mask")


def _dot(a: Tensor, b: Tensor) -> Tensor:
    """Row-wise dot product over the last dimension: (..., T, ℓ)·(..., T or 1, ℓ) -> (..., T).

    ``einsum`` reaches a batched matmul: ~5× faster than ``(a * b).sum(-1)``, and no temporary."""
    return torch.einsum("...i,...i->...", a, b)


def _flow(a_eps: Tensor, a_eps_sum: Tensor, x: Tensor, eps: float) -> Tensor:
    """(a + ε)·(x + ε) row by row, given a + ε and its feature sum: one product, no (…, T, ℓ)
    temporary for x + ε."""
    return _dot(a_eps, x) + eps * a_eps_sum


def _prefix_sum(x: Tensor, chunk: int) -> Tensor:
    """Σ_{s ≤ t} x_s along dim -2 (x: (…, T, F)), by blocks of ``chunk``: a lower-triangular
    (C, C) product inside each block, plus the sum of the blocks before. BLAS does the work;
    ``cumsum`` along dim -2 is a sequential loop, 2–3× slower on CPU."""
    T, F = x.shape[-2:]
    blocks = to_chunks(x, chunk)  # (…, n, C, F)
    within = torch.matmul(causal_mask(chunk, x.device).to(x.dtype), blocks)
    totals = within[..., -1:, :].cumsum(-3)  # (…, n, 1, F): through the end of each block
    within[..., 1:, :, :] += totals[..., :-1, :, :]  # in place: one pass, no (…, T, F) copy
    # every size explicit: an empty batch (B or H = 0) cannot infer a -1
    return within.reshape(*x.shape[:-2], blocks.shape[-3] * chunk, F)[..., :T, :]


def _count(keep: Tensor | None, like: Tensor, T: int, causal: bool) -> Tensor:
    """How many kept positions (N: (…, 1) non-causal; N(t): (…, T) causal, in like's dtype)."""
    if keep is None:
        if causal:
            return torch.arange(1, T + 1, device=like.device, dtype=like.dtype)
        return like.new_full((1,), float(T))
    kept = keep.squeeze(-1).to(like.dtype)
    return kept.cumsum(-1) if causal else kept.sum(-1, keepdim=True)


@takes_inference_tensors()
def flowformer_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    feature_map: str | FeatureMap = "sigmoid",
    is_causal: bool = False,
    key_padding_mask: Tensor | None = None,
    query_padding_mask: Tensor | None = None,
    eps: float | None = None,
    chunk_size: int | None = None,
) -> Tensor:
    """Flow-Attention. q: (..., Tq, D), k: (..., Tk, D), v: (..., Tk, Dv) -> (..., Tq, Dv).

    Args:
        feature_map: φ, ``"sigmoid"`` (the paper's) or any name / :class:`FeatureMap` of the
            other ops; the flows assume φ ≥ 0.
        is_causal: the causal form of the module docstring (needs Tq == Tk).
        key_padding_mask: bool (B, Tk), True = padded key: no source.
        query_padding_mask: bool (B, Tq), True = padded query: no sink (its row is still
            computed). For self-attention over padded sequences pass the same mask as both.
        eps: the flows' stabiliser ε, a finite number >= 0 (None: :data:`FLOW_EPS`, 1e-6).
        chunk_size: C of the causal product (default
            the policy's, :data:`linattn.ops.dispatch.DEFAULT_CHUNK_SIZE`).

    Returns:
        (..., Tq, Dv) in q's dtype.
    """
    is_causal = check_flag(is_causal, "is_causal")
    check_qkv(q, k, v, same_length=is_causal)
    fmap = flow_feature_map(feature_map)
    eps = flow_eps(eps)
    chunk = check_chunk_size(chunk_size, dispatch.policy().chunk_size)
    keep_k = key_mask_for(key_padding_mask, k)
    keep_q = query_mask_for(query_padding_mask, q)
    acc = accumulation_dtype(q.dtype)
    fq = fmap.forward_queries(traced_contiguous(q.to(acc)))  # (..., Tq, ℓ): every row
    fk = masked_key_features(fmap, k.to(acc), keep_k)  # (..., Tk, ℓ), padded rows 0
    sq = zero_padded(fq, keep_q)  # the sinks that enter the query sums
    v = zero_padded(v.to(acc), keep_k)
    Tq, Tk = q.shape[-2], k.shape[-2]
    nq = _count(keep_q, fq, Tq, is_causal)
    nk = _count(keep_k, fq, Tk, is_causal)
    if is_causal:
        out = _causal(fq, fk, sq, v, nq, nk, keep_q, keep_k, eps, clamped_chunk(chunk, Tq))
    else:
        out = _non_causal(fq, fk, sq, v, nq, nk, keep_q, keep_k, eps)
    return out.to(q.dtype)


def _non_causal(fq: Tensor, fk: Tensor, sq: Tensor, v: Tensor, nq: Tensor, nk: Tensor,
                keep_q: Tensor | None, keep_k: Tensor | None, eps: float) -> Tensor:
    """fq (…, n, ℓ), fk (…, m, ℓ) (padded keys 0), sq = fq with padded sinks 0, v (…, m, Dv)
    (padded keys 0), nq / nk (…, 1) counts, keep_q / keep_k keep-masks or None. Everything is a
    reduction over T or a matrix-vector product."""
    def flow(a: Tensor, x: Tensor) -> Tensor:  # (a_t + ε)·(x + ε) for every row t: (…, T)
        x = x + eps
        return torch.einsum("...tl,...l->...t", a, x) + eps * x.sum(-1, keepdim=True)

    incoming = guarded(flow(fq, fk.sum(-2)), 0.0)  # I: (…, n)
    outgoing = guarded(flow(fk, sq.sum(-2)), 0.0)  # O: (…, m)
    # a padded sink's I may be anything (its q is not checked): where, not a product
    inv_in = 1 / incoming if keep_q is None else torch.where(
        keep_q.squeeze(-1), 1 / incoming, incoming.new_zeros(()))
    sink_in = torch.einsum("...t,...tl->...l", inv_in, sq)  # Σ_i φ(q_i)/I_i: (…, ℓ)
    source_out = torch.einsum("...t,...tl->...l", 1 / outgoing, fk)  # Σ_j φ(k_j)/O_j
    conserved_sink = flow(fq, source_out)  # Î: (…, n)
    conserved_source = flow(fk, sink_in).clamp(-1.0, 1.0)  # Ô: (…, m)
    allocation = torch.sigmoid(conserved_sink * (nq / nk.clamp(min=1)))
    e = conserved_source.exp()  # Ô ≤ 1: no max to subtract
    if keep_k is not None:
        e = torch.where(keep_k.squeeze(-1), e, e.new_zeros(()))
    competition = e * (nk / guarded(e.sum(-1, keepdim=True), 0.0))  # m·softmax(Ô): (…, m)
    state = fk.transpose(-1, -2) @ (competition.unsqueeze(-1) * v)  # Σ φ(k_j) c_j v_jᵀ: (…, ℓ, Dv)
    return (fq @ state) * (allocation / incoming).unsqueeze(-1)


def _causal(fq: Tensor, fk: Tensor, sq: Tensor, v: Tensor, nq: Tensor, nk: Tensor,
            keep_q: Tensor | None, keep_k: Tensor | None, eps: float, chunk: int) -> Tensor:
    """As :func:`_non_causal` with prefix sums; nq / nk are the counts N(t): (…, T) or (T,)."""
    block = min(chunk, 32)  # prefix sums: a (C, C) product costs C flops per element
    fq_e, fk_e = fq + eps, fk + eps
    sq_e, sk_e = fq_e.sum(-1), fk_e.sum(-1)  # Σ_ℓ (φ + ε): the ε part of every flow
    raw_in = guarded(_flow(fq_e, sq_e, _prefix_sum(fk, block), eps), 0.0)  # N_k(i)·I_i: (…, T)
    raw_out = guarded(_flow(fk_e, sk_e, _prefix_sum(sq, block), eps), 0.0)  # N_q(j)·O_j
    inv_in = nk / raw_in  # 1/I_i: 0, not 0/0, before the first key
    inv_out = nq / raw_out  # 1/O_j
    nk1, nq1 = nk.clamp(min=1), nq.clamp(min=1)
    sources = fk * inv_out.unsqueeze(-1)  # φ(k_j)/O_j (padded keys: 0)
    conserved_sink = _flow(fq_e, sq_e, _prefix_sum(sources, block), eps) / nk1
    sinks = zero_padded(fq * inv_in.unsqueeze(-1), keep_q)  # φ(q_i)/I_i of the real sinks
    conserved_source = (_flow(fk_e, sk_e, _prefix_sum(sinks, block), eps) / nq1).clamp(-1, 1)
    e = conserved_source.exp()
    if keep_k is not None:
        e = torch.where(keep_k.squeeze(-1), e, e.new_zeros(()))
    competition = e * nk / guarded(e.cumsum(-1), 0.0)  # c_j: (…, T)
    del fq_e, fk_e, sources, sinks  # not needed below: the peak holds fewer (…, T, ℓ) tensors
    out, _ = causal_chunked(fq / raw_in.unsqueeze(-1), fk, v * competition.unsqueeze(-1),
                            chunk, None)
    return out * torch.sigmoid(conserved_sink).unsqueeze(-1)
