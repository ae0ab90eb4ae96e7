"""The C compiler of the compiled path: which one (:func:`compiler`), what identifies it
(:func:`compiler_identity`: what keys a failed build's marker, so that a changed compiler tries
again) and how it is run (:func:`run`: in a session of its own, the C locale, its whole process
group killed on a timeout or an interrupt). :mod:`linattn._cbuild` builds, caches and
test-loads the libraries with these, and re-exports :func:`compiler` and
:func:`compiler_identity`."""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
from contextlib import suppress

from linattn._native_env import cc_timeout

__all__ = ["compiler", "compiler_identity", "quick_identity", "version", "run", "signame"]


def compiler() -> str | None:
    """``$CC`` where it names a program on the path, else the first of cc, gcc and clang there;
    None without one."""
    cc = os.environ.get("CC")
    if cc and shutil.which(cc):
        return cc
    return next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)


def signame(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill ``proc`` and every process of its group (it leads a session of its own), then
    reap it. A child that left the group and keeps the pipes open costs at most 5 s."""
    with suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    with suppress(subprocess.SubprocessError, OSError, ValueError):
        proc.communicate(timeout=5)


def run(argv: list[str], data: bytes | None, timeout: float) -> subprocess.CompletedProcess:
    """``argv`` with ``data`` on stdin and its output captured, in a session of its own (the C
    locale: English messages, which :func:`linattn._cbuild._failed` reads). On a timeout (or an
    interrupt) its whole process group is killed, the compiler's own children included, and
    the TimeoutExpired (or the interrupt) propagates."""
    env = {**os.environ, "LC_ALL": "C"}
    stdin = subprocess.PIPE if data is not None else subprocess.DEVNULL
    with subprocess.Popen(argv, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          env=env, start_new_session=True) as proc:
        try:
            out, err = proc.communicate(data, timeout=timeout)
        except BaseException:
            _kill_group(proc)
            raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def quick_identity(cc: str) -> str:
    """Resolved path and mtime of ``cc``: no process started."""
    path = os.path.realpath(shutil.which(cc) or cc)
    try:
        mtime = os.stat(path).st_mtime_ns
    except OSError:
        mtime = 0
    return f"{path}\0{mtime}"


@functools.cache
def version(cc: str) -> str | None:
    """The first line of ``cc --version`` (once per process): "" where it fails, None where it
    did not answer within the compiler timeout (a hung compiler)."""
    try:
        out = run([cc, "--version"], None, min(cc_timeout(), 30.0)).stdout
    except subprocess.TimeoutExpired:
        return None
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.decode(errors="replace").partition("\n")[0].strip()


@functools.cache
def compiler_identity(cc: str) -> str:
    """Resolved path, mtime and ``--version`` first line of ``cc`` (once per process): what
    keys a ``.failed`` marker, so that an upgraded or different compiler tries again."""
    return f"{quick_identity(cc)}\0{version(cc) or ''}"
