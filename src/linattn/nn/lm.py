r"""A causal linear-attention language model that decodes in O(1) per token.

Positions: a per-head exponential decay of the state
------------------------------------------------------
Each head h attends with weights ``γ_h^{i−j} φ(q_i)·φ(k_j)`` (j ≤ i), see
:mod:`linattn.ops.decay`. Why this and not something else:

* It is a *relative* position: the weight depends on the lag ``i − j`` only, so the model is the
  same at position 10 and position 10⁶ and needs no maximum length.
* A recurrence carries it for free — ``S ← γ_h S + φ(k)vᵀ`` — so a decoding step costs the same
  O(H·ℓ·d) at every context length, and the state has a fixed size (per layer ``H·ℓ·(d+1)``
  numbers). Absolute embeddings would cap the length; learned relative vectors
  (:mod:`linattn.ops.relative`) or RoPE-style rotations of φ need the position inside the
  recurrence or a growing state; token shift gives only a one-token window.
* Heads get a fixed geometric spread ``γ_h = 1 − 2^{−(2 … 9)}`` (0.75 … 0.998, RetNet-style):
  some heads look a few characters back, others hundreds. Plain linear attention (γ = 1) has
  no notion of order beyond causality and its state keeps every token at equal weight, which
  blurs the recent past that language modelling depends on most.

The softmax baseline (``attention="softmax"``) runs the same code with softmax attention and the
same decays as an additive ALiBi bias ``(i − j)·log γ_h`` — the exact softmax analogue
(:func:`~linattn.ops.decay_softmax.decay_softmax_attention`, which folds the bias into the
causal SDPA kernel) — with a KV cache as its state, which grows by one (k, v) per token.

The hybrid (``attention="hybrid"``, ``window=w``) is :mod:`linattn.ops.window`: exact softmax
over the last w tokens and linear attention over everything older, in one normaliser; its state
is the linear state plus a ring buffer of the last w keys and values (constant size). It uses
*no decay*: the op's function has none (a decay would have to weigh both parts alike to keep
one normaliser meaningful), and the exact window already resolves the recent past, which is
what the decays give the linear model. The ``decay`` buffer is still there (the same
state_dict keys for every kind) but unused. Order inside the window comes from causality only.

Gated DeltaNet (``attention="gated_delta"``) mixes tokens with the gated delta rule
(:mod:`linattn.nn.gated_delta`): learned per-token decays and write strengths, L2-normalised
keys, a (d, d) state per head. It has its own parameters (gates, output gate and norm) and no
use for the ``decay`` buffer or a feature map.

Token shift (``short_conv=k``, default 0: none): a depthwise causal convolution of width k over
the token embeddings, ``e'_t = Σ_{j<k} w_j ⊙ e_{t−j}``, started at w_0 = 1 (the token itself)
and w_{j≥1} ~ N(0, 0.5²) per channel. It hands every position its predecessors' identities,
which no kind above can isolate on its own: the decays weigh a lag smoothly, softmax's bias
favours the token itself, and linear attention has no order at all. Associative recall needs
exactly that (a value must carry the key before it: an induction head, see docs/recall.md),
which is why Zoology's, Based's and fla's models all have short convolutions. The earlier taps
start open so that the gradient need not discover them (at MQAR the difference from an
identity start was within the run-to-run spread). Decoding keeps the last k − 1 embeddings
(:attr:`LMState.conv`).

The kinds and the modules that compute them are listed once, in :data:`linattn.nn.mixers.MIXERS`
(a new mixer is its module and one line there); :class:`LMConfig` holds and checks a model's
configuration.

Shapes: ids (B, T) integers in [0, vocab_size) → logits (B, T, vocab_size).
Tracing: the forward runs under ``torch.compile(model, fullgraph=True)`` and
``torch.export.export``. The ids' range is an assertion node of the graph there (a RuntimeError
when the compiled program meets an id out of range; a ValueError naming the range in eager);
dtype and shape checks run while tracing too.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linattn._config import rename_deprecated, renamed_keywords
from linattn._memory import check_fits, lm_parameters
from linattn.nn.attention import EMBED_DIM_ALIAS, FeatureMapSpec, MultiheadAttentionBase
from linattn.nn.encoder import PreNormBlock
from linattn.nn.mixers import (
    DEFAULT_WINDOW,
    MIXERS,
    OPTION_DEFAULTS,
    StateDict,
    batch_size_of,
    build_mixer,
    check_config,
    get_mixer,
    state_fields,
    state_from_dict,
    state_to_dict,
    state_types,
)
from linattn.ops._common import (
    check_dense,
    check_positive_int,
    check_size,
    check_values,
    is_bool,
    shown,
)
from linattn.ops._library import for_autograd, tracing
from linattn.ops.decay.op import decay_linear_attention, decay_linear_attention_step
from linattn.ops.decay_softmax.op import decay_softmax_attention
from linattn.ops.dispatch import DEFAULT_CHUNK_SIZE
from linattn.ops.linear.recurrent import LinearAttentionState
from linattn.ops.window.op import (
    WindowLinearAttentionState,
    check_window,
    window_linear_attention,
    window_linear_attention_step,
)

__all__ = ["LinearTransformerLM", "LMConfig", "LMState", "KVCache", "DecayedMultiheadAttention",
           "DecoderBlock", "default_decays", "DEFAULT_WINDOW"]


def default_decays(num_heads: int) -> Tensor:
    """``γ_h = 1 − 2^{−e_h}`` with e spread evenly over [2, 9]: (H,) float32, 0.75 … 0.998."""
    return 1.0 - torch.pow(2.0, -torch.linspace(2.0, 9.0, num_heads))


@dataclass(frozen=True)
class KVCache(StateDict):
    """The softmax baseline's per-layer state: k, v of every token so far, (B, H, T, d) each."""

    k: Tensor
    v: Tensor


#: The default sizes of ``linattn lm train``: what :func:`check_fits` names the option by.
_SIZE_DEFAULTS = {"vocab_size": 256, "d_model": 128, "num_layers": 4, "mlp_dim": None,
                  "short_conv": 0}


@dataclass
class LMState:
    """Per-layer decoding state of :class:`LinearTransformerLM`.

    ``layers[i]`` is the state type of the model's kind (:data:`linattn.nn.mixers.MIXERS`): a
    :class:`~linattn.ops.linear.recurrent.LinearAttentionState` (S: (B, H, ℓ, d),
    z: (B, H, ℓ)) for linear attention — the same size after 1 token or 1 million — a
    :class:`~linattn.ops.window.WindowLinearAttentionState` for the hybrid (S, z and a ring
    buffer k, v: (B, H, w, d), also constant), a
    :class:`~linattn.nn.gated_delta.DeltaRuleState` for Gated DeltaNet (S: (B, H, d, d)), or a
    :class:`KVCache` for the softmax baseline.
    ``position`` counts the tokens seen (the softmax bias reads the same count off the cache).
    ``conv`` is the token shift's memory, the last k − 1 embeddings (B, k − 1, E), for a model
    with ``short_conv=k`` (None otherwise).
    Save/restore with :meth:`to_dict` / :meth:`from_dict` (a flat dict of tensors, e.g. for
    ``safetensors``)."""

    layers: list = field(default_factory=list)
    position: int = 0
    conv: Tensor | None = None

    def to_dict(self) -> dict[str, Tensor]:
        """``position`` and ``layers.{i}.{field}`` for every field of every layer's state (int
        counters as int64 scalars), tensors detached and cloned."""
        out = {"position": torch.tensor(self.position, dtype=torch.int64)}
        for i, st in enumerate(self.layers):
            out.update(state_to_dict(st, f"layers.{i}."))
        if self.conv is not None:
            out["conv"] = self.conv.detach().clone()
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Tensor], attention: str | None = None) -> LMState:
        """The state saved by :meth:`to_dict`. Each layer's state type is ``attention``'s (a
        kind of :data:`~linattn.nn.mixers.MIXERS`), or without it the one registered type
        whose fields are that layer's entries. ValueError for a missing entry or entries that
        fit no (or several) state types."""
        want = None if attention is None else get_mixer(attention).state_class()
        try:
            layers, i = [], 0
            while True:
                prefix = f"layers.{i}."
                names = {k[len(prefix):] for k in d if k.startswith(prefix)}
                if not names:
                    break
                layers.append(state_from_dict(want or _state_type(names, i), d, prefix))
                i += 1
            return cls(layers, int(d["position"]), d.get("conv"))
        except KeyError as err:
            raise ValueError(f"state dict: missing entry {err}") from None

    def nbytes(self) -> int:
        """Bytes held by the state (what decoding keeps in memory besides the weights)."""
        return sum(t.numel() * t.element_size() for t in self.to_dict().values()
                   if t.dim() > 0)


def _state_type(names: set[str], layer: int) -> type:
    """The registered state type saved as the entries ``names``."""
    found = {cls for cls in state_types().values() if set(state_fields(cls)) == names}
    if len(found) == 1:
        return found.pop()
    kinds = ("no state type of " + ", ".join(MIXERS) if not found else
             "several state types: " + ", ".join(sorted(c.__name__ for c in found)))
    raise ValueError(f"state dict: the entries {sorted(names)} of layer {layer} fit {kinds}; "
                     "pass attention=")


class TokenShift(nn.Module):
    """The token shift of ``short_conv=k`` (module docstring): a depthwise causal convolution of
    width k over time, (B, T, E) -> (B, T, E), ``y_t = Σ_{j<k} w_j ⊙ x_{t−j}``, with
    ``weight`` (E, k) initialised to w_0 = 1 and w_{j≥1} ~ N(0, 0.5²) (:attr:`INIT_STD`; the
    module docstring says why). ``forward(x, tail)`` continues
    after ``tail`` (B, k − 1, E), the k − 1 inputs before x (None: zeros, the sequence's start)
    and returns (y, the new tail)."""

    #: the standard deviation of the earlier taps w_{j≥1} at initialisation
    INIT_STD = 0.5

    def __init__(self, d_model: int, kernel_size: int) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        weight = torch.randn(d_model, kernel_size) * self.INIT_STD
        weight[:, 0] = 1.0  # w_0: the token itself
        self.weight = nn.Parameter(weight)

    def forward(self, x: Tensor, tail: Tensor | None = None) -> tuple[Tensor, Tensor]:
        B, T, E = x.shape
        k = self.kernel_size
        if tail is None:
            tail = x.new_zeros(B, k - 1, E)
        elif tail.shape != (B, k - 1, E):
            raise ValueError(f"state.conv: expected shape {(B, k - 1, E)}, got "
                             f"{tuple(tail.shape)}")
        xp = torch.cat([tail.to(x.dtype), x], 1)  # (B, k − 1 + T, E)
        # conv1d correlates: its last tap meets the newest input, so w is flipped to w_0 last
        y = F.conv1d(xp.transpose(1, 2), self.weight.flip(1).unsqueeze(1).to(x.dtype),
                     groups=E).transpose(1, 2)
        return y, xp[:, xp.shape[1] - (k - 1):]

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, kernel_size={self.kernel_size}"


class DecayedMultiheadAttention(MultiheadAttentionBase):
    """Causal multi-head attention with per-head decays γ_h and a state: (B, T, E) -> (B, T, E).

    ``attention="linear"``: :func:`~linattn.ops.decay.decay_linear_attention` (a chunk of T > 1
    tokens, chunked parallel form) or its recurrent step (T = 1 with a state).
    ``attention="softmax"``: :func:`~linattn.ops.decay_softmax.decay_softmax_attention` (softmax
    with the ALiBi bias ``(i − j)·log γ_h`` ≤ 0) and a KV cache.
    ``attention="hybrid"``: :func:`~linattn.ops.window.window_linear_attention` with ``window``
    (default :data:`DEFAULT_WINDOW`; only for the hybrid), undecayed (module docstring), or its
    step (T = 1 with a state).
    Projections, feature map and parameter count are those of :class:`MultiheadLinearAttention`
    (both share :class:`~linattn.nn.attention.MultiheadAttentionBase`); the decays are a fixed
    buffer, not parameters. ``embed_dim=`` is a deprecated alias of ``d_model=``."""

    #: the kinds this module computes → the method that mixes (q, k, v, state) -> (o, state)
    MODES = {"linear": "_decayed_linear", "softmax": "_decayed_softmax", "hybrid": "_hybrid"}

    @renamed_keywords(EMBED_DIM_ALIAS)
    def __init__(
        self,
        d_model: int,
        num_heads: int,
        head_dim: int | None = None,
        *,
        feature_map: FeatureMapSpec = "elu",
        attention: str = "linear",
        decay: Tensor | None = None,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        bias: bool = False,
        dropout: float = 0.0,
        window: int | None = None,
    ) -> None:
        if attention not in self.MODES:
            raise ValueError(f"attention: expected one of {tuple(self.MODES)}, got {attention!r}")
        if attention == "hybrid":
            window = check_window(DEFAULT_WINDOW if window is None else window)
        elif window is not None:
            raise ValueError(f"window: only used with attention='hybrid', got {window!r} "
                             f"with attention={attention!r}")
        decay = default_decays(num_heads) if decay is None else torch.as_tensor(decay).float()
        if decay.shape != (num_heads,) or (decay <= 0).any() or (decay > 1).any():
            raise ValueError(f"decay: expected {num_heads} values in (0, 1], got {decay}")
        super().__init__(d_model, num_heads, head_dim, feature_map=feature_map, bias=bias,
                         dropout=dropout)
        self.attention, self.chunk_size, self.window = attention, chunk_size, window
        self.register_buffer("decay", decay)

    def forward(
        self, x: Tensor, state: LinearAttentionState | WindowLinearAttentionState | KVCache
        | None = None, position: int = 0,
    ) -> tuple[Tensor, LinearAttentionState | WindowLinearAttentionState | KVCache]:
        """x: (B, T, E); ``state`` after ``position`` earlier tokens (informational: every kind
        reads what it needs off its state). Returns (out, new state):
        out (B, T, E); the state a :class:`~linattn.ops.linear.recurrent.LinearAttentionState`
        (S: (B, H, ℓ, d), z: (B, H, ℓ)), a
        :class:`~linattn.ops.window.WindowLinearAttentionState` (hybrid) or a :class:`KVCache`
        (k, v: (B, H, position + T, d))."""
        q, k, v = self.project(x)
        o, new = getattr(self, self.MODES[self.attention])(q, k, v, state)
        return self.merge(o), new

    def _decayed_linear(self, q: Tensor, k: Tensor, v: Tensor,
                        state: LinearAttentionState | None) -> tuple[Tensor, LinearAttentionState]:
        g = self.decay.to(q.dtype)
        # (B, H, T, d) in memory: φ's backward then sees one layout (torch 2.13's fake strides
        # of elu_backward follow its input, eager's the gradient: a compiled backward of
        # transposed q, k fails on a view)
        q, k = q.contiguous(), k.contiguous()
        if q.shape[2] == 1 and state is not None:  # a decoding step: the recurrence, O(ℓ·d)
            o, new = decay_linear_attention_step(
                q[:, :, 0], k[:, :, 0], v[:, :, 0], g, state, feature_map=self.feature_map)
            return o.unsqueeze(2), new
        return decay_linear_attention(q, k, v, g, feature_map=self.feature_map,
                                      chunk_size=self.chunk_size, initial_state=state,
                                      return_state=True)

    def _decayed_softmax(self, q: Tensor, k: Tensor, v: Tensor,
                         state: KVCache | None) -> tuple[Tensor, KVCache]:
        if state is not None:
            if not isinstance(state, KVCache):
                raise TypeError(f"state: expected a KVCache, got {type(state).__name__}")
            k, v = torch.cat([state.k, k], 2), torch.cat([state.v, v], 2)
        # ALiBi: weight × γ^(i−j), i.e. bias (i − j)·log γ ≤ 0, queries at the last T of the
        # cached positions; the op folds the bias into the causal SDPA kernel
        return decay_softmax_attention(q, k, v, self.decay.to(q.dtype)), KVCache(k, v)

    def _hybrid(self, q: Tensor, k: Tensor, v: Tensor, state: WindowLinearAttentionState | None
                ) -> tuple[Tensor, WindowLinearAttentionState]:
        if state is not None and not isinstance(state, WindowLinearAttentionState):
            raise TypeError(
                f"state: expected a WindowLinearAttentionState, got {type(state).__name__}")
        if q.shape[2] == 1 and state is not None:  # a decoding step: O(w·d + ℓ·d) per head
            o, new = window_linear_attention_step(
                q[:, :, 0], k[:, :, 0], v[:, :, 0], state, window=self.window,
                feature_map=self.feature_map)
            return o.unsqueeze(2), new
        return window_linear_attention(
            q, k, v, window=self.window, feature_map=self.feature_map,
            chunk_size=self.chunk_size, initial_state=state, return_state=True)

    def extra_repr(self) -> str:
        window = f", window={self.window}" if self.window is not None else ""
        return (super().extra_repr()
                + f", attention={self.attention!r}, chunk_size={self.chunk_size}{window}")


class DecoderBlock(PreNormBlock):
    """Pre-norm causal block (the :class:`~linattn.nn.encoder.PreNormBlock` layout of
    :class:`~linattn.nn.encoder.EncoderBlock`) whose attention is the mixer of kind
    ``attention`` (:func:`linattn.nn.mixers.build_mixer`; :class:`DecayedMultiheadAttention` by
    default): ``block(x, state, position)`` with x (B, T, E) -> (x (B, T, E), new state).
    ``feature_map``, ``decay`` and ``window`` go to the kinds that take them; setting one that
    the kind does not take is a ValueError."""

    def __init__(self, d_model: int, num_heads: int, mlp_dim: int | None = None, *,
                 feature_map: FeatureMapSpec = "elu", attention: str = "linear",
                 decay: Tensor | None = None, chunk_size: int = DEFAULT_CHUNK_SIZE,
                 dropout: float = 0.0, window: int | None = None) -> None:
        attn = build_mixer(attention, d_model, num_heads, chunk_size=chunk_size, dropout=dropout,
                           feature_map=feature_map, decay=decay, window=window)
        super().__init__(d_model, attn, mlp_dim, dropout)

    def forward(self, x: Tensor, state: Any = None, position: int = 0) -> tuple[Tensor, Any]:
        a, new = self.attn(self.norm1(x), state, position)
        return self.mlp_residual(x + a), new


#: Deprecated spellings accepted in saved model configurations (with a DeprecationWarning).
RENAMED: dict[str, str] = {"embed_dim": "d_model", "layers": "num_layers",
                           "depth": "num_layers", "heads": "num_heads"}


@dataclass(frozen=True)
class LMConfig:
    """The configuration of a :class:`LinearTransformerLM` (the keywords of its constructor),
    checked when it is made: ValueError naming the field for a bad value or for an option that
    the ``attention`` kind does not take (:data:`linattn.nn.mixers.MIXERS` says which).

    ``decay`` is kept as a tuple of floats; ``chunk_size`` None means
    :data:`~linattn.ops.dispatch.DEFAULT_CHUNK_SIZE`. :meth:`to_dict` is the dict stored in
    checkpoints (``window`` only when set); :meth:`from_dict` reads it back, also as saved by
    earlier versions."""

    vocab_size: int
    d_model: int
    num_layers: int
    num_heads: int
    feature_map: FeatureMapSpec = OPTION_DEFAULTS["feature_map"]
    dropout: float = 0.0
    mlp_dim: int | None = None
    attention: str = next(iter(MIXERS))
    decay: tuple[float, ...] | None = OPTION_DEFAULTS["decay"]
    chunk_size: int = DEFAULT_CHUNK_SIZE
    window: int | None = OPTION_DEFAULTS["window"]
    short_conv: int = 0

    def __post_init__(self) -> None:
        if self.chunk_size is None:
            object.__setattr__(self, "chunk_size", DEFAULT_CHUNK_SIZE)
        # types, ranges, the kind's options: declared torch-free in linattn.nn.mixers
        check_config({f.name: getattr(self, f.name) for f in fields(self)})
        if self.decay is not None:
            try:
                decay = tuple(float(g) for g in self.decay)
            except (TypeError, ValueError):
                decay = None
            if decay is None or len(decay) != self.num_heads or \
                    not all(0 < g <= 1 for g in decay):
                raise ValueError(f"decay: expected {self.num_heads} values in (0, 1], "
                                 f"got {self.decay!r}")
            object.__setattr__(self, "decay", decay)

    def kwargs(self) -> dict[str, Any]:
        """The keywords of ``LinearTransformerLM(**kwargs)`` for this configuration."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def to_dict(self) -> dict[str, Any]:
        """The configuration as a plain dict (``decay`` a list; ``window`` only when set, as
        the configurations of the other kinds were saved without it)."""
        out = self.kwargs()
        out["decay"] = None if self.decay is None else list(self.decay)
        if self.window is None:
            del out["window"]
        if not self.short_conv:  # as saved before the option existed
            del out["short_conv"]
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "model config") -> LMConfig:
        """The configuration saved as ``d`` (:meth:`to_dict`, or the raw dicts of earlier
        checkpoints): deprecated names (``embed_dim``, ``layers``, ``depth``, ``heads``) are
        renamed with a DeprecationWarning, a ``chunk_size`` of None is the default, and a
        ``feature_map`` saved with a kind that does not use one (it was ignored) is dropped.
        ValueError naming ``where`` and the key for unknown or missing keys and bad values."""
        if not isinstance(d, Mapping):
            raise ValueError(f"{where}: expected a dict, got {type(d).__name__}")
        try:
            d = rename_deprecated(d, RENAMED, where, stacklevel=3)
        except TypeError as err:
            raise ValueError(str(err)) from None
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"{where}: unknown keys {unknown}")
        missing = [n for n in ("vocab_size", "d_model", "num_layers", "num_heads") if n not in d]
        if missing:
            raise ValueError(f"{where}: missing keys {missing}")
        spec = MIXERS.get(d.get("attention", cls.attention))
        if spec is not None and "feature_map" not in spec.options:
            d.pop("feature_map", None)
        try:
            return cls(**d)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{where}: {err}") from None


class LinearTransformerLM(nn.Module):
    """Causal pre-norm decoder: token embedding → ``num_layers`` × :class:`DecoderBlock` →
    LayerNorm → tied output projection. See the module docstring for the position scheme.

    ``logits = model(ids)``; ``logits, state = model(ids, state, return_state=True)`` for a chunk
    of any length after the tokens summarised by ``state`` (1 token: the O(1) recurrent step;
    more: the chunked parallel form, a prefill); :meth:`generate` = prefill, then steps.
    ``LinearTransformerLM.from_config(config)`` builds the model of an :class:`LMConfig` (or of
    its saved dict); ``model.config`` is the model's :class:`LMConfig`.

    Args:
        vocab_size: V. d_model: E. num_layers, num_heads: depth and H (head dim E / H).
        feature_map: φ (linear and hybrid only): a name, a
            :class:`~linattn.feature_maps.FeatureMap` template or a factory; every layer gets
            its own map (:func:`~linattn.nn.attention.own_feature_map`), never a shared one.
        dropout: after the embedding, the attention output and in the MLPs.
        mlp_dim: hidden width of the MLPs (default 4E; 0 for none).
        attention: a kind of :data:`linattn.nn.mixers.MIXERS`: ``"linear"`` (this model),
            ``"softmax"`` (the SDPA + KV-cache baseline, same parameters, same code),
            ``"hybrid"`` (exact softmax over the last ``window`` tokens + linear attention
            before them, one normaliser, undecayed; constant state) or ``"gated_delta"``
            (Gated DeltaNet, :mod:`linattn.nn.gated_delta`; learned decays, its own gate
            parameters, no feature map).
        decay: (H,) per-head decays in (0, 1] (default :func:`default_decays`; not with
            ``"gated_delta"``).
        chunk_size: C of the chunked parallel form (default
            :data:`~linattn.ops.dispatch.DEFAULT_CHUNK_SIZE`).
        window: the hybrid's w (default :data:`DEFAULT_WINDOW`); only with ``"hybrid"``.
        short_conv: width k of the token shift over the embeddings (module docstring); 0
            (default) for none.
    """

    def __init__(self, vocab_size: int, d_model: int, num_layers: int, num_heads: int, *,
                 feature_map: FeatureMapSpec = "elu", dropout: float = 0.0,
                 mlp_dim: int | None = None, attention: str = "linear",
                 decay: list[float] | None = None,
                 chunk_size: int = DEFAULT_CHUNK_SIZE, window: int | None = None,
                 short_conv: int = 0) -> None:
        super().__init__()
        self.config = c = LMConfig(
            vocab_size=vocab_size, d_model=d_model, num_layers=num_layers, num_heads=num_heads,
            feature_map=feature_map, dropout=dropout, mlp_dim=mlp_dim, attention=attention,
            decay=decay, chunk_size=chunk_size, window=window, short_conv=short_conv)
        _register_pytree(get_mixer(c.attention).state_class())  # a kind added at run time
        check_fits(lambda sizes: 4 * lm_parameters(sizes),  # float32 parameter bytes, checked
                   {f.name: getattr(c, f.name) for f in fields(c)}, _SIZE_DEFAULTS,
                   "this model")  # before the allocator fails in a traceback
        self.vocab_size = c.vocab_size
        self.embed = nn.Embedding(c.vocab_size, c.d_model)
        nn.init.normal_(self.embed.weight, std=0.02)  # tied with the output: small logits at init
        self.shift = TokenShift(c.d_model, c.short_conv) if c.short_conv else None
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(
            DecoderBlock(c.d_model, c.num_heads, c.mlp_dim, feature_map=c.feature_map,
                         attention=c.attention, decay=c.decay, chunk_size=c.chunk_size,
                         dropout=c.dropout, window=c.window)
            for _ in range(c.num_layers))
        self.norm = nn.LayerNorm(c.d_model)
        self.head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.head.weight = self.embed.weight

    @classmethod
    def from_config(cls, config: LMConfig | Mapping[str, Any]) -> LinearTransformerLM:
        """The model of ``config`` (an :class:`LMConfig`, or a dict read by
        :meth:`LMConfig.from_dict`)."""
        if not isinstance(config, LMConfig):
            config = LMConfig.from_dict(config)
        return cls(**config.kwargs())

    def check_ids(self, ids: Tensor) -> None:
        """ValueError unless ids is an integer (B, T) tensor, T ≥ 1, with 0 ≤ id < vocab_size.

        The range is read off the values, which a trace does not know: under
        ``torch.compile``/``torch.export`` (or any trace or transform,
        :func:`linattn.ops._library.tracing`) it is an assertion node of the graph, as the
        ops' value checks are (:func:`linattn.ops._common.check_values`): the compiled program
        raises a RuntimeError naming the range, and the lookup itself reads clamped ids
        (:meth:`embed_tokens`), so that no compiled gather reads outside the table (Inductor's
        own bounds check aborted the process from inside a parallel loop)."""
        if not isinstance(ids, Tensor):
            raise ValueError(f"ids: expected a torch.Tensor, got {type(ids).__name__}")
        check_dense(ids, "ids")
        if ids.device != self.embed.weight.device:
            raise ValueError(f"ids: expected a tensor on {self.embed.weight.device} (the model's "
                             f"device), got {ids.device}")
        if ids.dtype == torch.bool or ids.is_floating_point() or ids.is_complex():
            raise ValueError(f"ids: expected an integer tensor, got dtype {ids.dtype}")
        if ids.dim() != 2 or ids.shape[1] == 0:
            raise ValueError(f"ids: expected shape (B, T) with T >= 1, got {tuple(ids.shape)}")
        if tracing(ids) or ids.is_meta:  # values unknown (compile, export, fake, vmap, meta)
            check_values(ids, lambda i: (i >= 0) & (i < self.vocab_size),
                         f"ids: values must lie in [0, {self.vocab_size})")
            return
        if ids.numel() == 0:
            return
        lo, hi = (int(t) for t in torch.aminmax(ids))
        if lo < 0 or hi >= self.vocab_size:
            raise ValueError(f"ids: values must lie in [0, {self.vocab_size}), got [{lo}, {hi}]")

    def forward(self, ids: Tensor, state: LMState | None = None, return_state: bool = False):
        """ids: (B, T) -> logits (B, T, V) [and the new :class:`LMState`]."""
        self.check_ids(ids)
        if state is not None:
            if not isinstance(state, LMState) or len(state.layers) != len(self.blocks):
                raise ValueError(f"state: expected an LMState with {len(self.blocks)} layers")
            B = batch_size_of([*state.layers, state.conv])
            if B is not None and B != ids.shape[0]:  # some mixers' ops would broadcast it
                raise ValueError(f"state: holds a batch of {B}, ids a batch of {ids.shape[0]}")
        h, conv = self.embed_tokens(ids, None if state is None else state.conv)
        pos = 0 if state is None else state.position
        new = []
        for i, block in enumerate(self.blocks):
            h, st = block(h, None if state is None else state.layers[i], pos)
            new.append(st)
        logits = self.head(self.norm(h))
        if return_state:
            return logits, LMState(new, pos + ids.shape[1], conv)
        return logits

    def embed_tokens(self, ids: Tensor, conv: Tensor | None = None
                     ) -> tuple[Tensor, Tensor | None]:
        """The blocks' input for ``ids`` (B, T): embeddings, token-shifted after ``conv`` (the
        state's last k − 1 embeddings) where the model has ``short_conv``, then dropout.
        Returns (h (B, T, E), the new ``conv``, None without a token shift)."""
        ids = for_autograd(ids).long()  # an inference tensor is not saved for backward
        if tracing(ids):  # out-of-range ids fail the assertion of check_ids, not the gather
            ids = ids.clamp(0, self.vocab_size - 1)
        h = self.embed(ids)
        if self.shift is not None:
            h, conv = self.shift(h, conv)
        elif conv is not None:
            raise ValueError("state.conv: this model has no token shift (short_conv=0)")
        return self.drop(h), conv

    @torch.no_grad()
    def stream(self, ids: Tensor, max_new_tokens: int, temperature: float = 1.0,
               top_k: int | None = None, generator: torch.Generator | None = None,
               state: LMState | None = None) -> Iterator[Tensor]:
        """Prefill ``ids`` (B, T), then yield each new token (B,) as soon as it is sampled.

        ``temperature`` 0 is greedy; ``top_k`` keeps the k most likely tokens; ``generator``
        makes sampling reproducible."""
        max_new_tokens = check_size(max_new_tokens, "max_new_tokens")
        if (is_bool(temperature) or not isinstance(temperature, numbers.Real)
                or not temperature >= 0):  # NaN too
            raise ValueError(f"temperature: expected a number >= 0, got {shown(temperature)}")
        if top_k is not None:
            top_k = check_positive_int(top_k, "top_k")
        was = self.training
        self.eval()
        try:
            logits, state = self(ids, state, return_state=True)
            for i in range(max_new_tokens):
                last = logits[:, -1].float()
                if temperature == 0:
                    nxt = last.argmax(-1)
                else:
                    # shifted by the maximum first and divided in float64 (where 1e-300 is
                    # not 0): ≤ 0 before the division, so a tiny temperature gives -inf
                    # (weight 0), never inf − inf or 0 / 0; at 1e-300 all the weight is on the
                    # arg-max (greedy), where logits / t was NaN
                    last = (last - last.amax(-1, keepdim=True)).double() / temperature
                    if top_k is not None and top_k < last.shape[-1]:
                        kth = last.topk(top_k, -1).values[:, -1:]
                        last = last.masked_fill(last < kth, -math.inf)
                    nxt = torch.multinomial(last.softmax(-1), 1, generator=generator)[:, 0]
                yield nxt
                if i + 1 < max_new_tokens:
                    logits, state = self(nxt[:, None], state, return_state=True)
        finally:
            self.train(was)

    def generate(self, ids: Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, generator: torch.Generator | None = None) -> Tensor:
        """ids (B, T) followed by ``max_new_tokens`` sampled tokens: (B, T + max_new_tokens)."""
        new = list(self.stream(ids, max_new_tokens, temperature, top_k, generator))
        return torch.cat([ids.long(), *(t[:, None] for t in new)], dim=1)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def _register_pytree(cls: type) -> None:
    """``cls`` (a state dataclass) as a pytree, its fields the leaves, so that
    ``torch.export`` takes and returns it; a type registered already is left as it is."""
    from torch.utils._pytree import SUPPORTED_NODES

    if cls not in SUPPORTED_NODES:
        torch.export.register_dataclass(
            cls, serialized_type_name=f"{cls.__module__}.{cls.__qualname__}")


def _register_pytrees() -> None:
    for cls in (*state_types().values(), LMState):
        _register_pytree(cls)


_register_pytrees()
