"""Writing files so that a reader never sees half of one, and reading users' JSON files.

Every write that fails (a full disk, a read-only folder) raises an ``OSError`` whose
``filename`` is the file meant, and leaves the previous file (or none): never a truncated
one.

A write replaces a regular file by renaming a finished temporary file over it. What is not a
regular file is never replaced (:func:`write_target`): a symbolic link stays a link and the
file it points to is replaced; a device or a FIFO (``-o /dev/null``, ``/dev/full``, a named
pipe) is written through, as a shell's ``>`` would, since a rename would turn ``/dev/full``
into a regular file (a FIFO nobody reads is an error, not a hang). A file read as data
(:func:`read_regular`, :func:`read_json`) must be a regular file: a FIFO would wait for a
writer, and a device may never end.

A run folder (a training run's checkpoint, metrics and results) has one owner at a time:
:class:`FolderLock`."""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["atomic_path", "write_atomic", "write_json", "read_json", "read_regular",
           "not_regular", "copy_atomic",
           "append_text", "user_cache_dir", "write_target", "FolderLock", "FolderInUseError",
           "LOCK_FILE"]

_UMASK = os.umask(0)
os.umask(_UMASK)


def user_cache_dir() -> Path:
    """The user cache: ``$XDG_CACHE_HOME/linattn`` or ``~/.cache/linattn`` (downloaded datasets,
    compiled C libraries)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "linattn"


def write_target(path: str | os.PathLike) -> tuple[Path, bool]:
    """Where a write to ``path`` goes and whether it is a regular file there (replaced
    atomically) or not (a device, a FIFO or a socket: written through). A symbolic link is
    followed, so that the link stays and its file is replaced; a new file is regular. A folder
    is an IsADirectoryError naming ``path``."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode  # follows links
    except FileNotFoundError:  # a new file, or a link to one
        return (Path(os.path.realpath(path)) if os.path.islink(path) else path), True
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    if stat.S_ISREG(mode):
        return Path(os.path.realpath(path)) if os.path.islink(path) else path, True
    return path, False  # opened by its own name: /dev/stdout and /proc/self/fd/N links work


def _open_writing(path: str | os.PathLike, flags: int) -> int:
    """``os.open(path, O_WRONLY | flags)``; a FIFO that no process reads is an OSError
    (ENXIO) naming ``path``, where a plain open would wait for a reader for ever."""
    try:
        fifo = stat.S_ISFIFO(os.stat(path).st_mode)
    except OSError:
        fifo = False
    if not fifo:
        return os.open(path, os.O_WRONLY | flags, 0o666)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | flags)
    except OSError as err:
        if err.errno == errno.ENXIO:
            raise OSError(errno.ENXIO, "a FIFO that no process reads", str(path)) from None
        raise
    os.set_blocking(fd, True)
    return fd


def _write_fd(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


@contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = ".tmp") -> Iterator[Path]:
    """Yield a temporary path in ``path``'s folder; when the block succeeds, give the file the
    usual permissions and rename it over ``path`` (atomic on POSIX), otherwise delete it.

    ``with atomic_path(out) as tmp: fig.savefig(tmp)`` — an interrupted write leaves the old
    file (or none), never a truncated one. A target that is not a regular file is never
    replaced (:func:`write_target`): the temporary file is then made in the temporary folder
    and its bytes written through to ``path``."""
    try:
        target, regular = write_target(path)
    except OSError as err:
        raise _named(err, path) from None
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=suffix,
                               dir=target.parent if regular else None)
    os.close(fd)
    try:
        yield Path(tmp)
        if regular:
            os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600
            os.replace(tmp, target)
        else:
            out = _open_writing(target, 0)
            try:
                with open(tmp, "rb") as f:
                    while chunk := f.read(1 << 20):
                        _write_fd(out, chunk)
            finally:
                os.close(out)
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


def not_regular(mode: int) -> str:
    """What a file of ``mode`` (``st_mode``) is, in words, where it is not a regular file."""
    for test, what in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a folder"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "not a regular file"


def read_regular(path: str | os.PathLike) -> bytes:
    """The bytes of the regular file ``path``. Anything else is an OSError naming it, at once:
    a FIFO is opened without waiting for a writer (``O_NONBLOCK``), then refused."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, f"not a regular file ({not_regular(mode)})", str(path))
        with os.fdopen(os.dup(fd), "rb") as fh:
            return fh.read()
    finally:
        os.close(fd)


def read_json(path: str | os.PathLike) -> object:
    """The JSON value stored in ``path``. ValueError in one line naming the file when it is
    not UTF-8, not JSON or nested too deeply to be read (a RecursionError in the parser);
    OSError when it cannot be read or is not a regular file (:func:`read_regular`)."""
    data = read_regular(path)
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
    try:
        fd = _open_writing(path, os.O_APPEND | os.O_CREAT)
    except OSError as err:
        raise _named(err, path) from None
    try:
        try:
            size = os.lseek(fd, 0, os.SEEK_END)
        except OSError:  # a device or a FIFO: nothing to truncate back to
            size = None
        try:
            _write_fd(fd, data)
        except OSError as err:
            try:
                if size is not None:
                    os.ftruncate(fd, size)
            except OSError:
                pass
            raise _named(err, path) from None
    finally:
        os.close(fd)


#: The lock file of a run folder (:class:`FolderLock`).
LOCK_FILE = "run.lock"


def _not_a_lock(path: Path) -> OSError:
    return OSError(errno.EINVAL, "not a regular file (where a run keeps its lock): remove it",
                   str(path))


class FolderInUseError(BlockingIOError):
    """Another process holds the run folder (:class:`FolderLock`); ``filename`` is the folder."""


class FolderLock:
    """Exclusive ownership of the run folder ``folder`` while held: an advisory lock
    (``flock``) on ``folder/run.lock``, a file that holds the owner's process id while it
    exists. Two runs into one folder would otherwise both write its checkpoint and interleave
    its ``metrics.jsonl``. The kernel drops the lock with its process, so a killed run never
    leaves the folder locked (only its stale, unlocked file).

    Making one creates the folder (and its parents) and takes the lock, or raises
    :class:`FolderInUseError` naming the folder and the owner; :meth:`release` (or leaving a
    ``with`` block) gives it up and deletes the lock file, and the folder too if this lock
    created it and nothing else was written there. A lock is taken only on the file that is
    still at the path (one deleted by an owner releasing it meanwhile is opened again), so the
    deletion never lets two owners in. Where the platform has no ``flock`` it is a no-op."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_FILE
        self.created = not self.folder.exists()
        self.fd: int | None = None
        self.folder.mkdir(parents=True, exist_ok=True)
        try:
            import fcntl
        except ImportError:  # no flock here (Windows): unowned, as before
            return
        # not through a symbolic link (the pid written would replace the file it points to),
        # nor a FIFO or device (opened without waiting for a writer, then refused)
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
        while self.fd is None:
            try:
                fd = os.open(self.path, flags, 0o666)
            except OSError as err:
                if err.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                    raise _not_a_lock(self.path) from None
                raise _named(err, self.path) from None
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise _not_a_lock(self.path)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                owner = os.read(fd, 32).decode("ascii", "replace").strip()
                os.close(fd)
                if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise _named(err, self.path) from None
                raise FolderInUseError(
                    errno.EWOULDBLOCK, "in use by another linattn run"
                    + (f" (process {owner})" if owner.isdigit() else ""), str(self.folder)
                ) from None
            try:
                mine = os.fstat(fd)
                here = os.stat(self.path)
            except FileNotFoundError:  # released and deleted meanwhile: open it anew
                os.close(fd)
                continue
            if (mine.st_dev, mine.st_ino) != (here.st_dev, here.st_ino):
                os.close(fd)
                continue
            try:  # the owner's pid, for the message of the next one (informational only)
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            except OSError:
                pass
            self.fd = fd

    def release(self) -> None:
        """Give the folder up (again: nothing): the lock file is deleted while still locked,
        then the folder too if this lock created it and it is empty."""
        if self.fd is None:
            return
        fd, self.fd = self.fd, None
        try:
            os.unlink(self.path)
            if self.created and not any(self.folder.iterdir()):
                self.folder.rmdir()
        except OSError:
            pass
        finally:
            os.close(fd)  # drops the lock

    def __enter__(self) -> FolderLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self, _close=os.close) -> None:
        # os.close bound at definition: at interpreter exit the module's globals may already be
        # None, and a lock still held then must not print "Exception ignored" on stderr
        if getattr(self, "fd", None) is not None:
            _close(self.fd)
