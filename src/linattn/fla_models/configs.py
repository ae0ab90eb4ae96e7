"""fla's model configs: the same ``model_type`` strings, fields and defaults (fla 0.6.0), so a
``config.json`` written by fla reads here unchanged and one written here reads in fla.

Each config is a transformers ``PreTrainedConfig``; its fields are listed once per family
(:data:`FIELDS`) over the fields every fla language model shares (:data:`COMMON`). ``attn`` (the
softmax layers of a hybrid model) is checked as fla checks it and filled with fla's defaults.
"""

from __future__ import annotations

import copy
import math
from typing import Any, ClassVar

from transformers import PreTrainedConfig

#: fields of every fla language model here, with fla's defaults
COMMON: dict[str, Any] = {
    "max_position_embeddings": 2048, "hidden_ratio": 4, "intermediate_size": None,
    "hidden_act": "swish", "norm_eps": 1e-6, "attn": None, "use_cache": True,
    "initializer_range": 0.02, "fuse_norm": True, "fuse_swiglu": True,
    "fuse_cross_entropy": True, "fuse_linear_cross_entropy": False, "use_l2warp": False,
    "vocab_size": 32000, "attnres_block_size": None,
}

#: model_type -> its own fields and defaults (over COMMON)
FIELDS: dict[str, dict[str, Any]] = {
    "gla": {"hidden_size": 2048, "expand_k": 0.5, "expand_v": 1.0, "num_hidden_layers": 24,
            "num_heads": 4, "num_kv_heads": None, "feature_map": None, "attn_mode": "chunk",
            "use_short_conv": False, "conv_size": 4, "use_output_gate": True,
            "clamp_min": None, "elementwise_affine": True, "use_gk": True, "use_gv": False},
    "gated_deltanet": {"attn_mode": "chunk", "hidden_size": 2048, "expand_v": 2.0,
                       "use_gate": True, "use_short_conv": True, "allow_neg_eigval": False,
                       "conv_size": 4, "head_dim": 256, "num_heads": 6, "num_v_heads": None,
                       "num_hidden_layers": 21, "output_gate_activation": "swish"},
    "delta_net": {"attn_mode": "chunk", "hidden_size": 2048, "expand_k": 1.0, "expand_v": 1.0,
                  "use_gate": False, "use_short_conv": True, "allow_neg_eigval": False,
                  "conv_size": 4, "use_beta": True, "use_output_norm": True, "num_heads": 16,
                  "qk_norm": "l2", "qk_activation": "silu", "num_hidden_layers": 24},
    "kda": {"attn_mode": "chunk", "hidden_size": 2048, "expand_v": 1.0, "use_short_conv": True,
            "allow_neg_eigval": False, "safe_gate": False, "lower_bound": None, "conv_size": 4,
            "head_dim": 128, "num_heads": 16, "num_v_heads": None, "num_hidden_layers": 24},
    "retnet": {"attn_mode": "chunk", "hidden_size": 2048, "expand_k": 1.0, "expand_v": 2.0,
               "hidden_ratio": 2, "num_hidden_layers": 24, "num_heads": 8,
               "num_kv_heads": None, "feature_map": None, "use_short_conv": False,
               "conv_size": 4, "use_output_gate": True, "elementwise_affine": True},
    "linear_attn": {"attn_mode": "fused_chunk", "hidden_size": 2048, "expand_k": 1.0,
                    "expand_v": 1.0, "num_hidden_layers": 24, "num_heads": 4,
                    "num_kv_heads": None, "feature_map": "elementwise_product",
                    "tie_feature_map_qk": False, "norm_q": False, "norm_k": False,
                    "norm_feature_map": False, "elementwise_affine": True},
    "hgrn2": {"hidden_size": 2048, "num_hidden_layers": 24, "attn_mode": "chunk",
              "num_heads": None, "expand_ratio": 128, "use_short_conv": False, "conv_size": 4,
              "use_lower_bound": True, "elementwise_affine": True},
}

# fla's KDA config has no fuse_linear_cross_entropy
_NOT_IN = {"kda": ("fuse_linear_cross_entropy",)}


def parse_attn(attn: Any, num_hidden_layers: int) -> Any:
    """fla's ``attn`` (a dict, or a list of dicts, or None) checked and completed with fla's
    defaults (num_kv_heads = num_heads, qkv_bias False, window_size None, rope_theta 10000)."""
    if attn is None:
        return None
    if not isinstance(attn, (dict, list)):
        raise ValueError(f"attn: expected None, a dict or a list of dicts, got {attn!r}")
    specs, taken = [], set()
    for spec in [attn] if isinstance(attn, dict) else attn:
        if not isinstance(spec, dict):
            raise ValueError(f"attn: each specification must be a dict, got {spec!r}")
        spec = dict(spec)
        for name in ("layers", "num_heads"):
            if name not in spec:
                raise ValueError(f"attn: field {name!r} is required")
        layers = spec["layers"]
        if not isinstance(layers, (list, tuple)) or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in layers):
            raise ValueError(f"attn: 'layers' must be a list of layer indices, got {layers!r}")
        for i in layers:
            if not 0 <= i < num_hidden_layers or i in taken:
                raise ValueError(f"attn: layer {i} is out of range [0, {num_hidden_layers}) or "
                                 "given twice")
            taken.add(i)
        spec["layers"] = list(layers)
        if spec.get("num_kv_heads") is None:
            spec["num_kv_heads"] = spec["num_heads"]
        for name in ("num_heads", "num_kv_heads"):
            value = spec[name]
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"attn: {name!r} must be a positive integer, got {value!r}")
        spec.setdefault("qkv_bias", False)
        spec.setdefault("window_size", None)
        window = spec["window_size"]
        if window is not None and (isinstance(window, bool) or not isinstance(window, int)
                                   or window <= 0):
            raise ValueError(f"attn: 'window_size' must be a positive integer, got {window!r}")
        spec.setdefault("rope_theta", 10000.0)
        theta = spec["rope_theta"]
        if isinstance(theta, bool) or not isinstance(theta, (int, float)) or \
                not math.isfinite(theta) or theta <= 0:
            raise ValueError(f"attn: 'rope_theta' must be positive and finite, got {theta!r}")
        specs.append(spec)
    return specs[0] if isinstance(attn, dict) else specs


def attn_spec(config: PreTrainedConfig, layer_idx: int) -> dict | None:
    """The softmax-attention specification of layer ``layer_idx``, or None (the family's
    mixer)."""
    attn = config.attn
    for spec in [attn] if isinstance(attn, dict) else attn or ():
        if layer_idx in spec["layers"]:
            return spec
    return None


class FLAConfig(PreTrainedConfig):
    """One of fla's model configs (subclasses set ``model_type``)."""

    model_type = ""
    keys_to_ignore_at_inference: ClassVar[list[str]] = ["past_key_values"]

    def __init__(self, pad_token_id: int | None = None, bos_token_id: int = 1,
                 eos_token_id: int = 2, tie_word_embeddings: bool = False, **kwargs) -> None:
        fields = {**{k: v for k, v in COMMON.items()
                     if k not in _NOT_IN.get(self.model_type, ())},
                  **FIELDS[self.model_type]}
        for name, default in fields.items():
            setattr(self, name, copy.deepcopy(kwargs.pop(name, default)))
        self.attn = parse_attn(self.attn, self.num_hidden_layers)
        if self.fuse_cross_entropy and getattr(self, "fuse_linear_cross_entropy", False):
            raise ValueError("fuse_cross_entropy: cannot be True with fuse_linear_cross_entropy "
                             "(as fla)")
        if self.attnres_block_size is not None:
            raise ValueError("attnres_block_size: fla's attention residuals are not supported "
                             "by linattn.fla_models")
        if self.model_type == "hgrn2":  # fla derives one of the two from the other
            if self.expand_ratio is None and self.num_heads is not None:
                self.expand_ratio = self.hidden_size // self.num_heads
            elif self.expand_ratio is not None and self.num_heads is None:
                self.num_heads = self.hidden_size // self.expand_ratio
            elif self.expand_ratio is None:
                raise ValueError("expand_ratio: one of expand_ratio and num_heads must be given")
        if self.model_type == "kda" and self.safe_gate and self.lower_bound is None:
            raise ValueError("lower_bound: must be given with safe_gate=True (as fla; -5 is "
                             "fla's recommendation)")
        if self.model_type == "gated_deltanet" and self.output_gate_activation not in (
                "swish", "silu", "sigmoid"):
            raise ValueError(f"output_gate_activation: expected swish, silu or sigmoid, got "
                             f"{self.output_gate_activation!r}")
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
        # transformers 5 keeps the special tokens in the generation config; fla's models read
        # them from the model config (the embeddings' padding_idx), so they are set here
        self.pad_token_id, self.bos_token_id = pad_token_id, bos_token_id
        self.eos_token_id = eos_token_id

    def __init_subclass__(cls, **kwargs) -> None:
        # every family has this __init__: set before transformers' hook, which would otherwise
        # generate one per class
        cls.__init__ = FLAConfig.__init__
        super().__init_subclass__(**kwargs)


class GLAConfig(FLAConfig):
    model_type = "gla"


class GatedDeltaNetConfig(FLAConfig):
    model_type = "gated_deltanet"


class DeltaNetConfig(FLAConfig):
    model_type = "delta_net"


class KDAConfig(FLAConfig):
    model_type = "kda"


class RetNetConfig(FLAConfig):
    model_type = "retnet"


class LinearAttentionConfig(FLAConfig):
    model_type = "linear_attn"


class HGRN2Config(FLAConfig):
    model_type = "hgrn2"


CONFIGS: dict[str, type[FLAConfig]] = {c.model_type: c for c in (
    GLAConfig, GatedDeltaNetConfig, DeltaNetConfig, KDAConfig, RetNetConfig,
    LinearAttentionConfig, HGRN2Config)}
