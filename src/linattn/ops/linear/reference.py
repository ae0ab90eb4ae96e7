r"""The quadratic reference of :func:`linattn.linear_attention`: the explicit T×T similarity
matrix; standalone and O(T²) by design, as :mod:`linattn.ops.reference` describes them.
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.feature_maps import FeatureMap, get_feature_map
from linattn.ops._reference_checks import (
    check_padding_mask,
    check_qkv,
    inference_tensors_as_constants,
    kept_keys,
    map_eps,
)

__all__ = ['linear_attention']


@inference_tensors_as_constants
def linear_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    feature_map: str | FeatureMap = "elu",
    is_causal: bool = False,
    key_padding_mask: Tensor | None = None,
    eps: float | None = None,
) -> Tensor:
    r"""o_i = Σ_j φ(q_i)·φ(k_j) v_j / (Σ_j φ(q_i)·φ(k_j) + ε), with the T×T matrix built explicitly.

    Arguments and shapes as :func:`linattn.ops.linear.op.linear_attention` (without its state and
    chunk arguments). The sums run over the unpadded keys and, when causal, over j ≤ i; a row
    whose normaliser is exactly 0 (no key left, ε = 0) is 0."""
    check_qkv(q, k, v, same_length=is_causal)
    fmap = get_feature_map(feature_map)
    eps = map_eps(eps, fmap)
    if key_padding_mask is not None:
        check_padding_mask(key_padding_mask, k, "key_padding_mask", "k")
    out_dtype = q.dtype
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    q, k, v = q.to(acc), k.to(acc), v.to(acc)
    Tq, Tk = q.shape[-2], k.shape[-2]
    zero = q.new_zeros(())

    # kept[..., j]: key j takes part, (Tk,) or (B, 1, …, 1, Tk)
    kept = kept_keys(key_padding_mask, k)
    # A padded key or value may hold anything, nan and inf included: it is set to 0 before φ,
    # so that it reaches neither the sums nor the gradients.
    k = torch.where(kept[..., :, None], k, zero)
    v = torch.where(kept[..., :, None], v, zero)

    sim = fmap.forward_queries(q) @ fmap.forward_keys(k).transpose(-1, -2)  # (..., Tq, Tk)
    allowed = kept[..., None, :]  # (..., 1, Tk)
    if is_causal:
        i = torch.arange(Tq, device=q.device)[:, None]
        j = torch.arange(Tk, device=q.device)[None, :]
        allowed = allowed & (j <= i)
    sim = torch.where(allowed, sim, zero)

    num = sim @ v  # (..., Tq, Dv)
    den = sim.sum(-1) + eps  # (..., Tq)
    den = torch.where(den == 0, torch.ones_like(den), den)  # nothing to attend to: 0, not 0/0
    return (num / den[..., None]).to(out_dtype)
