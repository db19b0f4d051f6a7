"""The online benchmark's settings: defaults, --quick, the peers' fixed limits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quire_tools.workloads import sharegpt

REPO = Path(__file__).resolve().parents[2]
REQUEST_TIMEOUT_S = 300.0
SLO_LOAD_AXIS_MAX = 4.0
# vLLM's CPU attention takes block sizes in multiples of 32 only: the nearest to Quire's 16.
VLLM_BLOCK_SIZE = 32
QUIRE_KV_BLOCKS = 2048  # per executor, unless QUIRE_NUM_KV_BLOCKS is set
# vLLM's KV cache: about what Quire's two executors hold (2 x 2048 blocks of 16 tokens; for
# SmolLM2-135M in float32, 45 KiB per token: 2.8 GiB).
VLLM_KV_CACHE_GIB = 3  # the plot's SLO-load axis stops here; overload runs off the top

DEFAULTS: dict[str, Any] = {
    "model": "models/smollm2-135m-instruct",
    "dataset": "sharegpt",  # real ShareGPT requests (vLLM's sampling rule) or "random"
    "data": str(sharegpt.DEFAULT_PATH),
    "peers": "vllm,transformers",  # baselines, in order; the first is the main one
    "rates": "0.25,0.5,0.75,1,1.5",
    "num_prompts": 32,
    "burst": 64,  # requests sent all at once (rate infinity), per system
    "vllm_client": True,  # also drive Quire and vLLM with vLLM's own benchmark client
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
    "num_executors": 2,
}

# --quick: the smoke test's settings (tiny model, two low rates, a few short requests, one
# executor so the stack starts fast).
QUICK: dict[str, Any] = {
    "model": "models/quire-tiny",
    "rates": "1,2",
    "num_prompts": 4,
    "burst": 4,
    "vllm_client": False,
    "input_len": 16,
    "output_len": 8,
    "max_input_len": 32,
    "max_output_len": 16,
    "random_max_input_len": 32,
    "random_max_output_len": 16,
    "warmup": 1,
    "num_executors": 1,
}
