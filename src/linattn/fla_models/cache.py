"""The decoding cache of fla's models: one dict per layer, fla's keys and layouts.

``cache[i]`` is layer i's ``{"recurrent_state", "attn_state", "conv_state", "ffn_state"}``, as in
fla's ``fla.models.utils.Cache``:

* ``recurrent_state``: the layer's state in fla's layout: (N, H, V, K) where fla's layer passes
  ``state_v_first=True`` (GLA, HGRN2, Gated DeltaNet, KDA), (N, H, K, V) otherwise (DeltaNet,
  RetNet, linear attention: for the normalised form fla's pair (kv, z)). linattn's kernels keep
  (N, H, K, V); a v-first state is stored as a transposed *view* of it, so decoding copies
  nothing (``.contiguous()`` gives fla's memory order where that matters).
* ``conv_state``: a tuple of the layer's short convolutions' caches, each the last W inputs
  (N, D, W), updated in place while decoding (as fla does).
* ``attn_state``: softmax layers' (keys, values), each (N, S, Hkv·D), the last ``window_size``
  only for a sliding window.

The class is a transformers :class:`~transformers.cache_utils.Cache` (``generate`` keeps it
between steps; beam search reorders it), with a token counter per layer.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from transformers.cache_utils import Cache, CacheLayerMixin

KEYS = ("recurrent_state", "attn_state", "conv_state", "ffn_state")


def _map(value: Any, fn) -> Any:
    if isinstance(value, Tensor):
        return fn(value)
    if isinstance(value, tuple):
        return tuple(_map(v, fn) for v in value)
    if isinstance(value, list):
        return [_map(v, fn) for v in value]
    if isinstance(value, dict):
        return {k: _map(v, fn) for k, v in value.items()}
    return value


class FLALayerCache(CacheLayerMixin):
    """One layer's states and the number of tokens it has seen."""

    is_compileable = False
    is_sliding = False

    def __init__(self) -> None:
        super().__init__()
        self.state: dict[str, Any] = dict.fromkeys(KEYS)
        self.seen = 0

    # transformers' abstract interface; fla's layers never call update(keys, values)
    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        self.device = key_states.device

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs):
        raise NotImplementedError("FLALayerCache: the layers write their states with "
                                  "FLACache.update_layer")

    def get_seq_length(self) -> int:
        return self.seen

    def get_max_length(self) -> int:
        return -1

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.seen + query_length, 0

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.state = _map(self.state, lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self.state = _map(self.state, lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.reorder_cache(indices)

    def crop(self, max_length: int) -> None:
        if max_length < 0:
            max_length = max(0, self.seen + max_length)
        if max_length >= self.seen:
            return
        raise NotImplementedError("crop: a recurrent state cannot be rolled back to an earlier "
                                  "token (fla's models cannot either)")

    def reset(self) -> None:
        self.state = dict.fromkeys(KEYS)
        self.seen = 0
        self.is_initialized = False


class FLACache(Cache):
    """fla's per-layer state dicts as a transformers cache (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__(layer_class_to_replicate=FLALayerCache)

    def __getitem__(self, layer_idx: int) -> dict[str, Any]:
        return self.layers[layer_idx].state

    def has(self, layer_idx: int) -> bool:
        """Whether layer ``layer_idx`` holds states (it has run once)."""
        return layer_idx < len(self.layers) and self.layers[layer_idx].is_initialized

    def update_layer(self, layer_idx: int, tokens: int, **states: Any) -> dict[str, Any]:
        """Store a layer's new states (those given; None keeps the old) after ``tokens`` more
        tokens. Returns the layer's dict."""
        while len(self.layers) <= layer_idx:
            self.layers.append(FLALayerCache())
        layer = self.layers[layer_idx]
        for key, value in states.items():
            if key not in KEYS:
                raise ValueError(f"states: unknown key {key!r}; expected one of {KEYS}")
            if value is not None:
                layer.state[key] = value
        layer.seen += tokens
        layer.is_initialized = True
        return layer.state

    def get_seq_length(self, layer_idx: int | None = 0, *args, **kwargs) -> int:
        idx = layer_idx or 0
        return self.layers[idx].seen if idx < len(self.layers) else 0

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0, *args, **kwargs):
        if layer_idx >= len(self.layers):
            return query_length, 0
        return self.layers[layer_idx].get_mask_sizes(query_length)

    def to_legacy_cache(self) -> tuple[dict[str, Any], ...]:
        return tuple(layer.state for layer in self.layers)
