"""fla's mixers on the gated linear recurrence (``ops.gla``): GLA, RetNet (fixed per-head
decays) and HGRN2 (keys ``1 − forget gate``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linattn.fla_models._kernels import ops
from linattn.fla_models.cache import FLACache
from linattn.fla_models.layers._common import (
    _check_mode,
    _heads,
    _kv_heads,
    _positions,
    _recur,
    _repeat_heads,
    _ShortConvs,
    _start,
    _widths,
)
from linattn.fla_models.modules import (
    FusedRMSNormGated,
    RMSNorm,
    RotaryEmbedding,
    ShortConvolution,
    activation,
)

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
        _kv_heads(self, num_heads, num_kv_heads)
        self.feature_map_fn = activation(feature_map) if feature_map is not None else None
        self.use_short_conv, self.use_output_gate = use_short_conv, use_output_gate
        _widths(self, hidden_size, expand_k, expand_v, num_heads)
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
        state, packing, x, (q, k, v, conv_state) = self._start_qkv(
            hidden_states, attention_mask, past_key_values, use_cache)
        gk = self.gk_proj(x)
        q = _heads(q, self.head_k_dim)
        k, gk = (_repeat_heads(t, self.head_k_dim, self.num_kv_groups) for t in (k, gk))
        v = _repeat_heads(v, self.head_v_dim, self.num_kv_groups)
        gk = F.logsigmoid(gk) / self.gate_logit_normalizer
        if self.clamp_min is not None:
            gk = torch.clamp_min(gk, self.clamp_min)
        if self.feature_map_fn is not None:
            q, k = self.feature_map_fn(q), self.feature_map_fn(k)
        o = _recur(self, lambda S0: ops.gla(q, k, v, gk=gk, initial_state=S0,
                                            cu_seqlens=packing.cu_seqlens),
                   state, past_key_values, use_cache, hidden_states.shape[1], conv_state)
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
        state, packing, x = _start(self, hidden_states, attention_mask, past_key_values)
        cu = packing.cu_seqlens
        seen = past_key_values.get_seq_length(self.layer_idx) if state is not None else 0
        positions = _positions(attention_mask, B, q_len, seen, hidden_states.device)
        q, k, v, conv_state = self._qkv(x, state, use_cache, cu)
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
        state, packing, x = _start(self, hidden_states, attention_mask, past_key_values)
        cu = packing.cu_seqlens
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


