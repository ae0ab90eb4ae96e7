"""The building blocks of fla's layers, with fla's parameter names (so fla's checkpoints load):
RMS norms, the gated RMS norm, the short convolution, the SwiGLU MLP, rotary embeddings and
the learnable feature maps of fla's linear attention. Written for linattn's kernels (through
:data:`linattn.fla_models._kernels.ops`); no code of fla's is used.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linattn.fla_models._kernels import conv_window, ops


class RMSNorm(nn.Module):
    """fla's ``RMSNorm`` (``weight``; ``bias`` never used by fla's models). ``forward(x,
    residual, prenorm=True)`` is fla's fused residual form: returns (norm(x + residual),
    x + residual)."""

    def __init__(self, hidden_size: int, elementwise_affine: bool = True, eps: float = 1e-5,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.hidden_size, self.eps = hidden_size, eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype)) \
            if elementwise_affine else None

    def forward(self, x: Tensor, residual: Tensor | None = None, prenorm: bool = False):
        if residual is not None:
            x = x + residual
        y = ops.norm(x, None, self.weight, self.eps)
        return (y, x) if prenorm else y


class FusedRMSNormGated(nn.Module):
    """fla's ``FusedRMSNormGated``: ``rmsnorm(x)·weight·act(g)`` (act "swish"/"silu" or
    "sigmoid"), over the last dimension (one head)."""

    def __init__(self, hidden_size: int, elementwise_affine: bool = True, eps: float = 1e-5,
                 activation: str = "swish") -> None:
        super().__init__()
        if activation not in ("swish", "silu", "sigmoid"):
            raise ValueError(f"activation: expected 'swish', 'silu' or 'sigmoid', got "
                             f"{activation!r}")
        self.hidden_size, self.eps = hidden_size, eps
        self.activation = "sigmoid" if activation == "sigmoid" else "silu"
        self.weight = nn.Parameter(torch.ones(hidden_size)) if elementwise_affine else None

    def forward(self, x: Tensor, g: Tensor) -> Tensor:
        return ops.norm(x, g, self.weight, self.eps, self.activation)


class ShortConvolution(nn.Conv1d):
    """fla's ``ShortConvolution``: a depthwise causal convolution, weight (D, 1, W), optional
    bias, SiLU or no activation. Its cache is fla's: the last W inputs (N, D, W)."""

    def __init__(self, hidden_size: int, kernel_size: int, bias: bool = False,
                 activation: str | None = "silu") -> None:
        super().__init__(hidden_size, hidden_size, kernel_size, padding=kernel_size - 1,
                         groups=hidden_size, bias=bias)
        if activation not in (None, "silu", "swish"):
            raise ValueError(f"activation: expected 'silu', 'swish' or None, got {activation!r}")
        self.hidden_size, self.activation = hidden_size, activation

    def forward(self, x: Tensor, cache: Tensor | None = None, output_final_state: bool = False,
                cu_seqlens: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        W = self.kernel_size[0]
        weight = self.weight.squeeze(1)
        if cache is not None and x.shape[1] == 1 and cu_seqlens is None:
            # decoding: the cache (N, D, W) is shifted and written in place, as in fla
            y = ops.conv_step(x[:, 0], cache, weight, self.bias, self.activation)
            return y[:, None], cache
        initial = None if cache is None else cache[..., 1:]
        y = ops.conv(x, weight, self.bias, self.activation, initial, cu_seqlens)
        final = conv_window(x, initial, cu_seqlens, W) if output_final_state else None
        return y, final


def intermediate_size(hidden_size: int, hidden_ratio: float | None,
                      intermediate_size: int | None) -> int:
    """fla's GatedMLP width: given, or 2/3 of hidden_ratio (default 4) widths, rounded up to a
    multiple of 256."""
    if intermediate_size is not None:
        return intermediate_size
    ratio = 4 if hidden_ratio is None else hidden_ratio
    width = int(hidden_size * ratio * 2 / 3)
    return 256 * ((width + 255) // 256)


class GatedMLP(nn.Module):
    """fla's ``GatedMLP`` (SwiGLU): ``down(silu(gate(x)) · up(x))``."""

    def __init__(self, hidden_size: int, hidden_ratio: float | None = None,
                 intermediate_size: int | None = None, hidden_act: str = "swish") -> None:
        super().__init__()
        if hidden_act != "swish":
            raise ValueError(f"hidden_act: linattn.fla_models' GatedMLP takes 'swish', got "
                             f"{hidden_act!r}")
        width = globals()["intermediate_size"](hidden_size, hidden_ratio, intermediate_size)
        self.hidden_size, self.intermediate_size = hidden_size, width
        self.gate_proj = nn.Linear(hidden_size, width, bias=False)
        self.up_proj = nn.Linear(hidden_size, width, bias=False)
        self.down_proj = nn.Linear(width, hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class RotaryEmbedding(nn.Module):
    """fla's rotary embedding (GPT-NeoX halves, not interleaved; no parameters): angles
    ``position · base^(−2i/D)`` in float32, cos and sin rounded to the inputs' dtype as fla's
    tables are."""

    def __init__(self, dim: int, base: float = 10000.0) -> None:
        super().__init__()
        if dim % 2:
            raise ValueError(f"dim: rotary embeddings need an even head size, got {dim}")
        self.dim, self.base = dim, float(base)

    def forward(self, q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """q (B, T, H, D), k (B, T, Hk, D); positions (B, T) integers."""
        inv = 1.0 / (self.base ** (torch.arange(0, self.dim, 2, dtype=torch.float32,
                                                device=q.device) / self.dim))
        angles = positions.to(torch.float32)[..., None] * inv  # (B, T, D/2)
        cos, sin = angles.cos(), angles.sin()
        cos = torch.cat([cos, cos], -1)[:, :, None].to(q.dtype)
        sin = torch.cat([sin, sin], -1)[:, :, None].to(q.dtype)

        def rotate(x: Tensor) -> Tensor:
            x1, x2 = x.chunk(2, dim=-1)
            return x * cos + torch.cat([-x2, x1], dim=-1) * sin
        return rotate(q), rotate(k)


# ----------------------------------------------------------------------------- feature maps
# fla's linear attention (LinearAttention's feature_map=...): the learnable maps keep fla's
# module names (layer, layer1, layer2), so their weights load.


class HadamardFeatureMap(nn.Module):
    def __init__(self, head_dim: int) -> None:
        super().__init__()
        self.layer1 = nn.Linear(head_dim, head_dim)
        self.layer2 = nn.Linear(head_dim, head_dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.layer1(x) * self.layer2(x)


class HedgehogFeatureMap(nn.Module):
    def __init__(self, head_dim: int) -> None:
        super().__init__()
        self.layer = nn.Linear(head_dim, head_dim)
        with torch.no_grad():  # fla starts from the identity
            self.layer.weight.copy_(torch.eye(head_dim))
            self.layer.bias.zero_()

    def forward(self, x: Tensor) -> Tensor:
        y = 2 * self.layer(x)
        return torch.cat([y, -y], dim=-1).softmax(-1)


class T2RFeatureMap(nn.Module):
    def __init__(self, head_dim: int) -> None:
        super().__init__()
        self.layer = nn.Linear(head_dim, head_dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.layer(x).relu()


class DPFPFeatureMap(nn.Module):
    def __init__(self, head_dim: int, nu: int = 4) -> None:
        super().__init__()
        self.nu = nu

    def forward(self, x: Tensor) -> Tensor:
        x = torch.cat([x.relu(), (-x).relu()], dim=-1)
        rolled = torch.cat([x.roll(shifts=j, dims=-1) for j in range(1, self.nu + 1)], dim=-1)
        return torch.cat([x] * self.nu, dim=-1) * rolled


def elu_p1(x: Tensor) -> Tensor:
    return F.elu(x, 1.0) + 1.0


def sum_norm(x: Tensor) -> Tensor:
    return x / x.sum(-1, keepdim=True)


def activation(name: str):
    """fla's ACT2FN entries the layers use for feature maps and output gates."""
    table = {"swish": F.silu, "silu": F.silu, "sigmoid": torch.sigmoid, "relu": F.relu,
             "elu": F.elu, "gelu": F.gelu, "tanh": torch.tanh, "identity": lambda x: x,
             "relu2": lambda x: F.relu(x) ** 2, "elu_p1": elu_p1}
    if name not in table:
        raise ValueError(f"activation: linattn.fla_models takes {', '.join(sorted(table))}; got "
                         f"{name!r}")
    return table[name]


def integer_dim(name: str, value: float) -> int:
    """``hidden_size * expand_*`` must be a whole number (fla asserts it)."""
    rounded = round(value)
    if not math.isclose(value, rounded):
        raise ValueError(f"{name}: hidden_size * {name} must be an integer, got {value}")
    return rounded
