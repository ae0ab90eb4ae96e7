"""Build a C source shipped with the package into a cached shared library, and load it.

The package ships C sources, not binaries. The first use compiles one with the machine's C
compiler (``$CC``, else ``cc``, ``gcc`` or ``clang``) into a cache folder
(``$XDG_CACHE_HOME/linattn`` or ``~/.cache/linattn``) under a name keyed by a hash of the
source, the flags and the platform; later uses just load it with :mod:`ctypes`. Without a
working compiler :func:`load_library` returns None and the caller keeps its pure fallback.

A fresh build is *test-loaded in a child interpreter* before anything else trusts it: the
child dlopens it, looks up the entry points the caller names (``symbols``) and runs the
caller's test call (``check``, a few lines of Python with ``lib`` and ``ctypes`` in scope). A
file that would crash the process (a truncated output: SIGBUS inside ``dlopen``; foreign
instructions: SIGILL) or that is not the expected library fails there, is deleted and recorded
as a failed build. Only then is its record written, so a record vouches for a tested library.

Beside each library ``<name>-<key>.so`` in the cache:

* ``<name>-<key>.so.sha256``: JSON ``{"size": bytes, "sha256": hex, "check": seal}`` of the
  library, written (atomically) once the library is in place and passed its test load;
  ``seal`` hashes the test it passed *and the library's own hash*, so it vouches for those
  bytes only. A library is loaded only when size and hash match: a truncated or corrupt file
  would crash the process (SIGBUS in dlopen), so a mismatch or a missing record means
  "rebuild". A record whose seal does not vouch for the file (an older linattn, another test,
  a record rewritten to the size and hash of a truncated file) gets the child test load
  first, and a file shorter than its own ELF headers say (:func:`elf_complete`) is never
  opened in this process at all. A library that loads but lacks an entry point of
  ``symbols`` (a foreign file with a matching record) is not used: its record is removed, so
  the next process rebuilds.
* ``<name>-<key>.so.lock``: held with ``flock`` while building, so concurrent first runs
  compile once (the others wait, then load what the first built; for at most twice the
  compiler timeout and 30 s). Where ``fcntl`` or file locks are unavailable the build runs unlocked
  (still safe: files are renamed into place).
* ``<name>-<key>.<compiler>.failed``: the output of a compiler that refused the source, or the
  reason its library failed the test load. While it exists later processes do not retry. It
  expires: ``<compiler>`` hashes the compiler's identity (resolved path, its mtime, the first
  line of ``--version``), so a fixed or changed compiler retries, and a marker older than 24
  hours is ignored (a transient failure heals).

And one beside them all, per compiler:

* ``cc-<compiler>.timeout``: the compiler did not finish within ``LINATTN_CC_TIMEOUT`` seconds
  (default 60; a first build takes seconds), or did not answer ``--version``. It was stopped
  with its children (it runs in a session of its own, whose process group is killed), no other
  flags are tried (a hang is not a flag problem: a license server, a network file system, a
  wrapper waiting for a remote cache), and for 24 hours every build with that compiler is
  skipped at once, unless ``LINATTN_CC_TIMEOUT`` is raised above the timeout recorded in the
  marker. ``<compiler>`` hashes only path and mtime here (asking a hung compiler its version
  would hang too).

A failure of the machine rather than of the compiler (a full disk, a quota, a read-only or
unwritable folder, memory: "No space left on device" in the compiler's output, or the compiler
killed by a signal) writes no marker: the next process tries again. :class:`BuildError` says
which kind of failure it was (:attr:`BuildError.kind`), so that a caller retries other flags
only where the compiler refused these ones.

When a library cannot be had :func:`load_library` warns once per library and process
(RuntimeWarning, one line) and returns None; it never raises. An unwritable cache folder warns
once per process and builds in a private temporary folder instead.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from linattn._ccompiler import compiler, compiler_identity
from linattn._ccompiler import quick_identity as _quick_identity
from linattn._ccompiler import run as _run
from linattn._ccompiler import signame as _signame
from linattn._ccompiler import version as _version
from linattn._io import atomic_path, user_cache_dir, write_atomic
from linattn._native_env import (
    CC_TIMEOUT_S,
    ISA_NAMES,
    SETTINGS,
    cc_timeout,
    check_environment,
    cpu_flags,
    cpu_tag,
    isa_setting,
    native_setting,
    setting,
    warn_once,
)

fcntl: ModuleType | None
try:
    import fcntl
except ImportError:  # not on Windows (where load_library returns None anyway)
    fcntl = None

__all__ = ["load_library", "build_library", "library_path", "BuildError", "warn_failure",
           "compiler", "compiler_identity", "cc_timeout", "cpu_tag", "cpu_flags", "warn_once",
           "native_setting", "isa_setting", "check_environment", "ISA_NAMES", "SETTINGS",
           "setting", "CC_TIMEOUT_S"]

#: A ``.failed`` or ``.timeout`` marker older than this is ignored: the build is tried again.
MARKER_TTL_S = 24 * 3600


class BuildError(Exception):
    """No library, and why (``reason``). ``kind``:

    * ``"refused"``: the compiler rejected the source or a flag (a ``.failed`` marker, ``log``);
    * ``"unusable"``: it built, but the library failed its test load in a child interpreter
      (deleted; a ``.failed`` marker);
    * ``"timeout"``: the compiler did not finish in time (stopped; a ``.timeout`` marker);
    * ``"environment"``: the machine failed the build (disk full, quota, permissions, memory, a
      build lock held too long), not the compiler: no marker, the next process tries again;
    * ``"foreign"``: a cached library with a matching record lacks the entry points (its record
      is removed: the next process rebuilds);
    * ``"no-compiler"``, ``"missing"`` (the source), ``"unsupported"`` (Windows), ``"error"``
      (anything unforeseen).

    ``log`` is the marker that keeps the details, if one was written."""

    def __init__(self, reason: str, kind: str, log: Path | None = None) -> None:
        super().__init__(reason)
        self.reason, self.kind, self.log = reason, kind, log

    @property
    def other_flags_may_help(self) -> bool:
        """Whether a build with other flags may succeed: the compiler refused these, or what it
        built with them did not load (a hang or a full disk is no flag problem)."""
        return self.kind in ("refused", "unusable")


@dataclass(frozen=True)
class _Job:
    cc: str
    src: bytes
    flags: list[str]
    check: str
    symbols: tuple[str, ...]
    timeout: float

    @property
    def seal(self) -> str:
        return _seal(self.check, self.symbols)


def _seal(check: str, symbols: Sequence[str]) -> str:
    """What a record says its library passed: a hash of the test load."""
    return hashlib.sha256(json.dumps([check, list(symbols)]).encode()).hexdigest()[:16]


def _sidecar(target: Path) -> Path:
    return target.with_name(target.name + ".sha256")


def _digest(data: bytes) -> dict[str, int | str]:
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _vouched(seal: str, digest: dict[str, int | str]) -> str:
    """A record's ``check``: the test load ``seal`` bound to the bytes that passed it."""
    return hashlib.sha256(f"{seal}:{digest['size']}:{digest['sha256']}".encode()
                          ).hexdigest()[:16]


def _write_record(target: Path, seal: str) -> None:
    """Record ``target``'s size and hash, and the test load these bytes passed (``seal``)."""
    digest = _digest(target.read_bytes())
    write_atomic(_sidecar(target), json.dumps({**digest, "check": _vouched(seal, digest)}
                                              ).encode())


def elf_complete(data: bytes) -> bool:
    """Whether ``data`` holds every byte its ELF headers point to (the program and section
    header tables and each segment's file bytes). A truncated shared library maps pages past
    its end, and dlopen dies of SIGBUS on them. A file that is not ELF (Mach-O, ...) passes:
    its record's hash and the test load are the checks there."""
    import struct

    if data[:4] != b"\x7fELF":
        return True
    if len(data) < 52:
        return False
    wide, order = data[4] == 2, "<" if data[5] == 1 else ">"
    try:
        if wide:
            phoff, shoff = struct.unpack_from(order + "QQ", data, 32)
            phentsize, phnum, shentsize, shnum = struct.unpack_from(order + "HHHH", data, 54)
        else:
            phoff, shoff = struct.unpack_from(order + "II", data, 28)
            phentsize, phnum, shentsize, shnum = struct.unpack_from(order + "HHHH", data, 42)
        if phoff + phnum * phentsize > len(data) or shoff + shnum * shentsize > len(data):
            return False
        for i in range(phnum):  # each segment's bytes in the file: p_offset + p_filesz
            at = phoff + i * phentsize
            if wide:
                offset, filesz = struct.unpack_from(order + "Q8x8xQ", data, at + 8)
            else:
                offset, filesz = struct.unpack_from(order + "I8xI", data, at + 4)
            if offset + filesz > len(data):
                return False
    except struct.error:
        return False
    return True


def _mark(marker: Path | None, data: bytes) -> Path | None:
    """Write ``marker`` (atomically); the marker, or None where it was not written."""
    if marker is None:
        return None
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(marker, data)
    except OSError:
        return None
    return marker


#: Run in a child interpreter (``python -I -S -c``): argv = library, test code, entry points.
_TEST_LOAD = """\
import ctypes, sys
print("loading", flush=True)
lib = ctypes.CDLL(sys.argv[1])
missing = [s for s in sys.argv[3:] if not hasattr(lib, s)]
if missing:
    sys.exit("it lacks the entry points " + ", ".join(missing))
exec(sys.argv[2], {"ctypes": ctypes, "lib": lib})
print("ok")
"""


def _test_load(path: Path, job: _Job) -> None:
    """Load ``path`` in a child interpreter, look up ``job.symbols`` and run ``job.check``
    there: a library that would crash this process (SIGBUS on a truncated file, SIGILL on
    instructions this CPU lacks) or that is not the expected one fails in the child. Raises
    BuildError "unusable" (or "environment" where no child could be run)."""
    exe = sys.executable
    if not exe:
        raise BuildError("no Python executable to test-load it in", "environment")
    try:
        done = _run([exe, "-I", "-S", "-c", _TEST_LOAD, str(path), job.check, *job.symbols],
                    None, job.timeout)
    except subprocess.TimeoutExpired:
        raise BuildError(f"its test load did not finish within {job.timeout:g} s",
                         "unusable") from None
    except (OSError, subprocess.SubprocessError) as e:
        raise BuildError(f"could not start {exe} to test-load it: {e}", "environment") from e
    if done.returncode == 0 and done.stdout.strip().endswith(b"ok"):
        return
    if not done.stdout.startswith(b"loading"):  # not the library's fault: no Python ran
        raise BuildError(f"{exe} did not run the test load (exit status {done.returncode})",
                         "environment")
    if done.returncode == -signal.SIGKILL:  # the OOM killer, most likely
        raise BuildError("its test load was killed (SIGKILL: out of memory?)", "environment")
    if done.returncode < 0:
        why = f"the child that loaded it died of {_signame(-done.returncode)}"
    else:
        lines = done.stderr.decode(errors="replace").strip().splitlines()
        why = (lines[-1] if lines else f"exit status {done.returncode}")[:300]
    raise BuildError(f"the library it built failed its test load: {why}", "unusable")


def _load_cached(target: Path, job: _Job) -> ctypes.CDLL | None:
    """``target`` if it matches its record, else None (missing, truncated, corrupt, or from an
    interrupted build): never hand dlopen a file that could crash the process. A record
    without this test's seal gets the test load first. Raises BuildError "foreign" where the
    library loads but lacks an entry point of ``job.symbols``."""
    sidecar = _sidecar(target)
    try:
        record = json.loads(sidecar.read_text())
        if not isinstance(record, dict):
            return None
        data = target.read_bytes()
        digest = _digest(data)
        if digest != {"size": record.get("size"), "sha256": record.get("sha256")} or \
                not elf_complete(data):
            return None
    except (OSError, ValueError, RecursionError):  # a record nested too deeply: no record
        return None
    if record.get("check") != _vouched(job.seal, digest):  # not these bytes' test load
        try:
            _test_load(target, job)
        except BuildError:
            return None  # rebuild
        with suppress(OSError):
            write_atomic(sidecar, json.dumps({**digest, "check": _vouched(job.seal, digest)}
                                             ).encode())
    try:
        lib = ctypes.CDLL(str(target))
    except OSError:
        return None
    missing = [s for s in job.symbols if not hasattr(lib, s)]
    if missing:
        with suppress(OSError):
            sidecar.unlink()
        raise BuildError(f"the cached {target} is not the library it should be (it lacks "
                         f"{', '.join(missing)}); removed its record, so that the next process "
                         "builds it again", "foreign")
    return lib


def _fresh(marker: Path) -> bool:
    try:
        return time.time() - marker.stat().st_mtime < MARKER_TTL_S
    except OSError:
        return False


#: Compilers that timed out in this process -> the timeout they had (where no marker could be
#: written, this still spares the process a second wait).
_hung_here: dict[str, float] = {}


def _hung_before(hung: Path, job: _Job) -> None:
    """BuildError "timeout" where this compiler timed out in this process, or a fresh
    ``.timeout`` marker recorded, with a timeout at least as long as this one."""
    if job.timeout <= _hung_here.get(job.cc, 0.0):
        raise BuildError(f"{job.cc} did not finish within {_hung_here[job.cc]:g} s earlier in "
                         "this process", "timeout", hung if _fresh(hung) else None)
    if not _fresh(hung):
        return
    try:
        recorded = float(json.loads(hung.read_text())["timeout"])
    except (OSError, ValueError, TypeError, KeyError, RecursionError):
        recorded = math.inf
    if job.timeout <= recorded:
        raise _timed_out(job, recorded, hung, before=True)


def _hang_record(job: _Job) -> bytes:
    """The ``.timeout`` marker's text (and this process remembers the hang too)."""
    _hung_here[job.cc] = max(job.timeout, _hung_here.get(job.cc, 0.0))
    return json.dumps({"timeout": job.timeout, "cc": job.cc}).encode()


def _timed_out(job: _Job, seconds: float, hung: Path | None, before: bool = False) -> BuildError:
    when = "in an earlier process" if before else "and was stopped with its children"
    return BuildError(f"{job.cc} did not finish within {seconds:g} s {when}", "timeout", hung)


#: Compiler messages that blame the machine, not the source: no marker, the next process tries.
_ENVIRONMENT = (
    ("No space left on device", "the disk is full"),
    ("Disk quota exceeded", "the disk quota is exceeded"),
    ("Read-only file system", "the file system is read-only"),
    ("Permission denied", "permission denied"),
    ("Cannot allocate memory", "out of memory"),
    ("memory exhausted", "out of memory"),
    ("File size limit exceeded", "a file size limit (ulimit -f) was reached"),
    ("File too large", "a file size limit (ulimit -f) was reached"),
    ("Killed signal terminated program", "the compiler was killed (out of memory?)"),
    # any other signal that ended one of the compiler's own programs (cc1, as, ld): the
    # machine stopped it, the source was not refused
    ("signal terminated program", "a compiler process was stopped by a signal"),
)


def _failed(job: _Job, done: subprocess.CompletedProcess, marker: Path | None) -> BuildError:
    """What a non-zero exit of the compiler means: "environment" where its output blames the
    machine (or it was killed by a signal), else "refused" (and ``marker`` is written)."""
    err = done.stderr.decode(errors="replace")
    lines = err.splitlines()
    rc = done.returncode
    if rc < 0:
        return BuildError(f"{job.cc} was killed by {_signame(-rc)}; not a refusal, so the next "
                          "process tries again", "environment")
    for needle, cause in _ENVIRONMENT:
        line = next((ln for ln in lines if needle in ln), None)
        if line is not None:
            return BuildError(f"{cause}: {line.strip()[:200]}; not a refusal, so the next "
                              "process tries again", "environment")
    first = next((ln for ln in lines if "error" in ln), lines[0] if lines else "")
    return BuildError(f"{job.cc} exited with {rc}: {first[:200]}", "refused",
                      _mark(marker, done.stderr[-4000:]))


def _build(job: _Job, target: Path, marker: Path | None, hung: Path | None) -> None:
    """Compile ``job`` into ``target``, test-load it in a child, then record it. Raises
    BuildError (a refusal or a failed test load also writes ``marker``, a timeout ``hung``),
    OSError if the folder is not writable."""
    # Compile beside the target, then rename: a reader never sees half a file.
    with atomic_path(target, suffix=".so") as tmp:
        argv = [job.cc, *job.flags, "-shared", "-fPIC", "-o", str(tmp), "-x", "c", "-", "-lm"]
        try:
            done = _run(argv, job.src, job.timeout)
        except subprocess.TimeoutExpired:
            hung = _mark(hung, _hang_record(job))
            raise _timed_out(job, job.timeout, hung) from None
        except (OSError, subprocess.SubprocessError) as e:
            raise BuildError(f"{job.cc} did not run: {e}", "environment") from e
        if done.returncode != 0:
            raise _failed(job, done, marker)
        try:
            _test_load(tmp, job)  # a failure deletes tmp (atomic_path)
        except BuildError as e:
            if e.kind == "unusable":
                e.log = _mark(marker, f"{e.reason}\n".encode() + done.stderr[-4000:])
            raise
    try:
        _write_record(target, job.seal)  # after the .so is in place
    except OSError as e:
        warn_once("record", f"linattn: cannot record {target.name} in {target.parent} ({e}); "
                            "using it in this process, the next one builds it again.")


@contextmanager
def _locked(lock: Path, wait_s: float) -> Iterator[None]:
    """Hold an exclusive flock on ``lock`` (OSError if it cannot be created). BuildError
    "environment" where another process holds it for more than ``wait_s`` seconds."""
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        if fcntl is not None:
            deadline, pause = time.monotonic() + wait_s, 0.01
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released when fd closes
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise BuildError(f"another process has held {lock} for more than "
                                         f"{wait_s:g} s", "environment") from None
                    time.sleep(pause)
                    pause = min(2 * pause, 0.25)
                except OSError:
                    break  # a file system without locks: build unlocked
        yield
    finally:
        os.close(fd)


def _dlopen(path: Path) -> ctypes.CDLL:
    try:
        return ctypes.CDLL(str(path))
    except OSError as e:
        raise BuildError(f"could not load {path.name}: {e}", "error") from e


def _build_cached(job: _Job, target: Path, marker: Path, hung: Path) -> ctypes.CDLL:
    target.parent.mkdir(parents=True, exist_ok=True)
    # The holder compiles and test-loads, each within the timeout.
    with _locked(target.with_name(target.name + ".lock"), 2 * job.timeout + 30):
        lib = _load_cached(target, job)  # another process may have built it while we waited
        if lib is not None:
            return lib
        _hung_before(hung, job)  # ... or failed to
        if _fresh(marker):
            raise BuildError("an earlier build failed; retried after 24 h", "refused", marker)
        _build(job, target, marker, hung)
        for old in (marker, hung):  # expired ones
            with suppress(OSError):
                old.unlink(missing_ok=True)
    return _dlopen(target)


def _build_private(job: _Job, name: str) -> ctypes.CDLL:
    """Build into a private temporary folder, load, and let the folder go (the loaded library
    stays mapped)."""
    try:
        with tempfile.TemporaryDirectory(prefix="linattn-") as tmp:
            private = Path(tmp) / f"{name}.so"
            _build(job, private, None, None)
            return _dlopen(private)
    except OSError as e:
        raise BuildError(f"no writable temporary folder: {e}", "environment") from e


def library_path(src: bytes, name: str, flags: Sequence[str], cc: str | None = None) -> Path:
    """Where the cache keeps ``src`` built with ``flags`` by ``cc`` (default: :func:`compiler`)."""
    cc = compiler() if cc is None else cc
    key = hashlib.sha256(src + "\0".join([*flags, cc or ""]).encode()).hexdigest()[:16]
    native = "-march=native" in flags
    tag = f"{platform.machine()}-{sys.platform}-{cpu_tag() + '-' if native else ''}{key}"
    return user_cache_dir() / f"{name}-{tag}.so"


def _short(identity: str) -> str:
    return hashlib.sha256(identity.encode()).hexdigest()[:8]


def build_library(source: Path | bytes, name: str, flags: list[str], *, check: str = "",
                  symbols: Sequence[str] = ()) -> ctypes.CDLL:
    """``source`` (a C file, or the C text itself) compiled with ``flags`` (built on first use
    and test-loaded in a child interpreter: ``symbols`` must be there and ``check``, Python
    statements with ``lib`` and ``ctypes`` in scope, must run), loaded. Raises BuildError, and
    nothing else, where that fails."""
    try:
        return _build_library(source, name, flags, check, tuple(symbols))
    except BuildError:
        raise
    except Exception as e:  # unforeseen: still only "no library", never an error in an op call
        raise BuildError(f"unexpected {type(e).__name__}: {e}", "error") from e


def _build_library(source: Path | bytes, name: str, flags: list[str], check: str,
                   symbols: tuple[str, ...]) -> ctypes.CDLL:
    if sys.platform == "win32":
        raise BuildError("not built on Windows", "unsupported")
    try:
        src = source if isinstance(source, bytes) else source.read_bytes()
    except OSError as e:
        raise BuildError(f"cannot read its source: {e}", "missing") from e
    cc = compiler()
    target = library_path(src, name, flags, cc)
    job = _Job(cc or "", src, list(flags), check, symbols, cc_timeout())
    lib = _load_cached(target, job)
    if lib is not None:
        return lib
    if cc is None:
        raise BuildError("no C compiler found: install cc, gcc or clang, or set $CC",
                         "no-compiler")
    hung = target.with_name(f"cc-{_short(_quick_identity(cc))}.timeout")
    _hung_before(hung, job)  # before asking a hung compiler its version
    if _version(cc) is None:
        hung_at = _mark(hung, _hang_record(job))
        raise BuildError(f"{cc} --version did not answer within {min(job.timeout, 30.0):g} s "
                         "and was stopped with its children", "timeout", hung_at)
    marker = target.with_name(f"{target.stem}.{_short(compiler_identity(cc))}.failed")
    if _fresh(marker):
        raise BuildError("an earlier build failed; retried after 24 h", "refused", marker)
    try:
        return _build_cached(job, target, marker, hung)
    except OSError as e:  # the cache folder is not writable
        warn_once(
            "cache",
            f"linattn: cannot write the cache folder {target.parent} ({e}); compiling "
            "into a private temporary folder in every process (set XDG_CACHE_HOME to a "
            "writable folder).",
        )
        return _build_private(job, name)


def warn_failure(name: str, err: BuildError) -> None:
    """The one-line warning (once per ``name`` and process) that ``name`` is not compiled."""
    if err.kind == "unsupported":
        return
    fallback = "using the pure PyTorch/Python path."
    if err.kind == "foreign":
        warn_once(f"build:{name}", f"linattn: {err.reason}; {fallback}")
        return
    log = str(err.log) if err.log is not None else "not kept"
    tail = {
        "refused": f" Compiler output: {log}",
        "unusable": f" The library was deleted. Details: {log}",
        "timeout": f" Later processes do not run this compiler for 24 h; to try again, delete "
                   f"{log} or set LINATTN_CC_TIMEOUT (seconds) higher." if err.log is not None
                   else " To give it more time, set LINATTN_CC_TIMEOUT (seconds) higher.",
    }.get(err.kind, "")
    warn_once("no-compiler" if err.kind == "no-compiler" else f"build:{name}",
              f"linattn: could not compile {name} ({err.reason}); {fallback}{tail}")


def load_library(
    source: Path | bytes, name: str, flags: list[str], *, warn: bool = True, check: str = "",
    symbols: Sequence[str] = (),
) -> ctypes.CDLL | None:
    """``source`` (a C file, or the C text itself) compiled with ``flags`` (built on first
    use), or None where that fails (:func:`build_library`; this never raises).

    ``name`` prefixes the cached file. Callers remember the outcome, so a failed build is tried
    once per process. A None result warns once per ``name`` and process unless ``warn`` is
    False (for a first attempt the caller retries with other flags)."""
    try:
        return build_library(source, name, flags, check=check, symbols=symbols)
    except BuildError as e:
        if warn:
            warn_failure(name, e)
        return None
