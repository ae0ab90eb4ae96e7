#!/usr/bin/env bash
# The optional extras, each installed after `make test` has run without them (so a fresh clone's
# suite is green without them), then the tests that need it. Where an extra cannot be installed
# (no package index) its step says SKIP and passes; where it installs, its tests must pass.
#   fla_oracle  flash-linear-attention's own pure-PyTorch references as an external oracle for
#               linattn.fla (tests/test_fla_oracle.py): fla-core's naive.py files need only torch
#               and einops (no Triton, no GPU), ~1.2 MB without dependencies.
#   hf_models   transformers' linear-attention families through linattn.hf (tests/test_hf.py)
#               and fla's model classes on linattn's kernels (tests/test_fla_models.py): the `hf`
#               extra. Tiny random models built from config classes, no download of weights.
#   fla_models  fla's checkpoints through linattn.fla_models (tests/test_fla_models_files.py):
#               fla's own model classes build tiny random models and save_pretrained them (on a
#               CPU fla imports and builds, only its forward needs a GPU); linattn loads them and
#               checks every weight, its forward and its cached decode. ~20 s besides the download
#               (Triton, which fla imports, is ~1 GB unpacked).
#   onnx        ONNX export and onnxruntime (tests/test_onnx.py): the `onnx` extra. Exports tiny
#               models (and the shipped FordA model) to the opset-27 LinearAttention /
#               CausalConvWithState ops and runs them in onnxruntime against PyTorch.
# transformers and the onnx packages go into the CI venv; fla and its dependencies into a
# temporary folder on PYTHONPATH, one per step.
#
#   bash .ci/extras.sh [STEP...]      (default: every step, in the order above)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
WORK=$(mktemp -d "${TMPDIR:-/tmp}/linattn-extras.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

venv_pip() { "$PY" -m pip install -q "$@"; }
folder_pip() { "$PY" -m pip install -q --no-deps --target "$DIR" "$@"; }
tests() { PYTHONPATH="$DIR" "$PY" -m pytest -q -p no:cacheprovider "$@"; }

fla_oracle() {
    folder_pip fla-core==0.6.0 einops ||
        { echo "SKIP fla oracle: fla-core==0.6.0 could not be installed"; return; }
    tests tests/test_fla_oracle.py
}
hf_models() {
    venv_pip 'transformers==5.23.0' ||
        { echo "SKIP hf models: transformers==5.23.0 could not be installed"; return; }
    tests tests/test_hf.py tests/test_fla_models.py
}
fla_models() {
    if ! venv_pip 'transformers==5.23.0' || \
       ! folder_pip flash-linear-attention==0.6.0 fla-core==0.6.0 einops triton==3.9.0; then
        echo "SKIP fla models: transformers==5.23.0 or flash-linear-attention==0.6.0 (with" \
             "fla-core, einops, triton) could not be installed"
        return
    fi
    tests tests/test_fla_models_files.py
}
onnx() {
    venv_pip 'onnx>=1.23' 'onnxruntime>=1.32' 'onnxscript>=0.7' ||
        { echo "SKIP onnx: onnx, onnxruntime or onnxscript could not be installed"; return; }
    tests tests/test_onnx.py
}

steps=("$@")
[ $# -gt 0 ] || steps=(fla_oracle hf_models fla_models onnx)
for step in "${steps[@]}"; do
    case $step in
    fla_oracle | hf_models | fla_models | onnx) ;;
    *) echo "extras.sh: no step $step (fla_oracle, hf_models, fla_models, onnx)" >&2; exit 2 ;;
    esac
    DIR=$(mktemp -d "$WORK/$step.XXXXXX")
    "$step"
done
