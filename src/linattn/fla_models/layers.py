"""fla's token mixers with fla's parameter names, computing with linattn's kernels.

Each layer mirrors one of fla's (``fla.layers``): the same submodules and parameter shapes (so
a state dict saved by fla loads), the same arithmetic (gates, feature maps, normalisations, the
order of operations), and fla's cache entries (cache.py). What fla chooses per call (``mode``:
chunked, fused recurrent, ...) changes GPU kernels only; here every mode runs the same linattn
functions, which take the decoding step by themselves for one token.

Padding: as fla, ``attention_mask`` is a 0/1 (B, T) matrix (0: padding). A prefill drops the
padded tokens (the sequences are packed, ``cu_seqlens``) and puts zeros back at their places;
a decoding step needs every sequence's new token to be real (left padding, what ``generate``
makes).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linattn.fla_models._kernels import ops
from linattn.fla_models.cache import FLACache
from linattn.fla_models.modules import (
    DPFPFeatureMap,
    FusedRMSNormGated,
    HadamardFeatureMap,
    HedgehogFeatureMap,
    RMSNorm,
    RotaryEmbedding,
    ShortConvolution,
    T2RFeatureMap,
    activation,
    elu_p1,
    integer_dim,
    sum_norm,
)

# ----------------------------------------------------------------------------- padding


class Packing:
    """A prefill's padded tokens removed (fla's unpad_hidden_states): ``pack`` (B, T, ...) ->
    (1, total, ...), ``unpack`` back with zeros at the padded places; a no-op without a mask."""

    def __init__(self, attention_mask: Tensor | None, q_len: int) -> None:
        self.indices = self.cu_seqlens = None
        self.batch = None
        if attention_mask is None:
            return
        if attention_mask.dim() != 2:
            raise ValueError("attention_mask: expected a 0/1 matrix (batch, length) marking "
                             f"padding with 0 (as fla), got shape {tuple(attention_mask.shape)}")
        mask = attention_mask[:, -q_len:]
        if q_len == 1:  # decoding: the state of every sequence moves on by one token
            if not bool(mask.bool().all()):
                raise ValueError("attention_mask: a decoding step needs every sequence's new "
                                 "token to be real (pad on the left, as generate does)")
            return
        if bool(mask.bool().all()):
            return
        self.batch = mask.shape[0]
        flat = mask.reshape(-1).bool()
        self.indices = torch.nonzero(flat).flatten()
        lens = mask.bool().sum(-1)
        self.cu_seqlens = F.pad(lens.cumsum(0), (1, 0)).to(torch.long)
        self.q_len = q_len

    def pack(self, x: Tensor) -> Tensor:
        if self.indices is None:
            return x
        return x.reshape(-1, *x.shape[2:]).index_select(0, self.indices)[None]

    def unpack(self, x: Tensor) -> Tensor:
        if self.indices is None:
            return x
        out = x.new_zeros(self.batch * self.q_len, *x.shape[2:])
        out[self.indices] = x[0]
        return out.view(self.batch, self.q_len, *x.shape[2:])


def _layer_state(cache: FLACache | None, layer_idx: int) -> dict | None:
    return cache[layer_idx] if cache is not None and cache.has(layer_idx) else None


def _v_first(S: Tensor | None) -> Tensor | None:
    """linattn's (N, H, K, V) state <-> fla's (N, H, V, K): a transposed view, no copy."""
    return None if S is None else S.transpose(-1, -2)


def _heads(x: Tensor, d: int) -> Tensor:
    return x.unflatten(-1, (x.shape[-1] // d, d))


def _repeat_heads(x: Tensor, d: int, groups: int) -> Tensor:
    """fla's ``repeat(x, '... (h d) -> ... (h g) d')``: each of h heads repeated g times."""
    x = _heads(x, d)
    return x if groups == 1 else x.repeat_interleave(groups, dim=-2)


def _recur(layer: nn.Module, run, state: dict | None, cache: FLACache | None,
           use_cache: bool, q_len: int, conv_state: tuple | None = None,
           v_first: bool = True):
    """``run(initial_state) -> (o, final_state)`` with the layer's cached state: read from the
    cache in fla's layout (``v_first``: (N, H, V, K), a transposed view of linattn's
    (N, H, K, V)), the final state and the convolutions' tails stored back. Returns o."""
    layout = _v_first if v_first else (lambda S: S)
    o, S = run(layout(state["recurrent_state"]) if state is not None else None)
    if cache is not None and use_cache:
        cache.update_layer(layer.layer_idx, q_len, recurrent_state=layout(S),
                           conv_state=conv_state)
    return o


def _check_mode(mode: str, allowed: tuple[str, ...], layer: str) -> None:
    if mode not in allowed:
        raise ValueError(f"attn_mode: {layer} takes {', '.join(allowed)} (as fla), got {mode!r}")


class _ShortConvs(nn.Module):
    """The q/k/v (or q/f/i) short convolutions of a layer and their cache tuple."""

    def _convs(self, names: tuple[str, ...], inputs: list[Tensor], state: dict | None,
               use_cache: bool, cu: Tensor | None) -> tuple[list[Tensor], tuple | None]:
        caches = state["conv_state"] if state is not None and state["conv_state"] else \
            (None,) * len(names)
        outs, finals = [], []
        for name, x, c in zip(names, inputs, caches, strict=True):
            y, final = getattr(self, name)(x, cache=c, output_final_state=use_cache,
                                           cu_seqlens=cu)
            outs.append(y)
            finals.append(final)
        return outs, (tuple(finals) if use_cache else None)


# ----------------------------------------------------------------------------- GLA


class GatedLinearAttention(_ShortConvs):
    """fla's ``GatedLinearAttention`` (model_type "gla"): per-key gates
    ``logsigmoid(gk_proj(x)) / 16`` from a rank-16 projection, an output gate through a gated
    RMSNorm."""

    def __init__(self, mode: str = "chunk", hidden_size: int = 1024, expand_k: float = 0.5,
                 expand_v: float = 1.0, num_heads: int = 4, num_kv_heads: int | None = None,
                 feature_map: str | None = None, use_short_conv: bool = False,
                 conv_size: int = 4, conv_bias: bool = False, use_output_gate: bool = True,
                 gate_fn: str = "swish", elementwise_affine: bool | None = True,
                 norm_eps: float = 1e-5, gate_logit_normalizer: int = 16,
                 gate_low_rank_dim: int = 16, clamp_min: float | None = None,
                 fuse_norm: bool = True, layer_idx: int | None = None) -> None:
        super().__init__()
        _check_mode(mode, ("chunk", "fused_recurrent", "fused_chunk"), "GLA")
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads or num_heads
        if num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads: must divide num_heads={num_heads}, got "
                             f"{self.num_kv_heads}")
        self.num_kv_groups = num_heads // self.num_kv_heads
        self.feature_map_fn = activation(feature_map) if feature_map is not None else None
        self.use_short_conv, self.use_output_gate = use_short_conv, use_output_gate
        self.key_dim = integer_dim("expand_k", hidden_size * expand_k)
        self.value_dim = integer_dim("expand_v", hidden_size * expand_v)
        if self.key_dim % num_heads or self.value_dim % num_heads:
            raise ValueError(f"num_heads: must divide the key and value widths "
                             f"({self.key_dim}, {self.value_dim}), got {num_heads}")
        self.head_k_dim, self.head_v_dim = self.key_dim // num_heads, self.value_dim // num_heads
        kd, vd = self.key_dim // self.num_kv_groups, self.value_dim // self.num_kv_groups
        self.clamp_min, self.layer_idx = clamp_min, layer_idx
        self.gate_logit_normalizer = gate_logit_normalizer
        self.q_proj = nn.Linear(hidden_size, self.key_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, kd, bias=False)
        self.v_proj = nn.Linear(hidden_size, vd, bias=False)
        if use_output_gate:
            self.g_proj = nn.Linear(hidden_size, self.value_dim, bias=False)
        if use_short_conv:
            self.q_conv1d = ShortConvolution(self.key_dim, conv_size, conv_bias, "silu")
            self.k_conv1d = ShortConvolution(kd, conv_size, conv_bias, "silu")
            self.v_conv1d = ShortConvolution(vd, conv_size, conv_bias, "silu")
        self.gk_proj = nn.Sequential(nn.Linear(hidden_size, gate_low_rank_dim, bias=False),
                                     nn.Linear(gate_low_rank_dim, kd, bias=True))
        self.o_proj = nn.Linear(self.value_dim, hidden_size, bias=False)
        self.fuse_norm_and_gate = gate_fn == "swish" and fuse_norm and use_output_gate
        if self.fuse_norm_and_gate:
            self.g_norm_swish_gate = FusedRMSNormGated(self.head_v_dim, elementwise_affine,
                                                       norm_eps)
        else:
            self.g_norm = RMSNorm(self.head_v_dim, elementwise_affine, norm_eps,
                                  dtype=torch.float32)
            self.gate_fn = activation(gate_fn)

    def _output(self, o: Tensor, x: Tensor) -> Tensor:
        """fla's output gate and norm, shared with RetNet."""
        if self.use_output_gate and self.fuse_norm_and_gate:
            o = self.g_norm_swish_gate(o, _heads(self.g_proj(x), self.head_v_dim)).flatten(-2)
        elif self.use_output_gate:
            o = self.g_norm(o).flatten(-2) * self.gate_fn(self.g_proj(x))
        else:
            o = self.g_norm(o).flatten(-2)
        return self.o_proj(o)

    def forward(self, hidden_states: Tensor, attention_mask: Tensor | None = None,
                past_key_values: FLACache | None = None, use_cache: bool = False,
                **kwargs) -> Tensor:
        q_len = hidden_states.shape[1]
        state = _layer_state(past_key_values, self.layer_idx)
        packing = Packing(attention_mask, q_len)
        x, cu = packing.pack(hidden_states), packing.cu_seqlens
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        conv_state = None
        if self.use_short_conv:
            (q, k, v), conv_state = self._convs(("q_conv1d", "k_conv1d", "v_conv1d"),
                                                [q, k, v], state, use_cache, cu)
        gk = self.gk_proj(x)
        q = _heads(q, self.head_k_dim)
        k, gk = (_repeat_heads(t, self.head_k_dim, self.num_kv_groups) for t in (k, gk))
        v = _repeat_heads(v, self.head_v_dim, self.num_kv_groups)
        gk = F.logsigmoid(gk) / self.gate_logit_normalizer
        if self.clamp_min is not None:
            gk = torch.clamp_min(gk, self.clamp_min)
        if self.feature_map_fn is not None:
            q, k = self.feature_map_fn(q), self.feature_map_fn(k)
        o = _recur(self, lambda S0: ops.gla(q, k, v, gk=gk, initial_state=S0, cu_seqlens=cu),
                   state, past_key_values, use_cache, q_len, conv_state)
        return packing.unpack(self._output(o, x))


# ----------------------------------------------------------------------------- RetNet


class MultiScaleRetention(GatedLinearAttention):
    """fla's ``MultiScaleRetention`` (model_type "retnet"): fixed per-head decays
    ``log(1 − 2^(−5−h))``, rotary q and k, GLA's output gate."""

    def __init__(self, mode: str = "chunk", hidden_size: int = 1024, expand_k: float = 1.0,
                 expand_v: float = 2.0, num_heads: int = 8, num_kv_heads: int | None = None,
                 feature_map: str | None = None, use_short_conv: bool = False,
                 conv_size: int = 4, conv_bias: bool = False, use_output_gate: bool = True,
                 gate_fn: str = "swish", elementwise_affine: bool | None = True,
                 norm_eps: float = 1e-5, fuse_norm: bool = True,
                 layer_idx: int | None = None) -> None:
        _check_mode(mode, ("chunk", "fused_chunk", "parallel", "fused_recurrent"), "RetNet")
        super().__init__("chunk", hidden_size, expand_k, expand_v, num_heads, num_kv_heads,
                         feature_map, use_short_conv, conv_size, conv_bias, use_output_gate,
                         gate_fn, elementwise_affine, norm_eps, fuse_norm=fuse_norm,
                         layer_idx=layer_idx)
        del self.gk_proj  # retention's decays are fixed
        if self.head_k_dim > 256:
            raise ValueError(f"expand_k: RetNet's head key size must be at most 256 (as fla), "
                             f"got {self.head_k_dim}")
        self.rotary = RotaryEmbedding(self.head_k_dim)

    def forward(self, hidden_states: Tensor, attention_mask: Tensor | None = None,
                past_key_values: FLACache | None = None, use_cache: bool = False,
                **kwargs) -> Tensor:
        B, q_len = hidden_states.shape[:2]
        state = _layer_state(past_key_values, self.layer_idx)
        seen = past_key_values.get_seq_length(self.layer_idx) if state is not None else 0
        positions = _positions(attention_mask, B, q_len, seen, hidden_states.device)
        packing = Packing(attention_mask, q_len)
        x, cu = packing.pack(hidden_states), packing.cu_seqlens
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        conv_state = None
        if self.use_short_conv:
            (q, k, v), conv_state = self._convs(("q_conv1d", "k_conv1d", "v_conv1d"),
                                                [q, k, v], state, use_cache, cu)
        q, k = _heads(q, self.head_k_dim), _heads(k, self.head_k_dim)
        if self.feature_map_fn is not None:
            q, k = self.feature_map_fn(q), self.feature_map_fn(k)
        q, k = self.rotary(q, k, packing.pack(positions[..., None])[..., 0])
        if self.num_kv_groups > 1:
            k = k.repeat_interleave(self.num_kv_groups, dim=-2)
        v = _repeat_heads(v, self.head_v_dim, self.num_kv_groups)
        H = self.num_heads
        log_decay = torch.log1p(-torch.pow(2.0, -5.0 - torch.arange(H, dtype=torch.float64)))
        g = log_decay.to(q.device, torch.float64 if q.dtype == torch.float64 else
                         torch.float32).expand(*q.shape[:2], H)
        o = _recur(self, lambda S0: ops.gla(q, k, v, g=g, initial_state=S0, cu_seqlens=cu),
                   state, past_key_values, use_cache, q_len, conv_state, v_first=False)
        return packing.unpack(self._output(o, x))


def _positions(attention_mask: Tensor | None, B: int, q_len: int, seen: int,
               device: torch.device) -> Tensor:
    """Rotary positions (B, q_len) of fla's recurrent layers: with a mask, each token's index
    among its sequence's real tokens; without, ``seen + t``."""
    if attention_mask is None:
        return (seen + torch.arange(q_len, device=device)).expand(B, q_len)
    count = attention_mask.to(torch.long).cumsum(-1) - 1
    if attention_mask.shape[-1] < seen + q_len:  # a mask of the new tokens only
        count = count + seen
    return count[:, -q_len:].clamp_min(0)


# ----------------------------------------------------------------------------- HGRN2


_FUSED_NORM_EPS = 1e-5


class HGRN2Attention(_ShortConvs):
    """fla's ``HGRN2Attention``: GLA with keys ``1 − forget gate`` and per-layer lower bounds
    on the forget gates (passed by the model)."""

    def __init__(self, mode: str = "chunk", hidden_size: int = 1024,
                 num_heads: int | None = None, expand_ratio: int | None = 128,
                 use_short_conv: bool = False, conv_size: int = 4, conv_bias: bool = False,
                 elementwise_affine: bool | None = True, norm_eps: float = 1e-5,
                 layer_idx: int | None = None) -> None:
        super().__init__()
        _check_mode(mode, ("chunk", "fused_recurrent", "fused_chunk"), "HGRN2")
        if expand_ratio is not None:
            num_heads = hidden_size // expand_ratio
        elif num_heads is not None:
            expand_ratio = hidden_size // num_heads
        else:
            raise ValueError("expand_ratio: one of expand_ratio and num_heads must be given")
        self.num_heads, self.expand_ratio = num_heads, expand_ratio
        self.use_short_conv, self.layer_idx = use_short_conv, layer_idx
        self.forget_dim = num_heads * expand_ratio
        if hidden_size % num_heads:
            raise ValueError(f"num_heads: must divide hidden_size={hidden_size}, got {num_heads}")
        self.head_f_dim, self.head_i_dim = expand_ratio, hidden_size // num_heads
        self.q_proj = nn.Linear(hidden_size, self.forget_dim, bias=False)
        self.f_proj = nn.Linear(hidden_size, self.forget_dim, bias=False)
        self.i_proj = nn.Linear(hidden_size, hidden_size, bias=False)
        if use_short_conv:
            self.q_conv1d = ShortConvolution(self.forget_dim, conv_size, conv_bias, None)
            self.f_conv1d = ShortConvolution(self.forget_dim, conv_size, conv_bias, None)
            self.i_conv1d = ShortConvolution(hidden_size, conv_size, conv_bias, None)
        self.g_norm = RMSNorm(hidden_size, elementwise_affine, norm_eps, dtype=torch.float32)
        self.o_proj = nn.Linear(hidden_size, hidden_size, bias=False)

    def forward(self, hidden_states: Tensor, attention_mask: Tensor | None = None,
                past_key_values: FLACache | None = None, use_cache: bool = False,
                lower_bound: Tensor | None = None, **kwargs) -> Tensor:
        q_len = hidden_states.shape[1]
        state = _layer_state(past_key_values, self.layer_idx)
        packing = Packing(attention_mask, q_len)
        x, cu = packing.pack(hidden_states), packing.cu_seqlens
        q, f, i = self.q_proj(x), self.f_proj(x), self.i_proj(x)
        conv_state = None
        if self.use_short_conv:
            (q, f, i), conv_state = self._convs(("q_conv1d", "f_conv1d", "i_conv1d"),
                                                [q, f, i], state, use_cache, cu)
        q = F.silu(q)
        g = F.logsigmoid(f)
        if lower_bound is not None and self.layer_idx > 0:
            g = torch.logaddexp(lower_bound.log(), torch.log1p(-lower_bound) + g)
        k = (1 - g.exp()).to(i.dtype)
        q, k, g = (_heads(t, self.head_f_dim) for t in (q, k, g))
        v = _heads(i, self.head_i_dim)
        o = _recur(self, lambda S0: ops.gla(q, k, v, gk=g, initial_state=S0, cu_seqlens=cu),
                   state, past_key_values, use_cache, q_len, conv_state)
        # fla's HGRN2 fuses this norm into o_proj (rms_norm_linear) with that function's
        # default eps, 1e-5, whatever norm_eps says; the same here, so its checkpoints match
        o = ops.norm(o.flatten(-2), None, self.g_norm.weight, _FUSED_NORM_EPS)
        return packing.unpack(self.o_proj(o))


# ----------------------------------------------------------------------------- delta rules


def _fla_dt_bias(n: int) -> nn.Parameter:
    """fla's initial ``dt_bias``: softplus⁻¹ of a log-uniform dt in [1e-3, 0.1] (checkpoints
    overwrite it)."""
    dt = torch.exp(torch.rand(n) * (math.log(0.1) - math.log(1e-3))
                   + math.log(1e-3)).clamp(min=1e-4)
    return nn.Parameter(dt + torch.log(-torch.expm1(-dt)))


class _DeltaBase(_ShortConvs):
    """What fla's three delta-rule layers share: q/k/v projections and short convolutions,
    one forward (pack, convolve, the layer's own gates and β, :func:`ops.delta`, the cache,
    the output norm), and the grouped-value-head set-up of Gated DeltaNet and KDA. A layer
    supplies :meth:`_mix_inputs`."""

    #: whether fla's layer keeps its state as (N, H, V, K) (``state_v_first=True``)
    state_v_first = True
    #: whether the q/k path applies SiLU where there is no short convolution
    qk_silu = True

    def _grouped_heads(self, num_heads: int, num_v_heads: int | None, head_dim: int,
                       expand_v: float) -> None:
        self.num_heads = num_heads
        self.num_v_heads = num_v_heads if num_v_heads is not None else num_heads
        if self.num_v_heads % num_heads:
            raise ValueError(f"num_v_heads: must be a multiple of num_heads={num_heads}, got "
                             f"{self.num_v_heads}")
        self.head_k_dim = head_dim
        self.head_v_dim = integer_dim("expand_v", head_dim * expand_v)
        self.key_dim = num_heads * head_dim
        self.value_dim = self.num_v_heads * self.head_v_dim

    def _qkv_projections(self, hidden_size: int) -> None:
        self.q_proj = nn.Linear(hidden_size, self.key_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, self.key_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, self.value_dim, bias=False)

    def _qkv_convs(self, conv_size: int, conv_bias: bool, qk_act: str | None = "silu") -> None:
        self.q_conv1d = ShortConvolution(self.key_dim, conv_size, conv_bias, qk_act)
        self.k_conv1d = ShortConvolution(self.key_dim, conv_size, conv_bias, qk_act)
        self.v_conv1d = ShortConvolution(self.value_dim, conv_size, conv_bias, "silu")

    def _qkv(self, x: Tensor, state: dict | None, use_cache: bool, cu: Tensor | None
             ) -> tuple[Tensor, Tensor, Tensor, tuple | None]:
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if self.use_short_conv:
            (q, k, v), conv_state = self._convs(("q_conv1d", "k_conv1d", "v_conv1d"),
                                                [q, k, v], state, use_cache, cu)
            return q, k, v, conv_state
        if self.qk_silu:
            q, k = F.silu(q), F.silu(k)
        return q, k, F.silu(v), None

    def _mix_inputs(self, q: Tensor, k: Tensor, x: Tensor
                    ) -> tuple[Tensor, Tensor, Tensor, dict[str, Tensor], bool]:
        """(q, k, β, the gate keyword of :func:`ops.delta` ({} / {"g": ...} / {"gk": ...}),
        whether q and k are L2-normalised in the kernel)."""
        raise NotImplementedError

    def forward(self, hidden_states: Tensor, attention_mask: Tensor | None = None,
                past_key_values: FLACache | None = None, use_cache: bool = False,
                **kwargs) -> Tensor:
        q_len = hidden_states.shape[1]
        state = _layer_state(past_key_values, self.layer_idx)
        packing = Packing(attention_mask, q_len)
        x, cu = packing.pack(hidden_states), packing.cu_seqlens
        q, k, v, conv_state = self._qkv(x, state, use_cache, cu)
        q, k, v = _heads(q, self.head_k_dim), _heads(k, self.head_k_dim), \
            _heads(v, self.head_v_dim)
        q, k, beta, gate, l2norm = self._mix_inputs(q, k, x)
        o = _recur(self, lambda S0: ops.delta(q, k, v, beta, **gate, l2norm=l2norm,
                                              initial_state=S0, cu_seqlens=cu),
                   state, past_key_values, use_cache, q_len, conv_state, self.state_v_first)
        if self.use_gate:
            o = self.o_norm(o, _heads(self.g_proj(x), self.head_v_dim))
        else:
            o = self.o_norm(o)
        return packing.unpack(self.o_proj(o.flatten(-2)))


class GatedDeltaNet(_DeltaBase):
    """fla's ``GatedDeltaNet`` (model_type "gated_deltanet"): decays
    ``−exp(A_log)·softplus(a_proj(x) + dt_bias)``, β = sigmoid(b_proj(x)), L2-normalised q and
    k, grouped value heads (num_v_heads)."""

    def __init__(self, hidden_size: int = 2048, expand_v: float = 2, head_dim: int = 256,
                 num_heads: int = 6, num_v_heads: int | None = None, mode: str = "chunk",
                 use_gate: bool = True, use_short_conv: bool = True,
                 allow_neg_eigval: bool = False, conv_size: int = 4, conv_bias: bool = False,
                 layer_idx: int | None = None, norm_eps: float = 1e-5,
                 output_gate_activation: str = "swish", **kwargs) -> None:
        super().__init__()
        _check_mode(mode, ("chunk", "fused_recurrent"), "GatedDeltaNet")
        self.allow_neg_eigval, self.use_gate = allow_neg_eigval, use_gate
        self.use_short_conv, self.layer_idx = use_short_conv, layer_idx
        self._grouped_heads(num_heads, num_v_heads, head_dim, expand_v)
        self._qkv_projections(hidden_size)
        self.a_proj = nn.Linear(hidden_size, self.num_v_heads, bias=False)
        self.b_proj = nn.Linear(hidden_size, self.num_v_heads, bias=False)
        # fla's initialisation (A in [1, 16]); checkpoints overwrite it
        self.A_log = nn.Parameter(torch.empty(self.num_v_heads).uniform_(1, 16).log())
        self.dt_bias = _fla_dt_bias(self.num_v_heads)
        if use_short_conv:
            self._qkv_convs(conv_size, conv_bias)
        if use_gate:
            self.g_proj = nn.Linear(hidden_size, self.value_dim, bias=False)
            self.o_norm = FusedRMSNormGated(self.head_v_dim, eps=norm_eps,
                                            activation=output_gate_activation)
        else:
            self.o_norm = RMSNorm(self.head_v_dim, eps=norm_eps, dtype=torch.float32)
        self.o_proj = nn.Linear(self.value_dim, hidden_size, bias=False)

    def _gates(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(g, β) as fla's kernel forms them from the raw projections, in float32 (float64
        for float64)."""
        acc = torch.float64 if x.dtype == torch.float64 else torch.float32
        g = -self.A_log.to(acc).exp() * F.softplus(self.a_proj(x).to(acc)
                                                   + self.dt_bias.to(acc))
        beta = self.b_proj(x).to(acc).sigmoid()
        return g, (beta * 2 if self.allow_neg_eigval else beta)

    def _mix_inputs(self, q, k, x):
        g, beta = self._gates(x)
        return q, k, beta, {"g": g}, True


class KimiDeltaAttention(_DeltaBase):
    """fla's ``KimiDeltaAttention`` (model_type "kda"): the delta rule with a decay per key
    dimension ``−exp(A_log)·softplus(f_proj(x) + dt_bias)`` (or ``lower_bound·sigmoid(...)``),
    a sigmoid-gated RMSNorm on the output."""

    use_gate = True  # the output norm is always gated

    def __init__(self, hidden_size: int = 2048, expand_v: float = 1, head_dim: int = 128,
                 num_heads: int = 16, num_v_heads: int | None = None, mode: str = "chunk",
                 use_short_conv: bool = True, allow_neg_eigval: bool = False,
                 safe_gate: bool = False, lower_bound: float | None = None,
                 conv_size: int = 4, conv_bias: bool = False, layer_idx: int | None = None,
                 norm_eps: float = 1e-5, **kwargs) -> None:
        super().__init__()
        _check_mode(mode, ("chunk", "fused_recurrent"), "KDA")
        if safe_gate and lower_bound is None:
            raise ValueError("lower_bound: must be given with safe_gate=True (as fla)")
        self.allow_neg_eigval, self.lower_bound = allow_neg_eigval, lower_bound
        self.use_short_conv, self.layer_idx = use_short_conv, layer_idx
        self._grouped_heads(num_heads, num_v_heads, head_dim, expand_v)
        self._qkv_projections(hidden_size)
        if use_short_conv:
            self._qkv_convs(conv_size, conv_bias)
        self.gate_dim = self.num_v_heads * head_dim
        self.f_proj = nn.Sequential(nn.Linear(hidden_size, self.head_v_dim, bias=False),
                                    nn.Linear(self.head_v_dim, self.gate_dim, bias=False))
        self.b_proj = nn.Linear(hidden_size, self.num_v_heads, bias=False)
        A = torch.zeros(self.num_v_heads) if safe_gate else \
            torch.empty(self.num_v_heads).uniform_(1, 16).log()
        self.A_log = nn.Parameter(A)
        self.dt_bias = _fla_dt_bias(self.gate_dim)
        self.g_proj = nn.Sequential(nn.Linear(hidden_size, self.head_v_dim, bias=False),
                                    nn.Linear(self.head_v_dim, self.value_dim, bias=True))
        self.o_norm = FusedRMSNormGated(self.head_v_dim, activation="sigmoid", eps=norm_eps)
        self.o_proj = nn.Linear(self.value_dim, hidden_size, bias=False)

    def _gates(self, x: Tensor) -> tuple[Tensor, Tensor]:
        acc = torch.float64 if x.dtype == torch.float64 else torch.float32
        raw = _heads(self.f_proj(x).to(acc), self.head_k_dim) \
            + self.dt_bias.to(acc).view(self.num_v_heads, self.head_k_dim)
        a = self.A_log.to(acc).exp()[:, None]
        if self.lower_bound is None:
            g = -a * F.softplus(raw)
        else:
            g = self.lower_bound * torch.sigmoid(a * raw)
        beta = self.b_proj(x).to(acc).sigmoid()
        return g, (beta * 2 if self.allow_neg_eigval else beta)

    def _mix_inputs(self, q, k, x):
        gk, beta = self._gates(x)
        return q, k, beta, {"gk": gk}, True


class DeltaNet(_DeltaBase):
    """fla's ``DeltaNet`` (model_type "delta_net"): the ungated delta rule, q/k activation and
    normalisation (``qk_activation``, ``qk_norm``), β = sigmoid(b_proj(x)) or 1."""

    state_v_first = False  # fla's DeltaNet keeps (N, H, K, V)

    def __init__(self, mode: str = "chunk", d_model: int | None = None,
                 hidden_size: int = 1024, expand_k: float = 1.0, expand_v: float = 1.0,
                 num_heads: int = 4, use_beta: bool = True, use_gate: bool = False,
                 use_short_conv: bool = True, conv_size: int = 4, conv_bias: bool = False,
                 allow_neg_eigval: bool = False, layer_idx: int | None = None,
                 qk_activation: str = "silu", qk_norm: str = "l2", norm_eps: float = 1e-5,
                 **kwargs) -> None:
        super().__init__()
        if mode == "fused_chunk":
            raise NotImplementedError("attn_mode: fused_chunk is deprecated in fla; use chunk")
        _check_mode(mode, ("chunk", "fused_recurrent"), "DeltaNet")
        if qk_activation not in ("silu", "relu", "elu", "identity"):
            raise ValueError(f"qk_activation: expected silu, relu, elu or identity, got "
                             f"{qk_activation!r}")
        if qk_norm not in ("l2", "sum"):
            raise ValueError(f"qk_norm: expected 'l2' or 'sum', got {qk_norm!r}")
        hidden_size = d_model if d_model is not None else hidden_size
        self.qk_activation, self.qk_norm = qk_activation, qk_norm
        self.qk_silu = qk_activation == "silu"
        self.use_beta, self.use_gate, self.allow_neg_eigval = use_beta, use_gate, \
            allow_neg_eigval
        self.use_short_conv, self.layer_idx, self.num_heads = use_short_conv, layer_idx, \
            num_heads
        self.key_dim = integer_dim("expand_k", hidden_size * expand_k)
        self.value_dim = integer_dim("expand_v", hidden_size * expand_v)
        if self.key_dim % num_heads or self.value_dim % num_heads:
            raise ValueError(f"num_heads: must divide the key and value widths "
                             f"({self.key_dim}, {self.value_dim}), got {num_heads}")
        self.head_k_dim, self.head_v_dim = self.key_dim // num_heads, self.value_dim // num_heads
        self._qkv_projections(hidden_size)
        if use_beta:
            self.b_proj = nn.Linear(hidden_size, num_heads, bias=False)
        if use_short_conv:
            self._qkv_convs(conv_size, conv_bias, "silu" if self.qk_silu else None)
        if use_gate:
            self.g_proj = nn.Linear(hidden_size, self.value_dim, bias=False)
            self.o_norm = FusedRMSNormGated(self.head_v_dim, eps=norm_eps)
        else:
            self.o_norm = RMSNorm(self.head_v_dim, eps=norm_eps, dtype=torch.float32)
        self.o_proj = nn.Linear(self.value_dim, hidden_size, bias=False)

    def _mix_inputs(self, q, k, x):
        if self.qk_activation == "relu":
            q, k = q.relu(), k.relu()
        elif self.qk_activation == "elu":
            q, k = elu_p1(q), elu_p1(k)
        if self.qk_norm == "sum":
            q, k = sum_norm(q).to(q), sum_norm(k).to(k)
        if self.use_beta:
            beta = self.b_proj(x).sigmoid()
        else:
            beta = torch.ones_like(q[..., 0])
        if self.allow_neg_eigval:
            beta = beta * 2.0
        return q, k, beta, {}, self.qk_norm == "l2"


# ----------------------------------------------------------------------------- linear attn

_FEATURE_MAPS = {"hedgehog": HedgehogFeatureMap, "t2r": T2RFeatureMap,
                 "elementwise_product": HadamardFeatureMap}


class LinearAttention(nn.Module):
    """fla's ``LinearAttention`` (model_type "linear_attn"): a feature map on q and k (learnable
    ones keep fla's names), plain causal linear attention (``normalize`` =
    ``norm_feature_map``), an RMSNorm per head."""

    def __init__(self, mode: str = "chunk", hidden_size: int = 1024, expand_k: float = 1.0,
                 expand_v: float = 1.0, num_heads: int = 8, num_kv_heads: int | None = None,
                 feature_map: str = "elementwise_product", tie_feature_map_qk: bool = False,
                 output_norm: str = "rmsnorm", norm_q: bool = False, norm_k: bool = False,
                 do_feature_map_norm: bool = False, elementwise_affine: bool = True,
                 norm_eps: float = 1e-5, layer_idx: int | None = None, **kwargs) -> None:
        super().__init__()
        _check_mode(mode, ("chunk", "fused_chunk", "fused_recurrent"), "LinearAttention")
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads or num_heads
        if num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads: must divide num_heads={num_heads}, got "
                             f"{self.num_kv_heads}")
        self.num_kv_groups = num_heads // self.num_kv_heads
        self.key_dim = integer_dim("expand_k", hidden_size * expand_k)
        self.value_dim = integer_dim("expand_v", hidden_size * expand_v)
        if self.key_dim % num_heads or self.value_dim % num_heads:
            raise ValueError(f"num_heads: must divide the key and value widths "
                             f"({self.key_dim}, {self.value_dim}), got {num_heads}")
        self.head_k_dim, self.head_v_dim = self.key_dim // num_heads, self.value_dim // num_heads
        self.do_feature_map_norm, self.layer_idx = do_feature_map_norm, layer_idx
        d = self.head_k_dim
        if feature_map in _FEATURE_MAPS:
            cls = _FEATURE_MAPS[feature_map]
            self.feature_map_q = cls(d)
            self.feature_map_k = self.feature_map_q if tie_feature_map_qk else cls(d)
        elif feature_map == "dpfp":
            self.feature_map_q, self.feature_map_k = DPFPFeatureMap(d), DPFPFeatureMap(d)
        elif feature_map in ("elu", "relu", "identity"):
            fn = {"elu": elu_p1, "relu": F.relu, "identity": lambda t: t}[feature_map]
            self.feature_map_q = self.feature_map_k = fn
        else:
            raise ValueError(f"feature_map: expected one of hedgehog, t2r, elementwise_product, "
                             f"dpfp, elu, relu, identity (as fla), got {feature_map!r}")
        self.q_proj = nn.Linear(hidden_size, self.key_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, self.key_dim // self.num_kv_groups, bias=False)
        self.v_proj = nn.Linear(hidden_size, self.value_dim // self.num_kv_groups, bias=False)
        if output_norm == "rmsnorm":
            self.norm = RMSNorm(self.head_v_dim, elementwise_affine, norm_eps,
                                dtype=torch.float32)
        elif output_norm == "identity":
            self.norm = nn.Identity()
        else:
            raise ValueError(f"output_norm: expected 'rmsnorm' or 'identity', got "
                             f"{output_norm!r}")
        self.o_proj = nn.Linear(self.value_dim, hidden_size, bias=False)
        self.norm_q, self.norm_k = norm_q, norm_k

    def forward(self, hidden_states: Tensor, attention_mask: Tensor | None = None,
                past_key_values: FLACache | None = None, use_cache: bool = False,
                **kwargs) -> Tensor:
        q_len = hidden_states.shape[1]
        state = _layer_state(past_key_values, self.layer_idx)
        packing = Packing(attention_mask, q_len)
        x, cu = packing.pack(hidden_states), packing.cu_seqlens
        q = _heads(self.q_proj(x), self.head_k_dim)
        k = _repeat_heads(self.k_proj(x), self.head_k_dim, self.num_kv_groups)
        v = _repeat_heads(self.v_proj(x), self.head_v_dim, self.num_kv_groups)
        q, k = self.feature_map_q(q), self.feature_map_k(k)
        if self.norm_q:
            q = q / (q.sum(-1, True) + 1e-4)
        if self.norm_k:
            k = k / (k.sum(-1, True) + 1e-4)
        o = _recur(self, lambda S0: ops.linear(q, k, v, normalize=self.do_feature_map_norm,
                                               initial_state=S0, cu_seqlens=cu),
                   state, past_key_values, use_cache, q_len, v_first=False)
        return self.o_proj(self.norm(packing.unpack(o)).flatten(-2))


# ----------------------------------------------------------------------------- softmax


class Attention(nn.Module):
    """fla's softmax ``Attention`` (the layers of a hybrid config's ``attn``): rotary q and k
    (base ``rope_theta``), grouped key/value heads, an optional sliding window, torch's SDPA on
    CPU instead of flash-attention. Cache: (keys, values), each (N, S, Hkv·D)."""

    def __init__(self, hidden_size: int = 2048, num_heads: int = 32,
                 num_kv_heads: int | None = None, qkv_bias: bool = False,
                 qk_norm: bool = False, window_size: int | None = None,
                 rope_theta: float | None = 10000.0, max_position_embeddings: int | None = None,
                 layer_idx: int | None = None) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads if num_kv_heads is not None else num_heads
        if num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads: must divide num_heads={num_heads}, got "
                             f"{self.num_kv_heads}")
        self.num_kv_groups = num_heads // self.num_kv_heads
        self.head_dim = hidden_size // num_heads
        self.kv_dim = self.num_kv_heads * self.head_dim
        self.window_size, self.layer_idx, self.qk_norm = window_size, layer_idx, qk_norm
        self.q_proj = nn.Linear(hidden_size, hidden_size, bias=qkv_bias)
        self.k_proj = nn.Linear(hidden_size, self.kv_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(hidden_size, self.kv_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(hidden_size, hidden_size, bias=False)
        if qk_norm:
            self.q_norm = RMSNorm(self.head_dim, dtype=torch.float32)
            self.k_norm = RMSNorm(self.head_dim, dtype=torch.float32)
        self.rotary = RotaryEmbedding(self.head_dim, 10000.0 if rope_theta is None
                                      else rope_theta)

    def forward(self, hidden_states: Tensor, attention_mask: Tensor | None = None,
                past_key_values: FLACache | None = None, use_cache: bool = False,
                **kwargs) -> Tensor:
        B, q_len, _ = hidden_states.shape
        if attention_mask is not None and attention_mask.dim() != 2:
            raise ValueError("attention_mask: expected a 0/1 matrix (batch, length) marking "
                             f"padding with 0 (as fla), got shape {tuple(attention_mask.shape)}")
        q = _heads(self.q_proj(hidden_states), self.head_dim)
        k = _heads(self.k_proj(hidden_states), self.head_dim)
        v = _heads(self.v_proj(hidden_states), self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        # fla's positions: from 0 without a cache; with one, shifted so that a left-padded
        # sequence's first real token is at 0
        seen = past_key_values.get_seq_length(self.layer_idx) \
            if past_key_values is not None and past_key_values.has(self.layer_idx) else 0
        positions = torch.arange(q_len, device=q.device).expand(B, q_len) + seen
        if past_key_values is not None and attention_mask is not None:
            lens = attention_mask.to(torch.long).sum(-1, keepdim=True)
            positions = positions + lens - attention_mask.shape[-1]
        q, k = self.rotary(q, k, positions)
        keys, values = k.flatten(-2), v.flatten(-2)
        if past_key_values is not None and past_key_values.has(self.layer_idx):
            old_k, old_v = past_key_values[self.layer_idx]["attn_state"]
            keys, values = torch.cat([old_k, keys], 1), torch.cat([old_v, values], 1)
        if past_key_values is not None and use_cache:
            kept = (keys, values) if self.window_size is None else \
                (keys[:, -self.window_size:], values[:, -self.window_size:])
            past_key_values.update_layer(self.layer_idx, q_len, attn_state=kept)
        o = self._attend(q, _heads(keys, self.head_dim), _heads(values, self.head_dim),
                         attention_mask)
        return self.o_proj(o.flatten(-2))

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, attention_mask: Tensor | None) -> Tensor:
        """Causal (windowed) softmax attention of the last q_len of S positions; padded keys
        masked, padded queries' outputs zero (as fla's unpadded flash-attention leaves them)."""
        B, q_len, H, D = q.shape
        S = k.shape[1]
        qi = torch.arange(S - q_len, S, device=q.device)[:, None]
        kj = torch.arange(S, device=q.device)[None]
        allowed = kj <= qi
        if self.window_size is not None:
            allowed = allowed & (qi - kj < self.window_size)
        mask = allowed.expand(B, 1, q_len, S)
        real_q = None
        if attention_mask is not None:
            valid = attention_mask[:, -S:].bool() if attention_mask.shape[-1] >= S else \
                F.pad(attention_mask.bool(), (S - attention_mask.shape[-1], 0), value=True)
            real_q = valid[:, -q_len:]
            mask = mask & valid[:, None, None, :]
            # a padded query sees its own key, so no row is empty (its output is zeroed below)
            mask = mask | (~real_q[:, None, :, None] & (kj == qi)[None, None])
        if self.num_kv_groups > 1:
            k = k.repeat_interleave(self.num_kv_groups, dim=2)
            v = v.repeat_interleave(self.num_kv_groups, dim=2)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), attn_mask=mask)
        o = o.transpose(1, 2)
        if real_q is not None:
            o = o * real_q[..., None, None].to(o.dtype)
        return o
