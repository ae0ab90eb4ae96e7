"""linattn._io: writes that never leave half a file and never replace what is not a file."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from linattn import _io

HAS_FULL = os.path.exists("/dev/full") and stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_a_regular_file_is_replaced(tmp_path):
    p = tmp_path / "out.txt"
    p.write_text("old")
    _io.write_atomic(p, b"new")
    assert p.read_bytes() == b"new"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["out.txt"]  # no temporary left


def test_a_symlink_stays_a_link_and_its_file_is_replaced(tmp_path):
    (tmp_path / "real.txt").write_text("old")
    link = tmp_path / "link.txt"
    link.symlink_to("real.txt")
    _io.write_atomic(link, b"new")
    assert link.is_symlink() and os.readlink(link) == "real.txt"
    assert (tmp_path / "real.txt").read_bytes() == b"new"
    dangling = tmp_path / "dangling.txt"
    dangling.symlink_to("made.txt")
    _io.write_json(dangling, {"a": 1})
    assert dangling.is_symlink() and (tmp_path / "made.txt").read_text() == '{\n  "a": 1\n}\n'


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_is_written_through_or_refused_when_nobody_reads(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OSError) as err:  # no reader: an error at once, not a hang
        _io.write_atomic(fifo, b"data")
    assert err.value.errno == errno.ENXIO and err.value.filename == str(fifo)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    got = []
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader, before the writer opens
    try:
        _io.write_atomic(fifo, b"data")
        _io.append_text(fifo, "line\n")
        got.append(os.read(fd, 100))
    finally:
        os.close(fd)
    assert got == [b"dataline\n"]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)  # still a FIFO, never a regular file


def test_a_folder_is_refused_naming_it(tmp_path):
    with pytest.raises(IsADirectoryError) as err:
        _io.write_atomic(tmp_path, b"x")
    assert err.value.filename == str(tmp_path)


@pytest.mark.skipif(not os.path.exists(os.devnull), reason="no null device")
def test_the_null_device_stays_a_device():
    _io.write_atomic(os.devnull, b"x" * 3_000_000)
    _io.write_json(os.devnull, [1])
    _io.append_text(os.devnull, "x\n")
    assert stat.S_ISCHR(os.lstat(os.devnull).st_mode)


@pytest.mark.skipif(not HAS_FULL, reason="no /dev/full")
def test_a_full_device_is_no_space_left_and_stays_a_device():
    with pytest.raises(OSError) as err:
        _io.write_atomic("/dev/full", b"x")
    assert err.value.errno == errno.ENOSPC and err.value.filename == "/dev/full"
    with pytest.raises(OSError) as err:
        _io.append_text("/dev/full", "x\n")
    assert err.value.errno == errno.ENOSPC
    assert stat.S_ISCHR(os.lstat("/dev/full").st_mode)


def test_write_target(tmp_path):
    assert _io.write_target(tmp_path / "new") == (tmp_path / "new", True)
    (tmp_path / "f").write_text("")
    (tmp_path / "l").symlink_to(tmp_path / "f")
    assert _io.write_target(tmp_path / "l") == (Path(os.path.realpath(tmp_path / "f")), True)
    assert _io.write_target(os.devnull) == (Path(os.devnull), False)


def test_a_failed_write_leaves_the_old_file(tmp_path, monkeypatch):
    p = tmp_path / "out.txt"
    p.write_text("old")
    with pytest.raises(OSError), _io.atomic_path(p) as tmp:
        tmp.write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device")
    assert p.read_text() == "old"


def test_a_run_folder_has_one_owner(tmp_path):
    run = tmp_path / "a" / "run"
    first = _io.FolderLock(run)
    assert run.is_dir() and (run / _io.LOCK_FILE).read_text().strip() == str(os.getpid())
    with pytest.raises(_io.FolderInUseError) as err:  # another open of the lock: refused
        _io.FolderLock(run)
    assert err.value.filename == str(run)
    assert f"in use by another linattn run (process {os.getpid()})" in str(err.value)
    first.release()
    first.release()  # again: nothing
    assert not run.exists()  # made by the lock and left empty: removed again
    with _io.FolderLock(run):
        (run / "result.json").write_text("{}")
    assert [p.name for p in run.iterdir()] == ["result.json"]  # written to: kept, unlocked
    with _io.FolderLock(run) as lock:  # free again once released
        assert lock.fd is not None


@pytest.mark.parametrize("kind", ["symlink", "fifo", "folder"])
def test_a_lock_path_that_is_no_regular_file_is_refused_and_kept(tmp_path, kind):
    """OUT/run.lock made a symbolic link to another file: the owner's pid was written through
    it (the file's content lost) and the link deleted; a FIFO there was locked and deleted
    (issue 51). Now an OSError naming the path, and the path left as it was."""
    run = tmp_path / "run"
    run.mkdir()
    lock, victim = run / _io.LOCK_FILE, tmp_path / "victim"
    victim.write_text("keep me\n")
    {"symlink": lambda: lock.symlink_to(victim), "fifo": lambda: os.mkfifo(lock),
     "folder": lambda: lock.mkdir()}[kind]()
    with pytest.raises(OSError, match=r"not a regular file") as err:
        _io.FolderLock(run)
    assert err.value.filename == str(lock)
    assert victim.read_text() == "keep me\n"
    mode = os.lstat(lock).st_mode
    assert {"symlink": stat.S_ISLNK, "fifo": stat.S_ISFIFO, "folder": stat.S_ISDIR}[kind](mode)


def test_a_lock_held_at_interpreter_exit_prints_nothing(tmp_path):
    """A lock still held when the interpreter exits (a module global) is dropped quietly: no
    "Exception ignored in __del__" on stderr, whatever was torn down first."""
    code = ("import linattn._io as io\n"
            f"LOCK = io.FolderLock({str(tmp_path / 'run')!r})\n"
            "io.os = None  # as module teardown may leave it before LOCK goes\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0 and res.stderr == ""


def test_reading_a_fifo_a_folder_or_a_device_is_refused_at_once(tmp_path):
    """read_json / read_regular of something that is no regular file: an OSError naming it at
    once (issue 51 fifth probe: a FIFO given as a data or JSON file waited for a writer)."""
    from linattn._io import read_json, read_regular

    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "folder.json").mkdir()
    for name, what in (("fifo.json", "a FIFO"), ("folder.json", "a folder")):
        for read in (read_json, read_regular):
            with pytest.raises(OSError, match=rf"not a regular file \({what}\)") as err:
                read(tmp_path / name)
            assert err.value.filename == str(tmp_path / name)
    with pytest.raises(OSError, match=r"not a regular file \(a character device\)"):
        read_regular(os.devnull)
    (tmp_path / "ok.json").write_text('{"a": 1}')
    assert read_json(tmp_path / "ok.json") == {"a": 1}
