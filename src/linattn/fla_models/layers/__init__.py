"""fla's token mixers with fla's parameter names, computing with linattn's kernels: the GLA
family (gla.py: GLA, RetNet, HGRN2), the delta rules (delta.py), linear and softmax attention
(attention.py); what they share in _common.py.

Each layer mirrors one of fla's (``fla.layers``): the same submodules and parameter shapes (so
a state dict saved by fla loads), the same arithmetic (gates, feature maps, normalisations, the
order of operations), and fla's cache entries (cache.py). What fla chooses per call (``mode``:
chunked, fused recurrent, ...) changes GPU kernels only; here every mode runs the same linattn
functions, which take the decoding step by themselves for one token.

Padding: as fla, ``attention_mask`` is a 0/1 (B, T) matrix (0: padding). A prefill drops the
padded tokens (the sequences are packed, ``cu_seqlens``) and puts zeros back at their places;
a decoding step needs every sequence's new token to be real (left padding, what ``generate``
makes).
"""

from linattn.fla_models.layers._common import Packing
from linattn.fla_models.layers.attention import Attention, LinearAttention
from linattn.fla_models.layers.delta import DeltaNet, GatedDeltaNet, KimiDeltaAttention
from linattn.fla_models.layers.gla import GatedLinearAttention, HGRN2Attention, MultiScaleRetention

__all__ = ["Attention", "DeltaNet", "GatedDeltaNet", "GatedLinearAttention", "HGRN2Attention",
           "KimiDeltaAttention", "LinearAttention", "MultiScaleRetention", "Packing"]
