r"""cosFormer attention (Qin et al., 2022): ReLU features with a cosine re-weighting by distance.

.. math:: \mathrm{sim}(i, j) = \mathrm{relu}(q_i)\cdot\mathrm{relu}(k_j)\,
          \cos\!\Bigl(\frac{\pi}{2}\,\frac{i - j}{T}\Bigr), \qquad i, j \in \{0, …, T-1\}.

With :math:`a_t = \tfrac{\pi}{2}\,t/T`, :math:`\cos(a_i - a_j) = \cos a_i\cos a_j +
\sin a_i\sin a_j`, so the weight is a dot product of 2d features
:math:`[\mathrm{relu}(x_t)\cos a_t,\ \mathrm{relu}(x_t)\sin a_t]`: two linear attentions that
share one normaliser, O(T·d·Dv) like any other map. Since |i − j| < T the cosine lies in
(0, 1]: nearby tokens weigh more, and every weight stays non-negative.

Guard: relu features are zero for a query (or every key) with no positive coordinate, so the
normaliser can vanish; ``eps`` (default 1e-6) is added to it, and an exactly zero normaliser
gives a zero output.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from linattn.feature_maps import FeatureMap
from linattn.ops._common import check_dense
from linattn.ops.linear.op import linear_attention

__all__ = ["cosformer_attention", "CosFormerFeatures"]


class CosFormerFeatures(FeatureMap):
    """[relu(x_t) cos a_t, relu(x_t) sin a_t], a_t = π t / (2T), T = x.shape[-2]: ℓ = 2d.

    Position-dependent, so it belongs to whole sequences (:func:`cosformer_attention`), not to
    the shift-free recurrent step."""

    eps = 1e-6
    tokenwise = False  # a_t depends on t and T

    def num_features(self, head_dim: int) -> int:
        return 2 * head_dim

    def forward_features(self, x: Tensor) -> Tensor:
        T = x.shape[-2]
        # max(T, 1): an empty sequence has no positions to weigh (and must not divide by 0)
        a = torch.arange(T, device=x.device, dtype=x.dtype) * (math.pi / (2 * max(T, 1)))
        r = F.relu(x)
        return torch.cat([r * a.cos().unsqueeze(-1), r * a.sin().unsqueeze(-1)], dim=-1)


_FEATURES = CosFormerFeatures()


def cosformer_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    is_causal: bool = False,
    key_padding_mask: Tensor | None = None,
    eps: float | None = None,
    chunk_size: int | None = None,
) -> Tensor:
    """cosFormer attention. q, k: (..., T, D), v: (..., T, Dv) -> (..., T, Dv).

    ``key_padding_mask`` (B, T), True = padding; positions still count 0 … T−1 over the whole
    (padded) sequence. Other arguments as in :func:`linattn.linear_attention`."""
    if isinstance(q, Tensor) and isinstance(k, Tensor):
        check_dense(q, "q")
        check_dense(k, "k")
        if q.shape[-2:-1] != k.shape[-2:-1]:
            raise ValueError(
                f"k: cosFormer needs as many keys as queries, got {k.shape[-2]} keys for "
                f"{q.shape[-2]} queries"
            )
    return linear_attention(
        q,
        k,
        v,
        feature_map=_FEATURES,
        is_causal=is_causal,
        key_padding_mask=key_padding_mask,
        eps=eps,
        chunk_size=chunk_size,
    )
