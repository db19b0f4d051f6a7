"""The servers under test, each started on free ports in a pinned dtype and stopped afterwards:
Quire's stack, `vllm serve`, llama.cpp's `llama-server` and `transformers serve`."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common.server_process import serving_process
from benchmarks.online.client import LlamaCppServer, QuireServer, TransformersServer, VLLMServer
from benchmarks.online.config import (
    LLAMACPP_CTX_PER_SLOT,
    LLAMACPP_KV_POOL_TOKENS,
    QUIRE_KV_BLOCKS_TOTAL,
    REPO,
    VLLM_BLOCK_SIZE,
    VLLM_KV_CACHE_GIB,
)
from services.stack.ports import free_port, stack_ports


def served_model(base_url: str) -> str:
    """The first model id the server lists at /v1/models."""
    return str(httpx.get(f"{base_url}/v1/models", timeout=10).json()["data"][0]["id"])


@contextlib.contextmanager
def quire_server(
    model_dir: Path, num_executors: int, run_dir: Path, dtype: str, gguf_stem: Path | None = None
) -> Any:
    """Quire's stack (Redis, memory manager, executors, router) on free ports, its executors in
    `dtype`; the rest of its settings from the environment (`StackConfig.from_env`), the KV
    pool QUIRE_KV_BLOCKS_TOTAL blocks split evenly between the executors unless
    QUIRE_NUM_KV_BLOCKS sets each one's. A
    quantized dtype (QUANTIZED_DTYPES) serves llama.cpp's GGUF of it (`gguf_stem`'s) as it is,
    in float32."""
    from benchmarks.peers.llamacpp_env import QUANTIZED_DTYPES, QUIRE_KV_CACHE_DTYPES, gguf_path
    from services.stack.runner import Stack
    from services.stack.spec import StackConfig

    model: Path = model_dir
    kv_cache_dtype = QUIRE_KV_CACHE_DTYPES[dtype]  # llama.cpp's KV cache type for the row
    if dtype in QUANTIZED_DTYPES:
        model, dtype = gguf_path(dtype, stem=gguf_stem), "float32"
    ports = stack_ports(num_executors)
    config = StackConfig.from_env(
        model=str(model),
        **ports,
        num_executors=num_executors,
        redis_prefix=f"quire-bench-{ports['executor_base_port']}",
        python=sys.executable,
    )
    config = dataclasses.replace(config, executor_dtype=dtype)
    if config.num_kv_blocks is None:
        config = dataclasses.replace(
            config, num_kv_blocks=QUIRE_KV_BLOCKS_TOTAL // max(1, num_executors)
        )
    stack = Stack(config, run_dir, cwd=REPO, env={"QUIRE_KV_CACHE_DTYPE": kv_cache_dtype})
    stack.start(timeout_s=180)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            status = httpx.get(f"{config.router_admin_url}/cluster/status", timeout=5).json()
            if sum(e["healthy"] for e in status["executors"]) >= num_executors:
                break
            time.sleep(0.2)
        else:
            raise RuntimeError("Quire's executors never became healthy")
        yield QuireServer(config.router_url, served_model(config.router_url))
    finally:
        stack.stop()


@contextlib.contextmanager
def vllm_serve(model_dir: Path, log_path: Path, dtype: str) -> Any:
    """`vllm serve` on the checkpoint in `dtype`: the whole machine, Quire's batch limits."""
    from benchmarks.peers.vllm_server import vllm_server

    extra = ["--block-size", str(VLLM_BLOCK_SIZE), "--max-num-seqs", "256"]
    extra += ["--max-num-batched-tokens", "2048"]
    with vllm_server(
        model_dir,
        free_port(),
        dtype=dtype,
        kv_space_gib=VLLM_KV_CACHE_GIB,
        max_model_len=2048,
        extra_args=extra,
        log_path=log_path,
    ) as base_url:
        yield VLLMServer(base_url, served_model(base_url))


@contextlib.contextmanager
def llamacpp_serve(
    model_dir: Path, log_path: Path, dtype: str, num_slots: int, gguf_stem: Path | None = None
) -> Any:
    """llama.cpp's `llama-server` on the GGUF of `dtype` (`make peer-llamacpp`, or
    `gguf_stem`'s), `num_slots` requests decoded at once, Quire's KV pool size in tokens, the KV
    cache in `dtype`."""
    from benchmarks.peers.llamacpp_env import KV_CACHE_TYPES, gguf_path
    from benchmarks.peers.llamacpp_server import LlamaServerConfig, llamacpp_server

    config = LlamaServerConfig(
        gguf=gguf_path(dtype, stem=gguf_stem),
        port=free_port(),
        num_slots=num_slots,
        ctx_per_slot=LLAMACPP_CTX_PER_SLOT,
        kv_pool_tokens=LLAMACPP_KV_POOL_TOKENS,
        kv_cache_type=KV_CACHE_TYPES[dtype],
        alias=model_dir.name,
    )
    with llamacpp_server(config, log_path) as base_url:
        yield LlamaCppServer(base_url, served_model(base_url))


@contextlib.contextmanager
def transformers_server(model_dir: Path, log_path: Path, dtype: str, timeout_s: float = 180) -> Any:
    """`transformers serve --continuous-batching` on the CPU in `dtype`, on a free port."""
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "benchmarks.serving_hf",
        "--continuous-batching",
        "--device",
        "cpu",
        "--dtype",
        dtype,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        str(model_dir),
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    base_url = f"http://127.0.0.1:{port}"
    name = "transformers serve"
    with serving_process(
        name, argv, base_url, log_path, env=env, cwd=REPO, startup_timeout_s=timeout_s
    ):
        yield TransformersServer(base_url, served_model(base_url))
