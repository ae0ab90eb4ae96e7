"""fla's softmax ``Attention``, the layers a hybrid config lists in ``attn``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linattn.fla_models.cache import FLACache
from linattn.fla_models.layers._common import _heads
from linattn.fla_models.modules import RMSNorm, RotaryEmbedding


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
