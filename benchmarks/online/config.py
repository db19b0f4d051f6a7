"""The online benchmark's settings: defaults, --quick, the peers' fixed limits."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

from quire_tools.workloads import sharegpt

from quire.config import EngineConfig

REPO = Path(__file__).resolve().parents[2]
REQUEST_TIMEOUT_S = 300.0
SLO_LOAD_AXIS_MAX = 4.0
# vLLM's CPU attention takes block sizes in multiples of 32 only: the nearest to Quire's 16.
VLLM_BLOCK_SIZE = 32
# Quire's KV blocks in all, split evenly between its executors (so that one executor or two hold
# the same), unless QUIRE_NUM_KV_BLOCKS sets each executor's pool.
QUIRE_KV_BLOCKS_TOTAL = 4096
# tokens per KV block: the executors' default block_size (EngineConfig owns it)
QUIRE_BLOCK_SIZE: int = next(f.default for f in fields(EngineConfig) if f.name == "block_size")
# vLLM's KV cache: about what Quire holds (4096 blocks of 16 tokens; for SmolLM2-135M in
# float32, 45 KiB per token: 2.8 GiB).
VLLM_KV_CACHE_GIB = 3
# llama-server's shared KV pool in tokens: what Quire holds (4096 x 16), each slot limited to
# the longest ShareGPT request kept (prompt + output <= 2048 tokens).
LLAMACPP_KV_POOL_TOKENS = QUIRE_KV_BLOCKS_TOTAL * QUIRE_BLOCK_SIZE
LLAMACPP_CTX_PER_SLOT = 2048
# Which weight formats each system serves: the dtypes of --dtypes, "q4_1" and "q8_0" being
# GGUF files of the same model (llama.cpp's, benchmarks.peers.llamacpp_env) that Quire and
# llama.cpp serve as they are (Quire computing in float32 on the blocks).
SYSTEM_DTYPES = {
    "quire": ("float32", "bfloat16", "q4_1", "q8_0"),
    "vllm": ("float32", "bfloat16"),
    "llamacpp": ("float32", "bfloat16", "q4_1", "q8_0"),
    "transformers": ("float32", "bfloat16"),
}
PEERS = ("vllm", "llamacpp", "transformers")
CLIENTS = ("vllm", "quire")  # vLLM's `vllm bench serve`, or this benchmark's own

DEFAULTS: dict[str, Any] = {
    "model": "models/smollm2-135m-instruct",
    "gguf_stem": "",  # "" for the default model's GGUFs (benchmarks.peers.llamacpp_env)
    "dataset": "sharegpt",  # real ShareGPT requests (vLLM's sampling rule) or "random"
    "data": str(sharegpt.DEFAULT_PATH),
    "peers": "vllm,llamacpp",  # baselines, in order; the first is the main one
    "dtypes": "float32,bfloat16,q4_1,q8_0",  # each system in each it serves (SYSTEM_DTYPES)
    # The curve: max requests in flight per point ("all": every request at once) and the
    # requests each point sends, driven by these clients (CLIENTS).
    "concurrency": "1,4,16,all",
    "curve_prompts": "8,16,32,64",
    "clients": "vllm",
    "rates": "",  # Poisson request rates, req/s (none by default: the curve is the main run)
    "num_prompts": 32,  # requests per rate
    # --dataset random: lognormal lengths with these means and caps. ShareGPT requests keep
    # their own lengths unless max_input_len / max_output_len are given.
    "input_len": 128,
    "output_len": 64,
    "max_input_len": None,
    "max_output_len": None,
    "random_max_input_len": 512,
    "random_max_output_len": 256,
    "shared_prefix_len": 0,  # tokens of a tenant prefix before each prompt (0: none)
    "num_shared_prefixes": 4,  # distinct tenant prefixes, request i gets prefix i % K
    # The same targets for every system, sized for SmolLM2-135M on 2 cores. The longest
    # ShareGPT prompt kept (1024 tokens) takes about 3 s to prefill alone on one core, so the
    # TTFT target is twice that: room for queueing, none for a backlog. A decode step of a
    # busy executor takes 200-300 ms; 500 ms per output token flags a saturated one.
    "slo_ttft_ms": 6000.0,
    "slo_tpot_ms": 500.0,
    "warmup": 4,
    # One executor with every core: on one machine it serves the curve at least as well as two
    # executors splitting the cores, with none of their routing imbalance at low concurrency
    # (docs/benchmarks.md, "One executor or two"); --num-executors 2 measures the other layout.
    "num_executors": 1,
}

# --quick: the smoke test's settings (tiny model, two low rates, a few short requests, one
# executor so the stack starts fast).
QUICK: dict[str, Any] = {
    "model": "models/quire-tiny",
    "dtypes": "float32",
    "concurrency": "1,all",
    "curve_prompts": "2,4",
    "clients": "quire",
    "rates": "1,2",
    "num_prompts": 4,
    "input_len": 16,
    "output_len": 8,
    "max_input_len": 32,
    "max_output_len": 16,
    "random_max_input_len": 32,
    "random_max_output_len": 16,
    "warmup": 1,
    "num_executors": 1,
}
