r"""The quadratic reference of :func:`linattn.flowformer_attention`.

The ground truth of the tests: O(T²) time and memory by design; never call it on a fast path.
Standalone: it shares no code with the op it checks (only the feature-map objects, an input of
both, and the argument checks of :mod:`linattn.ops._reference_checks`, which no op uses). The
constants that must agree with the op, Flowformer's default ε and its sigmoid map, are restated
here and tests/ops/test_reference.py holds them equal to the op's.
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.feature_maps import FEATURE_MAPS, FeatureMap, get_feature_map
from linattn.ops._reference_checks import (
    check_eps,
    check_padding_mask,
    check_qkv,
    inference_tensors_as_constants,
)

__all__ = ['flowformer_attention']

#: The default ``eps`` of Flow-Attention, the authors' stabiliser; must equal the op's
#: ``linattn.ops.flowformer.FLOW_EPS``.
FLOW_EPS = 1e-6


class SigmoidFeatures(FeatureMap):
    """φ(x) = sigmoid(x), elementwise: Flowformer's default map, the ``"sigmoid"`` name (must
    agree with ``linattn.ops.flowformer.SigmoidFeatures``)."""

    def num_features(self, head_dim: int) -> int:
        return head_dim

    def forward_features(self, x: Tensor) -> Tensor:
        return torch.sigmoid(x)


def _feature_map(feature_map: str | FeatureMap) -> FeatureMap:
    """``"sigmoid"``, any other name of ``FEATURE_MAPS``, or a FeatureMap passed through."""
    if isinstance(feature_map, str):
        if feature_map.lower() == "sigmoid":
            return SigmoidFeatures()
        if feature_map.lower() not in FEATURE_MAPS:
            names = ", ".join(sorted([*FEATURE_MAPS, "sigmoid"]))
            raise ValueError(f"feature_map: unknown name {feature_map!r}; choose from {names}")
    return get_feature_map(feature_map)


def _kept(padding_mask: Tensor | None, x: Tensor) -> Tensor:
    """kept[..., t]: position t is not padding; (T,) or (B, 1, …, 1, T), one axis fewer than x."""
    T = x.shape[-2]
    if padding_mask is None:
        return torch.ones(T, dtype=torch.bool, device=x.device)
    kept = ~padding_mask.to(x.device)
    return kept.reshape(x.shape[0], *[1] * (x.dim() - 3), T) if x.dim() > 2 else kept


@inference_tensors_as_constants
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
) -> Tensor:
    r"""Flow-Attention with every flow a row or column sum of an explicit Tq×Tk matrix: the
    ground truth of :mod:`linattn.ops.flowformer` (whose docstring has the formulas).

    ``A[i, j] = (φ(q_i)+ε)·φ(k_j)`` for the sinks' flows, ``B[j, i] = (φ(k_j)+ε)·φ(q_i)`` for
    the sources'; a sink sees the sources ``j`` of ``L_in[i, j]`` (unpadded, and j ≤ i when
    causal), a source the sinks ``i`` of ``L_out[j, i]`` (unpadded, and i ≤ j when causal); the
    position counts are the row sums of these masks. ``o = W v`` with
    ``W[i, j] = L_in[i, j] σ(Î_i·r) φ(q_i)·φ(k_j) c_j / I_i`` (r = n/m, or 1 when causal).
    A flow that is exactly 0 divides as 1, a count as max(N, 1). Arguments and shapes as
    :func:`linattn.ops.flowformer.op.flowformer_attention` (without ``chunk_size``)."""
    check_qkv(q, k, v, same_length=is_causal)
    fmap = _feature_map(feature_map)
    eps = FLOW_EPS if eps is None else check_eps(eps)
    if key_padding_mask is not None:
        check_padding_mask(key_padding_mask, k, "key_padding_mask", "k")
    if query_padding_mask is not None:
        check_padding_mask(query_padding_mask, q, "query_padding_mask", "q")
    out_dtype = q.dtype
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    q, k, v = q.to(acc), k.to(acc), v.to(acc)
    Tq, Tk = q.shape[-2], k.shape[-2]
    dev = q.device
    zero = q.new_zeros(())

    kk = _kept(key_padding_mask, k)  # (…, Tk): the unpadded sources
    kq = _kept(query_padding_mask, q)  # (…, Tq): the unpadded sinks
    # A padded key is no source: its key (which may hold nan or inf) is 0 before φ, its
    # features 0 after, its value 0. Every query gets an output row, padded or not.
    k = torch.where(kk[..., :, None], k, zero)
    v = torch.where(kk[..., :, None], v, zero)
    fq = fmap.forward_queries(q)  # (…, Tq, ℓ)
    fk = torch.where(kk[..., :, None], fmap.forward_keys(k), zero)  # (…, Tk, ℓ)

    if is_causal:  # Tq == Tk
        pos = torch.arange(Tq, device=dev)
        link_in = pos[:, None] >= pos[None, :]  # [i, j]: j ≤ i
        link_out = link_in  # [j, i]: i ≤ j (the sinks up to the source, as in the authors' code)
    else:
        link_in = torch.ones(Tq, Tk, dtype=torch.bool, device=dev)
        link_out = link_in.transpose(0, 1)
    L_in = link_in & kk.unsqueeze(-2)  # (…, Tq, Tk)
    L_out = link_out & kq.unsqueeze(-2)  # (…, Tk, Tq)
    A = torch.where(L_in, (fq + eps) @ fk.transpose(-1, -2), zero)
    B = torch.where(L_out, (fk + eps) @ fq.transpose(-1, -2), zero)
    eps_q, eps_k = eps * (fq + eps).sum(-1), eps * (fk + eps).sum(-1)  # (φ + ε)·ε1
    I_raw = A.sum(-1) + eps_q  # (…, Tq): incoming flows (times N_k(i) when causal)
    O_raw = B.sum(-1) + eps_k  # (…, Tk): outgoing flows (times N_q(j) when causal)
    I_raw = torch.where(I_raw == 0, torch.ones_like(I_raw), I_raw)
    O_raw = torch.where(O_raw == 0, torch.ones_like(O_raw), O_raw)
    if is_causal:  # flows per visible term: divided by the position counts
        n_in, n_out = L_in.to(acc).sum(-1), L_out.to(acc).sum(-1)  # N_k(i), N_q(j)
    else:
        n_in, n_out = fq.new_ones(()), fq.new_ones(())
    inv_I, inv_O = n_in / I_raw, n_out / O_raw  # 1/I_i, 1/O_j
    conserved_sink = ((A * inv_O.unsqueeze(-2)).sum(-1) + eps_q) / n_in.clamp(min=1)  # Î_i
    sink_terms = torch.where(L_out, B * inv_I.unsqueeze(-2), zero)
    conserved_source = ((sink_terms.sum(-1) + eps_k) / n_out.clamp(min=1)).clamp(-1.0, 1.0)
    e = conserved_source.exp() * kk  # exp(Ô_j), padded sources 0 (bounded: Ô ≤ 1)
    if is_causal:  # c_j over the running sum of the sources j' ≤ j
        pos = torch.arange(Tk, device=dev)
        key_link = (pos[:, None] >= pos[None, :]) & kk.unsqueeze(-2)  # (…, Tk, Tk)
        den = torch.where(key_link, e.unsqueeze(-2), zero).sum(-1)
        n_src = key_link.to(acc).sum(-1)  # N_k(j)
        allocation = torch.sigmoid(conserved_sink)
    else:
        den = e.sum(-1, keepdim=True)
        n_src = kk.to(acc).sum(-1, keepdim=True)  # m
        n_sink = kq.to(acc).sum(-1, keepdim=True)  # n
        allocation = torch.sigmoid(conserved_sink * n_sink / n_src.clamp(min=1))
    competition = e * n_src / torch.where(den == 0, torch.ones_like(den), den)  # c_j: (…, Tk)
    W = torch.where(L_in, fq @ fk.transpose(-1, -2), zero) * competition.unsqueeze(-2)
    W = W * (allocation / I_raw).unsqueeze(-1)
    return (W @ v).to(out_dtype)
