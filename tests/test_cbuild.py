"""linattn._cbuild: a corrupt cached library is rebuilt, failure markers expire, failures warn
once, an unwritable cache warns and falls back, concurrent first runs compile once; a hanging
compiler is stopped (with its children) and remembered, a build is test-loaded in a child before
it is recorded, a foreign library is refused, a full disk is no refusal.

Fake compilers are small shell scripts that $CC names.

Each test compiles a tiny C source of its own into a cache under tmp_path. Libraries that a
test corrupts are only ever loaded in subprocesses (truncating a file mapped into this process
could crash it)."""

from __future__ import annotations

import ast
import json
import os
import re
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
FOREIGN = b"int la_phi(void) { return 1; }\n"
#: Loads sys.argv[1] as library sys.argv[2] (which must have the entry points sys.argv[3:]) and
#: prints answer(), or "none".
LOAD = (
    "import sys; from pathlib import Path; from linattn import _cbuild; "
    "lib = _cbuild.load_library(Path(sys.argv[1]), sys.argv[2], ['-O2'], symbols=sys.argv[3:]); "
    "print(lib.answer() if lib is not None else 'none')"
)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The cache folder (under tmp_path), with no warning given yet in this process."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr("linattn._native_env._warned", set())
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


def load_elsewhere(src: Path, name: str = "answer", *symbols: str) -> subprocess.Popen[str]:
    """load_library in a fresh interpreter (no library loaded yet), started in another cwd."""
    env = {**os.environ, "PYTHONPATH": str(Path(linattn.__file__).parents[1])}
    opt = ["-O"] if sys.flags.optimize else []
    return subprocess.Popen(
        [sys.executable, *opt, "-c", LOAD, str(src), name, *symbols],
        cwd=src.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def answer_elsewhere(src: Path, name: str = "answer", *symbols: str) -> str:
    out, err = load_elsewhere(src, name, *symbols).communicate(timeout=300)
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
    assert record.pop("check")  # the test load it passed
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
    monkeypatch.setattr("linattn._native_env._warned", set())
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


# ----------------------------------------------------------------------- fake compilers (issue 24)


def fake_cc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> Path:
    """A shell script named by $CC: ``body`` runs for every call (--version included)."""
    path = tmp_path / "fake-cc"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    monkeypatch.setenv("CC", str(path))
    return path


#: Answers --version; for a compilation, logs to {log} and runs {compile}.
COMPILE = (
    'case " $* " in *" -shared "*) ;; *) echo "fake cc 1.0"; exit 0;; esac\n'
    'echo run >> "{log}"\n'
    "{compile}\n"
)
#: Records its pid and that of a child, then waits for the child: a hung compiler.
HANG = 'echo $$ >> "{pids}"\nsleep 60 &\necho $! >> "{pids}"\nwait\n'
#: The real compiler, then the output cut to 4 KiB (a wrapper on a flaky file system): exit 0.
TRUNCATE = (
    "out=; prev=\n"
    'for a in "$@"; do [ "$prev" = -o ] && out=$a; prev=$a; done\n'
    '"{cc}" "$@" || exit\n'
    'truncate -s 4096 "$out"\n'
)
#: Ignores its input and builds another library: a cache shared with another program.
OTHER = (
    "cat > /dev/null\nout=; prev=\n"
    'for a in "$@"; do [ "$prev" = -o ] && out=$a; prev=$a; done\n'
    '"{cc}" -shared -fPIC -o "$out" "{foreign}"\n'
)
FULL_DISK = (
    'echo "/usr/bin/ld: final link failed: No space left on device" >&2\n'
    'echo "collect2: error: ld returned 1 exit status" >&2\n'
    "exit 1\n"
)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped by its new parent, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def all_gone(pids: list[str], within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while any(alive(int(p)) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize("hangs_on", ["compile", "--version"])
def test_hanging_compiler_is_stopped_and_remembered(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch, hangs_on: str
) -> None:
    """Was: two 120 s waits per process (-march=native, then without), the compiler left
    running, no marker, so that every process waited again."""
    pids, log = tmp_path / "pids", tmp_path / "cc-runs"
    pids.touch()
    log.touch()
    hang = HANG.format(pids=pids)
    fake_cc(tmp_path, monkeypatch, COMPILE.format(log=log, compile=hang) if hangs_on == "compile"
            else hang)
    monkeypatch.setenv("LINATTN_CC_TIMEOUT", "0.5")
    src = source(tmp_path)
    start = time.monotonic()
    with pytest.warns(RuntimeWarning, match=r"could not compile hang .*did not .* within 0\.5 s"
                      r".*LINATTN_CC_TIMEOUT") as w:
        assert _cbuild.load_library(src, "hang", ["-O2"]) is None
    assert time.monotonic() - start < 10
    started = pids.read_text().split()
    assert len(started) == 2  # one try: the script and its child
    assert all_gone(started), "the compiler's process group was not killed"
    (marker,) = cache.glob("cc-*.timeout")
    message = str(w[0].message)
    assert str(marker) in message and "\n" not in message

    # The next call, and the next process, skip the build at once.
    monkeypatch.setattr("linattn._native_env._warned", set())
    start = time.monotonic()
    with pytest.warns(RuntimeWarning, match="did not finish within 0.5 s earlier in this process"):
        assert _cbuild.load_library(src, "hang", ["-O2"]) is None
    monkeypatch.setattr("linattn._native_env._warned", set())
    monkeypatch.setattr(_cbuild, "_hung_here", {})  # as in another process: the marker says it
    with pytest.warns(RuntimeWarning, match="did not finish within 0.5 s in an earlier process"):
        assert _cbuild.load_library(src, "hang", ["-O2"]) is None
    with pytest.warns(RuntimeWarning, match=r"could not compile other .*in an earlier process"):
        assert _cbuild.load_library(src, "other", ["-O3"]) is None  # any build by this compiler
    assert time.monotonic() - start < 1
    proc = load_elsewhere(src, "hang")
    out, err = proc.communicate(timeout=300)
    assert out.strip() == "none" and "LINATTN_CC_TIMEOUT" in err
    assert len(pids.read_text().split()) == 2

    if hangs_on == "compile":  # more time than the marker's: tried again
        monkeypatch.setenv("LINATTN_CC_TIMEOUT", "0.7")
        assert _cbuild.load_library(src, "hang", ["-O2"], warn=False) is None
        more = pids.read_text().split()
        assert len(more) == 4 and all_gone(more) and count(log) == 2


def test_hanging_compiler_without_a_cache_folder_waits_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nowhere to write the marker: still one wait per process, not one per library."""
    monkeypatch.setattr("linattn._native_env._warned", set())
    (tmp_path / "xdg").write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    pids, log = tmp_path / "pids", tmp_path / "cc-runs"
    log.touch()
    fake_cc(tmp_path, monkeypatch, COMPILE.format(log=log, compile=HANG.format(pids=pids)))
    monkeypatch.setenv("LINATTN_CC_TIMEOUT", "0.3")
    src = source(tmp_path)
    with pytest.warns(RuntimeWarning) as w:
        assert _cbuild.load_library(src, "one", ["-O2"]) is None
    cache_warning, timeout_warning = (str(m.message) for m in w)
    assert cache_warning.startswith("linattn: cannot write the cache folder")
    assert re.match(r"linattn: could not compile one .*within 0\.3 s .*set LINATTN_CC_TIMEOUT "
                    r"\(seconds\) higher", timeout_warning)
    start = time.monotonic()
    with pytest.warns(RuntimeWarning, match="could not compile two .*earlier in this process"):
        assert _cbuild.load_library(src, "two", ["-O2"]) is None
    assert time.monotonic() - start < 0.5 and count(log) == 1
    assert all_gone(pids.read_text().split())


def test_bad_timeout_setting_warns_and_uses_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("linattn._native_env._warned", set())
    monkeypatch.setenv("LINATTN_CC_TIMEOUT", "soon")
    with pytest.warns(RuntimeWarning, match="LINATTN_CC_TIMEOUT='soon'"):
        assert _cbuild.cc_timeout() == _cbuild.CC_TIMEOUT_S
    monkeypatch.setenv("LINATTN_CC_TIMEOUT", "2.5")
    assert _cbuild.cc_timeout() == 2.5


@needs_cc
def test_truncated_build_fails_its_test_load_not_the_process(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was: the wrapper's truncated output got a matching record, and dlopen gave SIGBUS in the
    process that built it and in every later one."""
    log = tmp_path / "cc-runs"
    log.touch()
    fake_cc(tmp_path, monkeypatch,
            COMPILE.format(log=log, compile=TRUNCATE.format(cc=shutil.which(CC or "cc"))))
    src = source(tmp_path)
    errs = []
    for _ in range(2):
        proc = load_elsewhere(src, "cut", "answer")
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"the loading process died ({proc.returncode}): {err}"
        assert out.strip() == "none", err
        errs.append(err)
    assert "failed its test load" in errs[0] and "The library was deleted" in errs[0]
    assert "an earlier build failed" in errs[1]
    assert count(log) == 1  # the marker stopped the second process
    (marker,) = cache.glob("cut-*.failed")
    assert b"test load" in marker.read_bytes()
    assert not [*cache.glob("cut-*.so"), *cache.glob("cut-*.sha256")]  # no library, no record


@needs_cc
def test_foreign_build_is_refused(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compiler (wrapper) that hands back another library: the test load finds no entry
    point, so nothing is recorded and the caller gets None, not an AttributeError later."""
    foreign = tmp_path / "foreign.c"
    foreign.write_bytes(FOREIGN)
    fake_cc(tmp_path, monkeypatch, OTHER.format(cc=shutil.which(CC or "cc"), foreign=foreign))
    src = source(tmp_path)
    with pytest.warns(RuntimeWarning, match=r"failed its test load: it lacks the entry points "
                                            r"answer.*deleted"):
        assert _cbuild.load_library(src, "other", ["-O2"], symbols=["answer"]) is None
    assert list(cache.glob("other-*.failed"))
    assert not [*cache.glob("other-*.so"), *cache.glob("other-*.sha256")]


@needs_cc
def test_foreign_library_with_a_matching_record_is_not_used(
    tmp_path: Path, cache: Path, runs: Path
) -> None:
    """Was: a foreign library whose record matched was loaded as is, and the first op call
    raised AttributeError (undefined symbol)."""
    src = source(tmp_path)
    assert answer_elsewhere(src, "answer", "answer") == "42"
    (built,) = cache.glob("answer-*.so")
    sidecar = built.with_name(built.name + ".sha256")
    seal = _cbuild._seal("", ["answer"])  # the test load of this job (no check code)
    subprocess.run([shutil.which(CC or "cc"), "-shared", "-fPIC", "-o", str(built), "-x", "c",
                    "-"], input=FOREIGN, check=True)
    _cbuild._write_record(built, seal)  # a record that matches, vouching for these bytes
    proc = load_elsewhere(src, "answer", "answer")
    out, err = proc.communicate(timeout=300)
    assert out.strip() == "none" and proc.returncode == 0, err
    assert "is not the library it should be (it lacks answer)" in err
    assert "Traceback" not in err and not sidecar.exists()
    assert answer_elsewhere(src, "answer", "answer") == "42"  # the next process rebuilds
    assert count(runs) == 2


@needs_cc
def test_record_without_a_test_load_is_checked_first(
    tmp_path: Path, cache: Path, runs: Path
) -> None:
    """A record of an older linattn vouches for no test load: the library gets one in a child
    (no rebuild if it passes, a rebuild if not) before this process loads it."""
    src = source(tmp_path)
    assert answer_elsewhere(src) == "42"
    (built,) = cache.glob("answer-*.so")
    sidecar = built.with_name(built.name + ".sha256")

    def old_record() -> None:
        data = built.read_bytes()
        sidecar.write_text(json.dumps({"size": len(data),
                                       "sha256": _cbuild.hashlib.sha256(data).hexdigest()}))

    old_record()
    assert answer_elsewhere(src) == "42"
    assert count(runs) == 1 and "check" in json.loads(sidecar.read_text())
    os.truncate(built, 4096)  # truncated, and recorded so by an older linattn
    old_record()
    assert answer_elsewhere(src) == "42"
    assert count(runs) == 2 and "check" in json.loads(sidecar.read_text())


def test_full_disk_is_not_a_refusal(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was: a .failed marker, as if the compiler had refused the source: 24 h without the
    library (or, for the kernels, with the generic build instead of the native one)."""
    log = tmp_path / "cc-runs"
    log.touch()
    fake_cc(tmp_path, monkeypatch, COMPILE.format(log=log, compile=FULL_DISK))
    src = source(tmp_path)
    with pytest.warns(RuntimeWarning, match=r"could not compile full \(the disk is full: "
                      r".*No space left on device; not a refusal, so the next process tries") as w:
        assert _cbuild.load_library(src, "full", ["-O2"]) is None
    assert len(w) == 1 and "\n" not in str(w[0].message)
    assert not list(cache.glob("*.failed"))
    monkeypatch.setattr("linattn._native_env._warned", set())  # another process: it tries again
    with pytest.warns(RuntimeWarning, match="the disk is full"):
        assert _cbuild.load_library(src, "full", ["-O2"]) is None
    assert count(log) == 2


#: What gcc 12 printed when a file size limit (RLIMIT_FSIZE) stopped cc1 during a CI run.
FILE_SIZE_LIMIT = (
    'echo "cc: internal compiler error: File size limit exceeded signal terminated program cc1"'
    " >&2\n"
    'echo "Please submit a full bug report, with preprocessed source." >&2\n'
    "exit 4\n"
)


def test_a_file_size_limit_is_not_a_refusal(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was: a .failed marker, so that every later process of that machine went without the
    kernels for 24 h (a CLI test ran the first build of a fresh clone under ulimit -f)."""
    log = tmp_path / "cc-runs"
    log.touch()
    fake_cc(tmp_path, monkeypatch, COMPILE.format(log=log, compile=FILE_SIZE_LIMIT))
    src = source(tmp_path)
    with pytest.warns(RuntimeWarning, match=r"could not compile fsize \(a file size limit "
                      r"\(ulimit -f\) was reached: .*not a refusal"):
        assert _cbuild.load_library(src, "fsize", ["-O2"]) is None
    assert not list(cache.glob("*.failed"))


@needs_cc
def test_unwritable_record_uses_the_build_and_writes_no_marker(
    tmp_path: Path, cache: Path, runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cache folder fills up between the library and its record: this process uses the
    library it built and test-loaded, says why once, and writes no marker; the next builds
    again."""
    write = _cbuild.write_atomic

    def full(path, data):
        if str(path).endswith(".sha256"):
            raise OSError(28, "No space left on device")
        write(path, data)

    monkeypatch.setattr(_cbuild, "write_atomic", full)
    src = source(tmp_path)
    with pytest.warns(RuntimeWarning, match=r"cannot record answer-.*No space left on device"):
        lib = _cbuild.load_library(src, "answer", ["-O2"])
    assert lib is not None and lib.answer() == 42
    assert count(runs) == 1 and not list(cache.glob("*.failed"))
    monkeypatch.setattr(_cbuild, "write_atomic", write)
    assert answer_elsewhere(src) == "42" and count(runs) == 2


@needs_cc
def test_read_only_cache_with_a_refusing_compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                  ) -> None:
    """Nowhere to put a marker: None and one warning per process, never an error."""
    monkeypatch.setattr("linattn._native_env._warned", set())
    base = tmp_path / "xdg"
    base.write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(base))
    with pytest.warns(RuntimeWarning) as w:
        assert _cbuild.load_library(source(tmp_path, BAD), "bad", ["-O2"]) is None
    assert [str(m.message).split(" (")[0] for m in w] == [
        f"linattn: cannot write the cache folder {base / 'linattn'}",
        "linattn: could not compile bad"]


def test_held_build_lock_is_not_waited_on_forever(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process stuck while holding the build lock: a bounded wait, then None."""
    if _cbuild.fcntl is None:
        pytest.skip("no fcntl")
    log = tmp_path / "cc-runs"
    log.touch()
    fake_cc(tmp_path, monkeypatch, COMPILE.format(log=log, compile="exit 1"))
    monkeypatch.setenv("LINATTN_CC_TIMEOUT", "0.1")
    monkeypatch.setattr(_cbuild, "_locked", _short_lock_wait(_cbuild._locked))
    src = source(tmp_path)
    target = _cbuild.library_path(src.read_bytes(), "held", ["-O2"])
    target.parent.mkdir(parents=True)
    fd = os.open(target.with_name(target.name + ".lock"), os.O_RDWR | os.O_CREAT)
    try:
        _cbuild.fcntl.flock(fd, _cbuild.fcntl.LOCK_EX)
        with pytest.warns(RuntimeWarning, match=r"another process has held .*\.lock for more"):
            assert _cbuild.load_library(src, "held", ["-O2"]) is None
    finally:
        os.close(fd)
    assert count(log) == 0 and not list(cache.glob("*.failed"))


def _short_lock_wait(locked):
    return lambda lock, wait_s: locked(lock, 0.3)


@needs_cc
def test_no_python_to_test_load_in_is_no_failed_build(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sys.executable that is not a Python (an embedding host): the library is not used, but
    it is not blamed either (no marker)."""
    monkeypatch.setattr(sys, "executable", shutil.which("false") or "/bin/false")
    with pytest.warns(RuntimeWarning, match=r"could not compile answer \(.*did not run the test "
                                            r"load"):
        assert _cbuild.load_library(source(tmp_path), "answer", ["-O2"]) is None
    assert not list(cache.glob("*.failed"))


@needs_cc
def test_truncated_library_whose_record_was_rewritten_to_match_is_rebuilt(
    tmp_path: Path, cache: Path, runs: Path
) -> None:
    """A record is no proof on its own: one rewritten to the size and hash of a truncated
    library (its seal kept) loaded it, and dlopen died of SIGBUS in every later process. The
    loader checks the library itself: the seal vouches for the hash of the bytes that passed
    the test load, and a file shorter than its own ELF headers say is never opened."""
    src = source(tmp_path)
    assert answer_elsewhere(src) == "42"
    (built,) = cache.glob("answer-*.so")
    sidecar = built.with_name(built.name + ".sha256")
    good, seal = built.read_bytes(), json.loads(sidecar.read_text())["check"]
    os.truncate(built, 4096)
    data = built.read_bytes()
    sidecar.write_text(json.dumps({"size": len(data), "sha256":
                                   _cbuild.hashlib.sha256(data).hexdigest(), "check": seal}))
    assert answer_elsewhere(src) == "42"
    assert count(runs) == 2 and built.read_bytes() == good


def test_a_truncated_elf_file_is_incomplete(tmp_path: Path) -> None:
    lib = Path(sys.executable)  # an ELF file on Linux; any file elsewhere
    data = lib.read_bytes()
    if not data.startswith(b"\x7fELF"):
        pytest.skip("not an ELF system")
    assert _cbuild.elf_complete(data)
    assert not _cbuild.elf_complete(data[:4096])
    assert not _cbuild.elf_complete(data[:10])
