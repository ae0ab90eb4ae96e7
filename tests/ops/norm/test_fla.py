"""fla's gated RMSNorm (ops/norm/fla.py, gathered into linattn.fla) against its definition
(bias, residual, prenorm), and linattn.rms_norm_gated against the gated norms of transformers'
models when transformers is installed: Qwen3.5 (SiLU, norm before gate, the weight multiplied
in the input dtype), Kimi Linear (sigmoid), Mamba2 (groups, gate before norm)."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F

from linattn import fla, rms_norm_gated
from linattn.ops import dispatch
from linattn.ops import reference as ref

pytestmark = pytest.mark.usefixtures("single_thread")

F32, BF16 = torch.float32, torch.bfloat16


def _inputs(*shape, dtype=F32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(*shape, generator=gen) * 2).to(dtype)
    g = (torch.randn(*shape, generator=gen) * 2).to(dtype)
    w = (torch.rand(shape[-1], generator=gen) + 0.5).to(dtype)
    return x, g, w


def _close(got, want, dtype, ulps=4.0):
    want = want.double()
    assert got.shape == want.shape
    scale = max(want.abs().max().item(), 1.0) if want.numel() else 1.0
    torch.testing.assert_close(got.double(), want, rtol=0,
                               atol=ulps * torch.finfo(dtype).eps * scale)


# ------------------------------------------------------------------------------------- fla
@pytest.mark.parametrize("activation", ["swish", "silu", "sigmoid"])
def test_fla_without_extras_is_the_op(activation):
    x, g, w = _inputs(2, 9, 64)
    y = fla.rms_norm_gated(x, g, w, None, activation, eps=1e-5)
    want = ref.rms_norm_gated(x, g, w, eps=1e-5, activation=activation)
    _close(y, want, F32)
    _close(fla.rms_norm_gated(x, g, None, None), ref.rms_norm_gated(x, g, None), F32)


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_fla_bias_residual_prenorm(dtype):
    """fla: y = (rmsnorm(x + residual)·w + b)·act(g), the sum in float32; prenorm also returns
    the residual stream in residual's dtype."""
    x, g, w = _inputs(3, 48, dtype=dtype)
    res = _inputs(3, 48, dtype=dtype, seed=1)[0]
    b = torch.randn(48).to(dtype)
    y, r = fla.rms_norm_gated(x, g, w, b, "swish", residual=res, prenorm=True)
    s = x.double() + res.double()
    want = (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
            + b.double()) * F.silu(g.double())
    assert y.dtype == dtype and r.dtype == dtype
    _close(y, want, dtype, ulps=8.0 if dtype == F32 else 1.0)
    torch.testing.assert_close(r, (x.float() + res.float()).to(dtype))
    y2, r2 = fla.rms_norm_gated(x, g, w, None, residual=res, prenorm=True)
    _close(y2, ref.rms_norm_gated(s, g, w), dtype, ulps=8.0 if dtype == F32 else 1.0)
    _, r3 = fla.rms_norm_gated(x, g, w, None, prenorm=True, residual_in_fp32=True)
    assert r3.dtype == F32 and torch.equal(r3, x.float())
    _, r4 = fla.rms_norm_gated(x, g, w, None, prenorm=True)
    assert r4 is x


def test_fla_arguments():
    x, g, w = _inputs(2, 16)
    with pytest.raises(ValueError, match=r"^head_first: "):
        fla.rms_norm_gated(x, g, w, None, head_first=False)
    # unknown keywords are ignored, as fla ignores them
    torch.testing.assert_close(fla.rms_norm_gated(x, g, w, None, bogus=1),
                               fla.rms_norm_gated(x, g, w, None), rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"^activation: "):
        fla.rms_norm_gated(x, g, w, None, "gelu")
    with pytest.raises(ValueError, match=r"^g: "):
        fla.rms_norm_gated(x, g[:1], w, None)
    with pytest.raises(ValueError, match=r"^bias: "):
        fla.rms_norm_gated(x, g, w, torch.zeros(3))
    with pytest.raises(ValueError, match=r"^prenorm: "):
        fla.rms_norm_gated(x, g, w, None, prenorm="yes")


# ---------------------------------------------------------------------------- transformers
def _module(model: str, name: str):
    pytest.importorskip("transformers")
    try:
        module = importlib.import_module(f"transformers.models.{model}.modeling_{model}")
    except ImportError as exc:
        pytest.skip(f"transformers.models.{model}: {exc}")
    cls = getattr(module, name, None)
    if cls is None:
        pytest.skip(f"{model} has no {name}")
    return cls


def _weights(norm, D, dtype):
    with torch.no_grad():
        norm.weight.copy_(torch.rand(D, generator=torch.Generator().manual_seed(3)) + 0.5)
    return norm.to(dtype)


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("impl", ["auto", "portable"])
@pytest.mark.parametrize("rows", [16, 2048])
def test_qwen3_5(dtype, impl, rows):
    """Qwen3_5RMSNormGated (also Qwen3-Next's): SiLU gate after the norm; transformers rounds
    the normalised x to the input dtype before the weight (two more roundings in bfloat16)."""
    cls = _module("qwen3_5", "Qwen3_5RMSNormGated")
    norm = _weights(cls(128, eps=1e-6), 128, dtype)
    x, g, _ = _inputs(rows, 128, dtype=dtype)
    want = norm(x, g)
    with dispatch.use(impl=impl):
        y = rms_norm_gated(x, g, norm.weight.detach(), eps=1e-6)
    assert y.dtype == dtype
    _close(y, want, dtype, ulps=8.0 if dtype == F32 else 3.0)


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("impl", ["auto", "portable"])
def test_kimi_linear(dtype, impl):
    cls = _module("kimi_linear", "KimiLinearRMSNormGated")
    norm = _weights(cls(96, eps=1e-6), 96, dtype)
    x, g, _ = _inputs(7, 96, dtype=dtype)
    with dispatch.use(impl=impl):
        y = rms_norm_gated(x, g, norm.weight.detach(), eps=1e-6, activation="sigmoid")
    _close(y, norm(x, g), dtype, ulps=8.0 if dtype == F32 else 1.0)


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("impl", ["auto", "portable"])
@pytest.mark.parametrize("gated", [True, False])
def test_mamba2(dtype, impl, gated):
    """MambaRMSNormGated: groups, SiLU gate before the norm, the weight in the input dtype."""
    cls = _module("mamba2", "MambaRMSNormGated")
    norm = _weights(cls(256, group_size=64, eps=1e-5), 256, dtype)
    x, g, _ = _inputs(2, 5, 256, dtype=dtype)
    g = g if gated else None
    with dispatch.use(impl=impl):
        y = rms_norm_gated(x, g, norm.weight.detach(), eps=1e-5, group_size=64,
                           norm_before_gate=False)
    _close(y, norm(x, g), dtype, ulps=8.0 if dtype == F32 else 2.0)
