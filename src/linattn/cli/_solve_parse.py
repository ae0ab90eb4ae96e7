"""The compiled number parser of ``linattn solve``: built from ``_solve_parse.c`` at first use.

Parsing 144 MB of text is most of the exercise's work, and a C loop does it ~5x faster than
anything numpy or Python offer (see docs/bench-ops.md). The package ships the C source, not a
binary: the first call compiles it (:mod:`linattn._cbuild`: the machine's C compiler, a cache
folder keyed by source and platform) and later calls just load it with :mod:`ctypes`. Without a
compiler (or where the build fails its test call in a child interpreter: :data:`CHECK`)
:func:`load` returns None, with one warning, and the caller uses its pure Python/numpy parser.
``LINATTN_SOLVE_PARSER=python`` forces that fallback.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import numpy as np

from linattn import _cbuild

SOURCE = Path(__file__).with_name("_solve_parse.c")

#: The test call a fresh build must pass in a child interpreter before it is used
#: (:func:`linattn._cbuild.build_library`): two numbers parsed, and where they stopped.
CHECK = """\
buf = b"1.5 -2\\n"
out, stop = (ctypes.c_double * 2)(), ctypes.c_longlong()
lib.lap_parse.restype = ctypes.c_longlong
lib.lap_parse.argtypes = [ctypes.c_char_p, ctypes.c_longlong, ctypes.c_longlong,
                          ctypes.c_void_p, ctypes.c_longlong, ctypes.POINTER(ctypes.c_longlong)]
got = lib.lap_parse(buf, len(buf), 0, out, 2, ctypes.byref(stop))
if (got, list(out), stop.value) != (2, [1.5, -2.0], 6):
    raise SystemExit(f"lap_parse gave {got}, {list(out)}, stop {stop.value}")
"""

_lib: ctypes.CDLL | None = None
_tried = False


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    lib.lap_parse.restype = ctypes.c_longlong
    lib.lap_parse.argtypes = [
        ctypes.c_void_p,  # buf
        ctypes.c_longlong,  # len
        ctypes.c_longlong,  # pos
        ctypes.c_void_p,  # out (float64)
        ctypes.c_longlong,  # cap
        ctypes.POINTER(ctypes.c_longlong),  # stop
    ]
    return lib


def load() -> ctypes.CDLL | None:
    """The compiled parser, building it on first use; None where no C compiler works.

    The outcome is remembered for the process, so a failed build is tried once only."""
    global _lib, _tried
    if _tried:
        return _lib
    _tried = True
    if os.environ.get("LINATTN_SOLVE_PARSER", "").lower() == "python":
        return None
    lib = _cbuild.load_library(SOURCE, "solve_parse", ["-O2"], check=CHECK,
                               symbols=("lap_parse",))
    _lib = None if lib is None else _declare(lib)
    return _lib


def parse(lib: ctypes.CDLL, data: bytes, pos: int, out: np.ndarray, start: int) -> tuple[int, int]:
    """Parse numbers of ``data[pos:]`` into ``out[start:]`` (float64, C-contiguous).

    Returns (values stored, stop): ``stop`` is ``len(data)`` when only whitespace was left, the
    first byte of a token the C parser leaves to Python (it is not plain decimal, or not finite),
    or the byte after the last value once ``out`` is full."""
    stop = ctypes.c_longlong()
    buf = ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p)  # no copy: points into `data`
    dst = out.ctypes.data + start * out.itemsize
    got = lib.lap_parse(buf, len(data), pos, dst, out.size - start, ctypes.byref(stop))
    return int(got), int(stop.value)
