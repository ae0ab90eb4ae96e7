"""The C boundary of the compiled kernels: one argument struct per kernel, checked at load.

Every kernel that Python calls takes a single pointer to its argument struct
(``la_<kernel>_args``, ``int la_<kernel>_call(const la_<kernel>_args *)``). The C side declares
each struct once, as a field list from which it also builds a table of the struct's layout
(``la_<op>_abi(i)``: name, size and, per field, name, offset, size and kind; see
``ops/native/common.h``). Here each struct is mirrored as an :class:`Args` subclass, and
:func:`bind` compares every mirror with that table before it hands out a kernel: a field
added, removed, reordered or retyped on one side only is a :class:`LayoutError` when the library
loads, never a call that reads its arguments from the wrong place.

Why structs and ctypes rather than a compiled torch extension: the kernels build in about a
second with any C compiler, need no torch headers, build in every ISA variant from one source
(and under qemu for aarch64 in CI), and a machine without a compiler still imports linattn. What
a compiled extension would add — the C signature checked by the compiler — is what the layout
check gives here, at load time. Named fields also keep the call sites readable: a kernel with
28 arguments is called with 28 keywords, not 28 positions.
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, c_char, c_char_p, c_float, c_int, c_long, c_void_p

__all__ = ["Args", "LayoutError", "bind", "c_layouts", "layout_of", "KINDS"]

#: the C side's kind letters and the ctypes types that mirror them
KINDS: dict[str, type] = {"i": c_int, "l": c_long, "f": c_float, "p": c_void_p}
_KIND_OF = {t: k for k, t in KINDS.items()}


class LayoutError(RuntimeError):
    """A ctypes mirror does not match its C struct (the library is not used)."""


class Args(ctypes.Structure):
    """Base of the argument-struct mirrors. Subclasses set ``_c_name_`` (the C typedef) and
    ``_fields_``; instances are built with every field given by keyword (a forgotten field would
    otherwise be a silent 0 or NULL, a misspelt one an error only at run time)."""

    _c_name_ = ""
    _fields_: list = []

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        names = [name for name, _ in cls.__dict__.get("_fields_", [])]
        if not names:
            return
        # A generated __init__ with keyword-only parameters: Python itself refuses a missing or
        # an unknown field, and the call costs a third of ctypes' keyword initialisation (this
        # is on every decoding step).
        params, values = ", ".join(names), ", ".join(names)
        namespace: dict = {"_init": ctypes.Structure.__init__}
        exec(f"def __init__(self, *, {params}):\n    _init(self, {values})", namespace)  # noqa: S102
        cls.__init__ = namespace["__init__"]


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


def layout_of(cls: type[Args]) -> Layout:
    """The layout ctypes gives a mirror, in the form of :func:`c_layouts`."""
    fields = []
    for name, ctype in cls._fields_:
        desc = getattr(cls, name)
        fields.append((name, desc.offset, desc.size, _KIND_OF.get(ctype, "?")))
    return ctypes.sizeof(cls), tuple(fields)


def check(lib: ctypes.CDLL, table: str, mirrors: dict[str, type[Args]]) -> None:
    """LayoutError unless every mirror matches its C struct exactly and the table describes no
    struct that has no mirror."""
    have = c_layouts(lib, table)
    wanted = {cls._c_name_: cls for cls in mirrors.values()}
    if set(have) != set(wanted):
        raise LayoutError(f"{table}: the library describes {sorted(have)}, Python mirrors "
                          f"{sorted(wanted)}")
    for name, cls in wanted.items():
        mine, theirs = layout_of(cls), have[name]
        if mine != theirs:
            diff = next(((a, b) for a, b in zip(mine[1], theirs[1], strict=False) if a != b),
                        (len(mine[1]), len(theirs[1])))
            raise LayoutError(f"{name}: the ctypes mirror does not match the C struct (size "
                              f"{mine[0]} vs {theirs[0]}; first difference Python {diff[0]} "
                              f"vs C {diff[1]})")


def bind(lib: ctypes.CDLL, table: str, mirrors: dict[str, type[Args]]) -> dict[str, object]:
    """The entry points ``la_<kernel>_call`` of ``mirrors`` (kernel name -> its Args mirror),
    typed to take their struct, after :func:`check`. Call them as ``fn(args)`` (ctypes passes
    the struct by reference); they return 0, or -1 on sizes the kernel does not take."""
    check(lib, table, mirrors)
    fns = {}
    for kernel, cls in mirrors.items():
        fn = getattr(lib, f"la_{kernel}_call")
        fn.argtypes, fn.restype = [POINTER(cls)], c_int
        fns[kernel] = fn
    return fns
