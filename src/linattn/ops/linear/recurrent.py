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
from linattn.ops._common import (
    accumulation_dtype,
    check_state_sizes,
    check_step_inputs,
    features,
    normalise,
    resolve,
)
from linattn.ops._library import takes_inference_tensors

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
        """The empty state (no token seen yet); errors name the argument."""
        shape, n = check_state_sizes(batch_shape, dtype, num_features=num_features,
                                     value_dim=value_dim)
        acc = accumulation_dtype(dtype)
        return cls(
            S=torch.zeros(*shape, n["num_features"], n["value_dim"], dtype=acc, device=device),
            z=torch.zeros(*shape, n["num_features"], dtype=acc, device=device),
        )

    def check(
        self,
        name: str,
        batch_shape: tuple[int, ...],
        num_features: int,
        value_dim: int,
        device: torch.device | None = None,
    ) -> None:
        """Raise TypeError/ValueError naming ``name`` unless S and z are floating-point tensors
        of the expected shapes (and on ``device`` when given)."""
        check_float_parts(self, ("S", "z"), name)
        want_S = (*batch_shape, num_features, value_dim)
        if tuple(self.S.shape) != want_S or tuple(self.z.shape) != want_S[:-1]:
            raise ValueError(
                f"{name}: expected S {want_S} and z {want_S[:-1]}, "
                f"got S {tuple(self.S.shape)} and z {tuple(self.z.shape)}"
            )
        if device is not None and (self.S.device != device or self.z.device != device):
            raise ValueError(
                f"{name}: expected S and z on the inputs' device {device}, "
                f"got {self.S.device} and {self.z.device}"
            )


def check_float_parts(state: object, parts: tuple[str, ...], name: str) -> None:
    """TypeError naming ``name`` unless each attribute in ``parts`` of a state is a
    floating-point tensor (shared by every recurrent state's ``check``)."""
    for part in parts:
        t = getattr(state, part)
        if not isinstance(t, Tensor):
            raise TypeError(f"{name}: expected {part} to be a torch.Tensor, "
                            f"got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{name}: expected a floating-point {part}, got {t.dtype}")


def checked_state(
    state: object,
    name: str,
    batch_shape: tuple[int, ...],
    num_features: int,
    value_dim: int,
    device: torch.device,
) -> LinearAttentionState:
    """``state`` after :meth:`LinearAttentionState.check`; TypeError if it is not a state."""
    if not isinstance(state, LinearAttentionState):
        raise TypeError(f"{name}: expected a LinearAttentionState, got {type(state).__name__}")
    state.check(name, batch_shape, num_features, value_dim, device)
    return state


@takes_inference_tensors()
def linear_attention_step(
    q_t: Tensor,
    k_t: Tensor,
    v_t: Tensor,
    state: LinearAttentionState,
    *,
    feature_map: str | FeatureMap = "elu",
    eps: float | None = None,
) -> tuple[Tensor, LinearAttentionState]:
    """One decoding step. q_t, k_t: (..., D), v_t: (..., Dv), state for batch shape ``...``.

    Returns o_t: (..., Dv) in the input dtype and the new state (the old one is not modified),
    in the accumulation dtype: a state of another floating dtype is cast to it, as
    ``initial_state`` is in :func:`linattn.linear_attention`."""
    check_step_inputs(q_t, k_t, v_t)
    fmap, eps = resolve(feature_map, eps)
    fq, fk = features(fmap, q_t, k_t)
    checked_state(state, "state", tuple(q_t.shape[:-1]), fk.shape[-1], v_t.shape[-1], q_t.device)
    S = state.S.to(fk.dtype) + fk.unsqueeze(-1) * v_t.to(fk.dtype).unsqueeze(-2)
    z = state.z.to(fk.dtype) + fk
    num = (fq.unsqueeze(-2) @ S).squeeze(-2)
    den = (fq * z).sum(-1)
    o = normalise(num, den, eps)
    return o.to(q_t.dtype), LinearAttentionState(S, z)
