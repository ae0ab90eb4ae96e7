r"""The recurrent form of causal linear attention: one token at a time, O(ℓ·Dv) per step.

.. math::
    S_t = S_{t-1} + \varphi(k_t) v_t^\top, \quad z_t = z_{t-1} + \varphi(k_t), \quad
    o_t = \frac{S_t^\top \varphi(q_t)}{z_t\cdot\varphi(q_t)}

The state (S, z) has the same size at every position, so decoding costs the same for the
millionth token as for the first.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from linattn.feature_maps import FeatureMap
from linattn.ops._common import accumulation_dtype, check_qkv, features, normalise, resolve

__all__ = ["LinearAttentionState", "linear_attention_step"]


@dataclass(frozen=True)
class LinearAttentionState:
    """Running sums of causal linear attention.

    S: (..., ℓ, Dv) = Σ_t φ(k_t) v_tᵀ;  z: (..., ℓ) = Σ_t φ(k_t). Both in the accumulation dtype
    (float32 for half inputs). Immutable: steps return a new state, so autograd sees every step.
    """

    S: Tensor
    z: Tensor

    @classmethod
    def zeros(
        cls,
        batch_shape: tuple[int, ...] | torch.Size,
        num_features: int,
        value_dim: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> LinearAttentionState:
        """The empty state (no token seen yet)."""
        acc = accumulation_dtype(dtype)
        shape = tuple(batch_shape)
        return cls(
            S=torch.zeros(*shape, num_features, value_dim, dtype=acc, device=device),
            z=torch.zeros(*shape, num_features, dtype=acc, device=device),
        )

    def check(self, name: str, batch_shape: tuple[int, ...], num_features: int, value_dim: int):
        """Raise ValueError naming ``name`` unless S and z have the expected shapes."""
        want_S = (*batch_shape, num_features, value_dim)
        if tuple(self.S.shape) != want_S or tuple(self.z.shape) != want_S[:-1]:
            raise ValueError(
                f"{name}: expected S {want_S} and z {want_S[:-1]}, "
                f"got S {tuple(self.S.shape)} and z {tuple(self.z.shape)}"
            )


def linear_attention_step(
    q_t: Tensor,
    k_t: Tensor,
    v_t: Tensor,
    state: LinearAttentionState,
    feature_map: str | FeatureMap = "elu",
    eps: float | None = None,
) -> tuple[Tensor, LinearAttentionState]:
    """One decoding step. q_t, k_t: (..., D), v_t: (..., Dv), state for batch shape ``...``.

    Returns o_t: (..., Dv) in the input dtype and the new state (the old one is not modified)."""
    check_qkv(q_t.unsqueeze(-2), k_t.unsqueeze(-2), v_t.unsqueeze(-2), same_length=True)
    fmap, eps = resolve(feature_map, eps)
    fq, fk = features(fmap, q_t, k_t)
    if not isinstance(state, LinearAttentionState):
        raise TypeError(f"state: expected a LinearAttentionState, got {type(state).__name__}")
    state.check("state", tuple(q_t.shape[:-1]), fk.shape[-1], v_t.shape[-1])
    S = state.S + fk.unsqueeze(-1) * v_t.to(fk.dtype).unsqueeze(-2)
    z = state.z + fk
    num = (fq.unsqueeze(-2) @ S).squeeze(-2)
    den = (fq * z).sum(-1)
    o = normalise(num, den, eps)
    return o.to(q_t.dtype), LinearAttentionState(S, z)
