"""The few operations fla's layers need, in fla's (B, T, H, ·) layout, behind one switch.

The layers call :data:`ops` (never a kernel directly), so that a test can run the same model
on :class:`Reference` (linattn's sequential float64 references: the ground truth) and compare
it with :class:`Fast` (linattn's compiled CPU kernels, through :mod:`linattn.fla`):
``with reference_ops(): ...``. Recurrent states are returned as linattn keeps them,
(N, H, K, V), whatever layout the cache shows (see cache.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor


def _spans(T: int, cu: Tensor | None) -> list[tuple[int, int]]:
    return [(0, T)] if cu is None else list(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True))


def conv_window(x: Tensor, initial: Tensor | None, cu: Tensor | None, W: int) -> Tensor:
    """fla's convolution cache after a prefill: each sequence's last W inputs (N, D, W), its
    history (``initial``, (N, D, W − 1), zeros without one) in front where it is shorter."""
    B, T, D = x.shape
    spans = _spans(T, cu)
    N = B if cu is None else len(spans)
    if initial is None:
        initial = x.new_zeros(N, D, W - 1)
    if cu is None:
        return torch.cat([initial.to(x.dtype), x.transpose(1, 2)], dim=-1)[..., -W:].contiguous()
    return torch.stack([torch.cat([initial[n].to(x.dtype), x[0, a:b].transpose(0, 1)],
                                  dim=-1)[..., -W:] for n, (a, b) in enumerate(spans)])


class Fast:
    """linattn's kernels (compiled on CPU where a compiler is found, portable torch otherwise)."""

    name = "fast"

    def gla(self, q: Tensor, k: Tensor, v: Tensor, *, g: Tensor | None = None,
            gk: Tensor | None = None, scale: float | None = None,
            initial_state: Tensor | None = None, cu_seqlens: Tensor | None = None,
            ) -> tuple[Tensor, Tensor]:
        from linattn import fla

        if gk is not None:
            return fla.chunk_gla(q, k, v, g=gk, scale=scale, initial_state=initial_state,
                                 output_final_state=True, cu_seqlens=cu_seqlens)
        return fla.chunk_simple_gla(q, k, v, g=g, scale=scale, initial_state=initial_state,
                                    output_final_state=True, cu_seqlens=cu_seqlens)

    def delta(self, q: Tensor, k: Tensor, v: Tensor, beta: Tensor, *, g: Tensor | None = None,
              gk: Tensor | None = None, l2norm: bool, initial_state: Tensor | None = None,
              cu_seqlens: Tensor | None = None) -> tuple[Tensor, Tensor]:
        from linattn import fla

        if gk is not None:
            return fla.chunk_kda(q, k, v, gk, beta, initial_state=initial_state,
                                 output_final_state=True, use_qk_l2norm_in_kernel=l2norm,
                                 cu_seqlens=cu_seqlens)
        if g is not None:
            return fla.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=initial_state,
                                              output_final_state=True,
                                              use_qk_l2norm_in_kernel=l2norm,
                                              cu_seqlens=cu_seqlens)
        return fla.chunk_delta_rule(q, k, v, beta, initial_state=initial_state,
                                    output_final_state=True, use_qk_l2norm_in_kernel=l2norm,
                                    cu_seqlens=cu_seqlens)

    def linear(self, q: Tensor, k: Tensor, v: Tensor, *, normalize: bool,
               initial_state: Tensor | tuple | None = None, cu_seqlens: Tensor | None = None,
               ) -> tuple[Tensor, Tensor | tuple]:
        from linattn import fla

        return fla.chunk_linear_attn(q, k, v, initial_state=initial_state,
                                     output_final_state=True, normalize=normalize,
                                     cu_seqlens=cu_seqlens)

    def conv(self, x: Tensor, weight: Tensor, bias: Tensor | None, activation: str | None,
             initial_state: Tensor | None, cu_seqlens: Tensor | None) -> Tensor:
        from linattn.ops.conv import causal_conv1d

        return causal_conv1d(x, weight, bias, activation=activation,
                             initial_state=initial_state, cu_seqlens=cu_seqlens)

    def conv_step(self, x_t: Tensor, state: Tensor, weight: Tensor, bias: Tensor | None,
                  activation: str | None) -> Tensor:
        """One token (B, D); ``state`` (B, D, W) updated in place, as fla's cache is."""
        from linattn.ops.conv import causal_conv1d_step

        y, _ = causal_conv1d_step(x_t, state, weight, bias, activation=activation, inplace=True)
        return y

    def norm(self, x: Tensor, gate: Tensor | None, weight: Tensor | None, eps: float,
             activation: str = "silu") -> Tensor:
        from linattn.ops.norm import rms_norm_gated

        return rms_norm_gated(x, gate, weight, eps=eps, activation=activation)


class Reference(Fast):
    """linattn's references: every recurrence, convolution and norm walked in float64 (the
    ground truth of the tests; slow by design). Outputs keep the inputs' dtype, states are
    float64."""

    name = "reference"

    @staticmethod
    def _hf(x: Tensor | None) -> Tensor | None:
        return None if x is None else x.transpose(1, 2)

    def _per_sequence(self, fn, q: Tensor, tensors: dict, initial_state: Tensor | None,
                      cu_seqlens: Tensor | None) -> tuple[Tensor, Tensor]:
        outs, states = [], []
        for n, (a, b) in enumerate(_spans(q.shape[1], cu_seqlens)):
            part = {name: None if x is None else self._hf(x[:, a:b]) for name, x in
                    tensors.items()}
            S0 = None if initial_state is None else (
                initial_state if cu_seqlens is None else initial_state[n:n + 1])
            o, S = fn(**part, initial_state=S0)
            outs.append(o.transpose(1, 2))
            states.append(S)
        return torch.cat(outs, dim=1).to(q.dtype), torch.cat(states, dim=0)

    def gla(self, q, k, v, *, g=None, gk=None, scale=None, initial_state=None,
            cu_seqlens=None):
        from linattn.ops.gated.reference import gated_linear_attention

        def fn(q, k, v, g, gk, initial_state):
            return gated_linear_attention(q, k, v, g, gk, scale=scale,
                                          initial_state=initial_state)
        return self._per_sequence(fn, q, {"q": q, "k": k, "v": v, "g": g, "gk": gk},
                                  initial_state, cu_seqlens)

    def delta(self, q, k, v, beta, *, g=None, gk=None, l2norm, initial_state=None,
              cu_seqlens=None):
        from linattn.ops.delta.reference import delta_rule

        def fn(q, k, v, beta, g, gk, initial_state):
            return delta_rule(q, k, v, beta, g, gk, initial_state=initial_state,
                              qk_l2norm=l2norm)
        return self._per_sequence(fn, q, {"q": q, "k": k, "v": v, "beta": beta, "g": g,
                                          "gk": gk}, initial_state, cu_seqlens)

    def linear(self, q, k, v, *, normalize, initial_state=None, cu_seqlens=None):
        z0 = None
        if isinstance(initial_state, tuple):
            initial_state, z0 = initial_state
        o, S = self.gla(q, k, v, initial_state=initial_state, cu_seqlens=cu_seqlens)
        if not normalize:
            return o, S
        # fla's normalize=True: o_t / (⟨scale·q_t, z0 + Σ_{s≤t} k_s⟩ + 1e-10)
        f64 = torch.float64
        outs, zs = [], []
        for n, (a, b) in enumerate(_spans(q.shape[1], cu_seqlens)):
            c = k[:, a:b].to(f64).cumsum(1)
            if z0 is not None:
                c = c + (z0 if cu_seqlens is None else z0[n:n + 1]).to(f64)
            den = (q[:, a:b].to(f64) * q.shape[-1] ** -0.5 * c).sum(-1, keepdim=True) + 1e-10
            outs.append(o[:, a:b].to(f64) / den)
            zs.append(c[:, -1:])
        return torch.cat(outs, 1).to(q.dtype), (S, torch.cat(zs, 0).to(k.dtype))

    def conv(self, x, weight, bias, activation, initial_state, cu_seqlens):
        from linattn.ops.conv.reference import causal_conv1d

        y, _ = causal_conv1d(x, weight, bias, activation=activation,
                             initial_state=initial_state, cu_seqlens=cu_seqlens)
        return y.to(x.dtype)

    def conv_step(self, x_t, state, weight, bias, activation):
        W = weight.shape[-1]
        state.copy_(torch.cat([state[..., 1:], x_t[..., None].to(state.dtype)], dim=-1))
        f64 = torch.float64
        y = (state[..., -W:].to(f64) * weight.to(f64)).sum(-1)
        if bias is not None:
            y = y + bias.to(f64)
        if activation in ("silu", "swish"):
            y = F.silu(y)
        return y.to(x_t.dtype)

    def norm(self, x, gate, weight, eps, activation="silu"):
        from linattn.ops.norm.reference import rms_norm_gated

        return rms_norm_gated(x, gate, weight, eps=eps, activation=activation).to(x.dtype)


class _Switch:
    """The implementation the layers call now (attribute lookups are forwarded to it)."""

    def __init__(self) -> None:
        self.impl: Fast = Fast()

    def __getattr__(self, name: str):
        return getattr(self.impl, name)


ops = _Switch()


@contextlib.contextmanager
def reference_ops() -> Iterator[None]:
    """Run every fla model of this process on linattn's float64 references inside the block
    (for tests: convert the model with ``.double()`` too, for a float64 forward)."""
    previous, ops.impl = ops.impl, Reference()
    try:
        yield
    finally:
        ops.impl = previous
