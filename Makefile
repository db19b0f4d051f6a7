# One word per task. Everything installs itself into .venv/ on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
MODELS := models/quire-tiny/config.json models/quire-bench/config.json
PROTOS := $(wildcard protos/quire/rpc/*.proto)
RPC_STAMP := libs/quire/rpc/__init__.py
export TOKENIZERS_PARALLELISM := false

.PHONY: help install proto redis model up down test test-fast lint format bench-engine bench-kernels gpu-check clean

help:
	@echo "make up            run the stack locally (router on 127.0.0.1:8000)"
	@echo "make down          stop it"
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

install: $(STAMP) $(RPC_STAMP)

# gRPC stubs (with .pyi) are generated from protos/ into the quire.rpc package, never committed.
$(RPC_STAMP): $(STAMP) $(PROTOS)
	rm -rf libs/quire/rpc && mkdir -p libs/quire/rpc
	$(PY) -m grpc_tools.protoc -Iprotos --python_out=libs --grpc_python_out=libs --pyi_out=libs $(PROTOS)
	echo '"""Generated gRPC stubs (from protos/; do not edit)."""' > $(RPC_STAMP)

proto: $(RPC_STAMP)

# A real redis-server for the stack and the integration tests (Debian package).
redis:
	@command -v redis-server >/dev/null || { apt-get update -qq && apt-get install -y -qq redis-server; }

models/quire-tiny/config.json: $(STAMP) libs/quire/tools/make_model.py
	$(PY) -m quire.tools.make_model --preset tiny --out models/quire-tiny

models/quire-bench/config.json: $(STAMP) libs/quire/tools/make_model.py
	$(PY) -m quire.tools.make_model --preset bench --out models/quire-bench

model: $(MODELS)

# The whole stack as local processes (Redis, memory manager, 2 executors, router on :8000).
up: model redis $(RPC_STAMP)
	$(PY) -m services.stack up

down:
	@test -x $(PY) && $(PY) -m services.stack down || true

lint: $(STAMP) $(RPC_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

test: lint model redis
	$(PY) -m pytest -q -p no:cacheprovider

bench-engine: model
	$(PY) -m benchmarks.engine

bench-kernels: $(STAMP)
	$(PY) -m benchmarks.decode_attention

gpu-check: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider tests/kernels --device cuda
	$(PY) -m benchmarks.decode_attention --device cuda

clean:
	rm -rf $(VENV) models bench/results libs/quire/rpc .run
