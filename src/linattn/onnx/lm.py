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
  ``position``, the tokens before ``ids`` (an int64 scalar), for the angles;
* ``flowformer``: two tensors per layer, ``kv`` (d, d) and the flow sums [k_sum, q_sum,
  source_sum, sink_sum, e_sum] (4d + 1); ``position`` too;
* ``hybrid``: three tensors per layer, the linear state as for ``linear`` and the last w keys
  and values (B, H, w, d), oldest first (linattn's ring buffer rotated); ``position`` too.

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

__all__ = ["EXPORTABLE", "POSITIONAL", "STATE_PARTS", "state_parts", "LMGraph", "pack_state",
           "unpack_state", "state_shapes"]

#: the LM kinds that export → the update rule of their LinearAttention nodes (one per layer;
#: the hybrid's is its linear part, its window plain ops beside it; Flowformer's its product,
#: its flows prefix sums beside it)
EXPORTABLE = {"linear": "gated", "gated_delta": "gated_delta", "deltanet": "delta",
              "gla": "gated", "cosformer": "linear", "hybrid": "linear",
              "flowformer": "linear"}
#: the kinds whose graph also takes ``position`` (the tokens before ``ids``): cosFormer's
#: angles, the hybrid's slots that no token has filled yet, Flowformer's counts
POSITIONAL = frozenset({"cosformer", "hybrid", "flowformer"})


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


def _hybrid(attn, x: Tensor, state: tuple[Tensor, Tensor, Tensor], plain: bool,
            position: Tensor | None) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor]]:
    """Exact softmax over the last w tokens, linear attention before them, one normaliser
    (:mod:`linattn.ops.window`). The linear part is ``LinearAttention(linear)`` over the keys
    delayed by w: at query i the node adds key i − w, so its output is Σ_{j ≤ i−w}. The window
    is a band of w keys per query gathered from [the previous w keys, this call's keys]
    ((B, H, T, w, d): O(T·w), never T×T). ``state`` is (S with z as its last column, the last
    w keys, their values), the keys and values oldest first; ``position`` (the tokens seen)
    tells the slots before the first token, which take part in nothing."""
    from linattn.ops.window.op import _combine, _log_far, _row_max

    S0, buf_k, buf_v = state
    q, k, v = attn.project(x)
    fmap, eps = resolve(attn.feature_map, None)
    w = attn.window
    B, H, T, d = q.shape
    keys = torch.cat([buf_k.to(k.dtype), k], 2)  # positions position − w … position + T − 1
    vals = torch.cat([buf_v.to(v.dtype), v], 2)
    c = torch.arange(w + T)
    valid = (c + position - w >= 0).to(torch.float32)  # (w + T,): a token exists there
    fq = fmap.forward_queries(q.float())
    # the linear part: key i − w reaches query i (concatenated index t for query t)
    fk = fmap.forward_keys(keys[:, :, :T].float())
    v1 = F.pad(vals[:, :, :T].float(), (0, 1), value=1.0) * valid[:T, None]
    far, S = _recurrence(fq, fk, v1, S0, None, None, "linear", 1.0)
    far_den = far[..., -1] + eps
    # the window: keys at concatenated indices t + 1 … t + w for query t
    band = (torch.arange(T)[:, None] + 1 + torch.arange(w)[None, :]).reshape(-1)
    kb = keys.float().index_select(2, band).reshape(B, H, T, w, d)
    vb = vals.float().index_select(2, band).reshape(B, H, T, w, -1)
    scores = (kb @ q.float().unsqueeze(-1)).squeeze(-1) * (1.0 / math.sqrt(d))
    scores = scores.masked_fill(valid.index_select(0, band).reshape(T, w) == 0, float("-inf"))
    lam, absd = _log_far(far_den)
    mx = _row_max(scores, lam)
    e = torch.exp(scores - mx.unsqueeze(-1))
    num = (e.unsqueeze(-2) @ vb).squeeze(-2)
    o = _combine(num, e.sum(-1), far[..., :-1], far_den, absd, mx)
    new = (S, keys[:, :, T:].contiguous(), vals[:, :, T:].contiguous())
    return attn.merge(o.to(x.dtype)), new


def _flowformer(attn, x: Tensor, state: tuple[Tensor, Tensor], plain: bool,
                position: Tensor | None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """Causal Flowformer (:func:`linattn.nn.flowformer.flow_chunked`, formula for formula):
    the four flow sums and Σ exp(Ô) are prefix sums (ONNX ``CumSum``, dynamic T) continuing
    the state's, and the product Σ_j φ(k_j) c_j v_jᵀ read by φ(q_i)/(N·I_i) is one
    ``LinearAttention(linear)`` node. ``state`` is (kv (d, d), the sums [k_sum, q_sum,
    source_sum, sink_sum, e_sum] (4d + 1)); ``position`` gives the counts N(t)."""
    from linattn.nn.flowformer import _flow

    kv0, sums0 = state
    q, k, v = attn.project(x)
    fq, fk, v = torch.sigmoid(q.float()), torch.sigmoid(k.float()), v.float()
    T, d, eps = q.shape[2], q.shape[3], attn.eps
    n = (torch.arange(1, T + 1) + position).float()  # N(t), counted from 1
    k0, q0, src0, sink0, e0 = sums0.split([d, d, d, d, 1], -1)
    k_sum = fk.cumsum(-2) + k0.unsqueeze(-2)
    q_sum = fq.cumsum(-2) + q0.unsqueeze(-2)
    raw_in = guarded(_flow(fq, k_sum, eps), 0.0)  # N·I
    raw_out = guarded(_flow(fk, q_sum, eps), 0.0)  # N·O
    source_sum = (fk * (n / raw_out).unsqueeze(-1)).cumsum(-2) + src0.unsqueeze(-2)
    sink_sum = (fq * (n / raw_in).unsqueeze(-1)).cumsum(-2) + sink0.unsqueeze(-2)
    conserved_sink = _flow(fq, source_sum, eps) / n
    conserved_source = (_flow(fk, sink_sum, eps) / n).clamp(-1.0, 1.0)
    e = conserved_source.exp()
    e_sum = e.cumsum(-1) + e0
    competition = e * n / guarded(e_sum, 0.0)
    out, kv = _recurrence(fq / raw_in.unsqueeze(-1), fk, v * competition.unsqueeze(-1), kv0,
                          None, None, "linear", 1.0)
    o = out * torch.sigmoid(conserved_sink).unsqueeze(-1)
    sums = torch.cat([k_sum[..., -1, :], q_sum[..., -1, :], source_sum[..., -1, :],
                      sink_sum[..., -1, :], e_sum[..., -1:]], -1)
    return attn.merge(o.to(x.dtype)), (kv, sums)


_MIXERS = {"linear": _decayed_linear, "gated_delta": _delta, "deltanet": _delta, "gla": _gla,
           "cosformer": _cosformer, "hybrid": _hybrid, "flowformer": _flowformer}
#: the state tensors of one layer, by kind (default: one, ``state``)
STATE_PARTS = {"hybrid": ("state", "keys", "values"), "flowformer": ("state", "sums")}


def state_parts(model: LinearTransformerLM) -> tuple[str, ...]:
    """The names of one layer's state tensors (``past_<name>.<layer>``)."""
    return STATE_PARTS.get(model.config.attention, ("state",))


def check_exportable(model: LinearTransformerLM) -> None:
    """ValueError naming ``attention`` for a kind with no ONNX form here."""
    kind = model.config.attention
    if kind not in EXPORTABLE:
        raise ValueError(
            f"attention: {kind!r} models do not export to ONNX (exportable kinds: "
            f"{', '.join(EXPORTABLE)}; docs/onnx.md says why)")


def state_shapes(model: LinearTransformerLM, batch: int) -> list[tuple[int, ...]]:
    """The shapes of ``past`` for a batch of ``batch``: one (B, H, d_k, d_v) per layer (the
    hybrid: also its last w keys and values, (B, H, w, d) each), then (B, E, k − 1) with a
    token shift."""
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
        elif c.attention == "flowformer":
            shapes += [(batch, c.num_heads, d, d), (batch, c.num_heads, 4 * d + 1)]
        elif c.attention == "hybrid":
            dk = attn.feature_map.num_features(d)
            w = attn.window
            shapes += [(batch, c.num_heads, dk, d + 1), (batch, c.num_heads, w, d),
                       (batch, c.num_heads, w, d)]
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
        if model.config.attention == "flowformer":
            out.append(st.kv.float())
            out.append(torch.cat([st.k_sum, st.q_sum, st.source_sum, st.sink_sum,
                                  st.e_sum.unsqueeze(-1)], -1).float())
        elif model.config.attention == "hybrid":
            out.append(torch.cat([st.S, st.z.unsqueeze(-1)], -1).float())
            out += [_ring_to_chronological(b.float(), st.count) for b in (st.k, st.v)]
        elif model.config.attention == "linear":
            out.append(torch.cat([st.S, st.z.unsqueeze(-1)], -1).float())
        elif model.config.attention == "cosformer":
            out.append(torch.cat([st.kv, st.k_sum.unsqueeze(-1)], -1).float())
        else:
            out.append((st.S if hasattr(st, "S") else st.kv).float())
    if model.shift is not None:
        out.append(state.conv.transpose(1, 2).float())
    return out


def _ring_to_chronological(buf: Tensor, count: int) -> Tensor:
    """The window's ring buffer (token p in slot p mod w) oldest first, as the graph keeps it:
    row c holds token count − w + c (zeros before the first token)."""
    w = buf.shape[-2]
    pos = torch.arange(w) + count - w
    out = buf.index_select(-2, pos % w)
    return out * (pos >= 0).to(out.dtype)[:, None]


def _chronological_to_ring(buf: Tensor, count: int) -> Tensor:
    """The inverse of :func:`_ring_to_chronological` (unused slots zeros)."""
    w = buf.shape[-2]
    pos = torch.arange(w) + count - w
    keep = pos >= 0
    out = torch.zeros_like(buf)
    out[..., pos[keep] % w, :] = buf[..., keep, :]
    return out


def unpack_state(model: LinearTransformerLM, present: list[Tensor], position: int) -> LMState:
    """The graph's ``present`` tensors as an :class:`LMState` after ``position`` tokens."""
    from linattn.nn.mixers import get_mixer

    cls = get_mixer(model.config.attention).state_class()
    parts = len(state_parts(model))
    n = len(model.blocks) * parts
    layers = []
    for i in range(0, n, parts):
        S = present[i]
        if model.config.attention == "flowformer":
            d = S.shape[-1]
            sums = present[i + 1].split([d, d, d, d, 1], -1)
            layers.append(cls(*sums[:4], e_sum=sums[4][..., 0], kv=S))
        elif model.config.attention == "hybrid":
            k, v = (_chronological_to_ring(b, position) for b in present[i + 1:i + 3])
            layers.append(cls(S=S[..., :-1], z=S[..., -1], k=k, v=v, count=position))
        elif model.config.attention == "linear":
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
        self.parts = len(state_parts(model))

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
        n = self.parts
        for i, (block, plain) in enumerate(zip(m.blocks, self.plain, strict=True)):
            state = past[i * n] if n == 1 else tuple(past[i * n:(i + 1) * n])
            a, S = self.mixer(block.attn, block.norm1(h), state, plain, position)
            h = block.mlp_residual(h + a)
            present += [S] if n == 1 else list(S)
        if m.shift is not None:
            present.append(tail)
        return (m.head(m.norm(h)), *present)
