r"""The quadratic reference of :func:`linattn.flowformer_attention`.

The ground truth of the tests: O(T²) time and memory, or a Python loop over T, by design;
never call it on a fast path.
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.feature_maps import FeatureMap
from linattn.ops._common import (
    accumulation_dtype,
    causal_mask,
    check_qkv,
    key_mask_for,
    zero_padded,
)
from linattn.ops.flowformer.op import flow_eps, flow_feature_map, query_mask_for

__all__ = ['flowformer_attention']


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
    q: (..., Tq, D), k: (..., Tk, D), v: (..., Tk, Dv) -> (..., Tq, Dv)."""
    check_qkv(q, k, v, same_length=is_causal)
    fmap, eps = flow_feature_map(feature_map), flow_eps(eps)
    keep_k = key_mask_for(key_padding_mask, k)
    keep_q = query_mask_for(query_padding_mask, q)
    acc = accumulation_dtype(q.dtype)
    fq = fmap.forward_queries(q.to(acc))
    fk = zero_padded(fmap.forward_keys(zero_padded(k.to(acc), keep_k)), keep_k)
    v = zero_padded(v.to(acc), keep_k)
    Tq, Tk = q.shape[-2], k.shape[-2]
    dev = q.device
    if is_causal:
        link_in = causal_mask(Tq, dev)  # [i, j]: j ≤ i
        link_out = link_in  # [j, i]: i ≤ j (the sinks up to the source, as in the authors' code)
    else:
        link_in = torch.ones(Tq, Tk, dtype=torch.bool, device=dev)
        link_out = link_in.transpose(0, 1)
    kk = torch.ones(Tk, dtype=torch.bool, device=dev) if keep_k is None \
        else keep_k.squeeze(-1)  # (B, 1, …, Tk): the unpadded sources
    kq = torch.ones(Tq, dtype=torch.bool, device=dev) if keep_q is None \
        else keep_q.squeeze(-1)  # the unpadded sinks
    L_in = link_in & kk.unsqueeze(-2)  # (…, Tq, Tk)
    L_out = link_out & kq.unsqueeze(-2)  # (…, Tk, Tq)
    zero = fq.new_zeros(())
    A = torch.where(L_in, (fq + eps) @ fk.transpose(-1, -2), zero)
    B = torch.where(L_out, (fk + eps) @ fq.transpose(-1, -2), zero)
    eps_q, eps_k = eps * (fq + eps).sum(-1), eps * (fk + eps).sum(-1)  # (φ + ε)·ε1
    I_raw = A.sum(-1) + eps_q  # (…, Tq)
    O_raw = B.sum(-1) + eps_k  # (…, Tk)
    I_raw = torch.where(I_raw == 0, torch.ones_like(I_raw), I_raw)
    O_raw = torch.where(O_raw == 0, torch.ones_like(O_raw), O_raw)
    if is_causal:  # flows per visible term: divided by the position counts
        n_in, n_out = L_in.to(acc).sum(-1), L_out.to(acc).sum(-1)  # N_k(i), N_q(j)
    else:
        n_in, n_out = fq.new_ones(()), fq.new_ones(())
    inv_I, inv_O = n_in / I_raw, n_out / O_raw  # 1/I_i, 1/O_j
    conserved_sink = ((A * inv_O.unsqueeze(-2)).sum(-1) + eps_q) / n_in.clamp(min=1)
    sink_terms = torch.where(L_out, B * inv_I.unsqueeze(-2), zero)
    conserved_source = ((sink_terms.sum(-1) + eps_k) / n_out.clamp(min=1)).clamp(-1.0, 1.0)
    e = conserved_source.exp() * kk  # padded sources 0 (bounded: Ô ≤ 1)
    if is_causal:  # c_j over the running sum of the sources j' ≤ j
        key_link = causal_mask(Tk, dev) & kk.unsqueeze(-2)  # (…, Tk, Tk)
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
    return (W @ v).to(q.dtype)
