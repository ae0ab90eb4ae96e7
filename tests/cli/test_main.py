"""The ``linattn`` console script and ``python -m linattn``: help and version; the small
commands ``linattn plot`` and ``linattn bench``."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import linattn
from linattn.cli import SUBCOMMANDS, main


def _console_script() -> str:
    """The ``linattn`` script installed beside this interpreter (the venv's), else on PATH."""
    beside = Path(sys.executable).parent / "linattn"
    found = str(beside) if beside.exists() else shutil.which("linattn")
    if found is None:
        pytest.skip("the linattn console script is not installed")
    return found


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def test_console_script_help():
    res = _run(_console_script(), "--help")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("usage: linattn")
    for name in SUBCOMMANDS:
        assert name in res.stdout


def test_console_script_version():
    res = _run(_console_script(), "--version")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"linattn {linattn.__version__}"


def test_python_m_version():
    res = _run(sys.executable, "-m", "linattn", "--version")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"linattn {linattn.__version__}"


def test_version_matches_package_metadata():
    from importlib.metadata import version

    assert linattn.__version__ == version("linattn")


def test_main_in_process(capsys):
    assert main([]) == 0  # no subcommand: help, success
    assert "usage: linattn" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"linattn {linattn.__version__}"
    assert main(["no-such-command"]) == 2  # argparse's errors: one line, like every other
    err = capsys.readouterr().err
    assert err.startswith("linattn: error: ") and err.count("\n") == 1
    assert "invalid choice" in err


# -------------------- linattn plot
# ``linattn plot feature-maps``.


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "maps.png"
    assert main(["plot", "feature-maps", "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size > 10_000
    assert [p.name for p in tmp_path.iterdir()] == ["maps.png"]  # no temporary left behind


def test_plot_missing_folder_is_a_one_line_error(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    assert main(["plot", "feature-maps", "-o", str(tmp_path / "nope" / "x.png")]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and len(err.strip().splitlines()) == 1


# -------------------- linattn bench
# ``linattn bench``: argument errors, and (slow) one small end-to-end run.


def test_bench_bad_arguments_are_one_line_errors(capsys, tmp_path):
    assert main(["bench", "-T", "0", "--no-crossover"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "-T" in err and "positive" in err
    assert main(["bench", "-T", "64", "--plot", str(tmp_path / "nope" / "b.png")]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.slow
def test_bench_small_run_prints_the_tables_and_writes_the_plot(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    from linattn.ops import native

    out = tmp_path / "bench.png"
    code = main(["bench", "-T", "512", "-H", "2", "-d", "16", "--repeats", "1", "--no-portable",
                 "--crossover", "128", "256", "--plot", str(out)])
    text = capsys.readouterr().out
    assert code == 0
    assert text.count("| torch |") == 4 and "roofline:" in text
    assert text.count("| native native |") == (4 if native.load() else 0)
    assert "| of peak |" in text and "core peak, native build:" in text
    assert "crossover, forward non-causal" in text
    assert out.read_bytes()[:4] == b"\x89PNG"
