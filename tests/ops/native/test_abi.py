"""The C boundary (ops/native/abi.py): the ctypes mirror of every argument struct is built from
the C side's own layout table, matches it exactly in every build, and a call that names a field
the C struct lacks (or leaves one out) is a TypeError naming the kernel and the field."""

from __future__ import annotations

from ctypes import c_float, c_int, c_long, c_void_p

import pytest
import torch

from linattn.ops import native
from linattn.ops.conv import native as conv_native
from linattn.ops.delta import native as delta_native
from linattn.ops.gated import native as gated_native
from linattn.ops.linear import native as linear_native
from linattn.ops.native import abi
from linattn.ops.norm import native as norm_native

#: op -> (its C layout table, its kernels(isa))
OPS = {"linear": ("la_linear_abi", linear_native.kernels),
       "gated": ("la_gated_abi", gated_native.kernels),
       "delta": ("la_delta_abi", delta_native.kernels),
       "conv": ("la_conv_abi", conv_native.kernels),
       "norm": ("la_norm_abi", norm_native.kernels)}

pytestmark = pytest.mark.skipif(native.load() is None,
                                reason=f"compiled path: {native.unavailable_reason()}")


def _lib(isa):
    lib = native.load(isa)
    if lib is None:
        pytest.skip(f"{isa}: {native.unavailable_reason(isa)}")
    return lib


@pytest.mark.parametrize("isa", ["native", "scalar"])
@pytest.mark.parametrize("op", sorted(OPS))
def test_every_mirror_is_the_c_layout(op, isa):
    """Names, order, offsets, sizes and kinds of every field, and the struct sizes, are what
    the compiler laid out, for every struct the table describes (in any build: each library's
    mirrors are built from its own table)."""
    lib = _lib(isa)
    table, kernels = OPS[op]
    c = abi.c_layouts(lib, table)
    fns = kernels(isa)
    assert fns is not None
    structs = {name: fn.struct for name, fn in fns.items() if hasattr(fn, "struct")}
    assert {f"la_{name}_args" for name in structs} == set(c)
    for name, cls in structs.items():
        assert abi.layout_of(cls) == c[f"la_{name}_args"], name
        size, fields = c[f"la_{name}_args"]
        assert fields and size >= fields[-1][1] + fields[-1][2]


def test_each_build_has_its_own_mirrors():
    lib, other = _lib("native"), _lib("scalar")
    a, b = abi.bind(lib, "la_delta_abi"), abi.bind(other, "la_delta_abi")
    assert a["gdr_step"].struct is not b["gdr_step"].struct
    assert abi.layout_of(a["gdr_step"].struct) == abi.layout_of(b["gdr_step"].struct)
    assert a["gdr_step"].c_call is not b["gdr_step"].c_call


def test_binding_a_library_again_leaves_the_first_binding_working():
    """Each bind types function objects of its own: a second bind of the same library (a test
    resetting a kernel set, another op's table) must not retype the first one's entry points
    to its own mirrors."""
    lib = _lib("native")
    first = abi.bind(lib, "la_linear_abi")["mask_add"]
    abi.bind(lib, "la_linear_abi")
    A, ds = torch.ones(1, 2, 2), torch.ones(1, 2)
    assert first(A=A.data_ptr(), B=1, C=2, ds=ds.data_ptr()) == 0


def test_a_field_c_does_not_have_is_a_clear_error():
    fn = abi.bind(_lib("native"), "la_delta_abi")["gdr_step"]
    full = {name: 0 for name, _ in fn.struct._fields_}
    with pytest.raises(TypeError, match=r"la_gdr_step_call\(\) got an unexpected keyword "
                                        r"argument 'wrok'"):
        fn(**full, wrok=0)
    with pytest.raises(TypeError, match=r"la_gdr_step_call\(\) missing .*'work'"):
        fn(**{k: v for k, v in full.items() if k != "work"})
    with pytest.raises(TypeError):
        fn(*full.values())  # never by position


@pytest.mark.parametrize("op, kernel, fields", [("delta", "gdr_step", delta_native.STEP_FIELDS),
                                                 ("gated", "gla_step", gated_native.STEP_FIELDS)])
def test_a_positional_call_names_the_struct_fields_in_order(op, kernel, fields):
    """The decoding steps' positional callers: their field lists are the C structs', in order,
    and the loaded kernels carry them; a list out of order or with a name the struct lacks is a
    LayoutError when bound, never a call with its arguments in the wrong places."""
    fn = abi.bind(_lib("native"), OPS[op][0])[kernel]
    assert tuple(name for name, _ in fn.struct._fields_) == fields
    assert callable(OPS[op][1]("native")[f"{kernel}:positional"])
    swapped = (fields[1], fields[0], *fields[2:])
    with pytest.raises(abi.LayoutError, match="names the fields"):
        fn.positional(swapped)
    with pytest.raises(abi.LayoutError, match="names the fields"):
        fn.positional((*fields[:-1], "wrok"))


def test_the_struct_carries_the_values_given():
    fn = abi.bind(_lib("native"), "la_delta_abi")["gdr_step"]
    values = {name: i + 1 for i, (name, _) in enumerate(fn.struct._fields_)}
    values["scale"] = 0.5
    s = fn.struct(**values)
    assert {name: getattr(s, name) for name in values} == values


@pytest.mark.parametrize("change", ["offset", "size", "kind", "struct size"])
def test_a_table_ctypes_cannot_mirror_is_a_layout_error(change):
    """A field declared with the wrong kind in C (a long described as 'i', say) shows as an
    offset or size that ctypes lays out differently: refused when the library loads."""
    c = abi.c_layouts(_lib("native"), "la_delta_abi")
    size, fields = c["la_gdr_step_args"]
    fields = list(fields)
    name, offset, fsize, kind = fields[1]
    if change == "offset":
        fields[1] = (name, offset + 4, fsize, kind)
    elif change == "size":
        fields[1] = (name, offset, fsize // 2, kind)
    elif change == "kind":
        fields[1] = (name, offset, fsize, "d")
    else:
        size += 8
    with pytest.raises(abi.LayoutError, match="la_gdr_step_args"):
        abi.structure("la_gdr_step_args", (size, tuple(fields)))
    assert abi.layout_of(abi.structure("la_gdr_step_args", c["la_gdr_step_args"])) == \
        c["la_gdr_step_args"]


def test_kinds_cover_the_c_types():
    assert abi.KINDS == {"i": c_int, "l": c_long, "f": c_float, "p": c_void_p}
