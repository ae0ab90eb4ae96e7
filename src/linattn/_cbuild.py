"""Build a C source shipped with the package into a cached shared library, and load it.

The package ships C sources, not binaries. The first use compiles one with the machine's C
compiler (``$CC``, else ``cc``, ``gcc`` or ``clang``) into a cache folder
(``$XDG_CACHE_HOME/linattn`` or ``~/.cache/linattn``) under a name keyed by a hash of the
source, the flags and the platform; later uses just load it with :mod:`ctypes`. Without a
working compiler :func:`load_library` returns None and the caller keeps its pure fallback.
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

from linattn._io import atomic_path, user_cache_dir

__all__ = ["load_library", "compiler", "cpu_tag"]


def compiler() -> str | None:
    cc = os.environ.get("CC")
    if cc and shutil.which(cc):
        return cc
    return next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)


_CPU_KEYS = ("flags", "model name", "Features", "CPU implementer", "CPU part")  # x86, ARM


def cpu_tag() -> str:
    """A short hash of the CPU's model and feature flags: a library built with -march=native
    must not be loaded on another CPU that shares the cache folder."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            lines = sorted({ln for ln in f if ln.startswith(_CPU_KEYS)})
    except OSError:
        lines = [platform.processor()]
    return hashlib.sha256("".join(lines).encode()).hexdigest()[:8]


class _BuildFailed(Exception):
    """The compiler ran and refused the source."""


def _build(src: bytes, flags: list[str], target: Path) -> bool:
    """Compile ``src`` into the shared library ``target``; False if that fails for any reason.

    When the compiler itself refuses (these flags or this source on this compiler), a
    ``.failed`` marker beside the target keeps later processes from trying again."""
    cc = compiler()
    failed = target.with_suffix(".failed")
    if cc is None or failed.exists():
        return False
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        # Compile beside the target, then rename: concurrent first runs never load half a file.
        with atomic_path(target, suffix=".so") as tmp:
            done = subprocess.run(
                [cc, *flags, "-shared", "-fPIC", "-o", str(tmp), "-x", "c", "-", "-lm"],
                input=src,
                capture_output=True,
                timeout=120,
            )
            if done.returncode != 0:
                raise _BuildFailed
    except _BuildFailed:
        try:
            failed.write_bytes(done.stderr[-4000:])
        except OSError:
            pass
        return False
    except (OSError, subprocess.SubprocessError):
        return False
    return True


def _open(path: Path) -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(str(path))
    except OSError:
        return None


def load_library(source: Path, name: str, flags: list[str]) -> ctypes.CDLL | None:
    """``source`` compiled with ``flags`` (built on first use), or None where that fails.

    ``name`` prefixes the cached file. Callers remember the outcome, so a failed build is tried
    once per process."""
    if sys.platform == "win32":
        return None
    try:
        src = source.read_bytes()
    except OSError:
        return None
    key = hashlib.sha256(src + "\0".join([*flags, compiler() or ""]).encode()).hexdigest()[:16]
    native = "-march=native" in flags
    tag = f"{platform.machine()}-{sys.platform}-{cpu_tag() + '-' if native else ''}{key}"
    target = user_cache_dir() / f"{name}-{tag}.so"
    failed = target.with_suffix(".failed")  # the compiler refused (delete it to retry)
    if failed.exists():
        return None
    lib = _open(target) if target.exists() or _build(src, flags, target) else None
    if lib is None and not failed.exists():
        # No writable cache (or a broken file in it): build into a private temporary folder,
        # load, and let the folder go; the loaded library stays mapped.
        with tempfile.TemporaryDirectory(prefix="linattn-") as tmp:
            private = Path(tmp) / f"{name}.so"
            if _build(src, flags, private):
                lib = _open(private)
    return lib
