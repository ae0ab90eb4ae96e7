"""fla's attention layers without a gated recurrence: ``LinearAttention`` (a feature map on q
and k, plain causal linear attention, ``ops.linear``) and softmax ``Attention`` (the layers a
hybrid config lists in ``attn``)."""

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
    _recur,
    _repeat_heads,
    _start,
    _widths,
)
from linattn.fla_models.modules import (
    DPFPFeatureMap,
    HadamardFeatureMap,
    HedgehogFeatureMap,
    RMSNorm,
    RotaryEmbedding,
    T2RFeatureMap,
    elu_p1,
)

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
        _kv_heads(self, num_heads, num_kv_heads)
        _widths(self, hidden_size, expand_k, expand_v, num_heads)
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
        state, packing, x = _start(self, hidden_states, attention_mask, past_key_values)
        cu = packing.cu_seqlens
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
