"""The compiled parser of `linattn solve` (cli/_solve_parse.py) is used only after its test
call passed in a child interpreter: a library whose lap_parse misparses, or that has none, is
not used (one warning, the Python parser)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from linattn import _cbuild
from linattn.cli import _solve_parse
from linattn.cli.solve import solve

CC = _cbuild.compiler()
EXAMPLE = "2 2\n-1 -2\n-3 -1\n-1 -1\n-2 -3\n1 2\n3 4\n"
#: Finds no number anywhere.
WRONG = (b"long long lap_parse(const unsigned char *buf, long long len, long long pos, "
         b"double *out, long long cap, long long *stop) { *stop = len; return 0; }\n")
FOREIGN = b"int la_phi(void) { return 1; }\n"


@pytest.fixture
def fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(_solve_parse, "_tried", False)
    monkeypatch.setattr(_solve_parse, "_lib", None)
    monkeypatch.setattr("linattn._native_env._warned", set())
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("LINATTN_SOLVE_PARSER", raising=False)
    return tmp_path / "xdg" / "linattn"


@pytest.mark.skipif(CC is None, reason="no C compiler found")
@pytest.mark.parametrize(("built", "why"), [(WRONG, r"lap_parse gave 0, \[0\.0, 0\.0\]"),
                                            (FOREIGN, "it lacks the entry points lap_parse")])
def test_parser_that_fails_its_test_call_is_not_used(
    fresh: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, built: bytes, why: str
) -> None:
    other = tmp_path / "other.c"
    other.write_bytes(built)
    cc = tmp_path / "fake-cc"
    cc.write_text(
        "#!/bin/sh\n"
        'case " $* " in *" -shared "*) ;; *) echo "fake cc 1.0"; exit 0;; esac\n'
        "cat > /dev/null\nout=; prev=\n"
        'for a in "$@"; do [ "$prev" = -o ] && out=$a; prev=$a; done\n'
        f'exec "{shutil.which(CC or "cc")}" -shared -fPIC -o "$out" "{other}"\n'
    )
    cc.chmod(0o755)
    monkeypatch.setenv("CC", str(cc))
    with pytest.warns(RuntimeWarning, match=f"could not compile solve_parse .*failed its test "
                                            f"load: {why}"):
        assert _solve_parse.load() is None
    assert solve(EXAMPLE.encode()) == "5.000000\n5.000000\n"  # the Python parser
    assert list(fresh.glob("solve_parse-*.failed"))
    assert not list(fresh.glob("solve_parse-*.so"))


@pytest.mark.skipif(CC is None, reason="no C compiler found")
def test_real_parser_passes_its_test_call(fresh: Path) -> None:
    lib = _solve_parse.load()
    assert lib is not None
    (built,) = fresh.glob("solve_parse-*.so")
    assert '"check"' in built.with_name(built.name + ".sha256").read_text()
