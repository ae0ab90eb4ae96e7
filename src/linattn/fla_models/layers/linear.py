"""fla's ``LinearAttention``: a feature map on q and k, plain causal linear attention
(``ops.linear``)."""

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


