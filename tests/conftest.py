"""Shared fixtures: a random q/k/v factory, the feature maps to sweep, dtype-scaled tolerances.

Helpers are fixtures (not importable functions) so that tests work under any pytest import mode.
"""

from __future__ import annotations

import functools
import os

# Idle OpenMP threads sleep instead of spinning. Must be set before torch loads libgomp. On a
# busy shared machine a spinning partner thread turns every small parallel op into a wait for
# a descheduled core (measured here: 0.6 s -> 9 s for one 64k-token call at load 6).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402

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
