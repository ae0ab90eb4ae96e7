"""The ``linattn`` command. One module per subcommand.

Each subcommand module defines ``register(subparsers)``, which adds its parser and sets
``func`` (a callable taking the parsed ``argparse.Namespace`` and returning an exit status).
User errors are raised as :class:`UserError` and printed as one line on stderr with exit
status 2, never as a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings
from collections.abc import Sequence

from linattn import __version__

# Subcommand modules, in the order they are listed by --help.
SUBCOMMANDS: tuple[str, ...] = ("solve", "forda", "plot", "bench", "lm")


class UserError(Exception):
    """A problem with the user's input: reported in one line, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except UserError as err:
        print(f"linattn {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"linattn {args.command}: interrupted", file=sys.stderr)
        return 130
