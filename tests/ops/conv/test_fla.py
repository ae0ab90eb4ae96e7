"""The causal-conv1d package's names (ops/conv/fla.py, gathered into linattn.fla) against the
float64 reference, the package's own reference semantics (its circular buffer and batch
indices, restated here) and, when transformers is installed, the torch fallbacks of its
linear-attention layers (which take a conv_state of length W)."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F

from linattn import fla
from linattn.ops import dispatch
from linattn.ops import reference as ref

pytestmark = pytest.mark.usefixtures("single_thread")

F32, BF16 = torch.float32, torch.bfloat16

#: transformers 5.23 models whose torch fallbacks of causal_conv1d_fn / _update are tested
MODELS = ["qwen3_5", "qwen3_next", "kimi_linear", "mamba2", "lfm2", "olmo_hybrid"]


def _fallbacks(model: str):
    pytest.importorskip("transformers")
    try:
        module = importlib.import_module(f"transformers.models.{model}.modeling_{model}")
    except ImportError as exc:
        pytest.skip(f"transformers.models.{model}: {exc}")
    fns = []
    for name in ("causal_conv1d_fn", "causal_conv1d_update"):
        fn = getattr(module, name, None)
        if fn is None:
            pytest.skip(f"{model} has no {name}")
        fns.append(getattr(fn, "__wrapped__", fn))
    return fns


def _inputs(B=2, D=40, T=17, W=4, dtype=F32, seed=0):
    """x (B, D, T) as the layers hold it: a (B, T, D) projection transposed."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, D, generator=gen).to(dtype).transpose(1, 2)
    w = (torch.randn(D, W, generator=gen) * 0.5).to(dtype)
    b = torch.randn(D, generator=gen).to(dtype)
    return x, w, b


def _close(got, want, dtype, ulps=4.0):
    want = want.double()
    scale = max(want.abs().max().item(), 1.0) if want.numel() else 1.0
    assert got.shape == want.shape
    torch.testing.assert_close(got.double(), want, rtol=0,
                               atol=ulps * torch.finfo(dtype).eps * scale)


# ----------------------------------------------------------------- transformers' fallbacks
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("impl", ["auto", "portable"])
def test_prefill_agrees_with_transformers(model, dtype, impl):
    fn_t, _ = _fallbacks(model)
    x, w, b = _inputs(dtype=dtype)
    want = fn_t(x, w, b, activation="silu")
    with dispatch.use(impl=impl):
        got = fla.causal_conv1d_fn(x, w, b, activation="silu", cu_seq_lens_q=None,
                                   position_ids=None)  # transformers' keywords: ignored
    assert got.shape == want.shape and got.dtype == dtype
    # transformers rounds the sum and SiLU's output to bfloat16 apart: two roundings
    _close(got, want, dtype, ulps=4.0 if dtype == F32 else 2.0)
    got_none = fla.causal_conv1d_fn(x, w, None)
    _close(got_none, fn_t(x, w, None), dtype, ulps=4.0 if dtype == F32 else 2.0)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("T", [1, 3])
@pytest.mark.parametrize("two_d", [False, True])
def test_update_agrees_with_transformers(model, dtype, T, two_d):
    """conv_state of length W (transformers' cache), updated in place, several steps."""
    if two_d and T != 1:
        pytest.skip("x (B, D) is one token")
    _, up_t = _fallbacks(model)
    x, w, b = _inputs(T=5 * T, dtype=dtype)
    state = torch.randn(2, 40, 4).to(dtype)
    mine = state.clone()
    for s in range(5):
        xs = x[..., s * T:(s + 1) * T]
        want = up_t(xs, state, w, b, "silu")
        got = fla.causal_conv1d_update(xs[..., 0] if two_d else xs, mine, w, b, "silu")
        _close(got, want[..., 0] if two_d else want, dtype,
               ulps=4.0 if dtype == F32 else 2.0)
        assert torch.equal(mine, state)


# ------------------------------------------------------------------------- causal_conv1d_fn
def test_final_states_and_initial_states():
    x, w, b = _inputs()
    S0 = torch.randn(2, 40, 3)
    want, want_S = ref.causal_conv1d(x.transpose(1, 2), w, b, activation="swish",
                                     initial_state=S0)
    y, S = fla.causal_conv1d_fn(x, w, b, initial_states=S0, return_final_states=True,
                                activation="swish")
    _close(y, want.transpose(1, 2), F32)
    out = torch.empty(2, 3, 40).transpose(1, 2)  # the package's own layout for it
    y2, S2 = fla.causal_conv1d_fn(x, w, b, initial_states=S0, return_final_states=True,
                                  final_states_out=out, activation="swish")
    assert S2 is out and torch.equal(out, S) and torch.equal(y2, y)
    torch.testing.assert_close(S, want_S.float(), rtol=0, atol=0)
    assert fla.causal_conv1d_fn(x, w, b, final_states_out=out).shape == (2, 40, 17)


@pytest.mark.parametrize("monotonic", [True, False])
@pytest.mark.parametrize("impl", ["auto", "portable"])
def test_seq_idx_keeps_sequences_apart(monotonic, impl):
    x, w, b = _inputs(B=2, T=20)
    if monotonic:
        seq = torch.tensor([[0] * 3 + [1] * 9 + [2] * 8, [5] * 1 + [6] * 19])
    else:  # the package's rule: taps read tokens of the same index, wherever they are
        seq = torch.tensor([[0, 1] * 10, [3] * 10 + [1] * 5 + [3] * 5])
    with dispatch.use(impl=impl):
        y = fla.causal_conv1d_fn(x, w, b, seq_idx=seq, activation="silu")
    xt = x.transpose(1, 2).double()
    want = torch.zeros(2, 20, 40, dtype=torch.float64)
    for bb in range(2):
        for t in range(20):
            acc = b.double().clone()
            for j in range(4):
                p = t - 3 + j
                if p >= 0 and seq[bb, p] == seq[bb, t]:
                    acc += w[:, j].double() * xt[bb, p]
            want[bb, t] = F.silu(acc)
    _close(y, want.transpose(1, 2), F32)


def test_seq_idx_takes_no_states():
    x, w, b = _inputs()
    seq = torch.zeros(2, 17, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^initial_states: "):
        fla.causal_conv1d_fn(x, w, b, seq_idx=seq, initial_states=torch.zeros(2, 40, 3))
    with pytest.raises(ValueError, match=r"^return_final_states: "):
        fla.causal_conv1d_fn(x, w, b, seq_idx=seq, return_final_states=True)
    with pytest.raises(ValueError, match=r"^seq_idx: "):
        fla.causal_conv1d_fn(x, w, b, seq_idx=seq[:, :3])


# -------------------------------------------------------------------- causal_conv1d_update
def _package_update(x, conv_state, weight, bias, silu, cache_seqlens):
    """The package's reference ``causal_conv1d_update_ref`` semantics, restated in float64: with
    cache_seqlens the state is a circular buffer; the W − 1 entries before the write position
    are the history; x is written from it on."""
    B, D, T = x.shape
    S = conv_state.shape[-1]
    W = weight.shape[1]
    idx = torch.remainder(cache_seqlens[:, None] + torch.arange(-(W - 1), 0), S)
    history = conv_state.gather(2, idx[:, None, :].expand(B, D, W - 1))
    full = torch.cat([history, x], -1).double()
    out = F.conv1d(full, weight.double().unsqueeze(1), bias.double(), groups=D)
    put = torch.remainder(cache_seqlens[:, None] + torch.arange(T), S)
    conv_state.scatter_(2, put[:, None, :].expand(B, D, T), x)
    return F.silu(out) if silu else out


@pytest.mark.parametrize("T", [1, 2, 5])
def test_circular_buffer(T):
    x, w, b = _inputs(B=3, T=T)
    state = torch.randn(3, 40, 6)
    mine = state.clone()
    pos = torch.tensor([0, 4, 11], dtype=torch.int32)
    want = _package_update(x, state, w, b, True, pos.long())
    got = fla.causal_conv1d_update(x, mine, w, b, "silu", cache_seqlens=pos)
    _close(got, want, F32)
    assert torch.equal(mine, state)


def test_state_indices_pick_rows_of_a_larger_cache():
    x, w, b = _inputs(B=2, T=1)
    cache = torch.randn(5, 40, 4)
    rows = cache[[3, 1]].clone()
    want = fla.causal_conv1d_update(x[..., 0], rows, w, b, "silu")
    got = fla.causal_conv1d_update(x[..., 0], cache, w, b, "silu",
                                   conv_state_indices=torch.tensor([3, 1], dtype=torch.int32))
    assert torch.equal(got, want)
    assert torch.equal(cache[[3, 1]], rows)
    with pytest.raises(ValueError, match=r"^conv_state_indices: "):
        fla.causal_conv1d_update(x[..., 0], cache, w, b, conv_state_indices=torch.tensor([0, 5]))


@pytest.mark.parametrize("T", [1, 3])
def test_update_refuses_states_that_share_memory(T):
    # issue 51 probe: an expanded conv_state was written row over row (float32), silently
    torch.manual_seed(0)
    x, w = torch.randn(2, 4, T), torch.randn(4, 3)
    state = torch.randn(1, 4, 3).expand(2, 4, 3)
    for kw in ({}, {"cache_seqlens": torch.tensor([0, 1])}):
        with pytest.raises(ValueError, match="^conv_state: .*share memory"):
            fla.causal_conv1d_update(x, state, w, **kw)
    # two batch rows into one cache row: which one wins is undefined
    cache = torch.randn(3, 4, 3)
    with pytest.raises(ValueError, match="^conv_state_indices: .*twice"):
        fla.causal_conv1d_update(x, cache, w, conv_state_indices=torch.tensor([1, 1]))
    out = torch.randn(1, 4, 2).expand(2, 4, 2)
    with pytest.raises(ValueError, match="^final_states_out: .*share memory"):
        fla.causal_conv1d_fn(torch.randn(2, 4, 5), w, return_final_states=True,
                             final_states_out=out)


def test_update_errors_name_the_argument():
    x, w, b = _inputs(B=2, T=1)
    with pytest.raises(ValueError, match=r"^conv_state: "):
        fla.causal_conv1d_update(x, torch.zeros(2, 40, 2), w, b)
    with pytest.raises(ValueError, match=r"^conv_state: "):
        fla.causal_conv1d_update(x, torch.zeros(3, 40, 4), w, b)
    with pytest.raises(ValueError, match=r"^activation: "):
        fla.causal_conv1d_update(x, torch.zeros(2, 40, 4), w, b, "gelu")
    with pytest.raises(ValueError, match=r"^x: "):
        fla.causal_conv1d_update(x[0, 0], torch.zeros(2, 40, 4), w, b)
    with pytest.raises(TypeError, match=r"^cache_seqlens: "):
        fla.causal_conv1d_update(x, torch.zeros(2, 40, 4), w, b, cache_seqlens=[0, 1])
