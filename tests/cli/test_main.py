"""The ``linattn`` console script and ``python -m linattn``: help and version."""

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
