"""The compiled number parser of ``linattn solve``: built from ``_solve_parse.c`` at first use.

Parsing 144 MB of text is most of the exercise's work, and a C loop does it ~5x faster than
anything numpy or Python offer (see docs/benchmarks.md). The package ships the C source, not a
binary: the first call compiles it with the machine's C compiler (``$CC``, else ``cc``, ``gcc`` or
``clang``) into a cache folder (``$XDG_CACHE_HOME/linattn`` or ``~/.cache/linattn``) keyed by a
hash of the source and the platform, and later calls just load it with :mod:`ctypes`. Without a
compiler :func:`load` returns None and the caller uses its pure Python/numpy parser.
``LINATTN_SOLVE_PARSER=python`` forces that fallback.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from linattn._io import atomic_path

SOURCE = Path(__file__).with_name("_solve_parse.c")

_lib: ctypes.CDLL | None = None
_tried = False


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "linattn"


def _compiler() -> str | None:
    cc = os.environ.get("CC")
    if cc and shutil.which(cc):
        return cc
    return next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)


class _BuildFailed(Exception):
    """The compiler ran and refused the source."""


def _build(src: bytes, target: Path) -> bool:
    """Compile ``src`` into the shared library ``target``; False if that fails for any reason."""
    cc = _compiler()
    if cc is None:
        return False
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        # Compile beside the target, then rename: concurrent first runs never load half a file.
        with atomic_path(target, suffix=".so") as tmp:
            done = subprocess.run(
                [cc, "-O2", "-shared", "-fPIC", "-o", str(tmp), "-x", "c", "-"],
                input=src,
                capture_output=True,
                timeout=120,
            )
            if done.returncode != 0:
                raise _BuildFailed
    except (OSError, subprocess.SubprocessError, _BuildFailed):
        return False
    return True


def _open(path: Path) -> ctypes.CDLL | None:
    try:
        lib = ctypes.CDLL(str(path))
    except OSError:
        return None
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
    if os.environ.get("LINATTN_SOLVE_PARSER", "").lower() == "python" or sys.platform == "win32":
        return None
    try:
        src = SOURCE.read_bytes()
    except OSError:
        return None
    tag = f"{platform.machine()}-{sys.platform}-{hashlib.sha256(src).hexdigest()[:16]}"
    target = _cache_dir() / f"solve_parse-{tag}.so"
    if target.exists() or _build(src, target):
        _lib = _open(target)
    if _lib is None:
        # No writable cache (or a broken file in it): build into a private temporary folder,
        # load, and let the folder go; the loaded library stays mapped.
        with tempfile.TemporaryDirectory(prefix="linattn-") as tmp:
            private = Path(tmp) / "solve_parse.so"
            if _build(src, private):
                _lib = _open(private)
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
