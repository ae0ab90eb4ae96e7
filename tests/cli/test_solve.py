"""`linattn solve`: examples, the quadratic reference, bad input, syntax, both parsers."""

from __future__ import annotations

import io
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import linattn
from linattn import _cbuild
from linattn.cli import UserError, _solve_parse, main
from linattn.cli.solve import parse_header, parse_values, solve

EXAMPLE_1 = (
    "3 2\n1.0 -2.0\n0.0 1.0\n-1.0 0.5\n2.0 -1.0\n0.5 0.5\n-0.5 1.0\n1.0 2.0\n-1.0 0.5\n0.0 -1.0\n"
)
EXAMPLE_2 = "2 2\n-1 -2\n-3 -1\n-1 -1\n-2 -3\n1 2\n3 4\n"

HAVE_C = _solve_parse.load() is not None
PARSERS = ["python", pytest.param("c", marks=pytest.mark.skipif(not HAVE_C, reason="no cc"))]


def cli(stdin: bytes, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m linattn solve`` (or ``args``) as a user would: bytes in, bytes out."""
    cmd = [sys.executable, "-m", "linattn", "solve"] if not args else list(args)
    done = subprocess.run(
        cmd, input=stdin, capture_output=True, timeout=300, env={**os.environ, **(env or {})}
    )
    done.stderr = without_compile_notice(done.stderr)
    return done


def without_compile_notice(stderr: bytes) -> bytes:
    """On a machine without a C compiler the command says once that it parses in Python: a
    fact about the machine, not output under test."""
    return b"".join(line for line in stderr.splitlines(keepends=True)
                    if not line.startswith(b"linattn: could not compile"))


def text_of(q: np.ndarray, k: np.ndarray, v: np.ndarray, sep: str = " ") -> str:
    """The exercise's input for (N, d) arrays; repr() round-trips every float64 exactly."""
    n, d = q.shape
    rows = [sep.join(map(repr, row)) for m in (q, k, v) for row in m.tolist()]
    return f"{n} {d}\n" + "\n".join(rows) + "\n"


def expected_sums(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Row sums of O from the quadratic reference (explicit N×N), float64."""
    t = [torch.from_numpy(x) for x in (q, k, v)]
    return linattn.reference.linear_attention(*t, feature_map="relu").sum(-1).numpy()


def numbers(out: str) -> np.ndarray:
    return np.array([float(line) for line in out.splitlines()])


# ------------------------------------------------------------------------------- correct output


@pytest.mark.parametrize("parser", PARSERS)
def test_examples(parser: str) -> None:
    assert solve(EXAMPLE_1.encode(), parser=parser) == "0.951613\n0.534483\n0.622449\n"
    assert solve(EXAMPLE_2.encode(), parser=parser) == "5.000000\n5.000000\n"


def test_examples_cli_and_console_script() -> None:
    done = cli(EXAMPLE_1.encode())
    assert (done.returncode, done.stdout, done.stderr) == (
        0,
        b"0.951613\n0.534483\n0.622449\n",
        b"",
    )
    script = Path(sys.executable).with_name("linattn")
    if script.exists():
        done = cli(EXAMPLE_2.replace("\n", " ").encode(), str(script), "solve")
        assert (done.returncode, done.stdout, done.stderr) == (0, b"5.000000\n5.000000\n", b"")


@pytest.mark.parametrize("parser", PARSERS)
@pytest.mark.parametrize("n,d,scale", [(1, 1, 1.0), (5, 3, 10.0), (40, 16, 3.0), (257, 64, 10.0)])
def test_random_against_quadratic_reference(parser: str, n: int, d: int, scale: float) -> None:
    rng = np.random.default_rng(n * 1000 + d)
    q, k, v = rng.uniform(-scale, scale, (3, n, d))
    got = numbers(solve(text_of(q, k, v).encode(), parser=parser))
    assert got.shape == (n,)
    np.testing.assert_allclose(got, expected_sums(q, k, v), rtol=0, atol=1e-5)
    # printed to 6 decimals: off by at most half a unit in the last place plus rounding noise
    assert np.abs(got - expected_sums(q, k, v)).max() <= 5.000001e-7


def test_n1_d1() -> None:
    # One key: every weight cancels, O = V.
    assert solve(b"1 1\n-3\n7\n2.5\n") == "2.500000\n"
    assert solve(b"1 1 0 0 -0.0000004") == "-0.000000\n"  # %.6f keeps the sign, as C does


def test_beyond_ten_and_float64() -> None:
    q, k, v = np.array([[[1e3, -250.0]], [[77.0, 1e-3]], [[-1e6, 12345.678]]])
    q, k, v = (np.concatenate([x, -x]) for x in (q, k, v))  # N = 2
    got = numbers(solve(text_of(q, k, v).encode()))
    np.testing.assert_allclose(got, expected_sums(q, k, v), rtol=1e-12, atol=1e-6)


# ---------------------------------------------------------------------------- syntax and spacing

SYNTAXES = [
    "1",
    "-2.5",
    "+3.",
    ".5",
    "1e-3",
    "2.5E+1",
    "-.5e-3",
    "+.5E2",
    "0",
    "-0",
    "00012.50",
    "1_000.5",
    "1e1_0",
    "\u0661\u0662.5",  # float() takes underscores and Unicode digits
    "123456789012345678901234567890",
    "0.1234567890123456789012345",
    "1e-30",
    "4.9e-324",
    "1e-400",
    "1.7976931348623157e308",
    "9007199254740993",
    "2.2250738585072011e-308",
    "1e22",
    "1e23",
    "123456789e-22",
    "0.000000000000000000000000000001",
]


@pytest.mark.parametrize("parser", PARSERS)
def test_every_float_syntax_matches_float(parser: str) -> None:
    texts = SYNTAXES * 3  # Q, K, V of N = 1, d = len(SYNTAXES)
    got = parse_values("  ".join(texts).encode(), 0, 1, len(SYNTAXES), parser=parser)
    want = np.array([float(s) for s in texts])
    assert np.array_equal(got.view(np.int64), want.view(np.int64))  # bit for bit, -0.0 too


@pytest.mark.parametrize("parser", PARSERS)
def test_random_decimals_bit_exact(parser: str) -> None:
    # Short, long, tiny and huge decimals: each must equal float() to the last bit.
    rng = random.Random(7)
    texts = []
    for _ in range(3 * 4000):
        digits = "".join(
            rng.choice("0123456789") for _ in range(rng.choice([1, 3, 8, 15, 16, 17, 19, 20, 30]))
        )
        cut = rng.randrange(len(digits) + 1)
        mant = digits[:cut] + rng.choice([".", ""]) + digits[cut:] if cut else "." + digits
        mant = mant if any(c.isdigit() for c in mant) else "0"
        exp = rng.choice(["", "", f"e{rng.randint(-340, 270)}", f"E+{rng.randint(0, 22)}"])
        texts.append(rng.choice(["", "-", "+"]) + mant + exp)
    got = parse_values(" ".join(texts).encode(), 0, 4000, 1, parser=parser)
    want = np.array([float(t) for t in texts])
    assert np.array_equal(got.view(np.int64), want.view(np.int64))


@pytest.mark.parametrize("parser", PARSERS)
@pytest.mark.parametrize(
    "sep",
    [" ", "\t", "\n", "\r\n", "   \t ", "\x0b", "\x0c", "\x1c", "\u00a0", "\u2003", " \r\n\t"],
)
def test_any_whitespace_separates(parser: str, sep: str) -> None:
    header, body = EXAMPLE_1.split("\n", 1)
    text = header + "\n" + body.replace(" ", sep).replace("\n", sep)
    assert solve(text.encode(), parser=parser) == "0.951613\n0.534483\n0.622449\n"


@pytest.mark.parametrize("parser", PARSERS)
def test_crlf_leading_trailing_space_and_bom(parser: str) -> None:
    text = "\ufeff  \r\n" + EXAMPLE_2.replace("\n", "\r\n") + "\r\n\r\n  \t"
    assert solve(text.encode(), parser=parser) == "5.000000\n5.000000\n"


# ---------------------------------------------------------------------------------- bad input

BAD = [
    # (input, message)
    ("", "empty input: expected a header 'N d'"),
    ("  \n\t\r\n", "empty input: expected a header 'N d'"),
    ("3", "line 1: incomplete header: expected 'N d', got only '3'"),
    ("\n\n3\n", "line 3: incomplete header: expected 'N d', got only '3'"),
    ("0 2\n", "line 1: N: expected a positive integer, got '0'"),
    ("-3 2\n", "line 1: N: expected a positive integer, got '-3'"),
    ("2.5 2\n", "line 1: N: expected a positive integer, got '2.5'"),
    ("x 2\n", "line 1: N: expected a positive integer, got 'x'"),
    ("2\n1e2\n", "line 2: d: expected a positive integer, got '1e2'"),
    ("2 0\n", "line 1: d: expected a positive integer, got '0'"),
    ("1 1\n1\n2\nx\n", "line 4: expected a number, got 'x' (V row 1, column 1)"),
    (
        "2 2\n1 2\n3 4\n5 6\n7 8\n9 1O\n1 2\n",
        "line 6: expected a number, got '1O' (V row 1, column 2)",
    ),
    ("1 2\n1 2\n3 nan\n5 6\n", "line 3: expected a finite number, got 'nan' (K row 1, column 2)"),
    ("1 2\n1 -inf 3 4 5 6\n", "line 2: expected a finite number, got '-inf' (Q row 1, column 2)"),
    ("1 1\n1e400 1 1\n", "line 2: expected a finite number, got '1e400' (Q row 1, column 1)"),
    ("1 1\n1 2 3,\n", "line 2: expected a number, got '3,' (V row 1, column 1)"),
    ("1 1\n1 2 0x10\n", "line 2: expected a number, got '0x10' (V row 1, column 1)"),
    ("1 1\n1 2 1e\n", "line 2: expected a number, got '1e' (V row 1, column 1)"),
    ("1 1\n1 2 -\n", "line 2: expected a number, got '-' (V row 1, column 1)"),
    ("1 1\n1 .\n3\n", "line 2: expected a number, got '.' (K row 1, column 1)"),
    ("1 1\n1.2.3 2 3\n", "line 2: expected a number, got '1.2.3' (Q row 1, column 1)"),
    ("1 1\n1 2 --3\n", "line 2: expected a number, got '--3' (V row 1, column 1)"),
    ("1 1\n1 2 \udcff\n", "line 2: expected a number, got b'\\xff' (V row 1, column 1)"),
    (
        "1 2\n1 2\n\n\t\u00a0 \u0663\u00a0oops",  # Unicode spaces split, '٣' is 3
        "line 4: expected a number, got 'oops' (K row 1, column 2)",
    ),
    ("1 1\n1 2\n\u0663\u00a0oops", "expected 3 values after the header, got 4"),
    (
        "3\u00a02\u00a01\n",
        "line 1: header: expected 'N d' followed by ASCII whitespace, got '3\\xa02\\xa01'",
    ),
    ("3 2\n1 2 3 4 5 6\n", "expected 18 values after the header, got 6"),
    ("1 1\n", "expected 3 values after the header, got 0"),
    ("1 1 1 2 3 4", "expected 3 values after the header, got 4"),
    ("1 1 1 2 3 4 x y\n", "expected 3 values after the header, got 6"),
    ("100000 64\n1 2 3\n", "expected 19200000 values after the header, got 3"),
]


@pytest.mark.parametrize("parser", PARSERS)
@pytest.mark.parametrize("text,message", BAD)
def test_bad_input_message(parser: str, text: str, message: str) -> None:
    data = text.encode("utf-8", "surrogateescape")  # "\udcff" is the byte 0xff
    with pytest.raises(UserError) as err:
        solve(data, parser=parser)
    assert str(err.value) == message


@pytest.mark.parametrize("text,message", BAD)
def test_bad_input_cli_contract(
    text: str, message: str, monkeypatch: pytest.MonkeyPatch, capsysbinary: pytest.CaptureFixture
) -> None:
    # In-process `linattn solve` (a subprocess costs seconds of torch import per case).
    stdin = io.TextIOWrapper(io.BytesIO(text.encode("utf-8", "surrogateescape")))
    monkeypatch.setattr(sys, "stdin", stdin)
    status = main(["solve"])
    out, err = capsysbinary.readouterr()
    assert (status, out) == (2, b"")
    assert err.decode() == f"linattn solve: error: {message}\n"  # one line, no traceback


def test_bad_input_in_a_real_process() -> None:
    done = cli(b"2 2\n1 2\n3 4\n5 6\n7 8\n9 x\n")
    assert (done.returncode, done.stdout) == (2, b"")
    assert (
        done.stderr
        == b"linattn solve: error: line 6: expected a number, got 'x' (V row 1, column 2)\n"
    )


def test_overflowing_result_is_an_error() -> None:
    with pytest.raises(UserError, match=r"row 1: the result is not finite"):
        solve(b"1 2\n1e300 1e300\n1e300 1e300\n1 2\n")


def test_overflow_is_one_line_in_a_real_process() -> None:
    # NumPy's overflow RuntimeWarnings must not precede the error line (issue 14).
    text = "2 2\n" + "1e300 1e300\n" * 6
    for engine in ("numpy", "torch"):
        done = cli(text.encode(), sys.executable, "-W", "default", "-m", "linattn", "solve",
                   "--engine", engine)
        assert (done.returncode, done.stdout) == (2, b""), engine
        assert done.stderr == (b"linattn solve: error: row 1: the result is not finite in "
                               b"float64 (values too large to sum)\n"), engine


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_full_output_device_is_one_line() -> None:
    with open("/dev/full", "wb") as full:  # every write fails with ENOSPC
        done = subprocess.run([sys.executable, "-m", "linattn", "solve"], input=EXAMPLE_1.encode(),
                              stdout=full, stderr=subprocess.PIPE, timeout=300)
    assert done.returncode == 2
    assert without_compile_notice(done.stderr) == (
        b"linattn solve: error: cannot write the output (No space left on device)\n")


@pytest.mark.parametrize("closed", ["stdin", "stdout"])
def test_closed_standard_stream_is_one_line(closed: str) -> None:
    # `linattn solve <&-` / `>&-`: the shell closes the descriptor before Python starts.
    code = ("import os, sys; os.close({fd}); "
            "os.execv(sys.executable, [sys.executable, '-m', 'linattn', 'solve'])")
    done = subprocess.run([sys.executable, "-c", code.format(fd=0 if closed == "stdin" else 1)],
                          input=None if closed == "stdin" else EXAMPLE_1.encode(),
                          stdout=subprocess.PIPE if closed == "stdin" else None,
                          stderr=subprocess.PIPE, timeout=300)
    stderr = without_compile_notice(done.stderr)
    assert done.returncode == 2
    assert stderr.startswith(b"linattn solve: error: standard " +
                             (b"input" if closed == "stdin" else b"output") + b" is closed")
    assert stderr.count(b"\n") == 1


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_an_endless_stream_without_a_header_is_one_line_at_once(device: str) -> None:
    """`linattn solve < /dev/zero` read for ever (all of stdin before looking at the header,
    issue 51): the header is checked as soon as it has been read."""
    with open(device, "rb") as stdin:
        done = subprocess.run([sys.executable, "-m", "linattn", "solve"], stdin=stdin,
                              capture_output=True, timeout=120)
    stderr = without_compile_notice(done.stderr)
    assert done.returncode == 2 and stderr.count(b"\n") == 1, stderr
    assert stderr.startswith(b"linattn solve: error: line 1: ") and len(stderr) < 300, stderr


def test_parse_header_offset() -> None:
    assert parse_header(b"3 2\n1") == (3, 2, 3)
    assert parse_header(b"\xef\xbb\xbf 10\t64 ") == (10, 64, 9)


# --------------------------------------------------------------------------- the compiled parser


def test_fallback_when_no_compiler(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(_solve_parse, "_tried", False)
    monkeypatch.setattr(_solve_parse, "_lib", None)
    monkeypatch.setattr(_cbuild, "compiler", lambda: None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert _solve_parse.load() is None
    assert solve(EXAMPLE_1.encode()) == "0.951613\n0.534483\n0.622449\n"  # "auto" falls back
    with pytest.raises(RuntimeError, match="not available"):
        solve(EXAMPLE_1.encode(), parser="c")


@pytest.mark.skipif(not HAVE_C, reason="no cc")
def test_build_into_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(_solve_parse, "_tried", False)
    monkeypatch.setattr(_solve_parse, "_lib", None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert _solve_parse.load() is not None
    (built,) = (tmp_path / "linattn").glob("solve_parse-*.so")
    assert built.stat().st_size > 0


def test_env_selects_python_parser() -> None:
    done = cli(EXAMPLE_2.encode(), env={"LINATTN_SOLVE_PARSER": "python"})
    assert (done.returncode, done.stdout) == (0, b"5.000000\n5.000000\n")


# ------------------------------------------------------------------------------------ full size


def o_n_sums(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Row sums in O(N·d) with numpy (at N = 10^5 the quadratic reference would need 80 GB)."""
    fq, fk = np.maximum(q, 0) + 1, np.maximum(k, 0) + 1
    return fq @ (fk.T @ v.sum(1)) / (fq @ fk.sum(0))


@pytest.mark.slow
@pytest.mark.parametrize("parser", ["auto", "python"])
def test_full_size_1e5_by_64(parser: str) -> None:
    n, d = 100_000, 64
    rng = np.random.default_rng(0)
    x = np.round(rng.uniform(-10, 10, (3 * n, d)), 4)
    text = f"{n} {d}\n" + "\n".join(" ".join(f"{a:.4f}" for a in row) for row in x.tolist())
    done = cli(text.encode(), env={"LINATTN_SOLVE_PARSER": parser})
    assert done.returncode == 0, done.stderr
    got = numbers(done.stdout.decode())
    q, k, v = x.reshape(3, n, d)
    assert np.abs(got - o_n_sums(q, k, v)).max() <= 1e-5


@pytest.mark.parametrize("seed", range(6))
def test_numpy_engine_matches_the_library_op(seed):
    """The default engine (NumPy, no torch import) against linattn.linear_attention."""
    from linattn.cli.solve import row_sums, row_sums_numpy

    rng = np.random.default_rng(seed)
    n, d = int(rng.integers(1, 400)), int(rng.integers(1, 65))
    scale = [1.0, 10.0, 1e3][seed % 3]
    qkv = rng.uniform(-scale, scale, size=(3, n, d))
    np.testing.assert_allclose(row_sums_numpy(qkv), row_sums(qkv), rtol=1e-12, atol=1e-12)


def test_engines_print_the_same_text():
    from linattn.cli.solve import solve

    rng = np.random.default_rng(0)
    n, d = 50, 7
    body = "\n".join(" ".join(f"{x:.5f}" for x in row) for row in rng.normal(size=(3 * n, d)))
    data = f"{n} {d}\n{body}\n".encode()
    assert solve(data, engine="numpy") == solve(data, engine="torch")


# -------------------- the compiled parser
# The compiled parser of `linattn solve` (cli/_solve_parse.py) is used only after its test
# call passed in a child interpreter: a library whose lap_parse misparses, or that has none, is
# not used (one warning, the Python parser).


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
