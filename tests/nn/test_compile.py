"""Models built with linattn inside PyTorch's compilers: ``torch.compile(fullgraph=True)`` and
``torch.export`` on the compiled (``linattn::`` custom ops) and the torch paths, equal to eager to
float32 rounding, forward and backward; an AOTInductor package loaded in a fresh process."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from linattn.nn import EncoderBlock, LinearTransformerEncoder, MultiheadLinearAttention
from linattn.ops import dispatch
from linattn.ops.linear import native as linear_native
from linattn.tsc.model import FordATransformer, ModelConfig

ROOT = Path(__file__).resolve().parents[2]
_CXX = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
#: Inductor generates C++ for the CPU; without a compiler the same capture (Dynamo, fullgraph)
#: and AOTAutograd still run, with the graph executed by torch ("aot_eager")
BACKEND = "inductor" if _CXX else "aot_eager"

#: float32 results of a graph compiled by Inductor differ from eager by the order of their sums:
#: a few hundred unit roundoffs at the size of the largest value (the outputs here sum over at
#: most a few hundred terms per layer, through up to three layers)
ULPS = 256

MODULES = {
    "linear": lambda: MultiheadLinearAttention(32, 2),
    "linear-causal": lambda: MultiheadLinearAttention(32, 2, is_causal=True),
    "linear-relu-relative": lambda: MultiheadLinearAttention(32, 2, feature_map="relu",
                                                              max_len=24),
    "taylor": lambda: MultiheadLinearAttention(32, 2, feature_map="taylor"),
    "flow": lambda: MultiheadLinearAttention(32, 2, attention="flow", feature_map="sigmoid"),
    "flow-causal": lambda: MultiheadLinearAttention(32, 2, attention="flow", is_causal=True,
                                                    feature_map="sigmoid"),
    "encoder-block": lambda: EncoderBlock(32, 2),
    "encoder": lambda: LinearTransformerEncoder(2, 32, 2, max_len=24),
}


@pytest.fixture(params=["compiled", "torch"])
def path(request, monkeypatch):
    """The compiled kernels wherever they apply (LINATTN_NATIVE=1), or the torch paths only
    (LINATTN_NATIVE=0); each test traces afresh."""
    if request.param == "compiled" and linear_native.kernels() is None:
        pytest.skip(f"compiled path: {linear_native.unavailable()}")
    monkeypatch.setenv("LINATTN_NATIVE", "1" if request.param == "compiled" else "0")
    torch._dynamo.reset()
    dispatch._memo.clear()
    yield request.param
    torch._dynamo.reset()
    dispatch._memo.clear()


def _close(assert_close, got, want):
    assert_close(got.detach(), want.detach(), ulps=ULPS)


def _forda() -> FordATransformer:
    cfg = json.loads((ROOT / "models" / "forda" / "config.json").read_text())["model"]
    cfg.update(length=120, d_model=32, num_heads=2, head_dim=16, mlp_dim=64, num_layers=2,
               dropout=0.0)
    return FordATransformer(ModelConfig(**cfg))


def _check_compile(model, x, assert_close, *, ops_in_graph: bool):
    torch.manual_seed(0)
    eager = model(x)
    compiled = torch.compile(model, fullgraph=True, backend=BACKEND)
    got = compiled(x)
    _close(assert_close, got, eager)
    # backward: the same gradients of the input and of every parameter
    xe, xc = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    model.zero_grad()
    model(xe).square().sum().backward()
    want = [xe.grad] + [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    compiled(xc).square().sum().backward()
    have = [xc.grad] + [p.grad.clone() for p in model.parameters() if p.grad is not None]
    assert len(have) == len(want)
    for a, b in zip(have, want, strict=True):
        _close(assert_close, a, b)
    ep = torch.export.export(model, (x,))
    _close(assert_close, ep.module()(x), eager)
    names = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert any(t.startswith("linattn.") for t in names) == ops_in_graph, names


@pytest.mark.parametrize("name", sorted(MODULES))
def test_modules_compile_and_export(name, path, assert_close):
    torch.manual_seed(0)
    model = MODULES[name]()
    x = torch.randn(2, 20, 32)
    # the compiled kernels take 1 + elu and 1 + relu (not Flowformer, Taylor or the relative
    # terms' FFT); on the torch path no linattn op is in the graph
    compiled_map = name in ("linear", "linear-causal", "encoder-block")
    _check_compile(model, x, assert_close, ops_in_graph=path == "compiled" and compiled_map)


@pytest.mark.parametrize("path", ["torch"], indirect=True)  # its attention has no compiled kernel
def test_forda_model_compiles_and_exports(path, assert_close):
    """The FordA classifier (spectral patches, global spectrum, relative terms, so no compiled
    kernel): eval mode for the comparison (dropout draws differ between eager and compiled
    code)."""
    torch.manual_seed(0)
    model = _forda().eval()
    x = torch.randn(3, 120)
    _check_compile(model, x, assert_close, ops_in_graph=False)


@pytest.mark.parametrize("path", ["compiled"], indirect=True)
def test_dynamic_shapes(path, assert_close):
    """One compiled graph serves several batch sizes and lengths (dynamic=True)."""
    torch.manual_seed(0)
    model = MultiheadLinearAttention(32, 2, is_causal=True)
    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend=BACKEND)
    for B, T in ((2, 20), (3, 37), (1, 70)):
        x = torch.randn(B, T, 32)
        _close(assert_close, compiled(x), model(x))


@pytest.mark.skipif(_CXX is None, reason="AOTInductor needs a C++ compiler")
def test_aoti_package_runs_in_a_fresh_process(tmp_path, assert_close):
    """export → AOTInductor package → a new Python process that imports linattn (which
    registers the ``linattn::`` ops) and runs the package: the eager output."""
    if linear_native.kernels() is None:
        pytest.skip(f"compiled path: {linear_native.unavailable()}")
    torch.manual_seed(0)
    model = LinearTransformerEncoder(2, 32, 2).eval()
    x = torch.randn(2, 40, 32)
    ep = torch.export.export(model, (x,))
    package = torch._inductor.aoti_compile_and_package(ep, package_path=str(tmp_path / "m.pt2"))
    torch.save({"x": x, "y": model(x).detach()}, tmp_path / "io.pt")
    code = (
        "import sys, torch, linattn.ops\n"
        "linattn.ops.register_custom_ops()  # what docs/design.md tells a serving process\n"
        "io = torch.load(sys.argv[2])\n"
        "m = torch._inductor.aoti_load_package(sys.argv[1])\n"
        "torch.save(m(io['x']), sys.argv[3])\n"
    )
    done = subprocess.run([sys.executable, "-c", code, package, str(tmp_path / "io.pt"),
                           str(tmp_path / "out.pt")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    io = torch.load(tmp_path / "io.pt")
    _close(assert_close, torch.load(tmp_path / "out.pt"), io["y"])
