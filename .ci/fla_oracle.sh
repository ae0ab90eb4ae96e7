#!/usr/bin/env bash
# flash-linear-attention's own pure-PyTorch references as an external oracle for linattn.fla:
# fla-core's naive.py files need only torch and einops (no Triton, no GPU), ~1.2 MB without
# dependencies. Where the package index cannot be reached this step says SKIP and passes; where
# the package installs, its comparisons must pass.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
if ! .venv/bin/python -m pip install -q --no-deps --target "$dir" fla-core==0.6.0 einops; then
    echo "SKIP fla oracle: fla-core==0.6.0 could not be installed"
    exit 0
fi
PYTHONPATH="$dir" .venv/bin/python -m pytest -q -p no:cacheprovider tests/test_fla_oracle.py
