"""``linattn forda``: train and evaluate the FordA classifier (not built yet)."""

from __future__ import annotations

import argparse
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("forda", help="train and evaluate the FordA time-series classifier")
    p.add_argument("action", nargs="?", choices=("train", "evaluate"), default="train")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    print(
        "linattn forda: the FordA classifier is not built yet (see the FordA issue); "
        "nothing was trained.",
        file=sys.stderr,
    )
    return 0
