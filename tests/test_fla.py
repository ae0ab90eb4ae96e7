"""linattn.fla: fla's names, signatures, layout and return convention over linattn's ops, and
the front doors at one token per sequence (the last section).

The signatures are fla-core 0.6.0's (fla-org/flash-linear-attention), hard-coded here; see
tests/test_fla_oracle.py for the comparison against fla's own pure-PyTorch references."""

from __future__ import annotations

import inspect
import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import linattn
from linattn import fla
from linattn.ops import dispatch
from linattn.ops.delta import native as delta_native
from linattn.ops.delta import op as delta_op
from linattn.ops.delta.op import delta_rule
from linattn.ops.gated import fla as gated_fla
from linattn.ops.gated import native as gated_native
from linattn.ops.gated.op import gated_linear_attention
from linattn.ops.reference import delta_rule as reference
from linattn.ops.reference import gated_linear_attention as gla_reference

pytestmark = pytest.mark.usefixtures("single_thread")

_ = inspect.Parameter.empty
KW = "**"  # marks the VAR_KEYWORD parameter

STATE = ("scale", None), ("initial_state", None), ("output_final_state", False)
QKV = ("q", _), ("k", _), ("v", _)

#: fla-core 0.6.0: (name, default) in order; ("kwargs", KW) for **kwargs. All parameters are
#: positional-or-keyword in fla (none keyword-only).
FLA_SIGNATURES = {
    "chunk_simple_gla": [*QKV, ("g", None), ("g_gamma", None), *STATE, ("state_v_first", False),
                         ("cu_seqlens", None), ("cu_seqlens_cpu", None), ("kwargs", KW)],
    "fused_recurrent_simple_gla": [*QKV, ("g", None), ("g_gamma", None), *STATE,
                                   ("reverse", False), ("state_v_first", False),
                                   ("cu_seqlens", None), ("kwargs", KW)],
    "fused_chunk_simple_gla": [*QKV, ("g", None), ("g_gamma", None), *STATE,
                               ("cu_seqlens", None)],
    "parallel_simple_gla": [*QKV, ("g", None), ("scale", None), ("output_attentions", False),
                            ("cu_seqlens", None), ("cu_seqlens_cpu", None)],
    "chunk_gla": [*QKV, ("g", _), *STATE, ("state_v_first", False), ("cu_seqlens", None),
                  ("cu_seqlens_cpu", None)],
    "fused_recurrent_gla": [*QKV, ("gk", None), ("gv", None), *STATE, ("reverse", False),
                            ("state_v_first", False), ("cu_seqlens", None), ("kwargs", KW)],
    "fused_chunk_gla": [("kwargs", KW)],
    "chunk_retention": [*QKV, *STATE, ("cu_seqlens", None), ("kwargs", KW)],
    "fused_recurrent_retention": [*QKV, *STATE, ("reverse", False), ("state_v_first", False),
                                  ("cu_seqlens", None), ("kwargs", KW)],
    "fused_chunk_retention": [*QKV, *STATE, ("cu_seqlens", None)],
    "parallel_retention": [*QKV, ("scale", None), ("output_attentions", False),
                           ("cu_seqlens", None)],
    "chunk_linear_attn": [*QKV, *STATE, ("normalize", True), ("cu_seqlens", None)],
    "fused_chunk_linear_attn": [*QKV, *STATE, ("normalize", True), ("cu_seqlens", None)],
    "fused_recurrent_linear_attn": [*QKV, *STATE, ("reverse", False), ("normalize", False),
                                    ("cu_seqlens", None)],
    "chunk_delta_rule": [*QKV, ("beta", _), *STATE, ("use_qk_l2norm_in_kernel", False),
                         ("cu_seqlens", None), ("cu_seqlens_cpu", None), ("kwargs", KW)],
    "fused_recurrent_delta_rule": [*QKV, ("beta", None), *STATE,
                                   ("use_qk_l2norm_in_kernel", False), ("cu_seqlens", None)],
    "fused_chunk_delta_rule": [("kwargs", KW)],
    "parallel_delta_rule": [*QKV, ("beta", _), ("scale", None), ("output_attentions", False)],
    "chunk_gated_delta_rule": [
        *QKV, ("g", _), ("beta", _), *STATE, ("use_qk_l2norm_in_kernel", False),
        ("use_beta_sigmoid_in_kernel", False), ("allow_neg_eigval", False),
        ("state_v_first", False), ("cu_seqlens", None), ("cu_seqlens_cpu", None),
        ("chunk_indices", None), ("cp_context", None), ("kwargs", KW)],
    "fused_recurrent_gated_delta_rule": [
        *QKV, ("g", None), ("gk", None), ("gv", None), ("beta", None), *STATE,
        ("use_qk_l2norm_in_kernel", False), ("use_gate_in_kernel", False), ("A_log", None),
        ("dt_bias", None), ("use_beta_sigmoid_in_kernel", False), ("allow_neg_eigval", False),
        ("state_v_first", False), ("cu_seqlens", None), ("kwargs", KW)],
}
FLA_SIGNATURES["chunk_kda"] = [
    *QKV, ("g", _), ("beta", _), *STATE, ("use_qk_l2norm_in_kernel", False),
    ("use_gate_in_kernel", False), ("use_beta_sigmoid_in_kernel", False),
    ("allow_neg_eigval", False), ("safe_gate", False), ("lower_bound", None),
    ("disable_recompute", False), ("return_intermediate_states", False),
    ("state_v_first", False), ("cu_seqlens", None), ("cu_seqlens_cpu", None),
    ("cp_context", None), ("use_graph", False), ("max_num_seqs", None), ("kwargs", KW)]
FLA_SIGNATURES["fused_recurrent_kda"] = [
    *QKV, ("g", _), ("beta", _), ("A_log", None), ("dt_bias", None), *STATE,
    ("use_qk_l2norm_in_kernel", False), ("use_gate_in_kernel", False),
    ("use_beta_sigmoid_in_kernel", False), ("allow_neg_eigval", False), ("lower_bound", None),
    ("state_v_first", False), ("cu_seqlens", None), ("kwargs", KW)]
FLA_SIGNATURES["chunk_gdn"] = FLA_SIGNATURES["chunk_gated_delta_rule"]
FLA_SIGNATURES["fused_recurrent_gdn"] = FLA_SIGNATURES["fused_recurrent_gated_delta_rule"]
#: The layers' other kernels that linattn.fla gathers (ops/conv/fla.py, ops/norm/fla.py): the
#: causal-conv1d package's two functions (which ignore unknown keywords, as the package does)
#: and fla.modules' gated RMSNorm. Their inputs are not q, k, v: tests/ops/conv/test_fla.py and
#: tests/ops/norm/test_fla.py test them; the attention tests below leave them out.
NOT_ATTENTION = {
    "causal_conv1d_fn": [("x", _), ("weight", _), ("bias", None), ("seq_idx", None),
                         ("initial_states", None), ("return_final_states", False),
                         ("final_states_out", None), ("activation", None), ("kwargs", KW)],
    "causal_conv1d_update": [("x", _), ("conv_state", _), ("weight", _), ("bias", None),
                             ("activation", None), ("cache_seqlens", None),
                             ("conv_state_indices", None), ("kwargs", KW)],
    "rms_norm_gated": [("x", _), ("g", _), ("weight", _), ("bias", _), ("activation", "swish"),
                       ("residual", None), ("prenorm", False), ("residual_in_fp32", False),
                       ("eps", 1e-6), ("kwargs", KW)],
}
FLA_SIGNATURES.update(NOT_ATTENTION)
#: fla's attention functions: what the tests of q, k, v below run
ATTENTION = sorted(set(fla.__all__) - set(NOT_ATTENTION))


@pytest.mark.parametrize("name", sorted(FLA_SIGNATURES))
def test_signature_matches_fla(name):
    """fla's parameters in fla's order with fla's defaults, and **kwargs last in every function
    (also where fla has none: head_first= is then the documented ValueError everywhere)."""
    params = list(inspect.signature(getattr(fla, name)).parameters.values())
    got = [(p.name, KW if p.kind is p.VAR_KEYWORD else p.default) for p in params]
    want = FLA_SIGNATURES[name]
    assert got == (want if want[-1] == ("kwargs", KW) else [*want, ("kwargs", KW)])
    kinds = {p.kind for p in params if p.kind is not p.VAR_KEYWORD}
    assert kinds <= {inspect.Parameter.POSITIONAL_OR_KEYWORD}
    assert getattr(fla, name).__doc__


def test_exports():
    assert sorted(fla.__all__) == sorted(FLA_SIGNATURES)
    assert "linattn.fla import chunk_gated_delta_rule" in fla.__doc__


# ----------------------------------------------------------------------------- inputs


def make(B=2, T=11, H=2, K=4, V=3, *, HV=None, dtype=torch.float64, seed=0):
    """fla-layout q, k (unit norm), v, scalar gate g, per-key gk, per-value gv, beta, h0."""
    gen = torch.Generator().manual_seed(seed)
    HV = H if HV is None else HV

    def r(*s):
        return torch.randn(*s, generator=gen, dtype=torch.float64)

    x = {
        "q": r(B, T, H, K), "k": F.normalize(r(B, T, H, K), dim=-1), "v": r(B, T, HV, V),
        "g": F.logsigmoid(r(B, T, HV) + 2), "gk": F.logsigmoid(r(B, T, HV, K) + 2),
        "gv": F.logsigmoid(r(B, T, HV, V) + 2), "beta": torch.sigmoid(r(B, T, HV)),
        "h0": r(B, HV, K, V),
    }
    return {n: t.to(dtype) for n, t in x.items()}


def hf(x):
    return x.transpose(1, 2)


# ----------------------------------------------------------------------------- layout


def test_layout_simple_gla_equals_head_first_op(assert_close):
    x = make()
    o, S = fla.chunk_simple_gla(x["q"], x["k"], x["v"], x["g"], initial_state=x["h0"],
                                output_final_state=True, scale=0.3)
    o2, S2 = gated_linear_attention(hf(x["q"]), hf(x["k"]), hf(x["v"]), g=hf(x["g"]),
                                    scale=0.3, initial_state=x["h0"], return_state=True)
    assert o.shape == (2, 11, 2, 3) and S.shape == (2, 2, 4, 3)
    assert_close(o, hf(o2))
    assert_close(S, S2)


def test_layout_gla_equals_head_first_op(assert_close):
    x = make()
    o, S = fla.chunk_gla(x["q"], x["k"], x["v"], x["gk"], None, x["h0"], True)
    o2, S2 = gated_linear_attention(hf(x["q"]), hf(x["k"]), hf(x["v"]), gk=hf(x["gk"]),
                                    initial_state=x["h0"], return_state=True)
    assert_close(o, hf(o2))
    assert_close(S, S2)


def test_layout_delta_rules_equal_head_first_op(assert_close):
    x = make()
    o, S = fla.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                      initial_state=x["h0"], output_final_state=True)
    o2, S2 = delta_rule(hf(x["q"]), hf(x["k"]), hf(x["v"]), hf(x["beta"]), hf(x["g"]),
                        initial_state=x["h0"], return_state=True)
    assert_close(o, hf(o2))
    assert_close(S, S2)
    o, S = fla.chunk_delta_rule(x["q"], x["k"], x["v"], x["beta"], output_final_state=True,
                                use_qk_l2norm_in_kernel=True)
    o2, S2 = delta_rule(hf(x["q"]), hf(x["k"]), hf(x["v"]), hf(x["beta"]), return_state=True,
                        qk_l2norm=True)
    assert_close(o, hf(o2))
    assert_close(S, S2)


def test_variants_agree(assert_close):
    """chunk_*, fused_chunk_*, fused_recurrent_* and parallel_* of one op: one function."""
    x = make()
    q, k, v, g = x["q"], x["k"], x["v"], x["g"]
    ref = fla.chunk_simple_gla(q, k, v, g)[0]
    for f in (fla.fused_recurrent_simple_gla, fla.fused_chunk_simple_gla, fla.parallel_simple_gla):
        assert_close(f(q, k, v, g)[0], ref)
    ref = fla.chunk_retention(q, k, v)[0]
    for f in (fla.fused_recurrent_retention, fla.fused_chunk_retention, fla.parallel_retention):
        assert_close(f(q, k, v)[0], ref)
    assert_close(fla.fused_recurrent_gla(q, k, v, x["gk"])[0], fla.chunk_gla(q, k, v, x["gk"])[0])
    ref = fla.chunk_delta_rule(q, k, v, x["beta"])[0]
    assert_close(fla.fused_recurrent_delta_rule(q, k, v, x["beta"])[0], ref)
    assert_close(fla.parallel_delta_rule(q, k, v, x["beta"])[0], ref)
    ref = fla.chunk_gated_delta_rule(q, k, v, g, x["beta"])[0]
    assert_close(fla.fused_recurrent_gated_delta_rule(q, k, v, g, beta=x["beta"])[0], ref)
    assert fla.chunk_gdn is fla.chunk_gated_delta_rule
    assert fla.fused_recurrent_gdn is fla.fused_recurrent_gated_delta_rule
    a = fla.chunk_linear_attn(q, k, v, normalize=False)[0]
    assert_close(fla.fused_recurrent_linear_attn(q, k, v)[0], a)
    assert_close(fla.chunk_simple_gla(q, k, v)[0], a)


def test_retention_decay_and_g_gamma(assert_close):
    x = make(H=3)
    q, k, v = x["q"], x["k"], x["v"]
    gamma = torch.log(1 - 2.0 ** (-5.0 - torch.arange(3, dtype=torch.float64)))
    o = fla.chunk_retention(q, k, v)[0]
    assert_close(o, fla.chunk_simple_gla(q, k, v, g_gamma=gamma)[0])
    assert_close(o, fla.chunk_simple_gla(q, k, v, gamma.expand(2, 11, 3))[0])
    both = fla.fused_recurrent_simple_gla(q, k, v, x["g"], gamma)[0]  # both given: they add
    assert_close(both, fla.chunk_simple_gla(q, k, v, x["g"] + gamma)[0])


def test_parallel_attentions(assert_close):
    x = make()
    q, k, v, g = x["q"], x["k"], x["v"], x["g"]
    o, A = fla.parallel_simple_gla(q, k, v, g, output_attentions=True)
    assert A.shape == (2, 2, 11, 11)
    assert_close(o, hf(A @ hf(v)))
    assert (A.triu(1) == 0).all()
    o, A = fla.parallel_retention(q, k, v, scale=0.7, output_attentions=True)
    assert_close(o, hf(A @ hf(v)))
    assert fla.parallel_simple_gla(q, k, v, g)[1] is None


# ----------------------------------------------------------------------------- varlen


def packed_case(seed=1, lengths=(3, 0, 6, 4), H=2, K=4, V=3, HV=None):
    x = make(B=1, T=sum(lengths), H=H, K=K, V=V, HV=HV, seed=seed)
    N = len(lengths)
    HV = H if HV is None else HV
    x["h0"] = torch.randn(N, HV, K, V, generator=torch.Generator().manual_seed(seed),
                          dtype=torch.float64)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    return x, cu


CASES = {
    # name: (fn, per-token argument names, extra keyword arguments)
    "chunk_simple_gla": (fla.chunk_simple_gla, ("q", "k", "v", "g"), {}),
    "fused_recurrent_simple_gla": (fla.fused_recurrent_simple_gla, ("q", "k", "v", "g"), {}),
    "chunk_gla": (fla.chunk_gla, ("q", "k", "v", "gk"), {}),
    "fused_recurrent_gla_gv": (fla.fused_recurrent_gla, ("q", "k", "v", "gk", "gv"), {}),
    "chunk_retention": (fla.chunk_retention, ("q", "k", "v"), {}),
    "fused_recurrent_linear_attn": (fla.fused_recurrent_linear_attn, ("q", "k", "v"), {}),
    "chunk_delta_rule": (fla.chunk_delta_rule, ("q", "k", "v", "beta"), {}),
    "chunk_gated_delta_rule": (fla.chunk_gated_delta_rule, ("q", "k", "v", "g", "beta"), {}),
    "fused_recurrent_gated_delta_rule_gk_gv": (
        fla.fused_recurrent_gated_delta_rule, ("q", "k", "v", "g", "gk", "gv", "beta"), {}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_cu_seqlens_equals_separate_calls(case, assert_close):
    fn, names, kw = CASES[case]
    lengths = (3, 0, 6, 4)
    x, cu = packed_case(lengths=lengths)
    o, S = fn(*(x[n] for n in names), initial_state=x["h0"], output_final_state=True,
              cu_seqlens=cu, **kw)
    assert o.shape == x["v"].shape and S.shape == x["h0"].shape
    for n, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)):
        o_n, S_n = fn(*(x[m][:, a:b] for m in names), initial_state=x["h0"][n:n + 1],
                      output_final_state=True, **kw)
        assert_close(o[:, a:b], o_n)
        assert_close(S[n:n + 1], S_n)
    assert_close(S[1], x["h0"][1])  # the empty sequence keeps its initial state


def test_cu_seqlens_normalized_linear_attn(assert_close):
    x, cu = packed_case(lengths=(4, 0, 5))
    q, k, v = x["q"].abs(), x["k"].abs(), x["v"]
    z0 = torch.rand(3, 1, 2, 4, dtype=torch.float64)
    for reverse in (False, True):
        o, (S, z) = fla.fused_recurrent_linear_attn(
            q, k, v, initial_state=(x["h0"], z0), output_final_state=True, reverse=reverse,
            normalize=True, cu_seqlens=cu)
        assert z.shape == (3, 1, 2, 4)
        for n, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)):
            o_n, (S_n, z_n) = fla.fused_recurrent_linear_attn(
                q[:, a:b], k[:, a:b], v[:, a:b], initial_state=(x["h0"][n:n + 1], z0[n:n + 1]),
                output_final_state=True, reverse=reverse, normalize=True)
            assert_close(o[:, a:b], o_n)
            assert_close(S[n:n + 1], S_n)
            assert_close(z[n:n + 1], z_n)


def test_normalize_formula(assert_close):
    x = make()
    q, k, v = x["q"].abs(), x["k"].abs(), x["v"]
    raw = fla.chunk_linear_attn(q, k, v, scale=0.5, normalize=False)[0]
    o, (S, z) = fla.chunk_linear_attn(q, k, v, scale=0.5, output_final_state=True)
    den = (0.5 * q * k.cumsum(1)).sum(-1, keepdim=True) + 1e-10
    assert_close(o, raw / den)
    assert_close(z, k.sum(1, keepdim=True))
    assert fla.chunk_linear_attn(q, k, v)[1] is None
    assert_close(fla.fused_chunk_linear_attn(q, k, v)[0], o)


# ----------------------------------------------------------------------------- reverse


@pytest.mark.parametrize("fn,names", [
    (fla.fused_recurrent_simple_gla, ("q", "k", "v", "g")),
    (fla.fused_recurrent_gla, ("q", "k", "v", "gk", "gv")),
    (fla.fused_recurrent_retention, ("q", "k", "v")),
    (fla.fused_recurrent_linear_attn, ("q", "k", "v")),
])
def test_reverse_is_the_time_flip(fn, names, assert_close):
    x = make()
    o, S = fn(*(x[n] for n in names), initial_state=x["h0"], output_final_state=True,
              reverse=True)
    o2, S2 = fn(*(x[n].flip(1) for n in names), initial_state=x["h0"], output_final_state=True)
    assert_close(o, o2.flip(1))
    assert_close(S, S2)
    x, cu = packed_case(lengths=(5, 2, 0, 4))
    o, S = fn(*(x[n] for n in names), initial_state=x["h0"], output_final_state=True,
              reverse=True, cu_seqlens=cu)
    for i, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)):
        o_n, S_n = fn(*(x[n][:, a:b] for n in names), initial_state=x["h0"][i:i + 1],
                      output_final_state=True, reverse=True)
        assert_close(o[:, a:b], o_n)
        assert_close(S[i:i + 1], S_n)


def test_reverse_normalized_key_sum(assert_close):
    x = make()
    q, k, v = x["q"].abs(), x["k"].abs(), x["v"]
    o, (S, z) = fla.fused_recurrent_linear_attn(q, k, v, output_final_state=True, reverse=True,
                                                normalize=True)
    raw = fla.fused_recurrent_linear_attn(q, k, v, reverse=True)[0]
    kc = k.flip(1).cumsum(1).flip(1)
    assert_close(o, raw / ((q * 0.5 * kc).sum(-1, keepdim=True) + 1e-10))
    assert_close(z, kc[:, :1])


# ----------------------------------------------------------------------------- states


@pytest.mark.parametrize("case", sorted(CASES))
def test_state_round_trip(case, assert_close):
    """Two calls, the second from the first's final state, equal one call."""
    fn, names, kw = CASES[case]
    x = make(T=13)
    full, S = fn(*(x[n] for n in names), initial_state=x["h0"], output_final_state=True, **kw)
    o1, S1 = fn(*(x[n][:, :6] for n in names), initial_state=x["h0"], output_final_state=True,
                **kw)
    o2, S2 = fn(*(x[n][:, 6:] for n in names), initial_state=S1, output_final_state=True, **kw)
    assert_close(torch.cat([o1, o2], dim=1), full)
    assert_close(S2, S)
    assert fn(*(x[n] for n in names), **kw)[1] is None


def test_state_v_first(assert_close):
    x = make()
    q, k, v, g = x["q"], x["k"], x["v"], x["g"]
    o, S = fla.chunk_simple_gla(q, k, v, g, initial_state=x["h0"], output_final_state=True)
    o2, S2 = fla.chunk_simple_gla(q, k, v, g, initial_state=x["h0"].transpose(-1, -2),
                                  output_final_state=True, state_v_first=True)
    assert_close(o2, o)
    assert_close(S2, S.transpose(-1, -2))
    with pytest.warns(DeprecationWarning, match="state_v_first"):
        o3, S3 = fla.fused_recurrent_gated_delta_rule(
            q, k, v, g, beta=x["beta"], initial_state=x["h0"].transpose(-1, -2),
            output_final_state=True, transpose_state_layout=True)
    o4, S4 = fla.chunk_gated_delta_rule(q, k, v, g, x["beta"], initial_state=x["h0"],
                                        output_final_state=True)
    assert_close(o3, o4)
    assert_close(S3, S4.transpose(-1, -2))


# ----------------------------------------------------------------------------- delta extras


def test_gva_repeats_query_heads(assert_close):
    x = make(H=2, HV=4)
    q, k = x["q"], x["k"]
    o, S = fla.chunk_gated_delta_rule(q, k, x["v"], x["g"], x["beta"], output_final_state=True)
    assert o.shape == (2, 11, 4, 3) and S.shape == (2, 4, 4, 3)
    q2, k2 = q.repeat_interleave(2, dim=2), k.repeat_interleave(2, dim=2)
    o2, S2 = fla.chunk_gated_delta_rule(q2, k2, x["v"], x["g"], x["beta"],
                                        output_final_state=True)
    assert_close(o, o2)
    assert_close(S, S2)
    o3 = fla.fused_recurrent_gated_delta_rule(q, k, x["v"], x["g"], beta=x["beta"])[0]
    assert_close(o3, o)


def test_gate_and_beta_in_kernel(assert_close):
    x = make()
    gen = torch.Generator().manual_seed(3)
    raw = torch.randn(2, 11, 2, generator=gen, dtype=torch.float64)
    A_log = torch.randn(2, generator=gen, dtype=torch.float64)
    dt_bias = torch.randn(2, generator=gen, dtype=torch.float64)
    logits = torch.randn(2, 11, 2, generator=gen, dtype=torch.float64)
    g = -A_log.exp() * F.softplus(raw + dt_bias)
    want = fla.chunk_gated_delta_rule(x["q"], x["k"], x["v"], g, 2 * torch.sigmoid(logits))[0]
    got = fla.chunk_gated_delta_rule(x["q"], x["k"], x["v"], raw, logits,
                                     use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True,
                                     use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias)[0]
    assert_close(got, want)
    got = fla.fused_recurrent_gated_delta_rule(
        x["q"], x["k"], x["v"], raw, beta=logits, use_gate_in_kernel=True, A_log=A_log,
        dt_bias=dt_bias, use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True)[0]
    assert_close(got, want)


def test_per_value_beta_columns(assert_close):
    """beta (B, T, H, V): each value column is a delta rule with its own scalar beta."""
    x = make()
    gen = torch.Generator().manual_seed(4)
    bv = torch.rand(2, 11, 2, 3, generator=gen, dtype=torch.float64)
    o, S = fla.fused_recurrent_delta_rule(x["q"], x["k"], x["v"], bv, initial_state=x["h0"],
                                          output_final_state=True)
    for j in range(3):
        o_j, S_j = fla.chunk_delta_rule(x["q"], x["k"], x["v"][..., j:j + 1], bv[..., j],
                                        initial_state=x["h0"][..., j:j + 1],
                                        output_final_state=True)
        assert_close(o[..., j:j + 1], o_j)
        assert_close(S[..., j:j + 1], S_j)


def test_default_beta_is_one(assert_close):
    x = make()
    ones = torch.ones(2, 11, 2, dtype=torch.float64)
    assert_close(fla.fused_recurrent_delta_rule(x["q"], x["k"], x["v"])[0],
                 fla.chunk_delta_rule(x["q"], x["k"], x["v"], ones)[0])


# ----------------------------------------------------------------------------- dtypes


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_dtypes(dtype):
    x = make(dtype=dtype)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    for o, S in (
        fla.chunk_simple_gla(x["q"], x["k"], x["v"], x["g"], output_final_state=True),
        fla.fused_recurrent_gla(x["q"], x["k"], x["v"], x["gk"], x["gv"],
                                output_final_state=True),
        fla.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                   initial_state=x["h0"].float(), output_final_state=True),
    ):
        assert o.dtype == dtype and S.dtype == acc
        assert torch.isfinite(o).all() and torch.isfinite(S).all()


def test_empty_sequence():
    x = make(T=0)
    o, S = fla.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                      initial_state=x["h0"], output_final_state=True)
    assert o.shape == (2, 0, 2, 3)
    assert torch.equal(S, x["h0"])


# ----------------------------------------------------------------------------- errors


def test_errors_name_the_argument():
    x = make()
    q, k, v, g, beta = x["q"], x["k"], x["v"], x["g"], x["beta"]
    cases = [
        (lambda: fla.chunk_simple_gla(q, k[:, :5], v), ValueError, "k:"),
        (lambda: fla.chunk_simple_gla(q, k, v[:, :, :1]), ValueError, "v:"),
        (lambda: fla.chunk_simple_gla(hf(q), k, v), ValueError, "k:"),
        (lambda: fla.chunk_simple_gla(q[0], k, v), ValueError, "q:"),
        (lambda: fla.chunk_simple_gla(q, k, v, -g), ValueError, "g:"),
        (lambda: fla.chunk_simple_gla(q, k, v, hf(g)), ValueError, "g:"),
        (lambda: fla.chunk_simple_gla(q, k, v, g_gamma=torch.zeros(3)), ValueError, "g_gamma:"),
        (lambda: fla.chunk_gla(q, k, v, g), ValueError, "g:"),
        (lambda: fla.fused_recurrent_gla(q, k, v, gv=x["gk"]), ValueError, "gv:"),
        (lambda: fla.chunk_simple_gla(q, k, v, initial_state=x["h0"][:1]), ValueError,
         "initial_state:"),
        (lambda: fla.chunk_simple_gla(q, k, v, cu_seqlens=torch.tensor([0, 11])), ValueError,
         "cu_seqlens:"),
        (lambda: fla.chunk_simple_gla(q[:1], k[:1], v[:1], cu_seqlens=torch.tensor([0, 5])),
         ValueError, "cu_seqlens:"),
        (lambda: fla.chunk_simple_gla(q, k, v, scale=float("nan")), ValueError, "scale:"),
        (lambda: fla.fused_recurrent_delta_rule(q, k, v, scale=-1.0), ValueError, "scale:"),
        (lambda: fla.chunk_delta_rule(q, k, v, beta[..., None].expand(2, 11, 2, 3)), ValueError,
         "beta:"),
        (lambda: fla.chunk_gated_delta_rule(q, k, v, g, beta, allow_neg_eigval=True),
         ValueError, "allow_neg_eigval:"),
        (lambda: fla.chunk_gated_delta_rule(q, k, v, g, beta, use_gate_in_kernel=True),
         ValueError, "A_log:"),
        (lambda: fla.chunk_gated_delta_rule(q, k, torch.cat([v] * 3, 2)[:, :, :3], g, beta),
         ValueError, "v:"),
        (lambda: fla.chunk_simple_gla(q, k, v, head_first=False), ValueError, "head_first:"),
        (lambda: fla.chunk_linear_attn(q, k, v, initial_state=(x["h0"], None), normalize=False),
         ValueError, "initial_state:"),
        (lambda: fla.parallel_simple_gla(q[:1], k[:1], v[:1], output_attentions=True,
                                         cu_seqlens=torch.tensor([0, 11])),
         ValueError, "output_attentions:"),
        (lambda: fla.chunk_simple_gla(q, k, v.long()), TypeError, "v:"),
        # a nan parameter of the gate is named, not blamed on g (issue 51)
        (lambda: fla.chunk_gated_delta_rule(q, k, v, g, beta, use_gate_in_kernel=True,
                                            A_log=torch.full((2,), float("nan"))),
         ValueError, "A_log:"),
        (lambda: fla.chunk_gated_delta_rule(q, k, v, g, beta, use_gate_in_kernel=True,
                                            A_log=torch.zeros(2),
                                            dt_bias=torch.tensor([0.0, float("inf")])),
         ValueError, "dt_bias:"),
        (lambda: fla.chunk_kda(q, k, v, x["gk"], beta, use_gate_in_kernel=True,
                               lower_bound=0.5), ValueError, "lower_bound:"),
        (lambda: fla.chunk_kda(q, k, v, x["gk"], beta, use_gate_in_kernel=True,
                               safe_gate=True, A_log=torch.zeros(2)), ValueError, "lower_bound:"),
        (lambda: fla.chunk_kda(q, k, v, x["gk"], beta, return_intermediate_states=True),
         NotImplementedError, "return_intermediate_states"),
        (lambda: fla.chunk_kda(q, k, v, x["gk"], beta, use_gate_in_kernel=True,
                               A_log=torch.zeros(2), dt_bias=torch.zeros(3)),
         ValueError, "dt_bias:"),
        (lambda: fla.chunk_gated_delta_rule(q, k, v, g, beta, cp_context=object()),
         NotImplementedError, "cp_context"),
        (lambda: fla.parallel_delta_rule(q, k, v, beta, output_attentions=True),
         NotImplementedError, "output_attentions"),
        (lambda: fla.fused_chunk_gla(q=q), NotImplementedError, "chunk_gla"),
        (lambda: fla.fused_chunk_delta_rule(q=q), NotImplementedError, "chunk_delta_rule"),
    ]
    for i, (call, exc, name) in enumerate(cases):
        with pytest.raises(exc) as info:
            call()
        msg = str(info.value)
        assert name in msg, (i, msg)
        assert "\n" not in msg, (i, msg)


def test_chunk_size_keyword_changes_nothing(assert_close):
    x = make(T=20)
    a = fla.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"])[0]
    b = fla.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], chunk_size=4)[0]
    assert_close(a, b)
    a = fla.chunk_simple_gla(x["q"], x["k"], x["v"], x["g"])[0]
    assert_close(fla.chunk_simple_gla(x["q"], x["k"], x["v"], x["g"], chunk_size=8)[0], a)


def test_minus_infinity_gate_is_a_reset(assert_close):
    """A log decay of −∞ forgets everything before it (no nan), also in the attention matrix."""
    x = make()
    q, k, v, g = x["q"], x["k"], x["v"], x["g"].clone()
    g[:, 5] = float("-inf")
    o, A = fla.parallel_simple_gla(q, k, v, g, output_attentions=True)
    assert torch.isfinite(A).all() and (A[:, :, 5:, :5] == 0).all()
    o2 = fla.chunk_simple_gla(q[:, 5:], k[:, 5:], v[:, 5:], g[:, 5:].clamp_min(-1e30))[0]
    assert_close(o[:, 5:], o2)
    o3 = fla.chunk_gated_delta_rule(q, k, v, g, x["beta"], initial_state=x["h0"])[0]
    o4 = fla.chunk_gated_delta_rule(q[:, 5:], k[:, 5:], v[:, 5:], g[:, 5:].clamp_min(-1e30),
                                    x["beta"][:, 5:])[0]
    assert_close(o3[:, 5:], o4)


# ----------------------------------------------------------------------------- issue 24

DEPRECATED = {"fused_chunk_gla", "fused_chunk_delta_rule"}  # raise NotImplementedError (as fla)


#: the functions whose ``g`` is fla's per-key gate (B, T, H, K)
PER_KEY_G = {("chunk_gla", "g"), ("chunk_kda", "g"), ("fused_recurrent_kda", "g")}


def required(name: str, x: dict) -> dict:
    """The required arguments of fla function ``name`` from make()'s tensors, by keyword."""
    args = {}
    for p in inspect.signature(getattr(fla, name)).parameters.values():
        if p.default is p.empty and p.kind is not p.VAR_KEYWORD:
            args[p.name] = x["gk"] if (name, p.name) in PER_KEY_G else x[p.name]
    return args


def takes(name: str, param: str) -> bool:
    return param in inspect.signature(getattr(fla, name)).parameters


@pytest.mark.parametrize("name", ATTENTION)
def test_every_function_refuses_head_first_and_ignores_unknown_keywords(name):
    """``head_first=`` is the documented ValueError everywhere (ignoring it would read
    (B, H, T, ...) as (B, T, H, ...)); other unknown keywords are ignored, as fla ignores
    them: transformers' layers pass their own (``use_cache``, ``position_ids``) through."""
    x = make(T=3)
    fn = getattr(fla, name)
    for value in (False, True):
        with pytest.raises(ValueError, match=r"^head_first: removed \(in fla too\)"):
            fn(**required(name, x), head_first=value)
    if name in DEPRECATED:
        with pytest.raises(NotImplementedError):
            fn(**required(name, x), bogus=1)
        return
    o, S = fn(**required(name, x))
    assert o.shape[:2] == (2, 3)
    o2, S2 = fn(**required(name, x), bogus=1, use_cache=True, position_ids=None)
    torch.testing.assert_close(o2, o, rtol=0, atol=0)  # the same call, in the same process


BETA_FUNCTIONS = ["chunk_delta_rule", "fused_recurrent_delta_rule", "parallel_delta_rule",
                  "chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"]


@pytest.mark.parametrize("name", BETA_FUNCTIONS)
@pytest.mark.parametrize("bad", [float("inf"), -float("inf"), float("nan")])
def test_non_finite_beta_is_refused(name, bad):
    """β = ±inf gave all-nan outputs (only nan was refused)."""
    x = make(T=5)
    beta = x["beta"].clone()
    beta[0, 2, 1] = bad
    args = {**required(name, x), "beta": beta}
    with pytest.raises(ValueError, match=r"^beta: expected finite values, got [^\n]+$"):
        getattr(fla, name)(**args)
    if takes(name, "per_value_beta") or name.startswith("fused_recurrent"):
        wide = beta[..., None].expand(*beta.shape, 3).clone()
        with pytest.raises(ValueError, match=r"^beta: expected finite values"):
            getattr(fla, name)(**{**args, "beta": wide})


@pytest.mark.parametrize("name", ["chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"])
def test_infinite_beta_logits_are_saturated_sigmoids(name):
    """With ``use_beta_sigmoid_in_kernel`` beta holds logits: ±inf are sigmoid 1 and 0, valid;
    nan is still refused."""
    x = make(T=5)
    logits = torch.randn(2, 5, 2, dtype=torch.float64)
    logits[0, 1, 0], logits[1, 3, 1] = float("inf"), -float("inf")
    fn = getattr(fla, name)
    args = {**required(name, x), "use_beta_sigmoid_in_kernel": True}
    o, _ = fn(**{**args, "beta": logits})
    want, _ = fn(**{**required(name, x), "beta": torch.sigmoid(logits)})
    assert torch.isfinite(o).all()
    torch.testing.assert_close(o, want)
    logits[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"^beta: "):
        fn(**{**args, "beta": logits})


def _t0_cases():
    """(name, extra keyword arguments) for every function with an initial state, with the
    layouts and modes that take other paths (state_v_first, reverse, per-key/value gates,
    per-value beta, the normalised linear attention's (kv, z) tuple)."""
    cases = []
    for name in ATTENTION:
        if name in DEPRECATED or not takes(name, "initial_state"):
            continue
        cases.append((name, {}))
        if takes(name, "state_v_first"):
            cases.append((name, {"state_v_first": True}))
        if takes(name, "reverse"):
            cases.append((name, {"reverse": True}))
        if takes(name, "normalize"):
            cases.append((name, {"normalize": False}))
            cases.append((name, {"normalize": True, "z": True}))
        if takes(name, "gv"):
            cases.append((name, {"gv": True}))
        if name.startswith("fused_recurrent") and takes(name, "beta"):
            cases.append((name, {"wide_beta": True}))
    return cases


@pytest.mark.parametrize("name, extra", _t0_cases(),
                         ids=lambda x: x if isinstance(x, str) else "-".join(x) or "plain")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_empty_sequence_returns_a_new_state(name, extra, dtype):
    """T = 0 with an initial state returns its values in a new tensor, never the argument itself
    (chunk_simple_gla returned h0: updating the result in place changed the caller's h0)."""
    x = make(T=0, dtype=dtype)
    extra = dict(extra)
    args = required(name, x)
    h0 = x["h0"]
    if extra.pop("state_v_first", False):
        args["state_v_first"] = True
        h0 = h0.transpose(-1, -2).contiguous()
    z0 = None
    if extra.pop("z", False):
        z0 = torch.randn(2, 1, 2, 4, dtype=dtype)
        init = (h0, z0)
    else:
        init = h0
    if extra.pop("gv", False):
        args["gv"] = x["gv"]
    if extra.pop("wide_beta", False):
        args["beta"] = x["beta"][..., None].expand(*x["beta"].shape, 3)
    o, S = getattr(fla, name)(**args, **extra, initial_state=init, output_final_state=True)
    assert o.shape == (2, 0, 2, 3)
    if isinstance(S, tuple):  # normalize=True (the default of *chunk_linear_attn): (kv, z)
        S, z = S
        if z0 is None:  # no key sum given: zeros
            assert (z == 0).all()
        else:
            assert z.untyped_storage().data_ptr() != z0.untyped_storage().data_ptr()
            torch.testing.assert_close(z, z0, rtol=0, atol=0)
    assert S.untyped_storage().data_ptr() != h0.untyped_storage().data_ptr()
    torch.testing.assert_close(S, h0, rtol=0, atol=0)


def _scalar_cases():
    """(name, parameter) for every scalar parameter of every function."""
    flags = ("output_final_state", "reverse", "state_v_first", "normalize",
             "use_qk_l2norm_in_kernel", "output_attentions")
    return [(name, p) for name in ATTENTION if name not in DEPRECATED
            for p in ("scale", *flags) if takes(name, p)]


@pytest.mark.parametrize("name, param", _scalar_cases())
def test_numpy_scalars_are_accepted(name, param):
    """np.float32 scales and np.bool_ flags were refused (``scale: expected a finite real
    number or None, got np.float32(0.5)``)."""
    x = make(T=4)
    fn = getattr(fla, name)
    args = required(name, x)
    values = [(np.float32(0.5), 0.5), (np.float64(0.25), 0.25)] if param == "scale" else \
        [(np.True_, True), (np.False_, False)]
    if (name, param) == ("parallel_delta_rule", "output_attentions"):  # True: not supported
        with pytest.raises(NotImplementedError, match="^output_attentions: "):
            fn(**args, output_attentions=np.True_)
        values = values[1:]
    for np_value, value in values:
        got, want = fn(**args, **{param: np_value}), fn(**args, **{param: value})
        for a, b in zip(got, want, strict=True):
            if isinstance(a, tuple):
                for c, d in zip(a, b, strict=True):
                    torch.testing.assert_close(c, d, rtol=0, atol=0)
            elif a is not None:
                torch.testing.assert_close(a, b, rtol=0, atol=0)
            else:
                assert b is None


@pytest.mark.parametrize("name, param", _scalar_cases())
def test_bools_are_not_numbers_and_numbers_are_not_flags(name, param):
    x = make(T=4)
    fn = getattr(fla, name)
    bad = ([True, np.True_, "0.5"] if param == "scale"
           else ["yes", 0.5, None, np.float64(1.0), 0, 1])  # flags are never numbers
    for value in bad:
        with pytest.raises((TypeError, ValueError), match=rf"^{param}: expected [^\n]+$"):
            fn(**required(name, x), **{param: value})


def test_numpy_chunk_size():
    x = make(T=9)
    for name in ("chunk_simple_gla", "chunk_retention", "chunk_delta_rule",
                 "chunk_gated_delta_rule"):
        args = required(name, x)
        want = getattr(fla, name)(**args, chunk_size=4)[0]
        torch.testing.assert_close(getattr(fla, name)(**args, chunk_size=np.int64(4))[0], want,
                                   rtol=0, atol=0)
        with pytest.raises(ValueError, match=r"^chunk_size: expected a positive integer"):
            getattr(fla, name)(**args, chunk_size=np.True_)


# ----------------------------------------------------------------------------- KDA


def test_kda_gate_in_kernel_forms(assert_close):
    """fla's two in-kernel KDA gates: −exp(A_log)·softplus(g + dt_bias), and with lower_bound
    lower_bound·sigmoid(exp(A_log)·(g + dt_bias)) (A_log optional there)."""
    x = make(HV=4)
    q, k, v, beta = x["q"], x["k"], x["v"], x["beta"]
    raw = x["gk"] * 3 + 1  # any real numbers
    A_log = torch.tensor([0.1, -0.2, 0.3, 0.0], dtype=torch.float64)
    dt_bias = torch.linspace(-1, 1, 4 * 4, dtype=torch.float64)
    z = raw + dt_bias.view(4, 4)
    for kw, gk in (
        ({"A_log": A_log, "dt_bias": dt_bias}, -A_log.exp().view(4, 1) * F.softplus(z)),
        ({"A_log": A_log, "dt_bias": dt_bias, "lower_bound": -5.0},
         -5.0 * torch.sigmoid(A_log.exp().view(4, 1) * z)),
        ({"dt_bias": dt_bias.view(4, 4), "lower_bound": -2.0}, -2.0 * torch.sigmoid(z)),
    ):
        o, S = fla.chunk_kda(q, k, v, raw, beta, use_gate_in_kernel=True,
                             output_final_state=True, **kw)
        want, S_want = fla.chunk_kda(q, k, v, gk, beta, output_final_state=True)
        assert_close(o, want)
        assert_close(S, S_want)


def test_kda_decode_continues_the_prefill(assert_close):
    """fused_recurrent_kda one token at a time from chunk_kda's state equals one chunk_kda
    over the whole sequence (with GVA, HV = 2·H)."""
    x = make(T=9, HV=4)
    q, k, v, gk, beta = x["q"], x["k"], x["v"], x["gk"], x["beta"]
    o_all, S_all = fla.chunk_kda(q, k, v, gk, beta, initial_state=x["h0"],
                                 output_final_state=True, use_qk_l2norm_in_kernel=True)
    o, S = fla.chunk_kda(q[:, :5], k[:, :5], v[:, :5], gk[:, :5], beta[:, :5],
                         initial_state=x["h0"], output_final_state=True,
                         use_qk_l2norm_in_kernel=True)
    outs = [o]
    for t in range(5, 9):
        o, S = fla.fused_recurrent_kda(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1],
                                       gk[:, t:t + 1], beta[:, t:t + 1], initial_state=S,
                                       output_final_state=True, use_qk_l2norm_in_kernel=True)
        outs.append(o)
    assert_close(torch.cat(outs, 1), o_all)
    assert_close(S, S_all)


def test_grouped_value_heads_are_not_copied_on_the_compiled_path(monkeypatch):
    """GVA (HV = 2·H) prefill and decode through the front door read q and k in place on the
    compiled path: no repeat_interleave copy (where the compiled kernels load here)."""
    from linattn.ops.delta import native

    if native.unavailable() is not None:
        pytest.skip(f"no compiled kernels here: {native.unavailable()}")
    x = make(T=20, HV=4, V=16, dtype=torch.float32)
    q, k, v, g, beta = x["q"], x["k"], x["v"], x["g"], x["beta"]
    want, S = fla.chunk_gated_delta_rule(*(t.double() for t in (q, k, v, g, beta)),
                                         output_final_state=True)
    want_step, _ = fla.fused_recurrent_gated_delta_rule(
        *(t[:, :1].double() for t in (q, k, v)), g=g[:, :1].double(),
        beta=beta[:, :1].double(), initial_state=S, output_final_state=True)

    def refuse(*args, **kwargs):
        raise AssertionError("q or k was copied per value head")

    monkeypatch.setattr(torch, "repeat_interleave", refuse)
    monkeypatch.setattr(torch.Tensor, "repeat_interleave", refuse)
    with linattn_native():
        o, S32 = fla.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True)
        o_t, _ = fla.fused_recurrent_gated_delta_rule(
            q[:, :1], k[:, :1], v[:, :1], g=g[:, :1], beta=beta[:, :1],
            initial_state=S.float(), output_final_state=True)
    tol = dict(rtol=0, atol=64 * torch.finfo(torch.float32).eps * max(1.0, want.abs().max()))
    torch.testing.assert_close(o.double(), want, **tol)
    torch.testing.assert_close(o_t.double(), want_step, **tol)


def linattn_native():
    from linattn.ops import dispatch

    return dispatch.use(impl="native")


def test_kda_decoding_step_fast_path_matches_float64(assert_close):
    """fused_recurrent_kda's one-token call (the compiled step where it loads) against the
    float64 general path, with GVA."""
    x = make(T=1, HV=4, V=16)
    args = dict(q=x["q"], k=x["k"], v=x["v"], g=x["gk"], beta=x["beta"],
                initial_state=x["h0"][:, :, :, :1].expand(2, 4, 4, 16).contiguous(),
                output_final_state=True, use_qk_l2norm_in_kernel=True)
    want, S_want = fla.fused_recurrent_kda(**args)
    got, S = fla.fused_recurrent_kda(**{n: t.float() if isinstance(t, torch.Tensor) else t
                                        for n, t in args.items()})
    eps = 64 * torch.finfo(torch.float32).eps
    torch.testing.assert_close(got.double(), want, rtol=eps, atol=eps * want.abs().max())
    torch.testing.assert_close(S.double(), S_want, rtol=eps, atol=eps * S_want.abs().max())


def _meta_calls():
    """Every name of linattn.fla with meta-device inputs of the shapes it takes (issue 51
    probe: the gates' value checks called .item() on meta tensors; conv's cu_seqlens and
    seq_idx raised NotImplementedError)."""
    m = {"device": "meta", "dtype": torch.float32}
    B, T, H, K, V = 1, 8, 2, 4, 4
    q = torch.empty(B, T, H, K, **m)
    v = torch.empty(B, T, H, V, **m)
    gh = torch.empty(B, T, H, **m)  # a gate or β per head
    gk = torch.empty(B, T, H, K, **m)  # a gate per key
    gv = torch.empty(B, T, H, V, **m)
    state = torch.empty(B, H, K, V, **m)
    cu = torch.tensor([0, 3, 8], device="meta")
    x, w = torch.empty(1, 4, 8, **m), torch.empty(4, 3, **m)
    st = {"initial_state": state, "output_final_state": True}
    calls = {
        **{n: (q, q, v) for n in ("chunk_linear_attn", "fused_chunk_linear_attn",
                                  "fused_recurrent_linear_attn", "chunk_retention",
                                  "fused_recurrent_retention", "fused_chunk_retention",
                                  "parallel_retention")},
        **{n: (q, q, v, gh) for n in ("chunk_simple_gla", "fused_recurrent_simple_gla",
                                      "fused_chunk_simple_gla", "parallel_simple_gla")},
        "chunk_gla": (q, q, v, gk),
        "fused_recurrent_gla": (q, q, v, gk, gv),
        "fused_chunk_gla": {"q": q, "k": q, "v": v, "g": gk},
        **{n: (q, q, v, gh) for n in ("chunk_delta_rule", "fused_recurrent_delta_rule",
                                      "parallel_delta_rule")},
        "fused_chunk_delta_rule": {"q": q, "k": q, "v": v, "beta": gh},
        **{n: (q, q, v, gh, gh) for n in ("chunk_gated_delta_rule", "chunk_gdn")},
        **{n: {"q": q, "k": q, "v": v, "g": gh, "gk": gk, "beta": gh}
           for n in ("fused_recurrent_gated_delta_rule", "fused_recurrent_gdn")},
        **{n: (q, q, v, gk, gh) for n in ("chunk_kda", "fused_recurrent_kda")},
        "causal_conv1d_fn": (x, w),
        "causal_conv1d_update": (x[..., 0], torch.empty(1, 4, 3, **m), w),
        "rms_norm_gated": (v, v, torch.empty(V, **m), None),
    }
    extra = {
        "causal_conv1d_fn": [{"seq_idx": torch.zeros(1, 8, dtype=torch.int32, device="meta")},
                             {"initial_states": torch.empty(1, 4, 2, **m),
                              "return_final_states": True}],
        "causal_conv1d_update": [{"cache_seqlens": torch.zeros(1, dtype=torch.int32,
                                                               device="meta")}],
        "rms_norm_gated": [{}],
    }
    for name in fla.__all__:
        if name in ("fused_chunk_gla", "fused_chunk_delta_rule"):
            continue  # deprecated: NotImplementedError, as in fla
        args = calls[name]
        args, kw = ((), args) if isinstance(args, dict) else (args, {})
        for more in extra.get(name, [{}, st]):
            if name.startswith("parallel") and "initial_state" in more:
                continue
            yield name, args, {**kw, **more}
    q1, v1 = (t.reshape(1, B * T, H, -1) for t in (q, v))
    for name in ("chunk_gla", "chunk_simple_gla", "chunk_delta_rule"):
        g = gk if name == "chunk_gla" else gh
        yield name, (q1, q1, v1, g.reshape(1, B * T, H, -1).squeeze(-1)
                     if name != "chunk_gla" else g.reshape(1, B * T, H, K)), {"cu_seqlens": cu}


@pytest.mark.parametrize("name, args, kwargs",
                         [pytest.param(*c, id=f"{c[0]}-{i}") for i, c in enumerate(_meta_calls())])
def test_meta_inputs_give_meta_outputs(name, args, kwargs):
    out = getattr(fla, name)(*args, **kwargs)
    outs = out if isinstance(out, tuple) else (out,)
    assert any(isinstance(o, torch.Tensor) for o in outs)
    for o in outs:
        if isinstance(o, torch.Tensor):
            assert o.is_meta, name


def test_meta_indices_with_cpu_inputs_are_named():
    x, w = torch.randn(2, 4, 8), torch.randn(4, 3)
    with pytest.raises(ValueError, match="^seq_idx: .*meta"):
        fla.causal_conv1d_fn(x, w, seq_idx=torch.zeros(2, 8, dtype=torch.int32).to("meta"))
    q = torch.randn(1, 8, 2, 4)
    with pytest.raises(ValueError, match="^cu_seqlens: .*meta"):
        fla.chunk_simple_gla(q, q, q, torch.zeros(1, 8, 2),
                             cu_seqlens=torch.tensor([0, 3, 8], device="meta"))


# issue 51, second probe: use_gate_in_kernel's A_log and dt_bias read their values (finite?)
# with .item(), a RuntimeError for a meta tensor beside CPU inputs, and for an all-meta call
@pytest.mark.parametrize("name", ["fused_recurrent_gated_delta_rule", "chunk_kda"])
@pytest.mark.parametrize("param", ["A_log", "dt_bias"])
def test_meta_gate_parameters_with_cpu_inputs_are_named(name, param):
    B, T, H, K = 1, 5, 2, 4
    q, v, beta = torch.randn(B, T, H, K), torch.randn(B, T, H, K), torch.rand(B, T, H)
    kda = name == "chunk_kda"
    g = torch.randn(B, T, H, K) if kda else torch.randn(B, T, H)
    params = {"A_log": torch.randn(H), "dt_bias": torch.randn(H * K if kda else H)}
    params[param] = params[param].to("meta")
    with pytest.raises(ValueError, match=f"^{param}: .*meta"):
        getattr(fla, name)(q, q, v, g=g, beta=beta, use_gate_in_kernel=True, **params)


@pytest.mark.parametrize("name", ["fused_recurrent_gated_delta_rule", "chunk_kda"])
def test_meta_gate_in_kernel_gives_meta_outputs(name):
    m = {"device": "meta"}
    B, T, H, K = 1, 5, 2, 4
    kda = name == "chunk_kda"
    q, beta = torch.empty(B, T, H, K, **m), torch.empty(B, T, H, **m)
    g = torch.empty(B, T, H, K, **m) if kda else torch.empty(B, T, H, **m)
    o, S = getattr(fla, name)(q, q, q, g=g, beta=beta, use_gate_in_kernel=True,
                              A_log=torch.empty(H, **m),
                              dt_bias=torch.empty(H * K if kda else H, **m),
                              output_final_state=True)
    assert o.is_meta and S.is_meta


# issue 51, second probe: *_linear_attn(normalize=True) with a scale float32 holds (1e38) but
# scale·q does not: NaN where the quotient is an ordinary number (float64's is the reference)
@pytest.mark.parametrize("name", ["chunk_linear_attn", "fused_recurrent_linear_attn"])
@pytest.mark.parametrize("scale", [1e38, -3e38])
def test_normalized_linear_attn_with_a_huge_scale(name, scale):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 19, 2, 8, generator=gen) for _ in range(3))
    k = k.abs()  # positive keys: denominators away from 0
    q = q.abs()
    got, _ = getattr(fla, name)(q, k, v, scale=scale, normalize=True)
    want, _ = getattr(fla, name)(q.double(), k.double(), v.double(), scale=scale,
                                 normalize=True)
    assert got.isfinite().all()
    torch.testing.assert_close(got.double(), want, rtol=0,
                               atol=64 * torch.finfo(torch.float32).eps * want.abs().max())

# ------------------------------------------------------------------------ one token per sequence
# linattn.fla's delta-rule front door at one token per sequence (issue 25): T = 1, or a packed
# batch of one-token sequences (cu_seqlens 0, 1, ..., N), goes to the decoding step
# (:func:`linattn.delta_rule_step`; the plain float32 case straight to the compiled kernel)
# instead of the chunked form, with the same results and the same errors as the general path.
# The ground truth is the float64 sequential reference, :func:`linattn.reference.delta_rule`;
# the lean step itself (``inplace=``, ±inf β) is tested here too.


def skip_unless_takes(impl: str) -> None:
    """Skip when the dispatcher would refuse ``impl`` for a float32 step here (no compiled
    path, or LINATTN_NATIVE=0)."""
    try:
        with dispatch.use(impl=impl):
            dispatch.select("delta_rule", "step", torch.float32, "cpu", False, ("V:16",))
    except ValueError as e:
        pytest.skip(str(e))

B, H, K, V = 2, 3, 8, 16  # V a multiple of 16: the compiled step takes it


def make_step(T=1, dtype=torch.float64, seed=0, batch=B):
    """fla-layout q, k, v (batch, T, H, ·), g, beta (batch, T, H), h0 (batch, H, K, V)."""
    gen = torch.Generator().manual_seed(seed)

    def r(*s):
        return torch.randn(*s, generator=gen, dtype=torch.float64)

    x = {"q": r(batch, T, H, K), "k": F.normalize(r(batch, T, H, K), dim=-1),
         "v": r(batch, T, H, V), "g": F.logsigmoid(r(batch, T, H) + 2),
         "beta": torch.sigmoid(r(batch, T, H)), "h0": r(batch, H, K, V) * 0.5}
    return {n: t.to(dtype) for n, t in x.items()}


def expected(x, *, gated, h0, scale, l2):
    """The reference over head-first views: o (B, T, H, V), final state (B, H, K, V)."""
    def hf(t):
        return None if t is None else t.double().transpose(1, 2)

    o, S = reference(hf(x["q"]), hf(x["k"]), hf(x["v"]), hf(x["beta"]),
                     hf(x["g"]) if gated else None, scale=scale,
                     initial_state=None if h0 is None else h0.double(), qk_l2norm=l2)
    return o.transpose(1, 2), S


def call(gated, x, **kw):
    if gated:
        return fla.fused_recurrent_gated_delta_rule(x["q"], x["k"], x["v"], x["g"],
                                                    beta=x["beta"], **kw)
    return fla.fused_recurrent_delta_rule(x["q"], x["k"], x["v"], x["beta"], **kw)


@pytest.fixture
def no_chunked_form(monkeypatch):
    """The chunked form must not run: a call that reaches it fails."""
    def refuse(*a, **kw):
        raise AssertionError("the chunked delta_rule ran for one-token sequences")

    monkeypatch.setattr(delta_op, "delta_rule", refuse)


STEP_CASES = list(itertools.product(
    [True, False],  # gated
    [False, True],  # initial_state given
    [False, True],  # output_final_state
    [None, 0.3],  # scale
    [False, True],  # use_qk_l2norm_in_kernel
))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("gated, given, final, scale, l2", STEP_CASES)
def test_one_token_equals_reference(no_chunked_form, assert_close, dtype, gated, given, final,
                                    scale, l2):
    x = make_step(dtype=dtype)
    h0 = x["h0"].float() if given and dtype == torch.float32 else x["h0"] if given else None
    o, S = call(gated, x, scale=scale, initial_state=h0, output_final_state=final,
                use_qk_l2norm_in_kernel=l2)
    o_r, S_r = expected(x, gated=gated, h0=h0, scale=scale, l2=l2)
    assert o.shape == (B, 1, H, V) and o.dtype == dtype
    assert_close(o, o_r, ulps=64)
    if not final:
        assert S is None
        return
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    assert S.shape == (B, H, K, V) and S.dtype == acc
    assert_close(S, S_r, ulps=64)
    if given:
        assert S is not h0 and S.data_ptr() != h0.data_ptr()  # a new state, h0 untouched
        assert torch.equal(h0, x["h0"].to(h0.dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_one_token_state_v_first(no_chunked_form, assert_close, dtype):
    x = make_step(dtype=dtype)
    h0 = x["h0"].to(torch.float32 if dtype == torch.float32 else dtype)
    o, S = call(True, x, initial_state=h0.transpose(-1, -2).contiguous(),
                output_final_state=True, state_v_first=True)
    o_r, S_r = expected(x, gated=True, h0=h0, scale=None, l2=False)
    assert_close(o, o_r, ulps=64)
    assert S.shape == (B, H, V, K)
    assert_close(S, S_r.transpose(-1, -2), ulps=64)


@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_packed_one_token_sequences(no_chunked_form, assert_close, gated, dtype):
    """cu_seqlens 0, 1, ..., N over (1, N, H, ·): N decoding steps, one state each."""
    N = 4
    x = make_step(T=N, batch=1, dtype=dtype)
    h0 = make_step(batch=N, dtype=torch.float64)["h0"].to(x["h0"].dtype)
    kw = dict(initial_state=h0, output_final_state=True, cu_seqlens=torch.arange(N + 1))
    o, S = call(gated, x, **kw)
    assert o.shape == (1, N, H, V) and S.shape == (N, H, K, V)
    for n in range(N):  # each token alone, from its own state
        one = {name: t[:, n:n + 1] for name, t in x.items() if name != "h0"}
        o_r, S_r = expected(one, gated=gated, h0=h0[n:n + 1], scale=None, l2=False)
        assert_close(o[:, n:n + 1], o_r, ulps=64)
        assert_close(S[n:n + 1], S_r, ulps=64)


def test_longer_packed_sequences_take_the_chunked_form(assert_close):
    """cu_seqlens with a sequence of two tokens is no batch of steps: the general path, equal."""
    x = make_step(T=3, batch=1)
    h0 = make_step(batch=2)["h0"]
    o, S = call(True, x, initial_state=h0, output_final_state=True,
                cu_seqlens=torch.tensor([0, 1, 3]))
    o2, S2 = call(True, {n: t[:, 1:] for n, t in x.items() if n != "h0"}, initial_state=h0[1:],
                  output_final_state=True)
    assert_close(o[:, 1:], o2)
    assert_close(S[1:], S2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_one_token_errors_name_fla_arguments(dtype):
    """The errors of the general path, with fla's names (not the step's beta_t, g_t)."""
    x = make_step(dtype=dtype)
    h0 = x["h0"].to(torch.float32 if dtype == torch.float32 else dtype)
    for bad in (float("inf"), -float("inf"), float("nan")):
        beta = x["beta"].clone()
        beta[1, 0, 2] = bad
        with pytest.raises(ValueError, match=r"^beta: expected finite values"):
            fla.fused_recurrent_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], beta=beta,
                                                 initial_state=h0)
        with pytest.raises(ValueError, match=r"^beta: expected finite values"):
            fla.fused_recurrent_delta_rule(x["q"], x["k"], x["v"], beta, initial_state=h0)
    for bad in (0.5, float("nan")):
        g = x["g"].clone()
        g[0, 0, 1] = bad
        with pytest.raises(ValueError, match=r"^g: expected log decays <= 0"):
            fla.fused_recurrent_gated_delta_rule(x["q"], x["k"], x["v"], g, beta=x["beta"],
                                                 initial_state=h0)
    with pytest.raises(ValueError, match=r"^scale: "):
        call(False, x, scale=-1.0, initial_state=h0)  # (fused_recurrent_delta_rule: > 0)
    with pytest.raises(ValueError, match=r"^scale: "):
        call(True, x, scale=float("nan"), initial_state=h0)
    with pytest.raises(ValueError, match=r"^initial_state: expected shape"):
        call(True, x, initial_state=h0[:1])
    with pytest.raises(ValueError, match=r"^output_final_state: expected a bool"):
        call(True, x, initial_state=h0, output_final_state="yes")
    with pytest.raises(ValueError, match=r"^v: "):
        call(True, {**x, "v": x["v"][:1]}, initial_state=h0)


def test_float32_front_door_runs_the_compiled_step(monkeypatch, assert_close):
    """The plain float32 token goes straight to the kernel (step_into), nothing else."""
    skip_unless_takes("native")
    seen = []
    real = delta_native.step_into

    def counting(*a, **kw):
        seen.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(delta_native, "step_into", counting)
    x = make_step(dtype=torch.float32)
    with dispatch.use(impl="native"):
        o, S = call(True, x, initial_state=x["h0"], output_final_state=True)
    assert seen == [1]
    o_r, S_r = expected(x, gated=True, h0=x["h0"], scale=None, l2=False)
    assert_close(o, o_r, ulps=64)
    assert_close(S, S_r, ulps=64)


# ------------------------------------------------------------------------- the lean step


def _step_inputs(dtype=torch.float32):
    x = make_step(dtype=dtype)
    return ([x[n][:, 0] for n in ("q", "k", "v", "beta")], x["g"][:, 0],
            x["h0"].to(torch.float64 if dtype == torch.float64 else torch.float32))


@pytest.mark.parametrize("impl", ["auto", "portable", "native"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_step_inplace(assert_close, impl, dtype):
    """inplace=True writes the new state into the given one and returns that object; the
    values are the out-of-place step's."""
    if impl == "native" and dtype == torch.float64:
        pytest.skip("the compiled step takes float32")
    skip_unless_takes(impl)
    (q, k, v, beta), g, S = _step_inputs(dtype)
    with dispatch.use(impl=impl):
        o, S_new = linattn.delta_rule_step(q, k, v, beta, S, g_t=g, qk_l2norm=True)
        S_in = S.clone()
        o2, S2 = linattn.delta_rule_step(q, k, v, beta, S_in, g_t=g, qk_l2norm=True,
                                         inplace=True)
    assert S2 is S_in
    assert_close(o2, o)
    assert_close(S2, S_new)
    assert not torch.equal(S2, S)


def test_step_inplace_needs_a_state_of_the_accumulation_dtype():
    (q, k, v, beta), g, S = _step_inputs()
    with pytest.raises(ValueError, match=r"^state: inplace=True needs a state in torch.float32"):
        linattn.delta_rule_step(q, k, v, beta, None, inplace=True)
    with pytest.raises(ValueError, match=r"^state: inplace=True needs"):
        linattn.delta_rule_step(q, k, v, beta, S.double(), inplace=True)
    with pytest.raises(TypeError, match=r"^inplace: expected a bool"):
        linattn.delta_rule_step(q, k, v, beta, S, inplace=1)


@pytest.mark.parametrize("impl", ["auto", "portable", "native"])
@pytest.mark.parametrize("bad", [float("inf"), -float("inf"), float("nan")])
def test_step_refuses_non_finite_beta_on_every_path(impl, bad):
    """±inf β made the compiled step's output and state inf/nan unchecked (nan was refused by
    the kernel); now every path refuses all three, and an in-place state is left as it was."""
    skip_unless_takes(impl)
    (q, k, v, beta), g, S = _step_inputs()
    beta = beta.clone()
    beta[0, 1] = bad
    S_in = S.clone()
    with dispatch.use(impl=impl), pytest.raises(ValueError, match=r"^beta_t: "):
        linattn.delta_rule_step(q, k, v, beta, S_in, g_t=g, inplace=True)
    assert torch.equal(S_in, S)
    big = torch.full_like(beta, 3e38)  # finite, but its sum overflows: still accepted
    with dispatch.use(impl=impl):
        o, _ = linattn.delta_rule_step(q, k, v, big, S, g_t=g)
    assert o.shape == v.shape


@pytest.mark.parametrize("impl", ["auto", "portable", "native"])
def test_step_refuses_positive_gates_without_writing(impl):
    skip_unless_takes(impl)
    (q, k, v, beta), g, S = _step_inputs()
    g = g.clone()
    g[1, 0] = 0.25
    S_in = S.clone()
    with dispatch.use(impl=impl), pytest.raises(ValueError, match=r"^g_t: "):
        linattn.delta_rule_step(q, k, v, beta, S_in, g_t=g, inplace=True)
    assert torch.equal(S_in, S)


def test_the_beta_check_of_a_step_runs_no_reduction(monkeypatch):
    """fla's β is (B, 1, H): the compiled step's kernel checks it (nan and ±inf refused, before
    anything is written) and a good step runs no tensor reduction in Python (one cost a third of
    a step)."""
    skip_unless_takes("native")
    x = make_step(dtype=torch.float32)
    h0 = x["h0"].clone()
    for bad in (float("nan"), float("inf"), -float("inf")):
        beta = x["beta"].clone()
        beta[1, 0, 2] = bad
        with pytest.raises(ValueError, match=r"beta"):
            call(True, {**x, "beta": beta}, initial_state=h0, output_final_state=True)
        assert torch.equal(h0, x["h0"])

    def no_reduction(*a, **kw):
        raise AssertionError("a tensor reduction ran")

    with monkeypatch.context() as m:
        m.setattr(torch.Tensor, "isfinite", no_reduction)
        m.setattr(torch.Tensor, "isnan", no_reduction)
        o, S = call(True, x, initial_state=h0, output_final_state=True)
    assert o.shape == x["v"].shape and S.shape == h0.shape


# -------------------- GLA at one token
# linattn.fla's GLA front door at one token per sequence (issue 25): T = 1, or a packed batch
# of one-token sequences (cu_seqlens 0, 1, ..., N), goes to the decoding step
# (:func:`linattn.gated_linear_attention_step`) instead of the chunked form, with the results of
# the float64 sequential reference (:func:`linattn.reference.gated_linear_attention`).


def make_gla(dtype, seed=0):
    """fla-layout q, k (B, 1, H, K), v (B, 1, H, V), gates, h0 (B, H, K, V)."""
    gen = torch.Generator().manual_seed(seed)

    def r(*s):
        return torch.randn(*s, generator=gen, dtype=torch.float64)

    x = {"q": r(B, 1, H, K), "k": r(B, 1, H, K), "v": r(B, 1, H, V),
         "g": F.logsigmoid(r(B, 1, H)), "gk": F.logsigmoid(r(B, 1, H, K)),
         "gv": F.logsigmoid(r(B, 1, H, V)), "h0": r(B, H, K, V) * 0.5}
    return {n: t.to(dtype) for n, t in x.items()}


@pytest.fixture
def no_gla_chunked_form(monkeypatch):
    """Fails the test if the chunked form runs: one token must take the step."""
    def refuse(*a, **kw):
        raise AssertionError("the chunked form ran for one token")
    monkeypatch.setattr(gated_fla, "gated_linear_attention", refuse)


def hf64(t):
    return None if t is None else t.double().transpose(1, 2)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("gates,h0,final,svf,packed", list(itertools.product(
    [("gk",), ("gv",), ("gk", "gv")], [False, True], [False, True], [False, True],
    [False, True])))
def test_fused_recurrent_gla_one_token(no_gla_chunked_form, dtype, gates, h0, final, svf,
                                       packed):
    x = make_gla(dtype)
    kw = {g: x[g] for g in gates}
    S0 = x["h0"] if h0 else None
    if packed:  # B one-token sequences packed into one batch row
        args = [x[n].reshape(1, B, H, -1) for n in ("q", "k", "v")]
        kw = {g: t.reshape(1, B, H, -1) for g, t in kw.items()}
        kw["cu_seqlens"] = torch.arange(B + 1)
    else:
        args = [x[n] for n in ("q", "k", "v")]
    init = None if S0 is None else (S0.transpose(-1, -2).contiguous() if svf else S0)
    o, S = fla.fused_recurrent_gla(*args, **kw, scale=0.5, initial_state=init,
                                   output_final_state=final, state_v_first=svf)
    want_o, want_S = gla_reference(hf64(x["q"]), hf64(x["k"]), hf64(x["v"]),
                               gk=hf64(x["gk"]) if "gk" in gates else None,
                               gv=hf64(x["gv"]) if "gv" in gates else None, scale=0.5,
                               initial_state=None if S0 is None else S0.double())
    tol = {"rtol": 64 * torch.finfo(dtype).eps, "atol": 64 * torch.finfo(dtype).eps}
    assert o.dtype == dtype and o.shape == args[2].shape
    torch.testing.assert_close(o.double().reshape(B, 1, H, V), want_o.transpose(1, 2), **tol)
    if not final:
        assert S is None
    else:
        got = S.transpose(-1, -2) if svf else S
        torch.testing.assert_close(got.double(), want_S, **tol)


@pytest.mark.parametrize("name", ["fused_recurrent_simple_gla", "chunk_simple_gla"])
def test_simple_gla_one_token(no_gla_chunked_form, name):
    x = make_gla(torch.float64)
    o, S = getattr(fla, name)(x["q"], x["k"], x["v"], g=x["g"], initial_state=x["h0"],
                              output_final_state=True)
    want_o, want_S = gla_reference(hf64(x["q"]), hf64(x["k"]), hf64(x["v"]), g=hf64(x["g"]),
                               initial_state=x["h0"])
    torch.testing.assert_close(o, want_o.transpose(1, 2))
    torch.testing.assert_close(S, want_S)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name,gate", [("fused_recurrent_gla", "gk"),
                                       ("fused_recurrent_simple_gla", "g")])
def test_a_gla_token_goes_straight_to_the_compiled_step(monkeypatch, no_gla_chunked_form,
                                                        dtype, name, gate):
    """fla's one-token GLA calls with a float32 state take the compiled step as they are (the
    kernel's step_into, no general checks, no step function), in float32 and bfloat16, and
    give the float64 reference's values within the dtype's rounding; a positive gate still
    raises naming fla's argument."""
    skip_unless_takes("native")
    seen = []
    real = gated_native.step_into
    monkeypatch.setattr(gated_native, "step_into", lambda *a: seen.append(1) or real(*a))
    monkeypatch.setattr(gated_fla, "gated_linear_attention_step", None)
    x = make_gla(torch.float64)
    low = {n: x[n].to(dtype) for n in ("q", "k", "v", gate)}
    S0 = x["h0"].float()
    with dispatch.use(impl="native"):
        o, S = getattr(fla, name)(low["q"], low["k"], low["v"], **{gate: low[gate]},
                                  initial_state=S0, output_final_state=True)
    assert seen == [1] and o.dtype == dtype and S.dtype == torch.float32
    want_o, want_S = gla_reference(hf64(low["q"]), hf64(low["k"]), hf64(low["v"]),
                                   **{gate: hf64(low[gate])}, initial_state=S0.double())
    eps32 = torch.finfo(torch.float32).eps
    tol = 2 * torch.finfo(dtype).eps + 64 * eps32  # o's rounding, then float32 sums of K terms
    torch.testing.assert_close(o.double(), want_o.transpose(1, 2), rtol=tol,
                               atol=tol * want_o.abs().max().item())
    torch.testing.assert_close(S.double(), want_S, rtol=64 * eps32, atol=64 * eps32)
    bad = low[gate].clone()
    bad.view(-1)[1] = 0.5
    with pytest.raises(ValueError, match=rf"^{gate}: expected log decays <= 0"):
        getattr(fla, name)(low["q"], low["k"], low["v"], **{gate: bad}, initial_state=S0)


def test_reverse_of_one_token_is_the_token(no_gla_chunked_form):
    x = make_gla(torch.float64)
    fwd = fla.fused_recurrent_gla(x["q"], x["k"], x["v"], gk=x["gk"], initial_state=x["h0"],
                                  output_final_state=True)
    rev = fla.fused_recurrent_gla(x["q"], x["k"], x["v"], gk=x["gk"], initial_state=x["h0"],
                                  output_final_state=True, reverse=True)
    for a, b in zip(fwd, rev, strict=True):
        torch.testing.assert_close(a, b)


def test_two_tokens_still_take_the_chunked_form(monkeypatch):
    calls = []
    real = gated_fla.gated_linear_attention

    def spy(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(gated_fla, "gated_linear_attention", spy)
    x = make_gla(torch.float64)
    q, k, v = (torch.cat([x[n], x[n]], 1) for n in ("q", "k", "v"))
    fla.fused_recurrent_gla(q, k, v, gk=torch.cat([x["gk"], x["gk"]], 1))
    assert calls == [1]


_B, _T, _H, _K, _V = 2, 9, 2, 4, 3
INFERENCE_CALLS = {  # name: (call, arguments); q or x first
    "chunk_simple_gla": (lambda q, k, v, g: fla.chunk_simple_gla(q, k, v, g=g), "qkvg"),
    "chunk_gla": (lambda q, k, v, gk: fla.chunk_gla(q, k, v, g=gk), "qkvG"),
    "fused_recurrent_gla": (lambda q, k, v, gk: fla.fused_recurrent_gla(q, k, v, gk=gk), "qkvG"),
    "chunk_linear_attn": (lambda q, k, v: fla.chunk_linear_attn(q, k, v), "qkv"),
    "chunk_retention": (lambda q, k, v: fla.chunk_retention(q, k, v), "qkv"),
    "chunk_delta_rule": (lambda q, k, v, b: fla.chunk_delta_rule(q, k, v, b), "qnvb"),
    "chunk_gated_delta_rule": (
        lambda q, k, v, g, b: fla.chunk_gated_delta_rule(q, k, v, g, b), "qnvgb"),
    "fused_recurrent_gated_delta_rule": (
        lambda q, k, v, g, b: fla.fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=b),
        "qnvgb"),
    "chunk_kda": (lambda q, k, v, g, b: fla.chunk_kda(q, k, v, g, b), "qnvGb"),
    "fused_recurrent_kda": (lambda q, k, v, g, b: fla.fused_recurrent_kda(q, k, v, g, b),
                            "qnvGb"),
    "causal_conv1d_fn": (lambda x, w: fla.causal_conv1d_fn(x, w, activation="silu"), "xw"),
    "rms_norm_gated": (lambda x, g, w: fla.rms_norm_gated(x, g, w, None), "yyz"),
}


def _fla_argument(kind: str) -> torch.Tensor:
    return {"q": lambda: torch.randn(_B, _T, _H, _K),
            "k": lambda: torch.randn(_B, _T, _H, _K),
            "n": lambda: F.normalize(torch.randn(_B, _T, _H, _K), dim=-1),
            "v": lambda: torch.randn(_B, _T, _H, _V),
            "g": lambda: -torch.rand(_B, _T, _H), "G": lambda: -torch.rand(_B, _T, _H, _K),
            "b": lambda: torch.rand(_B, _T, _H), "x": lambda: torch.randn(_B, 6, _T),
            "w": lambda: torch.randn(6, 4), "y": lambda: torch.randn(_B, _T, 6),
            "z": lambda: torch.randn(6)}[kind]()


@pytest.mark.parametrize("name", list(INFERENCE_CALLS))
def test_inference_tensors_beside_inputs_requiring_grad(name):
    """Each argument made under torch.inference_mode in turn, beside one that requires grad:
    the output and gradient of the same call with normal tensors (issue 51: torch's
    "Inference tensors cannot be saved for backward" from the gated, delta, KDA, conv and
    norm paths)."""
    call, kinds = INFERENCE_CALLS[name]
    torch.manual_seed(0)
    xs = [_fla_argument(c) for c in kinds]

    def run(args, wanted):
        args = [a.detach().requires_grad_() if i == wanted else a for i, a in enumerate(args)]
        out = call(*args)
        out = out[0] if isinstance(out, tuple) else out
        (out.double() * torch.linspace(-1, 1, out.numel(), dtype=torch.float64
                                       ).view(out.shape)).sum().backward()
        return out.detach(), args[wanted].grad

    eps = torch.finfo(torch.float32).eps
    for made in range(len(xs)):
        for wanted in {0, len(xs) - 1} - {made}:
            odd = list(xs)
            with torch.inference_mode():
                odd[made] = xs[made].clone()
            for a, b in zip(run(odd, wanted), run(xs, wanted), strict=True):
                torch.testing.assert_close(a, b, rtol=16 * eps, atol=16 * eps * (1 + b.abs().max()))
