#!/usr/bin/env bash
# The installed package, not the source tree: build a wheel, install it (non-editable) into a
# fresh venv, and from a folder outside the repository (so `src/` cannot be imported) check that
#   - linattn is imported from that venv's site-packages,
#   - the shipped C sources are in the wheel and compile from there at first use (an empty
#     XDG_CACHE_HOME, so nothing built earlier is reused): linattn.ops.native.load() and the
#     `linattn solve` parser both return a library,
#   - the native path gives the reference's answer, and `linattn solve` works end to end.
# Prints PASS/FAIL lines; exits non-zero on any failure.
#
#   bash .ci/check_wheel.sh            (uses .venv/bin/python to build; PYTHON for the new venv)
#
# torch is installed into the new venv *first* and pinned (torch==2.13.0, the Makefile's pin):
# a bare `torch` requirement must never be left for pip to resolve (it could pick a CUDA build).
# The wheel itself goes in with --no-deps.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PYTHON=${PYTHON:-python3}
TORCH_PIN=${TORCH_PIN:-torch==2.13.0}
BUILD_PY=$REPO/.venv/bin/python
[ -x "$BUILD_PY" ] || BUILD_PY=$PYTHON

WORK=$(mktemp -d "${TMPDIR:-/tmp}/linattn-wheel.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
fail() { echo "FAIL: check_wheel: $*"; exit 1; }
step_t0=$SECONDS
stamp() { echo "  ($(( SECONDS - step_t0 )) s) $*"; step_t0=$SECONDS; }
t_start=$SECONDS

# 1. Build the wheel from a copy of the files a build reads (no build/ or egg-info left in the
#    repository, and no stale build/lib from an earlier build can sneak files into the wheel).
mkdir -p "$WORK/src-copy" "$WORK/dist"
cp pyproject.toml README.md LICENSE "$WORK/src-copy/"
tar -C "$REPO" --exclude='__pycache__' --exclude='*.egg-info' --exclude='*.pyc' -cf - src \
    | tar -C "$WORK/src-copy" -xf -
"$BUILD_PY" -m pip wheel -q --no-deps --no-build-isolation -w "$WORK/dist" "$WORK/src-copy" \
    >"$WORK/build.log" 2>&1 || { cat "$WORK/build.log"; fail "pip wheel"; }
WHEEL=$(ls "$WORK"/dist/linattn-*.whl)
stamp "built $(basename "$WHEEL")"
"$BUILD_PY" - "$WHEEL" <<'EOF' || fail "wheel contents"
import sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
need = ["linattn/cli/_solve_parse.c", "linattn/ops/native/common.h", "linattn/ops/native/ahead.h",
        "linattn/ops/native/tiles.h",
        "linattn/ops/native/native.c",
        "linattn/ops/linear/kernels.c", "linattn/ops/linear/kernels_forms.c",
        "linattn/ops/linear/kernels_entry.c", "linattn/ops/delta/kernels.c",
        "linattn/ops/delta/kernels_backward.c",
        "linattn/ops/native/__init__.py"]
for n in need:
    print(("PASS" if n in names else "FAIL") + f": wheel contains {n}")
sys.exit(0 if all(n in names for n in need) else 1)
EOF

# 2. A fresh venv: torch (pinned, first), numpy, then the wheel without its dependencies.
"$PYTHON" -m venv "$WORK/venv"
VPY=$WORK/venv/bin/python
stamp "venv created"
"$VPY" -m pip install -q "$TORCH_PIN" >"$WORK/pip.log" 2>&1 || { cat "$WORK/pip.log"; fail "install $TORCH_PIN"; }
stamp "installed $TORCH_PIN"
"$VPY" -m pip install -q numpy >"$WORK/pip.log" 2>&1 || { cat "$WORK/pip.log"; fail "install numpy"; }
"$VPY" -m pip install -q --no-deps "$WHEEL" >"$WORK/pip.log" 2>&1 || { cat "$WORK/pip.log"; fail "install wheel"; }
stamp "installed numpy and the wheel"

# 3. Checks, from a folder outside the repository, with an empty cache.
mkdir -p "$WORK/run" "$WORK/cache"
cd "$WORK/run"
export XDG_CACHE_HOME=$WORK/cache
unset PYTHONPATH LINATTN_NATIVE_ISA LINATTN_SOLVE_PARSER
export LINATTN_NATIVE=1 # the compiled path wherever it applies, no calibration run
"$VPY" - "$WORK/venv" <<'EOF' || fail "python checks"
import os, sys, sysconfig
from pathlib import Path

venv = Path(sys.argv[1]).resolve()
site = Path(sysconfig.get_paths()["purelib"]).resolve()
bad = 0

def check(ok, what):
    global bad
    print(("PASS" if ok else "FAIL") + ": " + what)
    bad += not ok

import linattn
where = Path(linattn.__file__).resolve()
check(site in where.parents and venv in where.parents, f"linattn imported from the venv ({where})")

from linattn.ops import native
srcs = [Path(p).resolve() for p in (native.HEADER, *native.SOURCES)]
check(len(srcs) >= 4 and all(p.is_file() and site in p.parents for p in srcs),
      "the kernels' C sources installed in site-packages")
lib = native.load()
check(lib is not None, "linattn.ops.native.load() builds and loads the kernels from the wheel")
if lib is not None and hasattr(native, "describe"):
    print(f"  note: {native.describe()}")
cache = Path(os.environ["XDG_CACHE_HOME"]) / "linattn"
built = sorted(p.name for p in cache.glob("*")) if cache.is_dir() else []
failed = [b for b in built if b.endswith(".failed")]
check(any(b.startswith("native-") and b.endswith(".so") for b in built),
      f"kernels compiled into the fresh cache ({', '.join(built) or 'nothing'})")
if failed:  # the -march=native build was refused and the -O3 fallback was used: say why
    for f in failed:
        print(f"  note: {f}: {(cache / f).read_text(errors='replace')[-600:]}")
check(not failed, "no build was refused by the compiler")

from linattn.cli import _solve_parse
plib = _solve_parse.load()
check(plib is not None and hasattr(plib, "lap_parse"), "the solve parser builds and loads")

if lib is not None:
    import contextlib
    import torch
    from linattn import linear_attention, reference
    try:  # force the compiled path (the default policy may prefer torch on this machine)
        from linattn.ops import dispatch
        with dispatch.use(impl="native"):
            pass
        forced = lambda: dispatch.use(impl="native")  # noqa: E731
    except (ImportError, AttributeError, TypeError, ValueError):
        forced = contextlib.nullcontext  # LINATTN_NATIVE=1 (set below) still takes it
    torch.manual_seed(0)
    worst = 0.0
    for causal in (False, True):
        for fm in ("elu", "relu"):
            q, k = torch.randn(2, 3, 100, 32), torch.randn(2, 3, 100, 32)
            v = torch.randn(2, 3, 100, 32)
            for t in (q, k, v):
                t.requires_grad_(True)
            with forced():
                o = linear_attention(q, k, v, feature_map=fm, is_causal=causal)
                g = torch.randn_like(o)
                grads = torch.autograd.grad(o, (q, k, v), g)
            qd, kd, vd = (t.detach().double().requires_grad_(True) for t in (q, k, v))
            r = reference.linear_attention(qd, kd, vd, feature_map=fm, is_causal=causal)
            rgrads = torch.autograd.grad(r, (qd, kd, vd), g.double())
            for a, b in zip((o, *grads), (r, *rgrads)):
                err = ((a.double() - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()
                worst = max(worst, err)
    check(worst < 1e-4, f"linear_attention on the compiled path (+ gradients) matches the reference "
                        f"(max rel err {worst:.1e})")
sys.exit(1 if bad else 0)
EOF

# `linattn solve` end to end, through the console script: N=2, d=1, Q=[1,2], K=[1,2], V=[3,4]:
# phi = relu + 1 gives weights proportional to [2, 3] for both rows: (2*3 + 3*4) / 5 = 3.6.
got=$(printf '2 1\n1\n2\n1\n2\n3\n4\n' | "$WORK/venv/bin/linattn" solve) || fail "linattn solve exited non-zero"
want=$'3.600000\n3.600000'
if [ "$got" = "$want" ]; then
    echo "PASS: linattn solve end to end (3.600000 x2)"
else
    fail "linattn solve printed '$got', expected '$want'"
fi
stamp "checks"
echo "PASS: check_wheel ($(( SECONDS - t_start )) s in all)"
