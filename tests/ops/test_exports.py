"""Every public op is importable from ``linattn`` itself, lazily, from the one table of ops."""

from __future__ import annotations

import linattn
import linattn.ops


def test_every_public_op_is_exported_from_linattn():
    for name in linattn.ops.EXPORTS:
        assert name in linattn.__all__, name
        assert getattr(linattn, name) is getattr(linattn.ops, name), name


def test_exports_and_all_agree_and_come_from_the_table_of_ops():
    """``_EXPORTS`` (the lazy imports) and ``__all__`` name the same things, every op name of
    the one table :data:`linattn.ops.OPS` among them, and each lazy name resolves."""
    assert set(linattn._EXPORTS) == set(linattn.__all__) - {"__version__"}
    assert set(linattn.ops.EXPORTS) <= set(linattn._EXPORTS)
    for name in linattn._EXPORTS:
        assert getattr(linattn, name) is not None


def test_every_reference_has_its_op():
    """linattn.reference holds the ground truth of each whole-sequence op, under the op's name."""
    for name in linattn.reference.__all__:
        assert callable(getattr(linattn.reference, name))
        assert getattr(linattn, name) is not getattr(linattn.reference, name)
