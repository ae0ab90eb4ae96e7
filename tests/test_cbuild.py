"""linattn._cbuild: a corrupt cached library is rebuilt, failure markers expire, failures warn
once, an unwritable cache warns and falls back, concurrent first runs compile once.

Each test compiles a tiny C source of its own into a cache under tmp_path. Libraries that a
test corrupts are only ever loaded in subprocesses (truncating a file mapped into this process
could crash it)."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

import linattn
from linattn import _cbuild

CC = _cbuild.compiler()
needs_cc = pytest.mark.skipif(CC is None, reason="no C compiler found (cc, gcc, clang or $CC)")

GOOD = b"int answer(void) { return 42; }\n"
BAD = b"int answer(void) { return }\n"
#: Loads sys.argv[1] as library sys.argv[2] and prints answer(), or "none".
LOAD = (
    "import sys; from pathlib import Path; from linattn import _cbuild; "
    "lib = _cbuild.load_library(Path(sys.argv[1]), sys.argv[2], ['-O2']); "
    "print(lib.answer() if lib is not None else 'none')"
)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The cache folder (under tmp_path), with no warning given yet in this process."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(_cbuild, "_warned", set())
    return tmp_path / "xdg" / "linattn"


@pytest.fixture
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point $CC at a wrapper that logs each compilation (not --version) to the returned file,
    sleeps a little (so concurrent runs overlap) and runs the real compiler."""
    log = tmp_path / "cc-runs"
    log.touch()
    wrapper = tmp_path / "cc-wrapper"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'case " $* " in *" -shared "*) echo run >> "{log}"; sleep 0.5;; esac\n'
        f'exec "{shutil.which(CC or "cc")}" "$@"\n'
    )
    wrapper.chmod(0o755)
    monkeypatch.setenv("CC", str(wrapper))
    return log


def count(log: Path) -> int:
    return len(log.read_text().split())


def source(tmp_path: Path, text: bytes = GOOD) -> Path:
    path = tmp_path / "src" / "answer.c"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(text)
    return path


def load_elsewhere(src: Path, name: str = "answer") -> subprocess.Popen[str]:
    """load_library in a fresh interpreter (no library loaded yet), started in another cwd."""
    env = {**os.environ, "PYTHONPATH": str(Path(linattn.__file__).parents[1])}
    opt = ["-O"] if sys.flags.optimize else []
    return subprocess.Popen(
        [sys.executable, *opt, "-c", LOAD, str(src), name],
        cwd=src.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def answer_elsewhere(src: Path, name: str = "answer") -> str:
    out, err = load_elsewhere(src, name).communicate(timeout=300)
    return out.strip() or err


def no_warnings(fn, *args, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn(*args, **kwargs)
    if caught:
        raise AssertionError(f"unexpected warning: {caught[0].message}")
    return result


@needs_cc
def test_build_records_size_and_hash(tmp_path: Path, cache: Path, runs: Path) -> None:
    lib = no_warnings(_cbuild.load_library, source(tmp_path), "answer", ["-O2"])
    assert lib is not None and lib.answer() == 42
    (built,) = cache.glob("answer-*.so")
    record = json.loads(built.with_name(built.name + ".sha256").read_text())
    data = built.read_bytes()
    assert record == {"size": len(data), "sha256": _cbuild.hashlib.sha256(data).hexdigest()}
    assert _cbuild.load_library(source(tmp_path), "answer", ["-O2"]) is not None
    assert count(runs) == 1  # the second call loaded the cached library


@needs_cc
def test_truncated_or_unrecorded_library_is_rebuilt(
    tmp_path: Path, cache: Path, runs: Path
) -> None:
    src = source(tmp_path)
    assert answer_elsewhere(src) == "42"
    (built,) = cache.glob("answer-*.so")
    sidecar = built.with_name(built.name + ".sha256")
    good = built.read_bytes()
    os.truncate(built, 4096)  # dlopen of this crashed every later run with SIGBUS
    assert answer_elsewhere(src) == "42"
    assert count(runs) == 2 and built.read_bytes() == good
    assert json.loads(sidecar.read_text())["size"] == len(good)
    sidecar.unlink()  # a library without a record (an interrupted build) is not trusted
    assert answer_elsewhere(src) == "42"
    assert count(runs) == 3 and sidecar.exists()


@needs_cc
def test_failed_marker_expires(
    tmp_path: Path, cache: Path, runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = source(tmp_path, BAD)
    with pytest.warns(RuntimeWarning, match=r"could not compile bad .*Compiler output: ") as w:
        assert _cbuild.load_library(src, "bad", ["-O2"]) is None
    (marker,) = cache.glob("bad-*.failed")
    message = str(w[0].message)
    assert str(marker) in message and "\n" not in message
    assert b"error" in marker.read_bytes()
    assert count(runs) == 1

    # A marker stops the next process from trying again; this one already warned.
    assert no_warnings(_cbuild.load_library, src, "bad", ["-O2"]) is None
    assert count(runs) == 1

    # Another compiler (or the same one upgraded) tries again.
    monkeypatch.setattr(_cbuild, "compiler_identity", lambda cc: "another compiler 2.0")
    assert no_warnings(_cbuild.load_library, src, "bad", ["-O2"]) is None
    assert count(runs) == 2
    (new,) = set(cache.glob("bad-*.failed")) - {marker}

    # A marker older than a day is ignored: a transient failure heals.
    two_days_ago = time.time() - 2 * 24 * 3600
    os.utime(new, (two_days_ago, two_days_ago))
    assert no_warnings(_cbuild.load_library, src, "bad", ["-O2"]) is None
    assert count(runs) == 3 and time.time() - new.stat().st_mtime < 3600

    # Fixed source, expired marker: the build succeeds and the marker goes.
    os.utime(new, (two_days_ago, two_days_ago))
    src.write_bytes(GOOD)
    lib = _cbuild.load_library(src, "bad", ["-O2"])
    assert lib is not None and lib.answer() == 42


def test_no_compiler_warns_once(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_cbuild, "compiler", lambda: None)
    src = source(tmp_path)
    with pytest.warns(RuntimeWarning, match=r"could not compile one \(no C compiler found") as w:
        assert _cbuild.load_library(src, "one", ["-O2"]) is None
    assert len(w) == 1 and "\n" not in str(w[0].message)
    assert no_warnings(_cbuild.load_library, src, "one", ["-O2"]) is None
    assert no_warnings(_cbuild.load_library, src, "two", ["-O2"]) is None  # one warning in all


@needs_cc
def test_retry_with_other_flags_without_warning(tmp_path: Path, cache: Path) -> None:
    src = source(tmp_path)
    assert no_warnings(_cbuild.load_library, src, "answer", ["-no-such-flag"], warn=False) is None
    lib = no_warnings(_cbuild.load_library, src, "answer", ["-O2"])
    assert lib is not None and lib.answer() == 42
    with pytest.warns(RuntimeWarning, match="first") as w:
        assert _cbuild.warn_once("k", "first") and not _cbuild.warn_once("k", "again")
    assert len(w) == 1


@needs_cc
@pytest.mark.parametrize("how", ["under a file", "read-only"])
def test_unwritable_cache_warns_once_and_builds_privately(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    monkeypatch.setattr(_cbuild, "_warned", set())
    base = tmp_path / "xdg"
    if how == "under a file":  # mkdir fails, even for root
        base.write_text("not a folder")
    else:
        (base / "linattn").mkdir(parents=True)
        (base / "linattn").chmod(0o500)
        if os.access(base / "linattn", os.W_OK):
            pytest.skip("running as root: chmod does not stop writes")
    monkeypatch.setenv("XDG_CACHE_HOME", str(base))
    src = source(tmp_path)
    with pytest.warns(RuntimeWarning, match="XDG_CACHE_HOME") as w:
        lib = _cbuild.load_library(src, "one", ["-O2"])
    assert lib is not None and lib.answer() == 42
    message = str(w[0].message)
    assert str(base / "linattn") in message and "\n" not in message
    lib = no_warnings(_cbuild.load_library, src, "two", ["-O2"])
    assert lib is not None and lib.answer() == 42


@needs_cc
def test_concurrent_first_runs_compile_once(tmp_path: Path, cache: Path, runs: Path) -> None:
    src = source(tmp_path)
    procs = [load_elsewhere(src) for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [out.strip() for out, _ in outs] == ["42"] * 3, outs
    assert count(runs) == 1


def test_no_assert_statements() -> None:
    """Runtime checks must survive ``python -O``."""
    tree = ast.parse(Path(_cbuild.__file__).read_text())
    assert not [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Assert)]
