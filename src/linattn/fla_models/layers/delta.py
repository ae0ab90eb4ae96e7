"""fla's delta-rule mixers (``ops.delta``): Gated DeltaNet, KDA (a decay per key dimension)
and DeltaNet (ungated), on one forward (:class:`_DeltaBase`)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linattn.fla_models._kernels import ops
from linattn.fla_models.cache import FLACache
from linattn.fla_models.layers._common import (
    _check_mode,
    _heads,
    _recur,
    _ShortConvs,
    _widths,
)
from linattn.fla_models.modules import (
    FusedRMSNormGated,
    RMSNorm,
    ShortConvolution,
    elu_p1,
    integer_dim,
    sum_norm,
)


def _fla_dt_bias(n: int) -> nn.Parameter:
    """fla's initial ``dt_bias``: softplus⁻¹ of a log-uniform dt in [1e-3, 0.1] (checkpoints
    overwrite it)."""
    dt = torch.exp(torch.rand(n) * (math.log(0.1) - math.log(1e-3))
                   + math.log(1e-3)).clamp(min=1e-4)
    return nn.Parameter(dt + torch.log(-torch.expm1(-dt)))


def _gate_dtype(x: Tensor) -> torch.dtype:
    """The dtype fla's kernels form the gates and β in: float32 (float64 for float64)."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


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
        q, k, v, conv_state = super()._qkv(x, state, use_cache, cu)
        if self.use_short_conv:
            return q, k, v, conv_state
        if self.qk_silu:
            q, k = F.silu(q), F.silu(k)
        return q, k, F.silu(v), None

    def _mix_inputs(self, q: Tensor, k: Tensor, x: Tensor
                    ) -> tuple[Tensor, Tensor, Tensor, dict[str, Tensor], bool]:
        """(q, k, β, the gate keyword of :func:`ops.delta` ({} / {"g": ...} / {"gk": ...}),
        whether q and k are L2-normalised in the kernel)."""
        raise NotImplementedError

    def _beta(self, x: Tensor, acc: torch.dtype) -> Tensor:
        """β as fla's kernel forms it from the raw projection: sigmoid(b_proj(x)) in ``acc``,
        times 2 with ``allow_neg_eigval``."""
        beta = self.b_proj(x).to(acc).sigmoid()
        return beta * 2 if self.allow_neg_eigval else beta

    def forward(self, hidden_states: Tensor, attention_mask: Tensor | None = None,
                past_key_values: FLACache | None = None, use_cache: bool = False,
                **kwargs) -> Tensor:
        state, packing, x, (q, k, v, conv_state) = self._start_qkv(
            hidden_states, attention_mask, past_key_values, use_cache)
        q, k, v = _heads(q, self.head_k_dim), _heads(k, self.head_k_dim), \
            _heads(v, self.head_v_dim)
        q, k, beta, gate, l2norm = self._mix_inputs(q, k, x)
        o = _recur(self, lambda S0: ops.delta(q, k, v, beta, **gate, l2norm=l2norm,
                                              initial_state=S0, cu_seqlens=packing.cu_seqlens),
                   state, past_key_values, use_cache, hidden_states.shape[1], conv_state,
                   self.state_v_first)
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

    def _mix_inputs(self, q, k, x):
        acc = _gate_dtype(x)
        g = -self.A_log.to(acc).exp() * F.softplus(self.a_proj(x).to(acc)
                                                   + self.dt_bias.to(acc))
        return q, k, self._beta(x, acc), {"g": g}, True


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

    def _mix_inputs(self, q, k, x):
        acc = _gate_dtype(x)
        raw = _heads(self.f_proj(x).to(acc), self.head_k_dim) \
            + self.dt_bias.to(acc).view(self.num_v_heads, self.head_k_dim)
        a = self.A_log.to(acc).exp()[:, None]
        if self.lower_bound is None:
            gk = -a * F.softplus(raw)
        else:
            gk = self.lower_bound * torch.sigmoid(a * raw)
        return q, k, self._beta(x, acc), {"gk": gk}, True


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
        _widths(self, hidden_size, expand_k, expand_v, num_heads)
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


