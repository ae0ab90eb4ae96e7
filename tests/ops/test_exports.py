"""Every public op is importable from ``linattn`` itself, lazily and for type checkers alike."""

from __future__ import annotations

import ast
import inspect

import linattn
import linattn.ops


def test_every_public_op_is_exported_from_linattn():
    for name in linattn.ops.__all__:
        assert name in linattn.__all__, name
        assert getattr(linattn, name) is getattr(linattn.ops, name), name


def test_exports_all_and_type_checking_block_agree():
    """``_EXPORTS`` (the lazy imports), ``__all__`` and the TYPE_CHECKING imports name the same
    things, and each lazy name resolves."""
    assert set(linattn._EXPORTS) == set(linattn.__all__) - {"__version__"}
    tree = ast.parse(inspect.getsource(linattn))
    block = next(node for node in tree.body if isinstance(node, ast.If)
                 and getattr(node.test, "id", None) == "TYPE_CHECKING")
    imported = {alias.asname or alias.name for node in block.body
                for alias in node.names}  # type: ignore[attr-defined]
    assert imported == set(linattn._EXPORTS)
    for name in linattn._EXPORTS:
        assert getattr(linattn, name) is not None


def test_every_reference_has_its_op():
    """linattn.reference holds the ground truth of each whole-sequence op, under the op's name."""
    for name in linattn.reference.__all__:
        assert callable(getattr(linattn.reference, name))
        assert getattr(linattn, name) is not getattr(linattn.reference, name)
