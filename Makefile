# One word per task. Everything installs itself into .venv/ on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
MODELS := models/quire-tiny/config.json models/quire-bench/config.json
export TOKENIZERS_PARALLELISM := false

.PHONY: help install model test test-fast lint format bench-engine bench-kernels gpu-check clean

help:
	@echo "make test          install everything, lint, run the whole suite"
	@echo "make model         generate models/quire-tiny and models/quire-bench"
	@echo "make bench-engine  offline engine benchmark against transformers"
	@echo "make gpu-check     kernel tests on CUDA + decode-attention bandwidth"

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned: the CPU build on local disk (any other spec pulls CUDA).
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

models/quire-tiny/config.json: $(STAMP) libs/quire/tools/make_model.py
	$(PY) -m quire.tools.make_model --preset tiny --out models/quire-tiny

models/quire-bench/config.json: $(STAMP) libs/quire/tools/make_model.py
	$(PY) -m quire.tools.make_model --preset bench --out models/quire-bench

model: $(MODELS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

test: lint model
	$(PY) -m pytest -q -p no:cacheprovider

bench-engine: model
	$(PY) -m benchmarks.engine

bench-kernels: $(STAMP)
	$(PY) -m benchmarks.decode_attention

gpu-check: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider tests/kernels --device cuda
	$(PY) -m benchmarks.decode_attention --device cuda

clean:
	rm -rf $(VENV) models bench/results
