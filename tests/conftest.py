"""Shared fixtures: a random q/k/v factory, the feature maps to sweep, dtype-scaled tolerances;
the benchmark scripts as modules (tests/benchmarks), the mixers' generation and decoding checks
(tests/nn), noisy series (tests/tsc).

Helpers are fixtures (not importable functions) so that tests work under any pytest import mode.
"""

from __future__ import annotations

import functools
import os

# Idle OpenMP threads sleep instead of spinning. Must be set before torch loads libgomp. On a
# busy shared machine a spinning partner thread turns every small parallel op into a wait for
# a descheduled core (measured here: 0.6 s -> 9 s for one 64k-token call at load 6).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F

from linattn.feature_maps import (
    FEATURE_MAPS,
    FavorPlus,
    Hedgehog,
    Polynomial,
    RandomReLU,
    get_feature_map,
)

#: Every string shortcut, explicit instances the shortcuts do not cover, and the random and
#: learnable maps (built per head dimension, seeded).
MAP_PARAMS = [
    *sorted(FEATURE_MAPS),
    "polynomial-p1",
    "polynomial-p3",
    "favor+",
    "random-relu",
    "hedgehog",
]


def build_feature_map(name: str, head_dim: int, dtype: torch.dtype = torch.float64):
    """A seeded feature-map *instance* for inputs (..., head_dim) of ``dtype``: pass the same
    instance to the fast path and to the reference, so random maps agree. The same arguments
    always give the same map, and maps built for different dtypes hold the same numbers."""
    if name.startswith("polynomial-p"):
        fmap = Polynomial(degree=int(name.removeprefix("polynomial-p")), c=1.0)
    elif name == "favor+":
        fmap = FavorPlus(head_dim, num_features=16, seed=0)
    elif name == "random-relu":
        fmap = RandomReLU(head_dim, num_features=16, seed=0)
    elif name == "hedgehog":
        fmap = Hedgehog(head_dim, num_features=3)
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in fmap.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    else:
        fmap = get_feature_map(name)
    return fmap.to(dtype)


@pytest.fixture(params=MAP_PARAMS)
def make_map(request):
    """Each feature map in turn, as a factory ``make_map(head_dim, dtype=torch.float64)``."""
    return functools.partial(build_feature_map, request.param)


@pytest.fixture(scope="session")
def build_map():
    """``build_map(name, head_dim, dtype=torch.float64)`` (session-scoped: fits hypothesis)."""
    return build_feature_map


@pytest.fixture(scope="session")
def map_names():
    return list(MAP_PARAMS)


@pytest.fixture(scope="session")
def held_at_scale():
    """``held_at_scale(got, want, scale)``: a float32 output ``got`` of a huge ``scale`` against
    the float64 ``want``: equal, relative to the outputs' size, where want fits in float32; ±inf
    where it does not."""

    def check(got, want, scale):
        top = torch.finfo(torch.float32).max
        fits = want.abs() < 0.99 * top
        assert got[~fits & (want.abs() > 1.01 * top)].isinf().all()
        unscaled = want / scale
        tol = 64 * torch.finfo(torch.float32).eps * max(1.0, unscaled.abs().max().item())
        torch.testing.assert_close(got.double()[fits] / scale, unscaled[fits], rtol=0, atol=tol)

    return check


@pytest.fixture
def qkv():
    """``qkv(*batch, T=..., D=..., Dv=..., Tk=None, dtype=float64, scale=0.5, seed=0)``.

    Seeded normal q (..., T, D), k (..., Tk, D), v (..., Tk, Dv). The default scale keeps
    odd-degree polynomial kernels (x·y + 1)^p positive, so normalisers stay away from 0."""

    def make(*batch, T=7, D=4, Dv=3, Tk=None, dtype=torch.float64, scale=0.5, seed=0):
        g = torch.Generator().manual_seed(seed)
        Tk = T if Tk is None else Tk
        q = torch.randn(*batch, T, D, generator=g, dtype=torch.float64) * scale
        k = torch.randn(*batch, Tk, D, generator=g, dtype=torch.float64) * scale
        v = torch.randn(*batch, Tk, Dv, generator=g, dtype=torch.float64)
        return q.to(dtype), k.to(dtype), v.to(dtype)

    return make


@pytest.fixture
def assert_close():
    """``assert_close(actual, expected, ulps=...)``: compare in float64 with a tolerance scaled by
    ``actual``'s dtype: ``ulps`` machine epsilons, absolute at the size of ``expected`` (errors
    of accumulated sums and of rounding the output scale with the largest value, not per entry).
    float64 defaults to 1e-9 absolute and relative, the bar for matching the reference."""

    def check(actual, expected, ulps: float = 4.0, atol: float | None = None):
        assert actual.shape == expected.shape, (actual.shape, expected.shape)
        assert torch.isfinite(actual).all(), "non-finite values"
        a, e = actual.double(), expected.double()
        if actual.dtype == torch.float64:
            tol = 1e-9 if atol is None else atol
            torch.testing.assert_close(a, e, rtol=tol, atol=tol)
            return
        eps = torch.finfo(actual.dtype).eps
        scale = max(e.abs().max().item(), 1.0) if e.numel() else 1.0
        tol = ulps * eps * scale if atol is None else atol
        torch.testing.assert_close(a, e, rtol=0.0, atol=tol)

    return check


#: Sizes under which the fast paths see short test sequences as long ones: blocks of 8 tokens
#: and causal chunks of 4 when the call names none, so T >= 9 spans several blocks and chunks.
SMALL_BLOCKS = {"block_size": 8, "chunk_size": 4}


@pytest.fixture
def fast_path_calls(monkeypatch):
    """Force the fast paths (native where it applies, else fused) for every length, with
    :data:`SMALL_BLOCKS`; returns ``count(module, name)``, which wraps ``module.name`` so that
    each call appends to the list it returns (to check a path was really taken)."""
    from linattn.ops import dispatch

    with dispatch.use(impl="fast", **SMALL_BLOCKS):

        def count(module, name: str) -> list:
            calls: list = []
            real = getattr(module, name)
            monkeypatch.setattr(module, name, lambda *a, **kw: calls.append(1) or real(*a, **kw))
            return calls

        yield count


@pytest.fixture(params=["tiles", "no tiles"])
def amx(request):
    """The bfloat16 products on AMX tiles ("tiles", where this CPU has them) or on vdpbf16ps
    (the form every other CPU with AVX512-BF16 runs; on an AMX CPU, tiles turned off for the
    test, in every build the dispatcher may take). Linear attention's one-pass forwards and the
    delta rule's bfloat16 chunks ask for it."""
    from linattn.ops import native

    if request.param == "tiles":
        if not native.amx_tiles():
            pytest.skip("no AMX tiles on this CPU")
        yield True
        return
    libs = [lib for lib in map(native.load, native.runnable_isas()) if lib is not None]
    was = [lib.la_amx_use(0) for lib in libs]
    try:
        yield False
    finally:
        for lib, on in zip(libs, was, strict=True):
            if on:
                lib.la_amx_use(1)


@pytest.fixture(params=["portable", "fused"])
def linear_path(request):
    """Run the test once per implementation behind ``linattn.linear_attention``: the portable
    whole-tensor form, and the fast paths forced on for every length with
    :data:`SMALL_BLOCKS` (short test sequences span several blocks): float32 with 1 + elu or
    1 + relu takes the compiled path (ops/linear/native.py) there, the rest the torch chunked
    one."""
    from linattn.ops import dispatch

    impl = "fast" if request.param == "fused" else "portable"
    with dispatch.use(impl=impl, **SMALL_BLOCKS):
        yield request.param


@pytest.fixture(scope="module")
def single_thread():
    """One intra-op thread for a module of tiny-tensor tests: they gain nothing from a second
    thread, and on a busy shared machine OpenMP's spinning makes them several times slower.
    Use with ``pytestmark = pytest.mark.usefixtures("single_thread")``; restores the setting."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# -------------------- the benchmark scripts as modules (tests/benchmarks)
# The benchmark scripts (``benchmarks/*.py``) imported as modules for their tests.


BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def forked_child_exit():
    """``run(setup, child)``: a fresh Python runs ``setup`` (which imports os), forks, and runs
    ``child`` in the child, which ends with ``os._exit(code)``; returns that code, after
    asserting the parent ended cleanly within two minutes. For what must neither hang nor fail
    after a fork (OpenMP's threads and Python's pool stay in the parent)."""
    def run(setup: str, child: str) -> int:
        code = (setup + "pid = os.fork()\nif pid == 0:\n" + textwrap.indent(child, "    ")
                + "_, status = os.waitpid(pid, 0)\nprint(os.waitstatus_to_exitcode(status))\n")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        return int(done.stdout.strip().splitlines()[-1])

    return run


@pytest.fixture(scope="module")
def load_benchmark():
    """``load_benchmark("ucr")``: benchmarks/ucr.py as a module (registered in
    ``sys.modules`` while the test module runs, as dataclasses and pickling need)."""
    names = []

    def load(name: str):
        spec = importlib.util.spec_from_file_location(f"_{name}_bench", BENCHMARKS / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        names.append(spec.name)
        spec.loader.exec_module(mod)
        return mod

    try:
        yield load
    finally:
        for name in names:
            sys.modules.pop(name, None)


# -------------------- the mixer tests' checks (tests/nn)
# Fixtures shared by the mixer tests of tests/nn (helpers are fixtures, as in
# tests/conftest.py, so that they work under any pytest import mode).


@pytest.fixture
def generates_and_trains():
    """``check(model, prompt, ids)``: greedy generation from ``prompt`` (B, 4) agrees with the
    arg-max of one parallel forward over what it generated, and a next-token loss on ``ids``
    (B, T) gives every parameter a finite gradient. Returns the model, its gradients kept."""

    def check(m, prompt, ids):
        out = m.generate(prompt, 6, temperature=0)
        with torch.no_grad():
            torch.testing.assert_close(m(out[:, :-1])[:, 3:].argmax(-1), out[:, 4:])
        m.train()
        loss = F.cross_entropy(m(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters())
        return m
    return check


@pytest.fixture
def decode_three_ways():
    """``run(mixer, x, split=7)`` for a mixer (``mixer(x, state, position) -> (out, state)``)
    and x (B, T, E), without gradients: the whole sequence at once, one token at a time, and
    two pieces cut at ``split``. Returns a dict: ``full``, ``want`` (its output and state),
    ``steps``, ``state`` (token by token, outputs concatenated) and ``pieces``, ``st`` (the two
    pieces)."""

    def run(m, x, split=7):
        with torch.no_grad():
            full, want = m(x)
            state, steps = None, []
            for t in range(x.shape[1]):
                o, state = m(x[:, t:t + 1], state, t)
                steps.append(o)
            a, st = m(x[:, :split])
            b, st = m(x[:, split:], st, split)
        return {"full": full, "want": want, "steps": torch.cat(steps, 1), "state": state,
                "pieces": torch.cat([a, b], 1), "st": st}
    return run


# -------------------- time series (tests/tsc)
# Shared fixtures of the time-series tests (fixtures, not importable functions, so that tests
# work under any pytest import mode).


def _series(n: int, length: int, seed: int = 0) -> np.ndarray:
    """n noisy sines of random frequency, float32 (n, length)."""
    g = np.random.default_rng(seed)
    t = np.linspace(0, 6 * np.pi, length)
    return (np.sin(t * g.uniform(0.5, 2, (n, 1))) + 0.3 * g.standard_normal((n, length))
            ).astype(np.float32)


@pytest.fixture
def series():
    """The factory ``series(n, length, seed=0)``: noisy sines, float32 (n, length)."""
    return _series


@pytest.fixture
def bfloat16_rows():
    """laid_out(layout, *xs): xs in bfloat16 as (B, H, T, D) tensors ("heads"), as views of
    fla's (B, T, H, D) layout ("fla"), or as views of rows one element longer ("odd": an odd
    token stride, which the recurrences' bfloat16 chunks on tiles do not read in place)."""

    def laid_out(layout: str, *xs):
        if layout == "fla":
            return [x.transpose(1, 2).contiguous().transpose(1, 2).bfloat16() for x in xs]
        if layout == "odd":
            return [torch.nn.functional.pad(x, (0, 1)).bfloat16()[..., :-1] for x in xs]
        assert layout == "heads", layout
        return [x.bfloat16() for x in xs]

    return laid_out
