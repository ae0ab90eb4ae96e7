"""Shared fixtures of the time-series tests (fixtures, not importable functions, so that tests
work under any pytest import mode)."""

from __future__ import annotations

import numpy as np
import pytest


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
