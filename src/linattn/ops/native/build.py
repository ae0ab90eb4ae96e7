"""Building and loading the compiled library (part of :mod:`linattn.ops.native`, whose
docstring tells the whole story): the sources joined into one translation unit, the flags of
each ISA build, :func:`load` (built on first use, None where it cannot be had, never an error),
and :class:`KernelSet`, one op's kernels bound per build after the layout check."""

from __future__ import annotations

import ctypes
import os
import re
import threading
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from linattn import _cbuild
from linattn.ops.native.abi import LayoutError, bind

_HERE = Path(__file__).parent
#: The shared header and the library-wide entry points; the op kernels are found beside their
#: ops (``ops/*/kernels.c``), so an op with new kernels needs no line here.
HEADER = _HERE / "common.h"
#: the prefetch plans, joined after common.h (the recurrences' and linear attention's kernels)
AHEAD = _HERE / "ahead.h"
#: the register-blocked products, joined after common.h (ops/linear/kernels.c uses them)
TILES = _HERE / "tiles.h"
SOURCES: list[Path] = [_HERE / "native.c", *sorted(_HERE.parent.glob("*/kernels.c"))]

#: Compiler flags of each build. "native" (the default) targets the CPU at hand, whose vector
#: width and register tiles common.h picks from the compiler's macros; the others build a
#: narrower ISA, to run it where it is faster (the dispatcher's calibration may choose it per
#: form), to measure it on a wider CPU, or to test the scalar form.
ISA_FLAGS = {
    "native": ["-march=native"],
    "avx512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx2", "-mfma"],
    "avx2": ["-mavx2", "-mfma"],
    "generic": [],  # the compiler's baseline: SSE2 on x86-64, NEON on aarch64
    "scalar": ["-DLA_W=1"],
}
#: /proc/cpuinfo flags an ISA build needs to run (x86); a build this CPU cannot run is refused.
_ISA_NEEDS = {"avx512": {"avx512f", "avx512bw", "avx512vl", "avx512dq", "fma"},
              "avx2": {"avx2", "fma"}}

#: The dtype code of a buffer for the kernels that read or write several dtypes (``LA_F32``,
#: ``LA_BF16``, ``LA_F16`` in common.h): what ``vload_dt`` / ``vstore_dt`` take.
DTYPE_CODES: dict[torch.dtype, int] = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


def in_kernel_dtype(t: torch.Tensor | None) -> torch.Tensor | None:
    """A weight, bias or state in a dtype the kernels read (:data:`DTYPE_CODES`): as it is, or
    float32 (float64 weights of a float32 model, say)."""
    if t is None or t.dtype in DTYPE_CODES:
        return t
    return t.float()

_libs: dict[str, ctypes.CDLL | None] = {}
_reasons: dict[str, str] = {}  # isa -> why load(isa) gave None
_LOAD_LOCK = threading.Lock()




def _forget_lock() -> None:
    """A forked child may inherit the load lock held by a thread it does not have."""
    global _LOAD_LOCK
    _LOAD_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_lock)


def source() -> bytes:
    """The one translation unit that is compiled: common.h, ahead.h and tiles.h, then native.c
    and each op's kernels.c, with ``#line`` markers so that compiler messages name the real
    files. (Each .c includes the headers under ``#ifndef LA_COMMON_H`` / ``LA_AHEAD_H`` /
    ``LA_TILES_H``, so the files also compile on their own.) A kernels.c split by concern
    includes its parts, the files beside it (``#include "kernels_<part>.c"``): they are written
    in at that line (:func:`_text`)."""
    return "".join(_text(path) for path in (HEADER, AHEAD, TILES, *SOURCES)).encode()


#: ``#include "<name>.c"`` on a line of its own (a trailing comment allowed): a part of the
#: file that includes it, beside it
_PART = re.compile(r'#include "(\w+\.c)"(?:\s*/\*.*\*/)?\s*')


def _text(path: Path) -> str:
    """One source file as the unit holds it: its parts written in where it includes them, each
    between ``#line`` markers (the part's lines, then the including file's again)."""
    name = f"{path.parent.name}/{path.name}"
    out = [f'#line 1 "{name}"\n']
    for i, line in enumerate(path.read_text().splitlines(keepends=True), 1):
        part = _PART.fullmatch(line)
        if part:
            out.append(f'{_text(path.parent / part[1])}#line {i + 1} "{name}"\n')
        else:
            out.append(line)
    return "".join(out) + "\n"


def required_symbols(src: bytes) -> tuple[str, ...]:
    """The entry points a library built from ``src`` must have: ``la_width``, ``la_tile`` and
    the layout table of each op (``LA_ABI_TABLE(la_<op>_abi, ...)`` in its kernels.c)."""
    tables = sorted(set(re.findall(rb"LA_ABI_TABLE\((la_\w+_abi)\b", src)))
    return ("la_width", "la_tile", *(t.decode() for t in tables))


def _check_code(symbols: tuple[str, ...]) -> str:
    """The test call of a fresh build (run in a child interpreter by :mod:`linattn._cbuild`):
    vector width and register tile are sane and each layout table answers."""
    tables = [s for s in symbols if s.endswith("_abi")]
    return (
        "for name in ('la_width', 'la_tile'):\n"
        "    getattr(lib, name).restype, getattr(lib, name).argtypes = ctypes.c_int, []\n"
        "if lib.la_width() < 1 or lib.la_tile() < 101:\n"
        "    raise SystemExit(f'la_width() = {lib.la_width()}, la_tile() = {lib.la_tile()}')\n"
        f"for name in {tables!r}:\n"
        "    fn = getattr(lib, name)\n"
        "    fn.restype, fn.argtypes = ctypes.c_void_p, [ctypes.c_long]\n"
        "    if not fn(0):\n"
        "        raise SystemExit(name + '(0) is NULL')\n"
    )


def _check_isa(isa: str) -> str:
    if isa not in ISA_FLAGS:
        raise ValueError(f"isa: expected one of {', '.join(ISA_FLAGS)}, got {isa!r}")
    return isa


def can_run(isa: str) -> bool:
    """Whether this CPU can run the ``isa`` build (x86 feature flags; other builds: yes)."""
    return _ISA_NEEDS.get(_check_isa(isa), set()) <= _cbuild.cpu_flags()


def runnable_isas() -> list[str]:
    """The builds worth calibrating against each other on this CPU: "native", and "avx2" too
    where native is wider (an AVX-512 CPU). On some AVX-512 CPUs (AMD Zen 4) the 256-bit build
    is as fast or faster; elsewhere native is the only sensible build."""
    out = ["native"]
    if "avx512f" in _cbuild.cpu_flags() and can_run("avx2"):
        out.append("avx2")
    return out


def load(isa: str = "native") -> ctypes.CDLL | None:
    """The compiled library of one build variant, built on first use, or None where that is not
    possible (no compiler, an ISA this CPU lacks, a refused build): remembered per process."""
    isa = _check_isa(isa)
    lib = _libs.get(isa, False)
    if lib is False:
        with _LOAD_LOCK:
            if isa not in _libs:
                try:
                    _libs[isa] = _load(isa)
                except Exception as e:  # unforeseen: the torch path, never an error in an op
                    _reasons[isa] = f"unexpected {type(e).__name__}: {e}"
                    _cbuild.warn_once(f"load:{isa}", f"linattn: could not load the {isa} build "
                                      f"of the compiled path ({_reasons[isa]}); using the "
                                      "PyTorch path.")
                    _libs[isa] = None
            lib = _libs[isa]
    return lib


def any_loaded() -> ctypes.CDLL | None:
    """A build this process has loaded (the first), or None: for the library-wide entry points
    that every build has alike (``la_run_threads``), without building one for them."""
    return next((lib for lib in list(_libs.values()) if lib is not None), None)


def flag_sets(isa: str) -> list[list[str]]:
    """The compiler flags :func:`load` tries for ``isa``, in order."""
    first = ["-O3", "-fno-math-errno", *ISA_FLAGS[_check_isa(isa)]]
    # OpenMP where the compiler has it (the kernels' own splitting, la_parallel in common.h);
    # a compiler without it (clang lacking libomp) builds the same kernels on one thread
    tries = [[*first, "-fopenmp"], first]
    if isa == "native":
        tries.append(["-O3"])  # a compiler that refuses -march=native
    return tries


def _load(isa: str) -> ctypes.CDLL | None:
    if not can_run(isa):
        _reasons[isa] = f"this CPU cannot run the {isa} build"
        warnings.warn(f"linattn: this CPU cannot run the {isa} build of the compiled path "
                      f"(needs {', '.join(sorted(_ISA_NEEDS[isa]))}); using the PyTorch path",
                      RuntimeWarning, stacklevel=4)
        return None
    try:
        src = source()
    except OSError as e:
        _reasons[isa] = f"the C sources cannot be read ({e})"
        _cbuild.warn_once("native-sources", f"linattn: {_reasons[isa]}; using the PyTorch path.")
        return None
    symbols = required_symbols(src)
    tries = flag_sets(isa)
    for flags in tries:
        try:
            lib = _cbuild.build_library(src, "native", flags, check=_check_code(symbols),
                                        symbols=symbols)
        except _cbuild.BuildError as err:
            if err.other_flags_may_help and flags is not tries[-1]:
                continue  # the compiler refused -march=native: its baseline, without a warning
            _reasons[isa] = err.reason
            _cbuild.warn_failure("native", err)  # once per process
            return None
        for name in ("la_width", "la_tile", "la_amx"):
            getattr(lib, name).restype, getattr(lib, name).argtypes = ctypes.c_int, []
        lib.la_amx_use.restype, lib.la_amx_use.argtypes = ctypes.c_int, [ctypes.c_int]
        if _cbuild.setting("LINATTN_AMX") == "0":
            lib.la_amx_use(0)  # before any kernel asks the OS for the tiles
        return lib
    return None


def unavailable_reason(isa: str = "native") -> str | None:
    """Why :func:`load` gives None (for skip messages and warnings), or None if it loads."""
    if load(isa) is not None:
        return None
    if isa in _reasons:
        return _reasons[isa]
    missing = [p.name for p in (HEADER, AHEAD, TILES, *SOURCES) if not p.exists()]
    if missing:
        return f"the C sources {', '.join(missing)} are not installed beside {__name__}"
    if not can_run(isa):
        return f"this CPU cannot run the {isa} build"
    if _cbuild.compiler() is None:
        return "no C compiler found (cc, gcc, clang or $CC)"
    return "the compiler refused the kernels (its output is in a .failed file in the cache)"


def describe(isa: str = "native") -> str:
    """One line on a build: ISA, vector width, register tile (or why there is none)."""
    lib = load(isa)
    if lib is None:
        return f"{isa}: not available ({unavailable_reason(isa)})"
    tile = lib.la_tile()
    return f"{isa}: {lib.la_width()}-float vectors, {tile // 100}x{tile % 100} register tile"


class KernelSet:
    """One op's kernels — every ``la_<kernel>_call`` entry point its C layout table ``table``
    describes (``la_<op>_abi``), each taking its argument struct's fields by keyword
    (:func:`~linattn.ops.native.abi.bind`: the ctypes mirrors are built from the table) — bound
    per ISA build on first use. ``extra(lib)`` may add plain functions of the library (name ->
    typed ctypes function); ``positional`` (kernel -> its fields in order) adds
    ``"<kernel>:positional"``, the kernel taking them by position, the names checked against
    the struct's once, here (``.positional`` of :func:`~linattn.ops.native.abi.bind`'s
    functions)."""

    def __init__(self, table: str,
                 extra: Callable[[ctypes.CDLL], dict] | None = None,
                 positional: dict[str, tuple[str, ...]] | None = None) -> None:
        self.table, self.extra, self.positional = table, extra, positional or {}
        self._bound: dict[str, dict | None] = {}
        self._why: dict[str, str] = {}

    def get(self, isa: str = "native") -> dict | None:
        """The kernels of the ``isa`` build (name -> ctypes function), or None where that build
        cannot be had or its layouts do not match (:meth:`unavailable` says why)."""
        fns = self._bound.get(isa, False)
        if fns is False:
            lib = load(isa)
            fns = None
            if lib is not None:
                try:
                    fns = bind(lib, self.table)
                    for kernel, fields in self.positional.items():
                        fns[f"{kernel}:positional"] = fns[kernel].positional(fields)
                    if self.extra is not None:
                        fns.update(self.extra(lib))
                except (LayoutError, AttributeError) as err:
                    fns = None
                    self._why[isa] = f"its argument structs cannot be mirrored ({err})"
            self._bound[isa] = fns
        return fns

    def unavailable(self, isa: str = "native") -> str | None:
        """Why :meth:`get` gives None for ``isa``, or None if it loads."""
        if self.get(isa) is not None:
            return None
        return self._why.get(isa) or unavailable_reason(isa)


def build_or_native(get: Callable[[str], dict | None], isa: str) -> dict | None:
    """``get(isa)``, else this machine's native build: a traced program names the build chosen
    where it was traced, which another CPU may lack. None where neither loads (the ops then
    compute the same function with torch operations)."""
    fns = get(isa)
    return fns if fns is not None or isa == "native" else get("native")


def check_rc(rc: int, name: str) -> None:
    """The kernels return -1 on sizes they do not take: a bug in the caller, never silence (an
    ``assert`` would vanish under ``python -O``)."""
    if rc != 0:
        raise RuntimeError(f"linattn native path: {name} refused its sizes (rc={rc})")


def bf16_products() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AVX512-BF16 or AMX on x86, the BF16
    extension on aarch64), so that torch's bfloat16 matmuls beat float32 ones."""
    return bool({"avx512_bf16", "amx_bf16", "bf16"} & _cbuild.cpu_flags())


def amx_tiles(isa: str = "native") -> bool:
    """Whether the ``isa`` build multiplies bfloat16 on AMX tiles here: compiled for a CPU with
    AMX-BF16, the OS handing the tiles to this process, and ``LINATTN_AMX`` not off
    (``la_amx`` in ops/native/native.c)."""
    if "amx_bf16" not in _cbuild.cpu_flags():
        return False
    lib = load(isa)
    return lib is not None and bool(lib.la_amx())
