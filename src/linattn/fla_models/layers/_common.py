"""What fla's mixers share: the packing of a prefill's real tokens, the cached state read and
stored back around one recurrence call (:func:`_recur`), head reshapes, the checks of fla's
arguments, the short convolutions' cache tuple, rotary positions."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linattn.fla_models.cache import FLACache
from linattn.fla_models.modules import integer_dim


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


def _start(layer: nn.Module, hidden_states: Tensor, attention_mask: Tensor | None,
           cache: FLACache | None) -> tuple[dict | None, Packing, Tensor]:
    """A mixer's forward begins: its cached state, the packing of the prefill's real tokens
    and the packed input."""
    packing = Packing(attention_mask, hidden_states.shape[1])
    return _layer_state(cache, layer.layer_idx), packing, packing.pack(hidden_states)


def _kv_heads(layer: nn.Module, num_heads: int, num_kv_heads: int | None) -> None:
    """fla's grouped key/value heads: ``num_kv_heads`` (default ``num_heads``) dividing
    ``num_heads``, each shared by ``num_kv_groups`` query heads."""
    layer.num_heads = num_heads
    layer.num_kv_heads = num_kv_heads or num_heads
    if num_heads % layer.num_kv_heads:
        raise ValueError(f"num_kv_heads: must divide num_heads={num_heads}, got "
                         f"{layer.num_kv_heads}")
    layer.num_kv_groups = num_heads // layer.num_kv_heads


def _widths(layer: nn.Module, hidden_size: int, expand_k: float, expand_v: float,
            num_heads: int) -> None:
    """fla's key and value widths (``hidden_size·expand_k``, ``hidden_size·expand_v``) and
    their per-head sizes."""
    layer.key_dim = integer_dim("expand_k", hidden_size * expand_k)
    layer.value_dim = integer_dim("expand_v", hidden_size * expand_v)
    if layer.key_dim % num_heads or layer.value_dim % num_heads:
        raise ValueError(f"num_heads: must divide the key and value widths "
                         f"({layer.key_dim}, {layer.value_dim}), got {num_heads}")
    layer.head_k_dim, layer.head_v_dim = layer.key_dim // num_heads, layer.value_dim // num_heads


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

    def _qkv(self, x: Tensor, state: dict | None, use_cache: bool, cu: Tensor | None
             ) -> tuple[Tensor, Tensor, Tensor, tuple | None]:
        """q, k, v projected from x and, with short convolutions, convolved (and their cache
        tuple)."""
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if not self.use_short_conv:
            return q, k, v, None
        (q, k, v), conv_state = self._convs(("q_conv1d", "k_conv1d", "v_conv1d"), [q, k, v],
                                            state, use_cache, cu)
        return q, k, v, conv_state

    def _start_qkv(self, hidden_states: Tensor, attention_mask: Tensor | None,
                   cache: FLACache | None, use_cache: bool
                   ) -> tuple[dict | None, Packing, Tensor, tuple]:
        """:func:`_start`, and the packed input's :meth:`_qkv`: (state, packing, x,
        (q, k, v, conv_state))."""
        state, packing, x = _start(self, hidden_states, attention_mask, cache)
        return state, packing, x, self._qkv(x, state, use_cache, packing.cu_seqlens)



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

