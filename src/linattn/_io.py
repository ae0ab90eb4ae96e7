"""Writing files so that a reader never sees half of one."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["atomic_path", "write_atomic", "write_json", "user_cache_dir"]

_UMASK = os.umask(0)
os.umask(_UMASK)


def user_cache_dir() -> Path:
    """The user cache: ``$XDG_CACHE_HOME/linattn`` or ``~/.cache/linattn`` (downloaded datasets,
    compiled C libraries)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "linattn"


@contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = ".tmp") -> Iterator[Path]:
    """Yield a temporary path in ``path``'s folder; when the block succeeds, give the file the
    usual permissions and rename it over ``path`` (atomic on POSIX), otherwise delete it.

    ``with atomic_path(out) as tmp: fig.savefig(tmp)`` — an interrupted write leaves the old
    file (or none), never a truncated one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` through :func:`atomic_path`."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_json(path: str | os.PathLike, obj) -> None:
    """Write ``obj`` as indented JSON atomically (:func:`write_atomic`)."""
    write_atomic(path, (json.dumps(obj, indent=2) + "\n").encode())
