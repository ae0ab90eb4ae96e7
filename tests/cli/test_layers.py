"""The two layers that keep the command-line contract (linattn.cli, docs/design.md): options
declared once (linattn._config.Check) and parsed with their declaration by every subcommand, and
the one place (linattn.cli.main) that turns user errors into one line and exit status 2. The
table of tests/cli/test_contract.py runs the commands; this file holds the layers themselves."""

from __future__ import annotations

import argparse
import errno
import math
import os
import re
import sys

import pytest

from linattn import _io
from linattn._config import (
    FEATURE_MAP_NAMES,
    POSITIVE_INT,
    THREADS,
    Check,
    Range,
    available_cpus,
    capped_threads,
)
from linattn.cli import UserError, build_parser, main, probe_output_dir
from linattn.train_loop import CheckpointError, NonFiniteError


def _options(parser: argparse.ArgumentParser, prog=""):
    """(command, action) for every option and positional of every (sub)parser."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, f"{prog} {name}".strip())
        else:
            yield prog, action


def test_every_numeric_option_is_parsed_by_a_declared_check():
    """A flag given ``type=int`` or ``type=float`` would accept any value (a thread count of
    100000, a learning rate of nan): each must name its declared Check instead."""
    loose = [f"{prog} {'/'.join(a.option_strings) or a.dest}" for prog, a in
             _options(build_parser()) if a.type in (int, float)]
    assert loose == []
    checked = {(prog, a.dest) for prog, a in _options(build_parser())
               if isinstance(getattr(a.type, "__self__", None), Check)}
    for prog in ("forda train", "forda evaluate", "lm train", "lm generate", "bench"):
        assert (prog, "threads") in checked


def test_feature_map_names_are_the_libraries():
    from linattn.feature_maps import FEATURE_MAPS

    assert sorted(FEATURE_MAP_NAMES) == sorted(FEATURE_MAPS)


@pytest.mark.parametrize("check, good, bad, expected", [
    (POSITIVE_INT, ["1", "7"], ["0", "-1", "1.5", "x", ""], "a positive integer"),
    (Check(float, Range(0.0, math.inf, False)), ["1e-3", "2"], ["0", "-1", "nan", "inf"],
     "a finite number > 0"),
    (Check(float, Range(0.0, 1.0)), ["0", "0.5"], ["1", "2", "nan"], "a number in [0, 1)"),
    (Check(int, Range(0, math.inf)), ["0", "3"], ["-1"], "a non-negative integer"),
    (Check(str, choices=("elu", "relu")), ["elu", "ReLU"], ["bogus"], "one of elu, relu"),
])
def test_check_parses_flags_and_checks_values(check, good, bad, expected):
    assert check.expected() == expected
    for text in good:
        check.parse(text)
    for text in bad:
        with pytest.raises(argparse.ArgumentTypeError,
                           match=f"^expected {re.escape(expected)}, got "):
            check.parse(text)
    with pytest.raises(ValueError, match=f"^name: expected {re.escape(expected)}, got True"):
        check.check("name", True)  # a bool is not a number, whatever Python says


def test_thread_counts_are_capped_with_one_warning():
    have = available_cpus()
    assert capped_threads(1) == 1
    with pytest.warns(RuntimeWarning, match=f"^--threads: 100000 threads asked for, this "
                                            f"machine gives the process {have} CPU"):
        assert capped_threads(100_000, "--threads") == have
    for bad in (0, -1, 2.0, True, None):
        with pytest.raises(ValueError, match="^n_threads: expected a positive integer"):
            capped_threads(bad)
    assert THREADS.expected() == "a positive integer"


def test_probe_output_dir_leaves_nothing(tmp_path):
    probe_output_dir(tmp_path / "a" / "b", "--out")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "f").write_text("x")
    with pytest.raises(UserError, match="^--out: .*f: not a folder$"):
        probe_output_dir(tmp_path / "f", "--out")
    with pytest.raises(UserError, match="^--out: .*Not a directory$"):
        probe_output_dir(tmp_path / "f" / "x", "--out")


@pytest.mark.parametrize("data, match", [
    (b"", "not valid JSON"), (b"\xff{", "not UTF-8"), (b"[" * 100_000, "nested too deeply"),
    (b'{"a": ', "not valid JSON"),
])
def test_read_json_is_one_value_error(tmp_path, data, match):
    (tmp_path / "x.json").write_bytes(data)
    with pytest.raises(ValueError, match=f"^{tmp_path / 'x.json'}: .*{match}") as err:
        _io.read_json(tmp_path / "x.json")
    assert "\n" not in str(err.value)


def test_failed_writes_name_the_file_and_leave_it_whole(tmp_path, monkeypatch):
    (tmp_path / "m.jsonl").write_text('{"a": 1}\n')
    real = os.write

    def full_after(fd, data):  # writes a few bytes, then the disk is full
        if len(data) > 3:
            return real(fd, bytes(data[:3]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_io.os, "write", full_after)
    with pytest.raises(OSError, match="No space left") as err:
        _io.append_text(tmp_path / "m.jsonl", '{"b": 2}\n')
    monkeypatch.undo()
    assert err.value.filename == str(tmp_path / "m.jsonl")
    assert (tmp_path / "m.jsonl").read_text() == '{"a": 1}\n'  # no half line

    with pytest.raises(OSError) as err, _io.atomic_path(tmp_path / "out.bin") as tmp:
        tmp.write_bytes(b"x")
        raise OSError(errno.EFBIG, "File too large")
    assert err.value.filename == str(tmp_path / "out.bin")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.jsonl"]


def _with_command(monkeypatch, func) -> None:
    """Add a subcommand ``probe-cmd`` running ``func()`` to the parser linattn.cli.main uses."""
    import linattn.cli as cli

    def parser():
        p = build_parser()
        sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
        sub.add_parser("probe-cmd").set_defaults(func=lambda args: func())
        return p

    monkeypatch.setattr(cli, "build_parser", parser)


@pytest.mark.parametrize("raise_, line", [
    (UserError("bad thing"), "linattn probe-cmd: error: bad thing"),
    (OSError(errno.ENOSPC, "No space left on device", "/x/run.json"),
     "linattn probe-cmd: error: /x/run.json: No space left on device"),
    (CheckpointError("/x/ck.pt: corrupt\nmore"), "linattn probe-cmd: error: /x/ck.pt: corrupt"),
    (NonFiniteError("training diverged at step 3"),
     "linattn probe-cmd: error: training diverged at step 3"),
    # an allocation that still fails past the memory estimates (issue 51): one line, no
    # traceback
    (MemoryError(), "linattn probe-cmd: error: out of memory; choose smaller sizes"),
    (RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough "
                  "memory: you tried to allocate 4398046511104 bytes."),
     "linattn probe-cmd: error: out of memory (4 TiB asked for); choose smaller sizes"),
])
def test_main_turns_user_errors_into_one_line(monkeypatch, capsys, raise_, line):
    def boom():
        raise raise_

    _with_command(monkeypatch, boom)
    assert main(["probe-cmd"]) == 2
    assert capsys.readouterr().err == line + "\n"


def test_main_reader_left_is_quiet_and_a_bug_still_raises(monkeypatch, capsys):
    def reader_left():
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    def bug():
        raise ZeroDivisionError("a bug is a traceback, not a user error")

    _with_command(monkeypatch, reader_left)
    assert main(["probe-cmd"]) == 1
    assert capsys.readouterr().err == ""
    assert sys.stdout is not None  # the caller's stdout is left as it was
    _with_command(monkeypatch, bug)
    with pytest.raises(ZeroDivisionError):
        main(["probe-cmd"])

    def torch_bug():
        raise RuntimeError("shape mismatch: a bug, not memory")

    _with_command(monkeypatch, torch_bug)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        main(["probe-cmd"])


def test_huge_integers_are_shown_by_their_size():
    """A 4,000-digit value made a 4 KB error line (and over 4,300 digits Python refuses to
    print it at all): the messages give its size instead."""
    from linattn._config import SEED

    with pytest.raises(argparse.ArgumentTypeError, match=r"^expected an integer in "
                                                         r"\[0, 4294967295\], got an integer "
                                                         r"of 13288 bits$"):
        SEED.parse("9" * 4000)
    with pytest.raises(argparse.ArgumentTypeError, match=r"got an integer of 5000 digits$"):
        SEED.parse("9" * 5000)  # more digits than int() reads
    with pytest.raises(ValueError, match=r"^seed: expected .*, got an integer of 3322 bits$"):
        SEED.check("seed", 10**1000)
    assert SEED.parse(str(2**32 - 1)) == 2**32 - 1


def test_a_closed_standard_output_is_one_line_and_a_closed_stderr_is_silence(monkeypatch,
                                                                              capsys):
    """A process started with `>&-` has sys.stdout None: the first print was an
    AttributeError. With `2>&-` (sys.stderr None) the command runs, its messages lost."""
    def prints():
        print("result")

    _with_command(monkeypatch, prints)
    monkeypatch.setattr(sys, "stdout", None)
    assert main(["probe-cmd"]) == 2
    assert capsys.readouterr().err == ("linattn probe-cmd: error: cannot write the output "
                                       "(standard output is closed)\n")
    assert sys.stdout is None  # restored as it was
    monkeypatch.undo()

    def warns_then_fails():
        import warnings
        warnings.warn("a warning with nowhere to go", RuntimeWarning, stacklevel=2)
        raise UserError("an error with nowhere to go")

    _with_command(monkeypatch, warns_then_fails)
    monkeypatch.setattr(sys, "stderr", None)
    assert main(["probe-cmd"]) == 2  # the status still says it
    assert sys.stderr is None


def test_help_into_a_full_disk_is_an_error(monkeypatch, capsys):
    """argparse swallowed the failed write of --help and --version: exit 0, nothing
    written."""
    class Full:
        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stdout", Full())
    assert main(["--help"]) == 2
    assert capsys.readouterr().err == ("linattn: error: cannot write the output (No space left "
                                       "on device)\n")
