"""Writing files so that a reader never sees half of one, and reading users' JSON files.

Every write that fails (a full disk, a read-only folder) raises an ``OSError`` whose
``filename`` is the file meant, and leaves the previous file (or none): never a truncated
one."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["atomic_path", "write_atomic", "write_json", "read_json", "copy_atomic",
           "append_text", "user_cache_dir"]

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
    except OSError as err:
        raise _named(err, path, tmp) from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _named(err: OSError, path: str | os.PathLike, tmp: str | None = None) -> OSError:
    """``err`` naming ``path`` where it names no file (a failed ``write`` names none) or only
    the temporary file ``tmp`` that stands for it."""
    names = {str(err.filename), str(err.filename2)}
    if err.errno is None or (err.filename is not None and (tmp is None or tmp not in names)):
        return err
    return type(err)(err.errno, err.strerror, str(path))


def write_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` through :func:`atomic_path`."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_json(path: str | os.PathLike, obj) -> None:
    """Write ``obj`` as indented JSON atomically (:func:`write_atomic`)."""
    write_atomic(path, (json.dumps(obj, indent=2) + "\n").encode())


def read_json(path: str | os.PathLike) -> object:
    """The JSON value stored in ``path``. ValueError in one line naming the file when it is
    not UTF-8, not JSON or nested too deeply to be read (a RecursionError in the parser);
    OSError when it cannot be read."""
    data = Path(path).read_bytes()
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not valid JSON (not UTF-8 text)") from None
    except RecursionError:
        raise ValueError(f"{path}: not valid JSON (nested too deeply)") from None
    except ValueError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from None


def copy_atomic(src: str | os.PathLike, dst: str | os.PathLike, *, link: bool = False) -> None:
    """Copy file ``src`` to ``dst`` through :func:`atomic_path`. With ``link``, a hard link
    where the file system allows one (for files that are replaced, never rewritten in place)."""
    with atomic_path(dst) as tmp:
        if link:
            try:
                os.unlink(tmp)
                os.link(src, tmp)
                return
            except OSError:
                pass
        shutil.copyfile(src, tmp)


def append_text(path: str | os.PathLike, text: str) -> None:
    """Append ``text`` to ``path``; a failed write truncates the file back to where it was (no
    half line) and raises the OSError naming ``path``."""
    data = text.encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        size = os.lseek(fd, 0, os.SEEK_END)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        except OSError as err:
            try:
                os.ftruncate(fd, size)
            except OSError:
                pass
            raise _named(err, path) from None
    finally:
        os.close(fd)
