"""The C boundary (ops/native/abi.py): every ctypes mirror of an argument struct matches the C
side's own layout table, and a mirror that does not is refused at load instead of called."""

from __future__ import annotations

from ctypes import c_float, c_int, c_long, c_void_p

import pytest

from linattn.ops import native
from linattn.ops.conv import native as conv_native
from linattn.ops.delta import native as delta_native
from linattn.ops.linear import native as linear_native
from linattn.ops.native import abi
from linattn.ops.norm import native as norm_native

#: op module -> (its C layout table, its mirrors)
OPS = {"linear": ("la_linear_abi", linear_native.KERNELS),
       "delta": ("la_delta_abi", delta_native.KERNELS),
       "conv": ("la_conv_abi", conv_native.KERNELS),
       "norm": ("la_norm_abi", norm_native.KERNELS)}

pytestmark = pytest.mark.skipif(native.load() is None,
                                reason=f"compiled path: {native.unavailable_reason()}")


@pytest.mark.parametrize("isa", ["native", "scalar"])
@pytest.mark.parametrize("op", sorted(OPS))
def test_every_mirror_matches_its_c_struct(op, isa):
    """Names, order, offsets, sizes and kinds of every field, and the struct sizes, are what
    the compiler laid out (in any build: the layout must not depend on the ISA)."""
    lib = native.load(isa)
    if lib is None:
        pytest.skip(f"{isa}: {native.unavailable_reason(isa)}")
    table, mirrors = OPS[op]
    c = abi.c_layouts(lib, table)
    assert set(c) == {cls._c_name_ for cls in mirrors.values()}
    for cls in mirrors.values():
        assert abi.layout_of(cls) == c[cls._c_name_], cls.__name__
        size, fields = c[cls._c_name_]
        assert fields and size >= fields[-1][1] + fields[-1][2]
    abi.check(lib, table, mirrors)  # what bind() runs before handing out a kernel


def _variant(cls, fields):
    return type("Bad", (abi.Args,), {"_c_name_": cls._c_name_, "_fields_": fields})


@pytest.mark.parametrize("change", ["reorder", "drop", "retype", "add"])
def test_a_mismatched_mirror_is_a_layout_error(change):
    lib = native.load()
    table, mirrors = OPS["delta"]
    good = mirrors["gdr_step"]
    fields = list(good._fields_)
    if change == "reorder":
        fields[0], fields[1] = fields[1], fields[0]
    elif change == "drop":
        fields.pop(5)
    elif change == "retype":  # scale: float -> long (same position, wrong type)
        fields = [(n, c_long if n == "scale" else t) for n, t in fields]
    else:
        fields.append(("extra", c_int))
    bad = {**mirrors, "gdr_step": _variant(good, fields)}
    with pytest.raises(abi.LayoutError, match="la_gdr_step_args"):
        abi.bind(lib, table, bad)


def test_a_struct_without_mirror_or_a_mirror_without_struct_is_refused():
    lib = native.load()
    table, mirrors = OPS["delta"]
    with pytest.raises(abi.LayoutError, match="describes"):
        abi.bind(lib, table, {"gdr_forward": mirrors["gdr_forward"]})
    ghost = type("Ghost", (abi.Args,), {"_c_name_": "la_ghost_args",
                                         "_fields_": [("x", c_void_p)]})
    with pytest.raises(abi.LayoutError, match="la_ghost_args"):
        abi.bind(lib, table, {**mirrors, "ghost": ghost})


def test_args_need_every_field_by_name():
    cls = delta_native.GdrStepArgs
    full = {name: 0 for name, _ in cls._fields_}
    cls(**full)
    with pytest.raises(TypeError, match="missing.*'work'"):
        cls(**{k: v for k, v in full.items() if k != "work"})
    with pytest.raises(TypeError, match="unexpected keyword argument 'wrok'"):
        cls(**full, wrok=0)
    with pytest.raises(TypeError):
        cls(*full.values())  # never by position


def test_kinds_cover_the_c_types():
    assert abi.KINDS == {"i": c_int, "l": c_long, "f": c_float, "p": c_void_p}
