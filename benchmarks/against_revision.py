"""This checkout's default path against another git revision's, side by side in one process.

A speed figure from another session is another machine's and another day's load; a regression
check needs both sides in the same rounds. This script extracts ``src/linattn`` of ``--base``
(``git archive``) into a temporary folder under another package name, imports both, and times
``linear_attention`` (default policy: whatever each revision's dispatcher takes) in interleaved
rounds — one call of each per round, in alternating order, after a warm-up round that also lets
each side build and calibrate its compiled kernels — for every form: non-causal and causal,
forward and forward+backward; then GLA (``gated_linear_attention``, a log-gate per token) and
the gated delta rule (``delta_rule``, q and k L2-normalised) over B = 1, H = 16, T = ``--rec-T``,
K = V = 64, forward and forward+backward. Prints the CPU, the shapes, the medians and the ratio
new / base. ``--dtype bfloat16`` times the same calls on bfloat16 tensors; ``--forms`` picks
some of ``la`` (linear attention), ``gla`` and ``gdn``::

    python benchmarks/against_revision.py --base e6f496c [-T 65536 -H 8 -d 64] [--threads 1]
    python benchmarks/against_revision.py --base e6f496c --dtype bfloat16 --forms gla,gdn
"""

from __future__ import annotations

import argparse
import importlib
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import linattn
from linattn.profiling import cpu_description

ROOT = Path(__file__).resolve().parents[1]
ALIAS = "linattn_base"


def import_revision(rev: str, where: Path):
    """``src/linattn`` of ``rev`` as the package ``linattn_base`` (its absolute imports of
    ``linattn`` rewritten), imported."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src/linattn"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    pkg = where / "src" / "linattn"
    target = where / ALIAS
    pkg.rename(target)
    pattern = re.compile(r"\blinattn(?=[.\s:]|$)")
    for path in target.rglob("*.py"):
        text = path.read_text()
        text = re.sub(r'(["\'])linattn\.', rf"\1{ALIAS}.", text)  # lazy-import tables
        # the custom ops' namespace (NAMESPACE = "linattn"): two copies registering the same
        # linattn:: ops clobbered each other's (torch's "no schema registered" assertion)
        text = re.sub(r'(["\'])linattn\1', rf"\1{ALIAS}\1", text)
        text = pattern.sub(ALIAS, text)
        path.write_text(text)
    sys.path.insert(0, str(where))
    return importlib.import_module(ALIAS)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, help="the git revision to compare against")
    p.add_argument("-T", type=int, default=65536)
    p.add_argument("-B", type=int, default=1)
    p.add_argument("-H", type=int, default=8)
    p.add_argument("-d", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rec-T", type=int, default=4096, help="GLA's and the delta rule's T")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--forms", default="la,gla,gdn", help="comma-separated: la, gla, gdn")
    args = p.parse_args()
    dtype, forms = getattr(torch, args.dtype), set(args.forms.split(","))
    if forms - {"la", "gla", "gdn"}:
        p.error(f"--forms: expected some of la, gla, gdn, got {args.forms!r}")
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="linattn-base-") as tmp:
        base = import_revision(args.base, Path(tmp))
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True).stdout.strip()
        print(f"{cpu_description()}; torch {torch.__version__}; {args.threads} thread(s)")
        print(f"B={args.B} H={args.H} T={args.T} d=Dv={args.d}, {args.dtype}, 1 + elu; medians of "
              f"{args.rounds} interleaved rounds after a warm-up round\n")
        print(f"| form | pass | base {args.base} | this checkout ({head}, uncommitted "
              "changes included) | this / base |")
        print("|---|---|---|---|---|")
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(args.B, args.H, args.T, args.d, generator=g).to(dtype)
                   for _ in range(3))
        for is_causal in (False, True) if "la" in forms else ():
            form = "causal" if is_causal else "non-causal"
            for backward in (False, True):
                _row(form, backward, base, (q, k, v), args.rounds,
                     lambda mod, q, k, v, c=is_causal: mod.linear_attention(q, k, v,
                                                                            is_causal=c))
        T = args.rec_T
        q, k, v = (torch.randn(1, 16, T, 64, generator=g).to(dtype) for _ in range(3))
        gate = (torch.nn.functional.logsigmoid(torch.randn(1, 16, T, generator=g)) / 16).to(dtype)
        beta = torch.rand(1, 16, T, generator=g).to(dtype)
        for form, call in (
                ("gla", lambda mod, q, k, v: mod.gated_linear_attention(q, k, v, g=gate)),
                ("gdn", lambda mod, q, k, v: mod.delta_rule(q, k, v, beta, gate,
                                                            qk_l2norm=True))):
            if form not in forms:
                continue
            form = f"{form.upper()}, T={T}"
            for backward in (False, True):
                _row(form, backward, base, (q, k, v), args.rounds, call)


def _row(form: str, backward: bool, base, inputs: tuple, rounds: int, call) -> None:
    """One table row: ``call(module, q, k, v)`` (and its backward) on each side."""
    times: dict[str, list[float]] = {"base": [], "head": []}
    sides = [("base", base), ("head", linattn)]
    for rnd in range(rounds + 1):
        # the order alternates: a call that follows another pays for what the first left
        # behind (freed pages, allocator state) — up to 40 % at T = 65536
        for name, mod in (sides if rnd % 2 else sides[::-1]):
            xs = [x.clone().requires_grad_(backward) for x in inputs]
            t0 = time.perf_counter()
            with torch.set_grad_enabled(backward):
                o = call(mod, *xs)
                if backward:
                    o.sum().backward()
            if rnd:
                times[name].append(time.perf_counter() - t0)
    b, h = (statistics.median(times[n]) for n in ("base", "head"))
    print(f"| {form} | {'fwd+bwd' if backward else 'forward'} | {b * 1e3:.1f} ms | "
          f"{h * 1e3:.1f} ms | {h / b:.3f} |", flush=True)


if __name__ == "__main__":
    main()
