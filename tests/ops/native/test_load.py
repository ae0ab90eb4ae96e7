"""linattn.ops.native.load when the build goes wrong (issue 24): a hanging compiler, a full disk,
a build that crashes when loaded, a foreign library in the cache. Each means "no compiled
library", one warning and the torch path, never an error in an op call; only a compiler that
refuses -march=native sends the build to the compiler's baseline flags.

Fake compilers are small shell scripts that $CC names; the cache is a folder under tmp_path."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

import linattn
from linattn import _cbuild
from linattn.ops import dispatch, native
from linattn.ops.delta import native as delta_native
from linattn.ops.linear import native as linear_native
from linattn.ops.linear import passes as linear_passes

CC = _cbuild.compiler()
needs_cc = pytest.mark.skipif(CC is None, reason="no C compiler found (cc, gcc, clang or $CC)")

#: Answers --version; for a compilation, logs to {log} and runs {compile}.
COMPILE = (
    'case " $* " in *" -shared "*) ;; *) echo "fake cc 1.0"; exit 0;; esac\n'
    'echo "$*" >> "{log}"\n'
    "{compile}\n"
)
OUT = 'out=; prev=\nfor a in "$@"; do [ "$prev" = -o ] && out=$a; prev=$a; done\n'
#: Has la_width and la_tile (what the loader used to look for) but no layout table.
FOREIGN = b"int la_width(void) { return 8; }\nint la_tile(void) { return 604; }\n"


@pytest.fixture
def fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Nothing loaded, built, bound, chosen or warned yet in this process; the cache folder
    (returned) under tmp_path."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    for var in ("LINATTN_NATIVE", "LINATTN_NATIVE_ISA", "LINATTN_CC_TIMEOUT", "LINATTN_AMX"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr("linattn._native_env._warned", set())
    monkeypatch.setattr(native.build, "_libs", {})
    monkeypatch.setattr(native.build, "_reasons", {})
    for kernels in (linear_passes._KERNELS, delta_native._KERNELS):
        monkeypatch.setattr(kernels, "_bound", {})
        monkeypatch.setattr(kernels, "_why", {})
    dispatch._memo.clear()
    yield tmp_path / "xdg" / "linattn"
    dispatch._memo.clear()


def fake_cc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compile: str) -> Path:
    """$CC: a script that answers --version and runs ``compile`` for a compilation; returns
    the file where it logs each compilation's arguments."""
    log = tmp_path / "cc-runs"
    log.touch()
    path = tmp_path / "fake-cc"
    path.write_text("#!/bin/sh\n" + COMPILE.format(log=log, compile=compile))
    path.chmod(0o755)
    monkeypatch.setenv("CC", str(path))
    return log


def runs(log: Path) -> list[str]:
    return log.read_text().splitlines()


def attention_works() -> None:
    """linear_attention (default dispatch) gives the torch result."""
    q, k, v = torch.randn(3, 1, 2, 24, 8, generator=torch.Generator().manual_seed(0)).unbind(0)
    got = linattn.linear_attention(q, k, v, is_causal=True)
    with dispatch.use(impl="torch"):
        want = linattn.linear_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(got, want)


def load_warns(match: str) -> str:
    """native.load() is None, with exactly one warning (matching ``match``) in all, also
    through the dispatcher's other builds; the warning's text."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert native.load() is None
        attention_works()
        assert native.load() is None
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1, messages
    assert re.search(match, messages[0]), messages[0]
    assert "\n" not in messages[0]
    return messages[0]


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def test_hanging_compiler_one_short_wait_no_fallback(
    fresh: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was: 2 x 120 s per process (-march=native, then the fallback), compilers left running,
    and the same wait in the next process."""
    pids = tmp_path / "pids"
    log = fake_cc(tmp_path, monkeypatch,
                  f'echo $$ >> "{pids}"\nsleep 60 &\necho $! >> "{pids}"\nwait')
    monkeypatch.setenv("LINATTN_CC_TIMEOUT", "0.5")
    start = time.monotonic()
    message = load_warns(r"could not compile native \(.* did not finish within 0\.5 s .*"
                         r"LINATTN_CC_TIMEOUT")
    assert time.monotonic() - start < 15
    assert len(runs(log)) == 1  # neither the fallback flags nor another ISA build
    started = [int(p) for p in pids.read_text().split()]
    deadline = time.monotonic() + 5
    while any(map(alive, started)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(map(alive, started))
    (marker,) = fresh.glob("cc-*.timeout")
    assert str(marker) in message
    assert "did not finish" in (linear_native.unavailable() or "")


def test_full_disk_is_no_reason_for_the_generic_build(
    fresh: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was: a .failed marker for the native flags, then the generic build for 24 hours."""
    log = fake_cc(tmp_path, monkeypatch,
                  'echo "/usr/bin/ld: final link failed: No space left on device" >&2\n'
                  'echo "collect2: error: ld returned 1 exit status" >&2\nexit 1')
    load_warns(r"could not compile native \(the disk is full: .*No space left on device")
    tried = runs(log)
    assert "-march=native" in tried[0]
    assert all(r.startswith("-O3 -fno-math-errno ") for r in tried)  # never the baseline ["-O3"]
    assert not list(fresh.glob("*.failed"))


@needs_cc
def test_refused_march_native_falls_back_to_the_baseline(
    fresh: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = fake_cc(tmp_path, monkeypatch,
                  'case " $* " in *" -march=native "*)\n'
                  "  echo \"cc1: error: bad value 'native' for '-march=' switch\" >&2; exit 1;;\n"
                  "esac\n"
                  f'exec "{shutil.which(CC or "cc")}" "$@"')
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lib = native.load()
    assert lib is not None and lib.la_width() >= 1
    # with OpenMP, without it, then the baseline
    assert [("-march=native" in r, "-fopenmp" in r) for r in runs(log)] == [
        (True, True), (True, False), (False, False)]
    assert len(list(fresh.glob("native-*.failed"))) == 2


@needs_cc
def test_a_compiler_without_openmp_builds_the_kernels_without_it(
    fresh: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """clang without libomp refuses -fopenmp: the same kernels, their splitting on one thread
    (la_parallel's fallback), with no warning."""
    log = fake_cc(tmp_path, monkeypatch,
                  'case " $* " in *" -fopenmp "*)\n'
                  "  echo \"clang: error: unsupported option '-fopenmp'\" >&2; exit 1;;\n"
                  "esac\n"
                  f'exec "{shutil.which(CC or "cc")}" "$@"')
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lib = native.load()
    assert lib is not None and lib.la_width() >= 1
    assert [("-march=native" in r, "-fopenmp" in r) for r in runs(log)] == [
        (True, True), (True, False)]


@needs_cc
def test_truncated_build_does_not_crash_the_process(
    fresh: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compiler wrapper that cuts its output and exits 0. Was: SIGBUS in every process (run
    in a child here, so that a crash would not take the test run with it)."""
    tiny = tmp_path / "tiny.c"
    tiny.write_bytes(FOREIGN)
    fake_cc(tmp_path, monkeypatch,
            f'cat > /dev/null\n{OUT}"{shutil.which(CC or "cc")}" -shared -fPIC -o "$out" "{tiny}"'
            ' || exit\ntruncate -s 4096 "$out"')
    code = ("import torch, linattn; from linattn.ops import native; print(native.load()); "
            "q = torch.randn(1, 2, 16, 8); print(tuple(linattn.linear_attention(q, q, q).shape))")
    env = {**os.environ, "PYTHONPATH": str(Path(linattn.__file__).parents[1])}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, f"died ({done.returncode}): {done.stderr}"
    assert done.stdout.split("\n")[:2] == ["None", "(1, 2, 16, 8)"], done.stderr
    assert done.stderr.count("RuntimeWarning") == 1, done.stderr
    assert "failed its test load" in done.stderr
    assert not list(fresh.glob("native-*.so"))


@needs_cc
def test_foreign_library_with_a_matching_record(
    fresh: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A library that is not the kernels sits in the cache with a record that matches it.
    Was: loaded as is (it has la_width), the ops then found no kernels, or raised
    AttributeError (undefined symbol) from linear_attention."""
    monkeypatch.setenv("CC", CC or "cc")
    src = native.source()
    symbols = native.required_symbols(src)
    target = _cbuild.library_path(src, "native", native.flag_sets("native")[0])
    target.parent.mkdir(parents=True)
    subprocess.run([CC or "cc", "-shared", "-fPIC", "-o", str(target), "-x", "c", "-"],
                   input=FOREIGN, check=True)
    _cbuild._write_record(target, _cbuild._seal(native._check_code(symbols), symbols))
    tables = ", ".join(sorted(f"la_{p.parent.name}_abi" for p in native.SOURCES
                              if p.name == "kernels.c"))
    message = load_warns(rf"is not the library it should be \(it lacks {tables}\).*the next "
                         "process builds it again")
    assert str(target) in message
    assert not target.with_name(target.name + ".sha256").exists()
    assert linear_native.kernels() is None and delta_native.kernels() is None
    assert "la_linear_abi" in (linear_native.unavailable() or "")
    assert native.describe().startswith("native: not available (the cached")


def test_the_unit_writes_each_part_in_where_its_kernels_c_includes_it():
    """A kernels.c split by concern includes its parts (``#include "kernels_<part>.c"``): the one
    translation unit holds each part once, in place of that line, between #line markers that
    name the part and then the including file again at the next line; no such include is left."""
    src = native.source().decode()
    parts = sorted(Path(native.build.__file__).parent.parent.glob("*/kernels_*.c"))
    assert parts  # linear/kernels_forms.c, linear/kernels_entry.c, delta/kernels_backward.c
    for part in parts:
        name = f"{part.parent.name}/{part.name}"
        assert src.count(f'#line 1 "{name}"\n') == 1, name
        assert part.read_text() in src
        including = (part.parent / "kernels.c").read_text().splitlines()
        at = next(i for i, line in enumerate(including, 1) if f'#include "{part.name}"' in line)
        after = src.split(f'#line 1 "{name}"\n', 1)[1].split(part.read_text(), 1)[1]
        assert after.lstrip("\n").startswith(f'#line {at + 1} "{part.parent.name}/kernels.c"\n')
    assert not re.search(r'^#include "\w+\.c"', src, re.M)
