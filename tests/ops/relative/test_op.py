"""relative_linear_attention (direct and FFT forms) against the quadratic reference."""

from __future__ import annotations

import pytest
import torch

import linattn
from linattn.ops.relative import op as rel_mod
from linattn.ops.relative.op import fft_size, relative_linear_attention


def _inputs(B=2, H=3, T=7, D=4, Dv=3, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, H, T, D, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(B, H, T, Dv, generator=g, dtype=torch.float64)
    r = torch.randn(H, 2 * T - 1, D, generator=g, dtype=torch.float64)
    return (t.to(dtype) for t in (q, k, v, r))


@pytest.mark.parametrize("method", ["direct", "fft"])
@pytest.mark.parametrize("feature_map", ["elu", "relu"])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("T", [1, 2, 7, 129])
def test_matches_reference(method, feature_map, is_causal, T):
    q, k, v, r = _inputs(T=T)
    got = relative_linear_attention(q, k, v, r, feature_map=feature_map, is_causal=is_causal,
                                    method=method)
    want = linattn.reference.relative_linear_attention(q, k, v, r, feature_map=feature_map,
                                                       is_causal=is_causal)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("method", ["direct", "fft"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_padding_matches_reference_and_ignores_padded_values(method, is_causal):
    q, k, v, r = _inputs(T=11)
    mask = torch.zeros(2, 11, dtype=torch.bool)
    mask[0, 7:] = True
    mask[1, ::3] = True
    got = relative_linear_attention(q, k, v, r, is_causal=is_causal, key_padding_mask=mask,
                                    method=method)
    want = linattn.reference.relative_linear_attention(q, k, v, r, is_causal=is_causal,
                                                       key_padding_mask=mask)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    # whatever sits at padded positions (NaN included) changes nothing
    padded = mask[:, None, :, None]
    k2 = k.masked_fill(padded, float("nan"))
    v2 = v.masked_fill(padded, 1e6)
    again = relative_linear_attention(q, k2, v2, r, is_causal=is_causal, key_padding_mask=mask,
                                      method=method)
    torch.testing.assert_close(again, got, rtol=1e-12, atol=1e-12)


def test_content_term_alone_is_plain_linear_attention():
    """The positional kernel adds weight: with φ(r) → 0 (relu map, r very negative) the
    relative op reduces to linear attention with the shifted ReLU map minus nothing."""
    q, k, v, r = _inputs(T=9)
    r_neg = torch.full_like(r, -50.0)
    # relu map: φ(r) = 1 for r <= 0, so the positional term is Σ_j φ(q_i)·1 v_j (constant lag);
    # compare against the reference built by hand from that identity
    fq = torch.relu(q) + 1
    pos_w = fq.sum(-1, keepdim=True)  # φ(q_i)·1 for every j
    content = (fq @ (torch.relu(k) + 1).transpose(-1, -2))
    sim = content + pos_w
    want = (sim @ v) / sim.sum(-1, keepdim=True)
    got = relative_linear_attention(q, k, v, r_neg, feature_map="relu", method="fft")
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("method", ["direct", "fft"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_gradcheck(method, is_causal):
    q, k, v, r = _inputs(B=1, H=2, T=6, D=3, Dv=2)
    args = [t.requires_grad_(True) for t in (q, k, v, r)]
    assert torch.autograd.gradcheck(
        lambda *a: relative_linear_attention(*a, is_causal=is_causal, method=method), args
    )


def test_auto_dispatch_uses_direct_below_crossover_and_fft_above(monkeypatch):
    calls = []
    monkeypatch.setattr(rel_mod, "_relative_direct", lambda *a: calls.append("direct") or 0)
    monkeypatch.setattr(rel_mod, "_relative_fft", lambda *a: calls.append("fft") or 0)
    monkeypatch.setattr(rel_mod, "DIRECT_MAX_T", 8)
    for T in (8, 9):
        q, k, v, r = _inputs(B=1, H=1, T=T)
        relative_linear_attention(q, k, v, r)
    assert calls == ["direct", "fft"]


def test_fft_blocks_agree_with_one_block(monkeypatch):
    """Blocking over batch rows and features (small memory budget) changes nothing."""
    q, k, v, r = _inputs(B=3, H=2, T=33, D=5, Dv=4)
    whole = relative_linear_attention(q, k, v, r, method="fft")
    monkeypatch.setattr(rel_mod, "FFT_BLOCK_BYTES", 1)  # one (row, feature) column per block
    blocked = relative_linear_attention(q, k, v, r, method="fft")
    torch.testing.assert_close(blocked, whole, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_low_precision_is_close_to_float64(dtype):
    q, k, v, r = _inputs(B=1, H=2, T=300, D=8, Dv=8, seed=3)
    want = relative_linear_attention(q, k, v, r, method="fft")
    for method in ("direct", "fft"):
        got = relative_linear_attention(*(t.to(dtype) for t in (q, k, v, r)), method=method)
        assert got.dtype == dtype
        tol = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 3e-2}[dtype]
        torch.testing.assert_close(got.double(), want, rtol=0, atol=tol)


def test_r_broadcasts_over_batch_and_heads():
    q, k, v, r = _inputs(B=2, H=3, T=5)
    shared = r[:1]  # one set of lag vectors for every head
    got = relative_linear_attention(q, k, v, shared, method="fft")
    want = relative_linear_attention(q, k, v, shared.expand_as(r), method="direct")
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "bad_shape", [(3, 12, 4), (3, 13, 5), (4,), (5, 13, 4)], ids=["lags", "dim", "1d", "heads"]
)
def test_bad_r_raises_naming_r(bad_shape):
    q, k, v, _ = _inputs(B=2, H=3, T=7)
    with pytest.raises(ValueError, match=r"^r: "):
        relative_linear_attention(q, k, v, torch.zeros(bad_shape, dtype=torch.float64))


def test_bad_arguments():
    q, k, v, r = _inputs(T=4)
    with pytest.raises(TypeError, match="r: "):
        relative_linear_attention(q, k, v, r.long())
    with pytest.raises(ValueError, match="method"):
        relative_linear_attention(q, k, v, r, method="magic")


def _is_smooth(n: int) -> bool:
    for p in (2, 3, 5):
        while n % p == 0:
            n //= p
    return n == 1


@pytest.mark.parametrize("m", [1, 2, 7, 11, 97, 1000, 4097])
def test_fft_size_is_the_smallest_5_smooth_length(m):
    n = fft_size(m)
    assert n >= m and _is_smooth(n)
    assert not any(_is_smooth(j) for j in range(m, n))


# VmHWM (reset at entry) rather than ru_maxrss: a child's ru_maxrss starts at its parent's
# resident size (the pytest process's), which would hide growth below it.
MEMORY_SCRIPT = """
import torch
from linattn.ops.relative.op import relative_linear_attention
from linattn.profiling import PeakMemory
B, H, T, D = 1, 4, 16384, 16
q, k, v = (torch.randn(B, H, T, D) for _ in range(3))
r = torch.randn(H, 2 * T - 1, D)
with PeakMemory() as mem:
    out = relative_linear_attention(q, k, v, r, method="fft")
assert torch.isfinite(out).all() and mem.extra_bytes is not None
print(mem.extra_bytes)
"""


def test_fft_memory_at_T_16384_stays_under_2_gib():
    """H = 4, ℓ = Dv = 16, T = 16384: the issue's bound. The (T, T) lag matrix alone would be
    4 GiB per head; the FFT form's blocks keep the whole call under 2 GiB of peak growth."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT], capture_output=True, text=True,
                         check=True, env={"OMP_NUM_THREADS": "1", "PATH": ""})
    grown = int(out.stdout.strip().splitlines()[-1])
    assert grown < 2 * 2**30, f"peak memory grew by {grown / 2**20:.0f} MiB"
