"""The benchmark scripts (``benchmarks/*.py``) imported as modules for their tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


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
