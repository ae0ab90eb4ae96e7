"""``linattn solve``: the stdin linear-attention exercise (placeholder until built)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("solve", help="read N, d, Q, K, V from stdin; print output row sums")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from linattn.cli import UserError

    raise UserError("not implemented yet")
