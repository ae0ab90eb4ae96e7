"""Build a C source shipped with the package into a cached shared library, and load it.

The package ships C sources, not binaries. The first use compiles one with the machine's C
compiler (``$CC``, else ``cc``, ``gcc`` or ``clang``) into a cache folder
(``$XDG_CACHE_HOME/linattn`` or ``~/.cache/linattn``) under a name keyed by a hash of the
source, the flags and the platform; later uses just load it with :mod:`ctypes`. Without a
working compiler :func:`load_library` returns None and the caller keeps its pure fallback.

Beside each library ``<name>-<key>.so`` in the cache:

* ``<name>-<key>.so.sha256``: JSON ``{"size": bytes, "sha256": hex}`` of the library, written
  (atomically) once the library is in place. A library is loaded only when it matches: a
  truncated or corrupt file would crash the process (SIGBUS) inside ``dlopen``, so a mismatch
  or a missing record means "rebuild".
* ``<name>-<key>.so.lock``: held with ``flock`` while building, so concurrent first runs
  compile once (the others wait, then load what the first built). Where ``fcntl`` or file
  locks are unavailable the build runs unlocked (still safe: files are renamed into place).
* ``<name>-<key>.<compiler>.failed``: the output of a compiler that refused the source. While
  it exists later processes do not retry. It expires: ``<compiler>`` hashes the compiler's
  identity (resolved path, its mtime, the first line of ``--version``), so a fixed or changed
  compiler retries, and a marker older than 24 hours is ignored (a transient failure heals).

When a library cannot be had (no compiler, a refusal, a marker) :func:`load_library` warns
once per library and process (RuntimeWarning, one line); an unwritable cache folder warns once
per process and builds in a private temporary folder instead.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from types import ModuleType

from linattn._io import atomic_path, user_cache_dir, write_atomic

fcntl: ModuleType | None
try:
    import fcntl
except ImportError:  # not on Windows (where load_library returns None anyway)
    fcntl = None

__all__ = ["load_library", "compiler", "compiler_identity", "cpu_tag", "cpu_flags", "warn_once"]

#: A ``.failed`` marker older than this is ignored: the build is tried again.
MARKER_TTL_S = 24 * 3600


def compiler() -> str | None:
    cc = os.environ.get("CC")
    if cc and shutil.which(cc):
        return cc
    return next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)


@functools.cache
def compiler_identity(cc: str) -> str:
    """Resolved path, mtime and ``--version`` first line of ``cc`` (once per process): what
    keys a ``.failed`` marker, so that an upgraded or different compiler tries again."""
    path = os.path.realpath(shutil.which(cc) or cc)
    try:
        mtime = os.stat(path).st_mtime_ns
    except OSError:
        mtime = 0
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, timeout=30).stdout
        version = out.decode(errors="replace").partition("\n")[0].strip()
    except (OSError, subprocess.SubprocessError):
        version = ""
    return f"{path}\0{mtime}\0{version}"


_CPU_KEYS = ("flags", "model name", "Features", "CPU implementer", "CPU part")  # x86, ARM


@functools.cache
def _cpu_lines() -> tuple[str, ...]:
    """The distinct /proc/cpuinfo lines that describe the CPU's model and features (read once
    per process), or the platform's processor string where there is no /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return tuple(sorted({ln for ln in f if ln.startswith(_CPU_KEYS)}))
    except OSError:
        return (platform.processor(),)


def cpu_tag() -> str:
    """A short hash of the CPU's model and feature flags: a library built with -march=native
    must not be loaded on another CPU that shares the cache folder."""
    return hashlib.sha256("".join(_cpu_lines()).encode()).hexdigest()[:8]


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (x86 ``flags``, ARM ``Features``), empty where unknown."""
    return frozenset(word for ln in _cpu_lines() if ln.startswith(("flags", "Features"))
                     for word in ln.partition(":")[2].split())


_warned: set[str] = set()


def warn_once(key: str, message: str) -> bool:
    """Emit ``message`` as one line (RuntimeWarning) unless ``key`` was warned already in this
    process; True if it warned. Callers that retry with other flags share the key, so a user
    sees one warning per library."""
    if key in _warned:
        return False
    _warned.add(key)
    warnings.warn(" ".join(message.split()), RuntimeWarning, stacklevel=3)
    return True


class _BuildFailed(Exception):
    """No library: ``reason`` says why, ``log`` is the compiler's output if it was kept."""

    def __init__(self, reason: str, log: Path | None = None) -> None:
        super().__init__(reason)
        self.reason, self.log = reason, log


def _sidecar(target: Path) -> Path:
    return target.with_name(target.name + ".sha256")


def _digest(data: bytes) -> dict[str, int | str]:
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _dlopen(path: Path) -> ctypes.CDLL:
    try:
        return ctypes.CDLL(str(path))
    except OSError as e:
        raise _BuildFailed(f"could not load {path.name}: {e}") from e


def _load_cached(target: Path) -> ctypes.CDLL | None:
    """``target`` if it matches its sidecar record, else None (missing, truncated, corrupt,
    or from an interrupted build): never hand dlopen a file that could crash the process."""
    try:
        want = json.loads(_sidecar(target).read_text())
        if target.stat().st_size != want["size"] or _digest(target.read_bytes()) != want:
            return None
        return _dlopen(target)
    except (OSError, ValueError, TypeError, KeyError, _BuildFailed):
        return None


def _fresh(marker: Path) -> bool:
    try:
        return time.time() - marker.stat().st_mtime < MARKER_TTL_S
    except OSError:
        return False


def _build(cc: str, src: bytes, flags: list[str], target: Path, marker: Path | None) -> None:
    """Compile ``src`` into ``target``, then record its size and hash. Raises _BuildFailed if
    the compiler fails (a refusal also writes ``marker``), OSError if the folder is not
    writable."""
    # Compile beside the target, then rename: a reader never sees half a file.
    with atomic_path(target, suffix=".so") as tmp:
        try:
            done = subprocess.run(
                [cc, *flags, "-shared", "-fPIC", "-o", str(tmp), "-x", "c", "-", "-lm"],
                input=src,
                capture_output=True,
                timeout=120,
            )
        except (OSError, subprocess.SubprocessError) as e:
            raise _BuildFailed(f"{cc} did not run: {e}") from e  # transient: no marker
        if done.returncode != 0:
            err = done.stderr.decode(errors="replace").splitlines()
            first = next((ln for ln in err if "error" in ln), err[0] if err else "")
            try:
                if marker is not None:
                    write_atomic(marker, done.stderr[-4000:])
            except OSError:
                marker = None
            raise _BuildFailed(f"{cc} exited with {done.returncode}: {first[:200]}", marker)
        record = _digest(tmp.read_bytes())
    write_atomic(_sidecar(target), json.dumps(record).encode())  # after the .so is in place


@contextmanager
def _locked(lock: Path) -> Iterator[None]:
    """Hold an exclusive flock on ``lock`` (OSError if it cannot be created)."""
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)  # released when fd closes, or the process dies
            except OSError:
                pass  # a file system without locks: build unlocked
        yield
    finally:
        os.close(fd)


def _build_cached(cc: str, src: bytes, flags: list[str], target: Path, marker: Path) -> ctypes.CDLL:
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked(target.with_name(target.name + ".lock")):
        lib = _load_cached(target)  # another process may have built it while we waited
        if lib is not None:
            return lib
        if _fresh(marker):  # ... or failed to
            raise _BuildFailed("the compiler refused it", marker)
        _build(cc, src, flags, target, marker)
        with suppress(OSError):
            marker.unlink(missing_ok=True)  # an expired marker
    return _dlopen(target)


def _build_private(cc: str, src: bytes, flags: list[str], name: str) -> ctypes.CDLL:
    """Build into a private temporary folder, load, and let the folder go (the loaded library
    stays mapped)."""
    try:
        with tempfile.TemporaryDirectory(prefix="linattn-") as tmp:
            private = Path(tmp) / f"{name}.so"
            _build(cc, src, flags, private, None)
            return _dlopen(private)
    except OSError as e:
        raise _BuildFailed(f"no writable temporary folder: {e}") from e


def load_library(
    source: Path | bytes, name: str, flags: list[str], *, warn: bool = True
) -> ctypes.CDLL | None:
    """``source`` (a C file, or the C text itself) compiled with ``flags`` (built on first
    use), or None where that fails.

    ``name`` prefixes the cached file. Callers remember the outcome, so a failed build is tried
    once per process. A None result warns once per ``name`` and process unless ``warn`` is
    False (for a first attempt the caller retries with other flags)."""
    if sys.platform == "win32":
        return None
    try:
        src = source if isinstance(source, bytes) else source.read_bytes()
    except OSError:
        return None
    cc = compiler()
    key = hashlib.sha256(src + "\0".join([*flags, cc or ""]).encode()).hexdigest()[:16]
    native = "-march=native" in flags
    tag = f"{platform.machine()}-{sys.platform}-{cpu_tag() + '-' if native else ''}{key}"
    target = user_cache_dir() / f"{name}-{tag}.so"
    lib = _load_cached(target)
    if lib is not None:
        return lib
    if cc is None:
        if warn:
            warn_once(
                "no-compiler",
                f"linattn: could not compile {name} (no C compiler found: install cc, gcc or "
                "clang, or set $CC); using the pure PyTorch/Python path.",
            )
        return None
    ident = hashlib.sha256(compiler_identity(cc).encode()).hexdigest()[:8]
    marker = target.with_name(f"{target.stem}.{ident}.failed")
    try:
        if _fresh(marker):
            raise _BuildFailed("the compiler refused it; retried after 24 h", marker)
        try:
            return _build_cached(cc, src, flags, target, marker)
        except OSError as e:  # the cache folder is not writable
            warn_once(
                "cache",
                f"linattn: cannot write the cache folder {target.parent} ({e}); compiling "
                "into a private temporary folder in every process (set XDG_CACHE_HOME to a "
                "writable folder).",
            )
            return _build_private(cc, src, flags, name)
    except _BuildFailed as e:
        if warn:
            log = e.log if e.log is not None else "not kept"
            warn_once(
                f"build:{name}",
                f"linattn: could not compile {name} ({e.reason}); using the pure "
                f"PyTorch/Python path. Compiler output: {log}",
            )
        return None
