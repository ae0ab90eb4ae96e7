"""linattn.fla against flash-linear-attention's own pure-PyTorch ``naive`` references.

Optional: runs only where the ``fla-core`` package (and ``einops``) can be found, else skips.
fla's package ``__init__`` imports Triton kernels, so ``import fla`` fails on a machine without
Triton; the ``naive.py`` files import only torch and einops, so they are loaded here by file
path without running the package. A cheap install (about 1.2 MB, no Triton, no CUDA)::

    python -m pip install --no-deps --target /tmp/fla_pkgs fla-core==0.6.0 einops
    PYTHONPATH=/tmp/fla_pkgs python -m pytest tests/test_fla_oracle.py

The references compute in float32 whatever the input dtype, so the tolerances are float32's.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import pathlib

import pytest
import torch
import torch.nn.functional as F

from linattn import fla

pytestmark = pytest.mark.usefixtures("single_thread")

INSTALL = ("pip install --no-deps --target DIR fla-core==0.6.0 einops, "
           "then PYTHONPATH=DIR")


@pytest.fixture(scope="module")
def naive():
    """``naive(name)``: fla/ops/<name>/naive.py loaded by path (fla's __init__ is not run)."""
    if importlib.util.find_spec("einops") is None:
        pytest.skip(f"fla oracle: einops not installed ({INSTALL})")
    spec = importlib.machinery.PathFinder.find_spec("fla")
    roots = list(spec.submodule_search_locations or []) if spec else []
    root = next((pathlib.Path(r) for r in roots
                 if (pathlib.Path(r) / "ops" / "gated_delta_rule" / "naive.py").is_file()), None)
    if root is None:
        pytest.skip(f"fla oracle: fla-core not installed ({INSTALL})")
    cache = {}

    def load(name):
        if name not in cache:
            path = root / "ops" / name / "naive.py"
            s = importlib.util.spec_from_file_location(f"_fla_naive_{name}", path)
            mod = importlib.util.module_from_spec(s)
            s.loader.exec_module(mod)
            cache[name] = mod
        return cache[name]

    return load


def close(actual, expected, tol=2e-5):
    """float32-level agreement, absolute at the size of the expected values."""
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert torch.isfinite(actual).all()
    scale = max(expected.abs().max().item(), 1.0) if expected.numel() else 1.0
    torch.testing.assert_close(actual.double(), expected.double(), rtol=0, atol=tol * scale)


def make(B=2, T=37, H=3, K=8, V=6, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def r(*s):
        return torch.randn(*s, generator=gen, dtype=torch.float64)

    x = {
        "q": r(B, T, H, K), "k": F.normalize(r(B, T, H, K), dim=-1), "v": r(B, T, H, V),
        "g": F.logsigmoid(r(B, T, H) + 1), "gk": F.logsigmoid(r(B, T, H, K) + 1),
        "beta": torch.sigmoid(r(B, T, H)), "bv": torch.sigmoid(r(B, T, H, V)),
        "h0": r(B, H, K, V),
    }
    return {n: t.to(dtype) for n, t in x.items()}


def hf(x):
    return x.transpose(1, 2)


DTYPES = [torch.float64, torch.float32]


@pytest.mark.parametrize("dtype", DTYPES)
def test_simple_gla(naive, dtype):
    x = make(dtype=dtype)
    q, k, v, g, h0 = x["q"], x["k"], x["v"], x["g"], x["h0"]
    ref = naive("simple_gla")
    o_r, S_r = ref.naive_recurrent_simple_gla(q, k, v, g, scale=0.4, initial_state=h0,
                                              output_final_state=True)
    o_c, S_c = ref.naive_chunk_simple_gla(q, k, v, g, initial_state=h0.float(),
                                          output_final_state=True, chunk_size=16, scale=0.4)
    for fn in (fla.chunk_simple_gla, fla.fused_recurrent_simple_gla, fla.fused_chunk_simple_gla):
        o, S = fn(q, k, v, g, scale=0.4, initial_state=h0, output_final_state=True)
        close(o, o_r)
        close(S, S_r)
        close(o, o_c)
        close(S, S_c)
    o, A = fla.parallel_simple_gla(q, k, v, g, output_attentions=True)
    o_p, A_p = ref.naive_parallel_simple_gla(q, k, v, g)
    close(o, o_p)
    close(A, A_p)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gla(naive, dtype):
    x = make(dtype=dtype)
    q, k, v, gk, h0 = x["q"], x["k"], x["v"], x["gk"], x["h0"]
    o_r, S_r = naive("gla").naive_recurrent_gla(q, k, v, gk, initial_state=h0,
                                                output_final_state=True)
    for o, S in (fla.chunk_gla(q, k, v, gk, initial_state=h0, output_final_state=True),
                 fla.fused_recurrent_gla(q, k, v, gk, initial_state=h0, output_final_state=True)):
        close(o, o_r)
        close(S, S_r)


@pytest.mark.parametrize("dtype", DTYPES)
def test_delta_rule(naive, dtype):
    x = make(dtype=dtype)
    q, k, v, beta, h0 = x["q"], x["k"], x["v"], x["beta"], x["h0"]
    ref = naive("delta_rule")  # head-first (B, H, T, ·)
    o_r, S_r = ref.delta_rule_recurrence(hf(q), hf(k), hf(v), hf(beta), initial_state=h0)
    for o, S in (fla.chunk_delta_rule(q, k, v, beta, initial_state=h0, output_final_state=True),
                 fla.fused_recurrent_delta_rule(q, k, v, beta, initial_state=h0,
                                                output_final_state=True)):
        close(o, hf(o_r))
        close(S, S_r)
    # per-value beta (B, T, H, V)
    o_r, S_r = ref.delta_rule_recurrence(hf(q), hf(k), hf(v), hf(x["bv"]), initial_state=h0)
    o, S = fla.fused_recurrent_delta_rule(q, k, v, x["bv"], initial_state=h0,
                                          output_final_state=True)
    close(o, hf(o_r))
    close(S, S_r)
    # the chunkwise reference: T a multiple of its chunk, zero initial state
    x = make(T=64, dtype=dtype, seed=1)
    o_c, S_c = ref.delta_rule_chunkwise(*(hf(x[n]).float() for n in ("q", "k", "v", "beta")))
    o, S = fla.chunk_delta_rule(x["q"], x["k"], x["v"], x["beta"], output_final_state=True)
    close(o, hf(o_c))
    close(S, S_c)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gated_delta_rule(naive, dtype):
    x = make(dtype=dtype)
    q, k, v, g, beta, h0 = x["q"], x["k"], x["v"], x["g"], x["beta"], x["h0"]
    ref = naive("gated_delta_rule")
    o_r, S_r = ref.naive_recurrent_gated_delta_rule(q, k, v, beta, g, scale=0.3,
                                                    initial_state=h0, output_final_state=True)
    o_c, S_c = ref.naive_chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=16, scale=0.3,
                                                initial_state=h0, output_final_state=True)
    for o, S in (
        fla.chunk_gated_delta_rule(q, k, v, g, beta, scale=0.3, initial_state=h0,
                                   output_final_state=True),
        fla.fused_recurrent_gated_delta_rule(q, k, v, g, None, None, beta, 0.3, h0, True),
    ):
        close(o, o_r)
        close(S, S_r)
        close(o, o_c)
        close(S, S_c)


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_attn(naive, dtype):
    x = make(T=64, dtype=dtype)
    q, k, v, h0 = x["q"], x["k"], x["v"], x["h0"]
    ref = naive("linear_attn")
    # (the reference mixes its float32 state with the initial state's dtype: give it float32)
    o_r, S_r = ref.naive_recurrent_linear_attn(q, k, v, initial_state=h0.float(),
                                               output_final_state=True)
    o, S = fla.fused_recurrent_linear_attn(q, k, v, initial_state=h0, output_final_state=True)
    close(o, o_r)
    close(S, S_r)
    close(fla.chunk_linear_attn(q, k, v, normalize=False)[0],
          ref.naive_chunk_linear_attn(q.float(), k.float(), v.float()))
    # normalize=True: positive q, k keep the denominators away from 0
    qp, kp = q.abs(), k.abs()
    z0 = kp[:, :3].sum(1, keepdim=True)
    o_r, (S_r, z_r) = ref.naive_recurrent_linear_attn(qp, kp, v, initial_state=(h0.float(), z0),
                                                      output_final_state=True, normalize=True)
    o, (S, z) = fla.fused_recurrent_linear_attn(qp, kp, v, initial_state=(h0, z0),
                                                output_final_state=True, normalize=True)
    close(o, o_r)
    close(S, S_r)
    close(z, z_r)
    close(fla.chunk_linear_attn(qp, kp, v)[0],
          ref.naive_chunk_linear_attn(qp.float(), kp.float(), v.float(), normalize=True))


@pytest.mark.parametrize("dtype", DTYPES)
def test_retention(naive, dtype):
    x = make(H=4, dtype=dtype)
    q, k, v = x["q"], x["k"], x["v"]
    o_r = naive("retention").naive_retention(hf(q), hf(k), hf(v))
    for fn in (fla.chunk_retention, fla.fused_recurrent_retention, fla.fused_chunk_retention,
               fla.parallel_retention):
        close(fn(q, k, v)[0], hf(o_r))


def test_packed_sequences_against_reference(naive):
    """cu_seqlens: each packed sequence equals the reference run on it alone."""
    lengths = [5, 17, 1, 9]
    x = make(B=1, T=sum(lengths), dtype=torch.float64, seed=2)
    h0 = torch.randn(len(lengths), 3, 8, 6, dtype=torch.float64,
                     generator=torch.Generator().manual_seed(5))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    q, k, v, g, beta = x["q"], x["k"], x["v"], x["g"], x["beta"]
    o, S = fla.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0,
                                      output_final_state=True, cu_seqlens=cu)
    o2, S2 = fla.chunk_simple_gla(q, k, v, g, initial_state=h0, output_final_state=True,
                                  cu_seqlens=cu)
    gdn, sgla = naive("gated_delta_rule"), naive("simple_gla")
    for n, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)):
        sl = slice(a, b)
        o_r, S_r = gdn.naive_recurrent_gated_delta_rule(
            q[:, sl], k[:, sl], v[:, sl], beta[:, sl], g[:, sl], initial_state=h0[n:n + 1],
            output_final_state=True)
        close(o[:, sl], o_r)
        close(S[n:n + 1], S_r)
        o_r, S_r = sgla.naive_recurrent_simple_gla(q[:, sl], k[:, sl], v[:, sl], g[:, sl],
                                                   initial_state=h0[n:n + 1],
                                                   output_final_state=True)
        close(o2[:, sl], o_r)
        close(S2[n:n + 1], S_r)


@pytest.mark.parametrize("gate_scale", [0.0, 5.0, 40.0])
def test_strong_decays(naive, gate_scale):
    """Gates from none to near-resets (log decays down to about −40 per token): the chunked
    forms agree with the recurrent references."""
    x = make(T=70, seed=3)
    q, k, v, h0, beta = x["q"], x["k"], x["v"], x["h0"], x["beta"]
    g = x["g"] * gate_scale
    o, S = fla.chunk_simple_gla(q, k, v, g, initial_state=h0, output_final_state=True)
    o_r, S_r = naive("simple_gla").naive_recurrent_simple_gla(q, k, v, g, initial_state=h0,
                                                              output_final_state=True)
    close(o, o_r)
    close(S, S_r)
    o, S = fla.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    o_r, S_r = naive("gated_delta_rule").naive_recurrent_gated_delta_rule(
        q, k, v, beta, g, initial_state=h0, output_final_state=True)
    close(o, o_r)
    close(S, S_r)
    o, S = fla.chunk_gla(q, k, v, x["gk"] * gate_scale, initial_state=h0, output_final_state=True)
    o_r, S_r = naive("gla").naive_recurrent_gla(q, k, v, x["gk"] * gate_scale, initial_state=h0,
                                                output_final_state=True)
    close(o, o_r)
    close(S, S_r)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("G", [1, 2])
def test_kda(naive, dtype, G):
    """Kimi Delta Attention (per-key gates), with grouped value heads (HV = G·H), against fla's
    naive recurrent and chunked KDA; then the gate computed in the kernel."""
    x = make(T=32, dtype=dtype, seed=3)
    gen = torch.Generator().manual_seed(4)
    B, T, H, K = x["q"].shape
    HV, V = G * H, 6
    v = torch.randn(B, T, HV, V, generator=gen, dtype=torch.float64).to(dtype)
    gk = F.logsigmoid(torch.randn(B, T, HV, K, generator=gen, dtype=torch.float64) + 1).to(dtype)
    beta = torch.sigmoid(torch.randn(B, T, HV, generator=gen, dtype=torch.float64)).to(dtype)
    h0 = torch.randn(B, HV, K, V, generator=gen, dtype=torch.float64)
    q, k = x["q"], x["k"]
    ref = naive("kda")
    o_r, S_r = ref.naive_recurrent_kda(q, k, v, gk, beta, initial_state=h0.float(),
                                       output_final_state=True)
    o_c, S_c = ref.naive_chunk_kda(q, k, v, gk, beta, initial_state=h0.float(),
                                   output_final_state=True, chunk_size=16)
    for fn in (fla.chunk_kda, fla.fused_recurrent_kda):
        o, S = fn(q, k, v, gk, beta, initial_state=h0, output_final_state=True)
        close(o, o_r)
        close(S, S_r)
        close(o, o_c)
        close(S, S_c)
    # use_gate_in_kernel: fla's naive gate, then the same recurrence
    raw = torch.randn(B, T, HV, K, generator=gen, dtype=torch.float64).to(dtype)
    A_log = torch.randn(HV, generator=gen, dtype=torch.float64) * 0.5
    dt_bias = torch.randn(HV * K, generator=gen, dtype=torch.float64)
    # fla's naive_kda_gate lives in gate.py, which imports Triton: its formula, written out
    gk2 = -A_log.exp().view(HV, 1) * F.softplus(raw.double() + dt_bias.view(HV, K))
    o_r, S_r = ref.naive_recurrent_kda(q, k, v, gk2.to(dtype), beta, initial_state=h0.float(),
                                       output_final_state=True)
    o, S = fla.chunk_kda(q, k, v, raw, beta, initial_state=h0, output_final_state=True,
                         use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias)
    close(o, o_r)
    close(S, S_r)
