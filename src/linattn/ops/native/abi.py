"""The C boundary of the compiled kernels: one argument struct per kernel, declared in C only.

Every kernel that Python calls takes a single pointer to its argument struct
(``la_<kernel>_args``, ``int la_<kernel>_call(const la_<kernel>_args *)``). The C side declares
each struct once, as a field list from which it also builds a table of the struct's layout
(``la_<op>_abi(i)``: name, size and, per field, name, offset, size and kind; see
``ops/native/common.h``). :func:`bind` reads that table from the library it loaded and builds
the ctypes mirror of each struct from it (:func:`structure`), so Python never spells a struct:
a kernel is called with its fields by keyword, ``fns["phi"](kind=0, x=..., ...)``, and a field
the C struct does not have (or one it has that the call leaves out) is a ``TypeError`` naming
the kernel and the field, never a call that reads its arguments from the wrong place.

Each library gets its own mirrors (a process may load several ISA builds; their layouts are
the same, but each build describes its own). A table whose layout ctypes would not reproduce
(a kind the mirror cannot express, an offset or size ctypes lays out differently: a field
declared with the wrong kind) is a :class:`LayoutError` when the library loads.

Why structs and ctypes rather than a compiled torch extension: the kernels build in about a
second with any C compiler, need no torch headers, build in every ISA variant from one source
(and under qemu for aarch64 in CI), and a machine without a compiler still imports linattn. What
a compiled extension would add — the C signature checked by the compiler — is what the mirror
built from the compiler's own layout gives here. Named fields also keep the call sites
readable: a kernel with 28 arguments is called with 28 keywords, not 28 positions.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from ctypes import POINTER, c_char, c_char_p, c_float, c_int, c_long, c_void_p

__all__ = ["LayoutError", "bind", "c_layouts", "layout_of", "structure", "KINDS"]

#: the C side's kind letters and the ctypes types that mirror them
KINDS: dict[str, type] = {"i": c_int, "l": c_long, "f": c_float, "p": c_void_p}
_KIND_OF = {t: k for k, t in KINDS.items()}


class LayoutError(RuntimeError):
    """A C layout table that ctypes cannot mirror exactly (the library is not used)."""


class _Field(ctypes.Structure):
    _fields_ = [("name", c_char_p), ("offset", c_long), ("size", c_long), ("kind", c_char)]


class _Struct(ctypes.Structure):
    _fields_ = [("name", c_char_p), ("size", c_long), ("nfields", c_long),
                ("fields", POINTER(_Field))]


Layout = tuple[int, tuple[tuple[str, int, int, str], ...]]


def c_layouts(lib: ctypes.CDLL, table: str) -> dict[str, Layout]:
    """The structs the library describes in ``table`` (``la_<op>_abi``): C name -> (size,
    ((field, offset, size, kind), ...))."""
    fn = getattr(lib, table)
    fn.restype, fn.argtypes = POINTER(_Struct), [c_long]
    out: dict[str, Layout] = {}
    i = 0
    while True:
        ptr = fn(i)
        if not ptr:
            return out
        s = ptr.contents
        fields = tuple((s.fields[j].name.decode(), s.fields[j].offset, s.fields[j].size,
                        s.fields[j].kind.decode()) for j in range(s.nfields))
        out[s.name.decode()] = (s.size, fields)
        i += 1


def layout_of(cls: type[ctypes.Structure]) -> Layout:
    """The layout ctypes gives a Structure, in the form of :func:`c_layouts`."""
    fields = []
    for name, ctype in cls._fields_:
        desc = getattr(cls, name)
        fields.append((name, desc.offset, desc.size, _KIND_OF.get(ctype, "?")))
    return ctypes.sizeof(cls), tuple(fields)


def structure(name: str, layout: Layout) -> type[ctypes.Structure]:
    """The ctypes mirror of the C struct ``name`` with ``layout`` (from :func:`c_layouts`);
    LayoutError unless ctypes lays it out exactly as the compiler did."""
    size, fields = layout
    unknown = [(f, kind) for f, _, _, kind in fields if kind not in KINDS]
    if unknown:
        raise LayoutError(f"{name}: fields of kinds the mirror does not know: {unknown}")
    cls = type(name, (ctypes.Structure,), {"_fields_": [(f, KINDS[kind])
                                                        for f, _, _, kind in fields]})
    mine = layout_of(cls)
    if mine != layout:
        diff = next(((a, b) for a, b in zip(mine[1], fields, strict=True) if a != b),
                    ("size", "size"))
        raise LayoutError(f"{name}: ctypes cannot mirror the C struct (size {mine[0]} vs "
                          f"{size}; first difference ctypes {diff[0]} vs C {diff[1]})")
    return cls


def _caller(kernel: str, cls: type[ctypes.Structure], fn: Callable) -> Callable[..., int]:
    """``la_<kernel>_call(*, <every field>)``: the struct built from the keywords (every
    field, by name only), passed to the C entry point ``fn``; returns its status. Generated
    with keyword-only parameters, so that Python itself refuses a missing or an unknown field
    with a TypeError naming the kernel and the field, at a third of the cost of ctypes' own
    keyword initialisation (this is on every decoding step). ``.struct`` is the mirror,
    ``.c_call`` the entry point taking a struct."""
    names = [f for f, _ in cls._fields_]
    if not all(f.isidentifier() for f in names):
        raise LayoutError(f"{cls.__name__}: a field name is no identifier: {names}")
    params = ", ".join(names)
    name = f"la_{kernel}_call"
    namespace: dict = {"_fn": fn, "_struct": cls}
    code = compile(f"def {name}(*, {params}):\n    return _fn(_struct({params}))", __file__,
                   "exec")  # (tracebacks and profiles name this file)
    exec(code, namespace)  # noqa: S102
    call = namespace[name]
    call.__doc__ = f"{name}: the fields of {cls.__name__} by keyword ({params})."
    call.struct, call.c_call = cls, fn
    call.positional = lambda fields: _positional_caller(name, cls, fn, fields)
    return call


def _positional_caller(name: str, cls: type[ctypes.Structure], fn: Callable,
                       fields: tuple[str, ...]) -> Callable[..., int]:
    """``name`` taking the struct's fields by position, for a call site that names them once,
    in ``fields``: LayoutError unless they are the struct's fields in its order (so that the
    compiler's layout is still what decides, checked when the library loads, not at each call).
    For the decoding steps: 18 keywords cost ~1.2 µs more than positions (of a ~18 µs step at
    H = 16, K = V = 64, 2 threads, Intel Xeon family 6)."""
    names = tuple(f for f, _ in cls._fields_)
    if tuple(fields) != names:
        raise LayoutError(f"{name}: a positional call names the fields {tuple(fields)}, the C "
                          f"struct {cls.__name__} has {names}")
    params = ", ".join(names)
    namespace: dict = {"_fn": fn, "_struct": cls}
    exec(compile(f"def {name}({params}):\n    return _fn(_struct({params}))", __file__,  # noqa: S102
                 "exec"), namespace)
    return namespace[name]


def bind(lib: ctypes.CDLL, table: str) -> dict[str, Callable[..., int]]:
    """Every kernel the layout table ``table`` describes (``la_<kernel>_args`` ->
    ``la_<kernel>_call``), as kernel name -> a function taking the struct's fields by keyword
    (:func:`_caller`), with mirrors built from this library's own table. The kernels return 0,
    or -1 on sizes they do not take. LayoutError where a struct cannot be mirrored or is no
    ``la_<kernel>_args``; AttributeError where the library lacks an entry point."""
    fns = {}
    for c_name, layout in c_layouts(lib, table).items():
        if not (c_name.startswith("la_") and c_name.endswith("_args")):
            raise LayoutError(f"{table}: {c_name} is no la_<kernel>_args struct")
        kernel = c_name[3:-5]
        cls = structure(c_name, layout)
        # a function object of its own (lib[...], not getattr, which hands every caller the
        # same one): another bind of this library types its own with its own mirrors
        fn = lib[f"la_{kernel}_call"]
        fn.argtypes, fn.restype = [POINTER(cls)], c_int
        fns[kernel] = _caller(kernel, cls, fn)
    if not fns:
        raise LayoutError(f"{table} describes no struct")
    return fns
