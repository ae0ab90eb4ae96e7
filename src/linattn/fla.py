r"""flash-linear-attention's front door: fla's function names, signatures and layout, on CPU.

Code written against `fla <https://github.com/fla-org/flash-linear-attention>`_ (``fla-core``
0.6.0) runs on any device torch runs on by changing one import: change
``from fla.ops.gated_delta_rule import chunk_gated_delta_rule`` to
``from linattn.fla import chunk_gated_delta_rule``. Every function takes fla's arguments in fla's
order with fla's names and defaults, tensors in fla's layout

* q, k: (B, T, H, K); v: (B, T, H, V); scalar gates and beta: (B, T, H); per-key gates
  (B, T, H, K); per-value gates (B, T, H, V),

and returns fla's pair ``(o, final_state)``: o (B, T, H, V) in q's dtype, final_state
(N, H, K, V) (N = B, or the number of packed sequences with ``cu_seqlens``) or ``None`` when
``output_final_state=False``. Gates are natural-log decays (the state is multiplied by
``exp(g)``); ``scale=None`` is ``K**-0.5``; no feature map and no normaliser (except
``*_linear_attn(normalize=True)``): ``o_t = S_tᵀ (scale·q_t)``.

The work is done by the head-first ops (B, H, T, ·) of :mod:`linattn.ops.gated`
(:func:`~linattn.ops.gated.gated_linear_attention`, chunked) and :mod:`linattn.ops.delta`
(:func:`~linattn.ops.delta.delta_rule`, chunked); this module only transposes, validates and
maps arguments. fla's ``chunk_*``, ``fused_chunk_*``, ``fused_recurrent_*`` and ``parallel_*``
variants of one op compute the same function (they differ in GPU kernels), and so do the ones
here.

================================== =================================================================
fla function                       here
================================== =================================================================
chunk_simple_gla                   yes (g and/or g_gamma) -> gated_linear_attention(g=...)
fused_recurrent_simple_gla         yes, also ``reverse``
fused_chunk_simple_gla             yes
parallel_simple_gla                yes, ``output_attentions`` without ``cu_seqlens`` (as fla)
chunk_gla                          yes (fla's ``g`` is the per-key gate: gk= here)
fused_recurrent_gla                yes, ``reverse``; ``gv`` runs the step function token by token
fused_chunk_gla                    raises NotImplementedError, as fla (deprecated there)
chunk_retention & co. (4)          yes: g_gamma[h] = log(1 − 2^(−5−h)); ``reverse`` where fla has it
chunk_linear_attn                  yes, ``normalize`` (default True, as fla), (kv, z) state tuples
fused_chunk_linear_attn            yes (normalize default True)
fused_recurrent_linear_attn        yes, ``reverse`` (normalize default False, as fla)
chunk_delta_rule                   yes -> delta_rule; any float dtype (fla: not float32)
fused_recurrent_delta_rule         yes; per-value beta (B, T, H, V) runs token by token
fused_chunk_delta_rule             raises NotImplementedError, as fla (deprecated there)
parallel_delta_rule                o only; ``output_attentions=True`` raises NotImplementedError
chunk_gated_delta_rule / chunk_gdn yes -> delta_rule(g=...); GVA (HV > H); use_gate_in_kernel,
                                   A_log, dt_bias, beta sigmoid, allow_neg_eigval, state_v_first
fused_recurrent_gated_delta_rule   yes, same; ``gk``/``gv``/per-value beta run token by token
 / fused_recurrent_gdn
chunk_kda                          yes -> delta_rule(gk=...) (Kimi Delta Attention); GVA;
                                   use_gate_in_kernel with A_log, dt_bias, lower_bound (safe_gate)
fused_recurrent_kda                yes, same; a decoding step runs delta_rule_step
rms_norm_gated                     fla.modules' gated RMSNorm -> linattn.rms_norm_gated; ``bias``,
                                   ``residual``, ``prenorm``, ``residual_in_fp32``
causal_conv1d_fn                   the causal-conv1d package's (not fla's) -> linattn.causal_conv1d;
                                   x (B, D, T); ``seq_idx``; unknown keywords ignored, as there
causal_conv1d_update               the same package's decoding update, ``conv_state`` in place;
                                   ``cache_seqlens``, ``conv_state_indices``
================================== =================================================================

Not supported: ``cp_context`` (context parallelism: NotImplementedError), ``head_first``
(removed in fla too, which now ignores it: a ValueError here, because ignoring it would read
(B, H, T, ...) inputs as (B, T, H, ...)), KDA's ``return_intermediate_states``
(NotImplementedError), gates > 0 (ValueError: a log-decay must be ≤ 0; fla does not check), β
of nan or ±inf (ValueError; as logits with ``use_beta_sigmoid_in_kernel`` only nan). Every
function takes ``**kwargs`` (fla's signature, plus ``**kwargs`` where fla has none) and ignores
names it does not know, as fla does: transformers' layers pass their own keyword arguments
(``use_cache``, ``position_ids``, ...) through. Scalars: ``scale`` any finite real number
(NumPy's included; bools refused), flags bools (NumPy's included; never numbers).
``chunk_size=`` (where fla takes it) is forwarded as linattn's chunk size, which changes speed
only; ``cu_seqlens_cpu`` and ``chunk_indices`` are accepted and unused (they are GPU
synchronisation hints).

Dtypes: any floating dtype, q, k and v alike (fla's Triton kernels want half precision in some
functions). States are accumulated and returned in float32, or float64 for float64 inputs (fla:
float32 always); ``initial_state`` may have any floating dtype (``chunk_gla`` in fla wants
float32). ``use_qk_l2norm_in_kernel`` is linattn's ``qk_l2norm``, with fla's formula
``x / sqrt(Σx² + 1e-6)``.
"""

from __future__ import annotations

import importlib
import importlib.util

from linattn.ops import OPS

# Each op keeps fla's names for it in its own folder (linattn/ops/<op>/fla.py); this module
# gathers them.
__all__: list[str] = []
for _op in OPS:
    if importlib.util.find_spec(f"linattn.ops.{_op}.fla") is None:
        continue
    _module = importlib.import_module(f"linattn.ops.{_op}.fla")
    for _name in _module.__all__:
        globals()[_name] = getattr(_module, _name)
        __all__.append(_name)
del _op, _module, _name
