"""The export form of :class:`~linattn.nn.LinearTransformerLM`: the same parameters, states
as plain tensors in ONNX's layouts, each recurrence one ``linattn::onnx_linear_attention`` node.

``LMGraph(model)(ids, *past) -> (logits, *present)``: ``past`` is one state per layer and, with
``short_conv``, the token shift's tail last. A layer's state is ONNX ``LinearAttention``'s
``(B, H, d_k, d_v)``:

* ``linear`` (decayed linear attention): φ(K)ᵀ[V, 1], i.e. linattn's ``S`` with its normaliser
  ``z`` appended as a last value column, d_v = d + 1 (:func:`pack_state`); the feature map
  runs as ONNX elementwise ops and the normaliser is carried exactly, as the extra column of
  ones that the values get (the numerator and ``z·φ(q)`` come out of the same node);
* ``gated_delta`` / ``deltanet`` / ``gla``: the state as linattn keeps it (d, d);
* ``cosformer``: ``kv`` with ``k_sum`` appended, (2d, d + 1); its graph also takes
  ``position``, the tokens before ``ids`` (an int64 scalar), for the angles.

The tail of the token shift is ONNX ``CausalConvWithState``'s ``(B, E, k − 1)`` (channels
first; :class:`~linattn.nn.lm.LMState` keeps it as (B, k − 1, E)).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linattn.nn.lm import LinearTransformerLM, LMState
from linattn.ops._common import guarded, resolve
from linattn.ops.delta.chunk import l2_normalised

__all__ = ["EXPORTABLE", "POSITIONAL", "LMGraph", "pack_state", "unpack_state", "state_shapes"]

#: the LM kinds whose every mixer is an ONNX LinearAttention node → its update rule
EXPORTABLE = {"linear": "gated", "gated_delta": "gated_delta", "deltanet": "delta",
              "gla": "gated", "cosformer": "linear"}
#: the kinds whose graph also takes ``position`` (the tokens before ``ids``): cosFormer's angles
POSITIONAL = frozenset({"cosformer"})


def _packed(x: Tensor) -> Tensor:
    """(B, H, T, d) -> (B, T, H·d)."""
    B, H, T, d = x.shape
    return x.transpose(1, 2).reshape(B, T, H * d)


def _heads(x: Tensor, num_heads: int) -> Tensor:
    """(B, T, H·d) -> (B, H, T, d)."""
    B, T, _ = x.shape
    return x.reshape(B, T, num_heads, -1).transpose(1, 2)


def _recurrence(q, k, v, state, decay, beta, rule: str, scale: float):
    """q, k, v (B, H, T, ·) → o (B, H, T, d_v) and the state, through one op node."""
    H = q.shape[1]
    o, S = torch.ops.linattn.onnx_linear_attention(
        _packed(q), _packed(k), _packed(v), state, decay, beta, rule, H, scale)
    return _heads(o, H), S


def _decayed_linear(attn, x: Tensor, state: Tensor, plain: bool, position: Tensor | None
                    ) -> tuple[Tensor, Tensor]:
    q, k, v = attn.project(x)
    fmap, eps = resolve(attn.feature_map, None)
    fq = fmap.forward_queries(q.float())
    fk = fmap.forward_keys(k.float())
    v1 = F.pad(v.float(), (0, 1), value=1.0)  # the normaliser as one more value column
    B, H, T, _ = q.shape
    gamma = attn.decay.float()
    if plain:  # every γ = 1: plain causal linear attention, no decay input
        rule, decay = "linear", None
    else:
        rule, decay = "gated", gamma.log().expand(B, T, H)
    out, S = _recurrence(fq, fk, v1, state, decay, None, rule, 1.0)
    o = out[..., :-1] / guarded(out[..., -1], eps).unsqueeze(-1)
    return attn.merge(o.to(x.dtype)), S


def _delta(attn, x: Tensor, state: Tensor, plain: bool, position: Tensor | None
           ) -> tuple[Tensor, Tensor]:
    q, k, v = attn.project(x)
    q, k = l2_normalised(F.silu(q).float()), l2_normalised(F.silu(k).float())
    beta, g = attn.gates(x)  # (B, H, T) each; g None for DeltaNet
    rule = "gated_delta" if g is not None else "delta"
    o, S = _recurrence(q, k, v.float(), state,
                       None if g is None else g.transpose(1, 2).float(),
                       beta.transpose(1, 2).float(), rule, q.shape[-1] ** -0.5)
    o = attn.norm(o.to(x.dtype))
    gate = F.silu(attn._heads(attn.gate_proj(x)))
    return attn.merge(o * gate), S


def _gla(attn, x: Tensor, state: Tensor, plain: bool, position: Tensor | None
         ) -> tuple[Tensor, Tensor]:
    q, k, v = attn.project(x)
    gk = _packed(attn.gates(x).float())  # (B, T, H·d): one log-gate per key dimension
    o, S = _recurrence(q.float(), k.float(), v.float(), state, gk, None, "gated",
                       q.shape[-1] ** -0.5)
    o = attn.norm(o.to(x.dtype))
    gate = F.silu(attn._heads(attn.gate_proj(x)))
    return attn.merge(o * gate), S


def _cosformer(attn, x: Tensor, state: Tensor, plain: bool, position: Tensor | None
               ) -> tuple[Tensor, Tensor]:
    """cosFormer's cos(π/2·(i − j)/M) re-weighting is the sum of a cos and a sin product, so
    [relu(q) cos a_i, relu(q) sin a_i]·[relu(k) cos a_j, relu(k) sin a_j] over 2d features is
    plain causal linear attention: ``update_rule="linear"``, the normaliser as a value column
    of ones. The angles a_t = π/2·t/M read the absolute positions from ``position``."""
    from linattn.nn.cosformer import EPS

    q, k, v = attn.project(x)
    T = q.shape[2]
    t = (torch.arange(T) + position).float()  # exact integers, then the angles
    a = (t * (math.pi / (2 * attn.horizon))).unsqueeze(-1)  # (T, 1)

    def features(z: Tensor) -> Tensor:
        r = F.relu(z.float())
        return torch.cat([r * a.cos(), r * a.sin()], -1)

    v1 = F.pad(v.float(), (0, 1), value=1.0)
    out, S = _recurrence(features(q), features(k), v1, state, None, None, "linear", 1.0)
    o = out[..., :-1] / guarded(out[..., -1], EPS).unsqueeze(-1)
    return attn.merge(o.to(x.dtype)), S


_MIXERS = {"linear": _decayed_linear, "gated_delta": _delta, "deltanet": _delta, "gla": _gla,
           "cosformer": _cosformer}


def check_exportable(model: LinearTransformerLM) -> None:
    """ValueError naming ``attention`` for a kind with no ONNX form here."""
    kind = model.config.attention
    if kind not in EXPORTABLE:
        raise ValueError(
            f"attention: {kind!r} models do not export to ONNX (exportable kinds: "
            f"{', '.join(EXPORTABLE)}; docs/onnx.md says why)")


def state_shapes(model: LinearTransformerLM, batch: int) -> list[tuple[int, ...]]:
    """The shapes of ``past`` for a batch of ``batch``: one (B, H, d_k, d_v) per layer, then
    (B, E, k − 1) with a token shift."""
    c = model.config
    shapes = []
    for block in model.blocks:
        attn = block.attn
        d = attn.head_dim
        if c.attention == "linear":
            dk = attn.feature_map.num_features(d)
            shapes.append((batch, c.num_heads, dk, d + 1))
        elif c.attention == "cosformer":
            shapes.append((batch, c.num_heads, 2 * d, d + 1))
        else:
            shapes.append((batch, c.num_heads, d, d))
    if model.shift is not None:
        shapes.append((batch, c.d_model, c.short_conv - 1))
    return shapes


def pack_state(model: LinearTransformerLM, state: LMState | None, batch: int) -> list[Tensor]:
    """``state`` (None: the start, zeros) as the exported graph's ``past`` tensors."""
    if state is None:
        return [torch.zeros(s) for s in state_shapes(model, batch)]
    out = []
    for st in state.layers:
        if model.config.attention == "linear":
            out.append(torch.cat([st.S, st.z.unsqueeze(-1)], -1).float())
        elif model.config.attention == "cosformer":
            out.append(torch.cat([st.kv, st.k_sum.unsqueeze(-1)], -1).float())
        else:
            out.append((st.S if hasattr(st, "S") else st.kv).float())
    if model.shift is not None:
        out.append(state.conv.transpose(1, 2).float())
    return out


def unpack_state(model: LinearTransformerLM, present: list[Tensor], position: int) -> LMState:
    """The graph's ``present`` tensors as an :class:`LMState` after ``position`` tokens."""
    from linattn.nn.mixers import get_mixer

    cls = get_mixer(model.config.attention).state_class()
    n = len(model.blocks)
    layers = []
    for S in present[:n]:
        if model.config.attention == "linear":
            layers.append(cls(S=S[..., :-1], z=S[..., -1]))
        elif model.config.attention == "cosformer":
            layers.append(cls(kv=S[..., :-1], k_sum=S[..., -1]))
        else:
            layers.append(cls(*[S]))
    conv = present[n].transpose(1, 2) if model.shift is not None else None
    return LMState(layers, position, conv)


class LMGraph(nn.Module):
    """``(ids (B, T), *past) -> (logits (B, T, V), *present)`` with ``model``'s parameters
    (module docstring for the states). Evaluation only: no dropout, no id range check (ONNX's
    Gather rejects an id out of range)."""

    def __init__(self, model: LinearTransformerLM) -> None:
        super().__init__()
        check_exportable(model)
        self.model = model
        self.mixer = _MIXERS[model.config.attention]
        # read off the buffers now: a traced graph cannot branch on their values
        self.plain = [model.config.attention == "linear" and bool((b.attn.decay == 1).all())
                      for b in model.blocks]
        self.positional = model.config.attention in POSITIONAL

    def forward(self, ids: Tensor, *past: Tensor) -> tuple[Tensor, ...]:
        m = self.model
        position = None
        if self.positional:  # the last input: the tokens before ids, an int64 scalar
            past, position = past[:-1], past[-1]
        h = m.embed(ids)
        present = []
        if m.shift is not None:
            # the token shift: a causal depthwise convolution, weight w_0 (the token itself)
            # meeting the newest input, i.e. flipped for a correlation
            weight = m.shift.weight.flip(1).unsqueeze(1).to(h.dtype)
            y, tail = torch.ops.linattn.onnx_causal_conv(h.transpose(1, 2), weight, past[-1],
                                                         "none")
            h = y.transpose(1, 2)
        for block, state, plain in zip(m.blocks, past[:len(m.blocks)], self.plain, strict=True):
            a, S = self.mixer(block.attn, block.norm1(h), state, plain, position)
            h = block.mlp_residual(h + a)
            present.append(S)
        if m.shift is not None:
            present.append(tail)
        return (m.head(m.norm(h)), *present)
