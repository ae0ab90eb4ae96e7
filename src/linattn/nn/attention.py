"""Multi-head linear attention as an ``nn.Module``, with optional learned relative positions.

:class:`MultiheadAttentionBase` holds what every attention module here shares — the q/k/v/output
projections, the head reshaping and the module's own feature map — and defines no ``forward``:
:class:`MultiheadLinearAttention` and :class:`~linattn.nn.lm.DecayedMultiheadAttention` each
define theirs, so neither overrides the other's contract.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from linattn._config import POSITIVE_INT, renamed_keywords
from linattn.feature_maps import FeatureMap, get_feature_map
from linattn.nn.mixers import CONFIG_CHECKS
from linattn.ops._common import check_dense, check_flag
from linattn.ops._library import for_autograd
from linattn.ops.flowformer.op import SigmoidFeatures, flowformer_attention
from linattn.ops.linear.op import linear_attention
from linattn.ops.relative.op import relative_linear_attention

__all__ = ["MultiheadAttentionBase", "MultiheadLinearAttention", "FeatureMapSpec",
           "own_feature_map"]

#: What the modules accept as ``feature_map``: a name, a template instance or a factory.
FeatureMapSpec = str | FeatureMap | Callable[[], FeatureMap]


def own_feature_map(feature_map: FeatureMapSpec) -> FeatureMap:
    """A feature map for one module alone, never shared with another module.

    * a name: a new map of that kind (:func:`~linattn.feature_maps.get_feature_map`);
    * a :class:`~linattn.feature_maps.FeatureMap` instance is a *template*: the module gets
      ``template.new_feature_map()`` — same configuration, its own random draw (unless the
      template has a fixed ``seed``) — whose learnable parameters start from the template's
      values (so a distilled :class:`~linattn.feature_maps.Hedgehog` keeps its fit) but are
      independent tensors that train separately;
    * a callable (a FeatureMap class, ``lambda: FavorPlus(16, seed=next(seeds))``): called once
      per module, as fast-transformers' feature-map factories are.
    """
    if isinstance(feature_map, FeatureMap):
        return _copy_template(feature_map)
    if isinstance(feature_map, str) or not callable(feature_map):
        return get_feature_map(feature_map)  # a name, or the TypeError for anything else
    made = feature_map()
    if not isinstance(made, FeatureMap):
        raise TypeError(
            f"feature_map: the factory returned {type(made).__name__}, expected a FeatureMap"
        )
    return made


def _copy_template(template: FeatureMap) -> FeatureMap:
    try:
        new = template.new_feature_map()
    except TypeError:  # a custom map whose config() does not rebuild it: copy it whole
        return copy.deepcopy(template)
    ref = next(itertools.chain(template.parameters(), template.buffers()), None)
    if ref is not None:  # a template already moved or cast: the copy follows it
        new.to(device=ref.device, dtype=ref.dtype if ref.is_floating_point() else None)
    learned = dict(template.named_parameters())
    with torch.no_grad():
        for name, p in new.named_parameters():
            p.copy_(learned[name])
            p.requires_grad_(learned[name].requires_grad)
    return new


#: Deprecated keyword of the attention modules' constructors -> today's name.
EMBED_DIM_ALIAS = {"embed_dim": "d_model"}


class MultiheadAttentionBase(nn.Module):
    """Projections ``E → H·d`` for queries, keys and values, ``H·d → E`` for the output, and the
    module's own feature map (see :func:`own_feature_map`). No ``forward``: subclasses define it.

    Args:
        d_model: E. num_heads: H. head_dim: d (default E // H).
        feature_map: a name, a :class:`~linattn.feature_maps.FeatureMap` template or a factory.
        bias: biases in the four projections.
        dropout: dropout on the output projection.
    """

    def __init__(self, d_model: int, num_heads: int, head_dim: int | None = None, *,
                 feature_map: FeatureMapSpec = "elu", bias: bool = False,
                 dropout: float = 0.0) -> None:
        super().__init__()
        d_model = CONFIG_CHECKS["d_model"].check("d_model", d_model)
        num_heads = CONFIG_CHECKS["num_heads"].check("num_heads", num_heads)
        dropout = CONFIG_CHECKS["dropout"].check("dropout", dropout)
        bias = check_flag(bias, "bias")
        if head_dim is not None:
            head_dim = POSITIVE_INT.check("head_dim", head_dim)
        elif d_model % num_heads:
            raise ValueError(
                f"num_heads: d_model {d_model} is not divisible by {num_heads}; pass head_dim"
            )
        else:
            head_dim = d_model // num_heads
        self.d_model, self.num_heads, self.head_dim = d_model, num_heads, head_dim
        inner = num_heads * head_dim
        self.q_proj = nn.Linear(d_model, inner, bias=bias)
        self.k_proj = nn.Linear(d_model, inner, bias=bias)
        self.v_proj = nn.Linear(d_model, inner, bias=bias)
        self.out_proj = nn.Linear(inner, d_model, bias=bias)
        self.feature_map = own_feature_map(feature_map)
        self.dropout = nn.Dropout(dropout)

    def _heads(self, x: Tensor) -> Tensor:
        """(B, T, H·d) -> (B, H, T, d)."""
        B, T, _ = x.shape
        return x.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)

    def project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x: (B, T, E) -> q, k, v, each (B, H, T, d)."""
        if not isinstance(x, Tensor):
            raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
        check_dense(x, "x")
        w = self.q_proj.weight
        if x.dtype != w.dtype and not torch.is_autocast_enabled(x.device.type):
            raise TypeError(f"x: expected {w.dtype} (the module's parameters' dtype), got "
                            f"{x.dtype}")
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x: expected shape (B, T, {self.d_model}), got {tuple(x.shape)}")
        x = for_autograd(x)  # an inference tensor cannot be saved for the weights' gradients
        return self._heads(self.q_proj(x)), self._heads(self.k_proj(x)), self._heads(self.v_proj(x))

    def merge(self, o: Tensor) -> Tensor:
        """Per-head outputs o: (B, H, T, d) -> (B, T, E), through the output projection."""
        B, H, T, d = o.shape
        return self.dropout(self.out_proj(o.transpose(1, 2).reshape(B, T, H * d)))

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, num_heads={self.num_heads}, head_dim={self.head_dim}"


class MultiheadLinearAttention(MultiheadAttentionBase):
    r"""Multi-head linear attention: ``(B, T, E) -> (B, T, E)``.

    Projections ``E → H·d`` for queries, keys and values, linear attention per head, and an
    output projection ``H·d → E``. With ``max_len`` set, each head also learns ``2·max_len − 1``
    relative vectors ``r_m`` (lags m = −(max_len−1) … max_len−1) that enter as a second kernel,
    ``sim(i, j) = φ(q_i)·φ(k_j) + φ(q_i)·φ(r_{j−i})`` (see :mod:`linattn.ops.relative`); a
    sequence of length T ≤ max_len uses the central 2T − 1 of them.

    Parameters without biases: ``4·E·H·d + (2·max_len − 1)·H·d``.

    The relative vectors are initialised N(0, τ²) with τ the standard deviation of a key
    coordinate at initialisation for unit-variance inputs (τ² = mean over rows of ‖W_k row‖²),
    so neither the content nor the position term dominates the scores at the start.

    Args:
        d_model: E (``embed_dim=`` is a deprecated alias). num_heads: H. head_dim: d
            (default E // H).
        feature_map: a name, a :class:`~linattn.feature_maps.FeatureMap` or a factory; the
            module always owns its map (a submodule, so random maps are saved with the model):
            an instance is a template copied by :func:`own_feature_map`, never shared.
        is_causal: attend to j ≤ i only.
        max_len: longest sequence; set it to learn relative positions.
        bias: biases in the four projections.
        dropout: dropout on the output projection (there is no attention matrix to drop from).
        sequence_parallel_group: a ``torch.distributed`` group across which the sequence is
            split (each rank holds a contiguous slice, in rank order); attention then runs
            through :func:`linattn.distributed.sequence_parallel_linear_attention`. Not with
            ``max_len``: lag terms would need the other ranks' values.
        attention: ``"linear"`` (the default) or ``"flow"``: Flow-Attention
            (:func:`linattn.flowformer_attention`, Flowformer) with this module's feature map
            (``feature_map="sigmoid"`` is the paper's; the name is accepted here). A
            ``key_padding_mask`` then removes the padded tokens as sources *and* sinks, so the
            real tokens' outputs do not depend on the padding. Not with ``max_len`` or
            ``sequence_parallel_group``.
    """

    @renamed_keywords(EMBED_DIM_ALIAS)
    def __init__(
        self,
        d_model: int,
        num_heads: int,
        head_dim: int | None = None,
        *,
        feature_map: FeatureMapSpec = "elu",
        is_causal: bool = False,
        max_len: int | None = None,
        bias: bool = False,
        dropout: float = 0.0,
        sequence_parallel_group=None,
        attention: str = "linear",
    ) -> None:
        if attention not in ("linear", "flow"):
            raise ValueError(f"attention: expected 'linear' or 'flow', got {attention!r}")
        if attention == "flow" and (max_len is not None or sequence_parallel_group is not None):
            raise ValueError(
                "attention: 'flow' takes neither max_len nor sequence_parallel_group"
            )
        if isinstance(feature_map, str) and feature_map.lower() == "sigmoid":
            feature_map = SigmoidFeatures  # not among the linear maps' names: a factory
        if sequence_parallel_group is not None and max_len is not None:
            raise ValueError(
                "sequence_parallel_group: relative positions (max_len) need the whole sequence "
                "on one rank"
            )
        if max_len is not None:
            max_len = POSITIVE_INT.check("max_len", max_len)
        super().__init__(d_model, num_heads, head_dim, feature_map=feature_map, bias=bias,
                         dropout=dropout)
        self.sequence_parallel_group = sequence_parallel_group
        # checked now (a TypeError naming it), not at the first forward
        self.is_causal = check_flag(is_causal, "is_causal")
        self.max_len = max_len
        self.attention = attention
        if max_len is not None:
            self.rel = nn.Parameter(torch.empty(num_heads, 2 * max_len - 1, self.head_dim))
            self.reset_relative()
        else:
            self.register_parameter("rel", None)

    def key_std(self) -> float:
        """Std of one key coordinate for unit-variance inputs: sqrt(mean_h ‖W_k[h]‖²)."""
        return math.sqrt(self.k_proj.weight.detach().pow(2).sum(1).mean().item())

    def reset_relative(self) -> None:
        """Draw the relative vectors from N(0, τ²), τ = :meth:`key_std` (τ² = σ²)."""
        if self.rel is not None:
            with torch.no_grad():
                self.rel.normal_(0.0, self.key_std())

    def relative_vectors(self, T: int) -> Tensor:
        """The central 2T − 1 relative vectors: (H, 2T − 1, d)."""
        if self.max_len is None or self.rel is None:
            raise ValueError("relative_vectors: this module has no relative vectors (max_len)")
        if T > self.max_len:
            raise ValueError(f"x: sequence length {T} exceeds max_len={self.max_len}")
        return self.rel[:, self.max_len - T : self.max_len + T - 1]

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        """x: (B, T, E); key_padding_mask: bool (B, T), True = padding. Returns (B, T, E)."""
        q, k, v = self.project(x)
        kwargs = dict(
            feature_map=self.feature_map,
            is_causal=self.is_causal,
            key_padding_mask=key_padding_mask,
        )
        if self.attention == "flow":
            o = flowformer_attention(q, k, v, query_padding_mask=key_padding_mask, **kwargs)
        elif self.rel is not None:
            o = relative_linear_attention(q, k, v, self.relative_vectors(x.shape[1]), **kwargs)
        elif self.sequence_parallel_group is not None:
            from linattn.distributed import sequence_parallel_linear_attention

            o = sequence_parallel_linear_attention(
                q, k, v, group=self.sequence_parallel_group, **kwargs
            )
        else:
            o = linear_attention(q, k, v, **kwargs)
        return self.merge(o)

    def extra_repr(self) -> str:
        flow = ", attention='flow'" if self.attention == "flow" else ""
        return super().extra_repr() + f", is_causal={self.is_causal}, max_len={self.max_len}{flow}"
