"""fla's language models (``*Model``, ``*ForCausalLM``) with fla's module tree: embeddings,
pre-norm blocks (``attn_norm``, ``attn``, ``mlp_norm``, ``mlp``), a final ``norm`` and an
``lm_head`` (tied to the embeddings when the config says so). Any layer listed in the config's
``attn`` is fla's softmax attention instead of the family's mixer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from linattn.fla_models import configs as C
from linattn.fla_models import layers as L
from linattn.fla_models.cache import FLACache
from linattn.fla_models.modules import FusedRMSNormGated, GatedMLP, RMSNorm


def _mixer(config: C.FLAConfig, layer_idx: int) -> nn.Module:
    """The token mixer of block ``layer_idx``: fla's arguments from fla's config fields."""
    spec = C.attn_spec(config, layer_idx)
    if spec is not None:
        return L.Attention(config.hidden_size, spec["num_heads"], spec["num_kv_heads"],
                           spec["qkv_bias"], window_size=spec["window_size"],
                           rope_theta=spec["rope_theta"],
                           max_position_embeddings=config.max_position_embeddings,
                           layer_idx=layer_idx)
    c, kind = config, config.model_type
    if kind == "gla":
        if c.use_gv or not c.use_gk:
            raise ValueError("use_gv, use_gk: fla's GLA layer uses per-key gates only "
                             "(use_gk=True, use_gv=False)")
        return L.GatedLinearAttention(
            c.attn_mode, c.hidden_size, c.expand_k, c.expand_v, c.num_heads, c.num_kv_heads,
            c.feature_map, c.use_short_conv, c.conv_size, use_output_gate=c.use_output_gate,
            gate_fn=c.hidden_act, elementwise_affine=c.elementwise_affine, norm_eps=c.norm_eps,
            clamp_min=c.clamp_min, fuse_norm=c.fuse_norm, layer_idx=layer_idx)
    if kind == "retnet":
        return L.MultiScaleRetention(
            c.attn_mode, c.hidden_size, c.expand_k, c.expand_v, c.num_heads, c.num_kv_heads,
            c.feature_map, c.use_short_conv, c.conv_size, use_output_gate=c.use_output_gate,
            gate_fn=c.hidden_act, elementwise_affine=c.elementwise_affine, norm_eps=c.norm_eps,
            fuse_norm=c.fuse_norm, layer_idx=layer_idx)
    if kind == "gated_deltanet":
        return L.GatedDeltaNet(
            c.hidden_size, c.expand_v, c.head_dim, c.num_heads, c.num_v_heads, c.attn_mode,
            c.use_gate, c.use_short_conv, c.allow_neg_eigval, c.conv_size, layer_idx=layer_idx,
            norm_eps=c.norm_eps, output_gate_activation=c.output_gate_activation)
    if kind == "kda":
        return L.KimiDeltaAttention(
            c.hidden_size, c.expand_v, c.head_dim, c.num_heads, c.num_v_heads, c.attn_mode,
            c.use_short_conv, c.allow_neg_eigval, c.safe_gate, c.lower_bound, c.conv_size,
            layer_idx=layer_idx, norm_eps=c.norm_eps)
    if kind == "delta_net":
        return L.DeltaNet(
            c.attn_mode, hidden_size=c.hidden_size, expand_k=c.expand_k, expand_v=c.expand_v,
            num_heads=c.num_heads, use_beta=c.use_beta, use_gate=c.use_gate,
            use_short_conv=c.use_short_conv, conv_size=c.conv_size,
            allow_neg_eigval=c.allow_neg_eigval, layer_idx=layer_idx,
            qk_activation=c.qk_activation, qk_norm=c.qk_norm, norm_eps=c.norm_eps)
    if kind == "linear_attn":
        return L.LinearAttention(
            c.attn_mode, c.hidden_size, c.expand_k, c.expand_v, c.num_heads, c.num_kv_heads,
            c.feature_map, c.tie_feature_map_qk, norm_q=c.norm_q, norm_k=c.norm_k,
            do_feature_map_norm=c.norm_feature_map, elementwise_affine=c.elementwise_affine,
            norm_eps=c.norm_eps, layer_idx=layer_idx)
    if kind == "hgrn2":
        return L.HGRN2Attention(
            c.attn_mode, c.hidden_size, c.num_heads, c.expand_ratio, c.use_short_conv,
            c.conv_size, elementwise_affine=c.elementwise_affine, norm_eps=c.norm_eps,
            layer_idx=layer_idx)
    raise ValueError(f"config: no mixer for model_type {kind!r}")


class FLABlock(nn.Module):
    """fla's pre-norm block: ``x + attn(attn_norm(x))``, then ``+ mlp(mlp_norm(·))``."""

    def __init__(self, config: C.FLAConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.attn_norm = RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.attn = _mixer(config, layer_idx)
        self.mlp_norm = RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.mlp = GatedMLP(config.hidden_size, config.hidden_ratio, config.intermediate_size,
                            config.hidden_act)

    def forward(self, hidden_states: Tensor, attention_mask: Tensor | None,
                past_key_values: FLACache | None, use_cache: bool, **kwargs) -> Tensor:
        h = self.attn(self.attn_norm(hidden_states), attention_mask=attention_mask,
                      past_key_values=past_key_values, use_cache=use_cache, **kwargs)
        h, residual = self.mlp_norm(h, hidden_states, prenorm=True)
        return residual + self.mlp(h)


class FLAPreTrainedModel(PreTrainedModel):
    """What fla's models share: config class, weight initialisation (fla's), cache policy."""

    config_class = C.FLAConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = False
    _no_split_modules = ["FLABlock"]
    _is_stateful = True  # a recurrent state cannot be rolled back (no assisted decoding)
    _input_embed_layer = "embeddings"

    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Conv1d)):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, (RMSNorm, FusedRMSNormGated)) and module.weight is not None:
            nn.init.ones_(module.weight)


class FLAModel(FLAPreTrainedModel):
    """fla's ``*Model``: embeddings, blocks, final norm; returns the hidden states."""

    def __init__(self, config: C.FLAConfig) -> None:
        super().__init__(config)
        self.padding_idx, self.vocab_size = config.pad_token_id, config.vocab_size
        self.embeddings = nn.Embedding(config.vocab_size, config.hidden_size, self.padding_idx)
        if config.model_type == "hgrn2" and config.use_lower_bound:
            self.lower_bounds = nn.Parameter(torch.zeros(config.num_hidden_layers,
                                                         config.hidden_size))
        self.layers = nn.ModuleList([FLABlock(config, i)
                                     for i in range(config.num_hidden_layers)])
        self.norm = RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.post_init()

    def _lower_bounds(self) -> Tensor | None:
        """HGRN2's forget-gate floors per layer: softmax over layers, cumulated, from 0."""
        if not hasattr(self, "lower_bounds"):
            return None
        acc = torch.float64 if self.lower_bounds.dtype == torch.float64 else torch.float32
        bounds = self.lower_bounds.softmax(0, dtype=acc)
        return bounds.cumsum(0) - bounds[0]

    def forward(self, input_ids: Tensor | None = None, attention_mask: Tensor | None = None,
                inputs_embeds: Tensor | None = None, past_key_values: FLACache | None = None,
                use_cache: bool | None = None, output_hidden_states: bool | None = None,
                return_dict: bool | None = None, **kwargs) -> BaseModelOutputWithPast | tuple:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("input_ids: give exactly one of input_ids and inputs_embeds")
        kwargs.pop("output_attentions", None)  # fla's models never return attentions
        for unused in ("position_ids", "cache_position", "logits_to_keep"):
            kwargs.pop(unused, None)
        if kwargs.get("cu_seqlens") is not None:
            raise ValueError("cu_seqlens: packed inputs are not supported by linattn.fla_models; "
                             "pass a padded batch with attention_mask")
        kwargs.pop("cu_seqlens", None)
        use_cache = self.config.use_cache if use_cache is None else use_cache
        output_hidden_states = self.config.output_hidden_states \
            if output_hidden_states is None else output_hidden_states
        return_dict = self.config.return_dict if return_dict is None else return_dict
        hidden = self.embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        if past_key_values is not None and not isinstance(past_key_values, FLACache):
            raise TypeError(f"past_key_values: expected linattn.fla_models' FLACache (what the "
                            f"model returns), got {type(past_key_values).__name__}")
        if use_cache and past_key_values is None:
            past_key_values = FLACache()
        if attention_mask is not None and attention_mask.dim() != 2:
            raise ValueError("attention_mask: expected a 0/1 matrix (batch, length) marking "
                             f"padding with 0 (as fla), got shape {tuple(attention_mask.shape)}")
        if attention_mask is not None and not bool(((attention_mask == 0)
                                                    | (attention_mask == 1)).all()):
            raise ValueError("attention_mask: expected 0 (padding) and 1 (a token) only, as "
                             "fla's models take it")
        if attention_mask is not None and bool(attention_mask.bool().all()):
            attention_mask = None  # nothing padded: fla's unpadding is a no-op then
        bounds = self._lower_bounds()
        all_hidden = () if output_hidden_states else None
        for i, layer in enumerate(self.layers):
            if output_hidden_states:
                all_hidden += (hidden,)
            extra = {} if bounds is None else {"lower_bound": bounds[i]}
            hidden = layer(hidden, attention_mask, past_key_values, use_cache, **extra)
        hidden = self.norm(hidden)
        if output_hidden_states:
            all_hidden += (hidden,)
        cache = past_key_values if use_cache else None
        if not return_dict:
            return tuple(x for x in (hidden, cache, all_hidden) if x is not None)
        return BaseModelOutputWithPast(last_hidden_state=hidden, past_key_values=cache,
                                       hidden_states=all_hidden)


class FLAForCausalLM(FLAPreTrainedModel, GenerationMixin):
    """fla's ``*ForCausalLM``: the model and ``lm_head``; ``generate`` keeps an FLACache."""

    _tied_weights_keys = {"lm_head.weight": "model.embeddings.weight"}  # noqa: RUF012

    def __init__(self, config: C.FLAConfig) -> None:
        super().__init__(config)
        self.model = FLAModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the model makes its own FLACache (per-layer state dicts)

    def get_decoder(self) -> FLAModel:
        return self.model

    def forward(self, input_ids: Tensor | None = None, attention_mask: Tensor | None = None,
                inputs_embeds: Tensor | None = None, past_key_values: FLACache | None = None,
                labels: Tensor | None = None, use_cache: bool | None = None,
                output_hidden_states: bool | None = None, return_dict: bool | None = None,
                logits_to_keep: int | Tensor = 0, **kwargs) -> CausalLMOutputWithPast | tuple:
        return_dict = self.config.return_dict if return_dict is None else return_dict
        out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                         inputs_embeds=inputs_embeds, past_key_values=past_key_values,
                         use_cache=use_cache, output_hidden_states=output_hidden_states,
                         return_dict=True, **kwargs)
        hidden = out.last_hidden_state
        if labels is None and isinstance(logits_to_keep, int) and logits_to_keep > 0:
            hidden = hidden[:, -logits_to_keep:]
        elif labels is None and not isinstance(logits_to_keep, int):
            hidden = hidden[:, logits_to_keep]
        logits = self.lm_head(hidden)
        loss = None
        if labels is not None:
            # fla's shift: position t predicts labels[t + 1]; the last position is ignored
            shifted = torch.cat([labels[..., 1:], torch.full_like(labels[:, :1], -100)], 1)
            loss = F.cross_entropy(logits.float().flatten(0, -2), shifted.flatten(),
                                   ignore_index=-100)
        if not return_dict:
            rest = tuple(x for x in (out.past_key_values, out.hidden_states) if x is not None)
            return ((loss,) if loss is not None else ()) + (logits,) + rest
        return CausalLMOutputWithPast(loss=loss, logits=logits,
                                      past_key_values=out.past_key_values,
                                      hidden_states=out.hidden_states)


def _family(config_cls: type[C.FLAConfig], prefix: str) -> tuple[type, type]:
    """fla's two class names of one family (``GLAModel``, ``GLAForCausalLM``), on the shared
    implementation, with the family's config class (what AutoModel dispatches on)."""
    model = type(f"{prefix}Model", (FLAModel,), {"config_class": config_cls,
                                                 "__module__": __name__})
    causal = type(f"{prefix}ForCausalLM", (FLAForCausalLM,), {"config_class": config_cls,
                                                              "__module__": __name__})
    return model, causal


GLAModel, GLAForCausalLM = _family(C.GLAConfig, "GLA")
GatedDeltaNetModel, GatedDeltaNetForCausalLM = _family(C.GatedDeltaNetConfig, "GatedDeltaNet")
DeltaNetModel, DeltaNetForCausalLM = _family(C.DeltaNetConfig, "DeltaNet")
KDAModel, KDAForCausalLM = _family(C.KDAConfig, "KDA")
RetNetModel, RetNetForCausalLM = _family(C.RetNetConfig, "RetNet")
LinearAttentionModel, LinearAttentionForCausalLM = _family(C.LinearAttentionConfig,
                                                           "LinearAttention")
HGRN2Model, HGRN2ForCausalLM = _family(C.HGRN2Config, "HGRN2")

#: model_type -> (config, model, causal LM) classes
MODELS: dict[str, tuple[type, type, type]] = {
    "gla": (C.GLAConfig, GLAModel, GLAForCausalLM),
    "gated_deltanet": (C.GatedDeltaNetConfig, GatedDeltaNetModel, GatedDeltaNetForCausalLM),
    "delta_net": (C.DeltaNetConfig, DeltaNetModel, DeltaNetForCausalLM),
    "kda": (C.KDAConfig, KDAModel, KDAForCausalLM),
    "retnet": (C.RetNetConfig, RetNetModel, RetNetForCausalLM),
    "linear_attn": (C.LinearAttentionConfig, LinearAttentionModel, LinearAttentionForCausalLM),
    "hgrn2": (C.HGRN2Config, HGRN2Model, HGRN2ForCausalLM),
}
