#!/usr/bin/env bash
# fla's checkpoints through linattn.fla_models (tests/test_fla_models_files.py): fla's own model
# classes build tiny random models and save_pretrained them (on a CPU fla imports and builds,
# only its forward needs a GPU); linattn loads them and checks every weight, its forward and its
# cached decode. fla, fla-core, einops and Triton (fla imports it; ~1 GB unpacked) go into a
# temporary folder, transformers into the CI venv as in hf_models.sh. Where the packages cannot
# be installed this step says SKIP and passes; where they install, the tests must pass. ~20 s
# besides the download.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
if ! .venv/bin/python -m pip install -q 'transformers==5.23.0' || \
   ! .venv/bin/python -m pip install -q --no-deps --target "$dir" flash-linear-attention==0.6.0 \
        fla-core==0.6.0 einops triton==3.9.0; then
    echo "SKIP fla models: transformers==5.23.0 or flash-linear-attention==0.6.0 (with" \
         "fla-core, einops, triton) could not be installed"
    exit 0
fi
PYTHONPATH="$dir" .venv/bin/python -m pytest -q -p no:cacheprovider tests/test_fla_models_files.py
