"""benchmarks/peers/ggml_gated_delta.py without ggml: where ggml is missing or unusable the
script says so in one line on stderr and exits 2, before importing torch or linattn."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "peers" / "ggml_gated_delta.py"


def run(*args: str, ggml_env: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "LINATTN_GGML"}
    if ggml_env is not None:
        env["LINATTN_GGML"] = ggml_env
    return subprocess.run([sys.executable, str(SCRIPT), *args], env=env, capture_output=True,
                          text=True, timeout=60)


def one_line_exit_2(p: subprocess.CompletedProcess, *words: str) -> None:
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert p.stdout == ""
    lines = p.stderr.splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("ggml_gated_delta.py: ")
    for w in words:
        assert w in lines[0]


def test_no_ggml_given():
    one_line_exit_2(run(), "--ggml", "LINATTN_GGML")


@pytest.mark.parametrize("how", ["arg", "env"])
def test_ggml_folder_missing(tmp_path, how):
    missing = str(tmp_path / "nowhere")
    p = run("--ggml", missing) if how == "arg" else run(ggml_env=missing)
    one_line_exit_2(p, "does not exist", missing)


def test_folder_without_the_libraries(tmp_path):
    one_line_exit_2(run("--ggml", str(tmp_path)), "libggml-base.so", str(tmp_path))


def test_libraries_that_do_not_load(tmp_path):
    lib = tmp_path / "build" / "src"
    lib.mkdir(parents=True)
    for name in ("libggml-base.so", "libggml-cpu.so"):
        (lib / name).write_bytes(b"not a library")
    one_line_exit_2(run("--ggml", str(tmp_path)), "cannot use ggml", "not an ELF", str(lib))


def test_bad_threads_is_a_usage_error():
    p = run("--threads", "0,1")
    assert p.returncode == 2 and "--threads" in p.stderr
