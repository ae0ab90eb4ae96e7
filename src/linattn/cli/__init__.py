"""The ``linattn`` command. One module per subcommand.

Each subcommand module defines ``register(subparsers)``, which adds its parser and sets
``func`` (a callable taking the parsed ``argparse.Namespace`` and returning an exit status).

The contract (docs/design.md): a user error is one line on stderr, ``linattn COMMAND: error:
...``, and exit status 2, never a traceback. Two layers keep it for every subcommand:

* **Arguments**: a flag's type and range are declared once, as a :class:`linattn._config.Check`
  shared with the library configuration that takes the same value, and the flag is parsed with
  it (``type=check.parse``): a bad value fails while parsing, before torch or any data is
  loaded. argparse's own errors are one line too (:class:`Parser`: no usage block).
* **Errors**: :func:`main` is the one place that turns what a user can cause into one line and
  exit 2: :class:`UserError` (raised by the subcommands), argparse's errors, ``OSError`` (an
  unwritable folder, a full disk: the file and the reason), the library's
  :class:`~linattn.train_loop.CheckpointError` (a corrupt or mismatched file) and
  :class:`~linattn.train_loop.NonFiniteError` (training diverged), and an allocation that
  failed (``MemoryError``, torch's allocator: sizes are estimated before allocating,
  :mod:`linattn._memory`, so this is what is left). Standard output is guarded:
  a failed write (``> /dev/full``) is ``cannot write the output (...)``, and a reader that left
  (``| head``) ends the command quietly with status 1, as Unix tools do.

So a new flag is covered by declaring its :class:`~linattn._config.Check` (beside its
configuration) and passing ``type=check.parse``; a new subcommand by raising
:class:`UserError`, ``OSError`` or those library errors, never printing tracebacks itself, and
by a row in the table of tests/cli/test_contract.py.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys
import warnings
from collections.abc import Sequence

from linattn import __version__
from linattn._memory import is_out_of_memory
from linattn.train_loop import CheckpointError, NonFiniteError

# Subcommand modules, in the order they are listed by --help.
SUBCOMMANDS: tuple[str, ...] = ("solve", "forda", "plot", "bench", "lm", "recall")

__all__ = ["UserError", "OutputError", "Parser", "build_parser", "main", "SUBCOMMANDS",
           "path_arg", "probe_output_dir", "probe_output_file", "read_json_file", "start_work"]


class UserError(Exception):
    """A problem with the user's input: reported in one line, exit status 2."""


class _ArgumentError(UserError):
    """argparse's error, with the command it belongs to (``linattn lm``)."""

    def __init__(self, message: str, command: str) -> None:
        super().__init__(message)
        self.command = command


class OutputError(OSError):
    """Standard output cannot be written (a full disk, ``/dev/full``)."""


class Parser(argparse.ArgumentParser):
    """argparse's parser whose errors are one line (:func:`main` prints them), not a usage
    block and a second line; subparsers are of this class too."""

    def error(self, message: str) -> None:  # type: ignore[override]
        command = " ".join(self.prog.split()[:2])  # "linattn lm train" -> "linattn lm"
        raise _ArgumentError(message.removeprefix("argument "), command)

    def _print_message(self, message: str, file=None) -> None:
        """argparse's, without swallowing a failed write: ``--help`` or ``--version`` into a
        full disk exited 0 with nothing written. Flushed, so that the failure is raised here,
        in :func:`main`'s layer, not at the interpreter's exit."""
        if message:
            file = sys.stderr if file is None else file
            file.write(message)
            file.flush()


class _GuardedOutput:
    """Standard output whose failed writes raise :class:`OutputError` (BrokenPipeError, the
    reader leaving, passes through as it is)."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def _guard(self, method, *args):
        try:
            return method(*args)
        except BrokenPipeError:
            raise
        except OSError as err:
            raise OutputError(err.errno, f"cannot write the output ({err.strerror or err})"
                              ) from None

    def write(self, text):
        return self._guard(self._stream.write, text)

    def flush(self):
        return self._guard(self._stream.flush)

    def __getattr__(self, name):
        return getattr(self._stream, name)


class _LossyError:
    """Standard error whose failed writes (a full disk, ``/dev/full``) are dropped, as a closed
    one's are: the progress bar and the error line have nowhere to go, and the exit status
    still says what happened (a progress bar's failed write ended a run with status 1, an
    error line's turned status 2 into 1)."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def _lossy(self, method, *args):
        try:
            return method(*args)
        except OSError:  # what is buffered goes to /dev/null, also at the interpreter's exit
            _drop_stream(self._stream, sys.__stderr__)
            try:
                return method(*args)
            except OSError:
                return None

    def write(self, text):
        written = self._lossy(self._stream.write, text)
        return len(text) if written is None else written

    def flush(self):
        self._lossy(self._stream.flush)

    def __getattr__(self, name):
        return getattr(self._stream, name)


class _ClosedStream:
    """Stands for a standard stream the process was started without (``>&-``): Python makes
    it None, and the first ``print`` was an AttributeError. A write is an OSError, which
    :class:`_GuardedOutput` reports in one line."""

    closed = True  # as a closed file says (a command may ask before its work)

    def __init__(self, name: str) -> None:
        self.name = name

    def write(self, text: str) -> int:
        raise OSError(errno.EBADF, f"{self.name} is closed")

    def flush(self) -> None:
        pass


def _occupy_closed_descriptors() -> None:
    """Point file descriptors 0-2 that the process was started without at /dev/null, so that
    the next file opened (a checkpoint, a lock) never becomes descriptor 1 or 2, where C code's
    and torch's messages would land in it."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            try:
                devnull = os.open(os.devnull, os.O_RDWR)
                if devnull != fd:
                    os.dup2(devnull, fd)
                    os.close(devnull)
            except OSError:
                pass


def _standard_streams() -> tuple:
    """(stdout, stderr) for a command: a closed standard output writes nothing and fails in
    one line (``cannot write the output (standard output is closed)``); a closed standard
    error is /dev/null (progress bars and warnings have nowhere to go; the exit status still
    says what happened)."""
    _occupy_closed_descriptors()
    stdout = sys.stdout if sys.stdout is not None else _ClosedStream("standard output")
    stderr = sys.stderr
    if stderr is None:
        stderr = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - the process's own
    return stdout, _LossyError(stderr)


def _drop_stdout(stream) -> None:
    """Point the process's standard output at /dev/null once a write to it failed, so that
    the interpreter's flush of what is still buffered, at exit, does not fail a second time
    with a traceback (a stream other than the process's own is left alone)."""
    _drop_stream(stream, sys.__stdout__)


def _drop_stream(stream, own) -> None:
    """Point ``stream``'s descriptor at /dev/null when it is the process's own ``own``."""
    if stream is None or stream is not own:
        return
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def describe_os_error(err: OSError) -> str:
    """One line for an OSError: ``FILE: reason`` (both files of a rename or copy)."""
    if isinstance(err, OutputError):
        return err.strerror
    reason = err.strerror or str(err) or type(err).__name__
    if err.filename is None:
        return reason
    files = str(err.filename) + ("" if err.filename2 is None else f" -> {err.filename2}")
    return f"{files}: {reason}"


def path_arg(text: str) -> str:
    """argparse's ``type=`` of an output path: not empty (an unset shell variable, ``--out
    "$OUT"``: ``Path("")`` is the current folder, where the run was written)."""
    if not text:
        raise argparse.ArgumentTypeError("expected a path, got ''")
    return text


def probe_output_dir(path: str | os.PathLike, option: str) -> None:
    """Fail now, as a :class:`UserError` naming ``option``, if folder ``path`` cannot be created
    or written, instead of after minutes of work: the missing folders are created, a file is
    written and everything made here is removed again. A folder that vanished or appeared
    meanwhile (another run's probe of the same new path, two runs started at once) is probed
    again."""
    from pathlib import Path

    for attempt in range(3):
        try:
            return _probe_dir(Path(path), option)
        except (FileNotFoundError, FileExistsError) as err:
            if attempt == 2:
                raise UserError(f"{option}: {describe_os_error(err)}") from None
        except OSError as err:
            raise UserError(f"{option}: {describe_os_error(err)}") from None


def _probe_dir(path, option: str) -> None:
    """:func:`probe_output_dir` once (OSError as it is)."""
    import tempfile

    made = []
    try:
        missing = [p for p in (path, *path.parents) if not p.exists()]
        for p in reversed(missing):
            p.mkdir()
            made.append(p)
        if not path.is_dir():
            raise UserError(f"{option}: {path}: not a folder")
        with tempfile.TemporaryFile(dir=path) as f:
            f.write(b"\0")
            f.flush()
    finally:
        for p in reversed(made):
            try:
                p.rmdir()
            except OSError:
                pass


def probe_output_file(path: str | os.PathLike, option: str) -> None:
    """Fail now, as a :class:`UserError` naming ``option``, if file ``path`` cannot be written.
    A regular file (new, or behind a link) is replaced from its folder, which must exist and be
    writable (:func:`probe_output_dir`); a device or a FIFO is written through
    (:func:`linattn._io.write_target`) and needs write permission only."""
    from linattn._io import write_target

    try:
        target, regular = write_target(path)
    except OSError as err:
        raise UserError(f"{option}: {describe_os_error(err)}") from None
    if not regular:
        if not os.access(target, os.W_OK):
            raise UserError(f"{option}: {path}: {os.strerror(errno.EACCES)}")
        return
    if not target.parent.is_dir():
        raise UserError(f"{option}: folder {str(target.parent)!r} does not exist")
    probe_output_dir(target.parent, option)


def start_work(threads: int | None, option: str = "--threads", *, set_torch: bool = True
               ) -> int | None:
    """What a command does once every option, file and size is checked, before its work:
    the ``LINATTN_*`` settings read (a bad one: one warning line,
    :func:`linattn._cbuild.check_environment`) and the thread count capped at the CPUs
    available (one warning line) and, with ``set_torch``, set for torch. A user error is then
    the only line a command prints, never after a warning. Returns the count (None: torch's
    default)."""
    from linattn import _cbuild
    from linattn._config import capped_threads, set_threads

    _cbuild.check_environment()
    if not set_torch:
        return None if threads is None else capped_threads(threads, option)
    return set_threads(threads, option)


def read_json_file(path: str | os.PathLike) -> object:
    """The JSON value in a user's file; a :class:`UserError` in one line naming the file for a
    file that is not UTF-8, not JSON or nested too deeply to parse (an unreadable one is an
    OSError, which :func:`main` reports)."""
    from linattn._io import read_json

    try:
        return read_json(path)
    except ValueError as err:
        raise UserError(str(err)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="linattn", description="Linear attention for PyTorch: tools and benchmarks."
    )
    parser.add_argument("--version", action="version", version=f"linattn {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(f"linattn.cli.{name}").register(sub)
    return parser


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    # The library's warnings (e.g. "could not compile ...; using the PyTorch path") are meant
    # for the person at the terminal: one line, without the source location Python adds.
    return f"{message}\n"


def main(argv: Sequence[str] | None = None) -> int:
    warnings.formatwarning = _one_line_warning
    command = "linattn"
    stdout, stderr = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _standard_streams()
    if not isinstance(sys.stdout, _GuardedOutput):
        sys.stdout = _GuardedOutput(sys.stdout)
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if getattr(args, "func", None) is None:
            parser.print_help()
            return _flushed(0)
        command = f"linattn {args.command}"
        return _flushed(int(args.func(args) or 0))
    except _ArgumentError as err:
        return _error(err.command, str(err))
    except UserError as err:
        return _error(command, str(err))
    except BrokenPipeError:  # `| head`: the reader left; end quietly, as Unix tools do
        _drop_stdout(stdout)
        return 1
    except OSError as err:
        if isinstance(err, OutputError):
            _drop_stdout(stdout)
        return _error(command, describe_os_error(err))
    except (CheckpointError, NonFiniteError) as err:
        return _error(command, str(err).strip().splitlines()[0] if str(err).strip() else
                      type(err).__name__)
    except (MemoryError, RuntimeError) as err:  # past the estimates (linattn._memory)
        if not is_out_of_memory(err):
            raise  # a bug: its traceback
        return _error(command, _out_of_memory(err))
    except KeyboardInterrupt:
        print(f"{command}: interrupted", file=sys.stderr)
        return 130
    finally:
        sys.stdout, sys.stderr = stdout, stderr


def _out_of_memory(err: BaseException) -> str:
    """One line for an allocation that failed: how much was asked for, where torch says."""
    import re

    from linattn._memory import format_bytes

    asked = re.search(r"allocate (\d+) bytes", str(err))
    size = f" ({format_bytes(int(asked.group(1)))} asked for)" if asked else ""
    return f"out of memory{size}; choose smaller sizes"


def _flushed(status: int) -> int:
    """``status`` once standard output is written out (a full disk fails here, inside the
    error layer, not at the interpreter's exit)."""
    if sys.stdout is not None:
        sys.stdout.flush()
    return status


def _error(command: str, message: str) -> int:
    print(f"{command}: error: {message}", file=sys.stderr)
    return 2
