# Every target sets itself up from a fresh clone: a .venv with the CPU build of torch, pinned
# and installed *before* the package so that pip never resolves a bare `torch` to a CUDA build.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_PIN := torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: venv test test-all lint forda clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_PIN)
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

test-all: $(STAMP)
	$(PY) -m pytest -q -m ''

lint: $(STAMP)
	$(VENV)/bin/ruff check .

forda: $(STAMP)
	$(VENV)/bin/linattn forda train

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache
