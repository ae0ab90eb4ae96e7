"""The walk of one call from ``linattn.linear_attention`` down to its C kernel: which files of
linattn it crosses. Prints, for a steady-state call (library built, dispatcher's choice made):

* the walk: the files of the frames between ``linear_attention`` and the kernel when the
  kernel is called (consecutive frames of one file are one step), for each distinct walk;
* what is asked on the way: every other linattn file whose code runs in the call (argument
  checks, the dispatcher, the kernel set, the thread policy, ...): each returns to its caller.

    python benchmarks/walk.py [--causal/--no-causal] [-T 1024] [-H 8] [-d 64] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

import linattn
from linattn.ops import dispatch

ROOT = os.path.dirname(linattn.__file__)


def _rel(path: str) -> str | None:
    return os.path.relpath(path, ROOT) if path.startswith(ROOT + os.sep) else None


def trace(fn) -> tuple[list[tuple[str, ...]], list[str]]:
    """(the distinct walks to a kernel, every linattn file whose code ran) of ``fn()``."""
    walks: list[tuple[str, ...]] = []
    ran: list[str] = []

    def prof(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        f = _rel(code.co_filename)
        if f is not None and f not in ran:
            ran.append(f)
        # the kernel is called by ctypes, which a profile does not see: its Python caller is
        # ``la_<kernel>_call`` (ops/native/abi.py), or, before the mirrors were generated,
        # the argument struct built right before the call (a generated ``__init__``)
        kernel = code.co_name.startswith("la_") and code.co_name.endswith("_call")
        if not kernel and not (code.co_name == "__init__" and code.co_filename == "<string>"):
            return
        files: list[str] = []
        fr = frame if kernel else frame.f_back
        while fr is not None:
            f = _rel(fr.f_code.co_filename)
            if f is not None and (not files or files[-1] != f):
                files.append(f)
            if fr.f_code.co_name == "linear_attention" and f == "ops/linear/op.py":
                break
            fr = fr.f_back
        walk = (*reversed(files), "kernels.c")
        if walk not in walks:
            walks.append(walk)

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return walks, ran


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("-T", type=int, default=1024)
    p.add_argument("-H", type=int, default=8)
    p.add_argument("-d", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    q, k, v = (torch.randn(1, a.H, a.T, a.d) for _ in range(3))

    def call():
        linattn.linear_attention(q, k, v, is_causal=a.causal)

    with dispatch.use(impl="native"), torch.no_grad():
        for _ in range(2):
            call()
        walks, ran = trace(call)
    print(f"linattn.linear_attention(q, k, v, is_causal={a.causal}), q {tuple(q.shape)}, "
          f"{a.threads} thread(s)\n")
    for walk in walks:
        names = [w.split(" ")[0] for w in walk]
        twice = sorted({n for n in names if names.count(n) > 1})
        print(f"walk ({len(walk)} files{', twice: ' + ', '.join(twice) if twice else ''}):")
        print("  " + "\n  -> ".join(walk))
    on_walk = {w for walk in walks for w in walk}
    asked = [f for f in ran if f not in on_walk]
    print(f"\nasked on the way ({len(asked)} files, each returning to its caller):")
    print("  " + ", ".join(asked))


if __name__ == "__main__":
    main()
