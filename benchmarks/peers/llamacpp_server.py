"""llama.cpp's `llama-server` as a benchmark peer: its OpenAI-compatible API on a GGUF.

    with llamacpp_server(LlamaServerConfig(gguf, port=8200, num_slots=64), log) as base_url:
        ...  # POST {base_url}/v1/completions

The binary comes from `make peer-llamacpp` (benchmarks.peers.llamacpp_env). It runs with
continuous batching, `num_slots` parallel slots sharing one KV pool (`--kv-unified`) of
`kv_pool_tokens` tokens, each slot limited to `ctx_per_slot` tokens, the KV cache in
`kv_cache_type`, and every core for both prompt and token batches.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common.server_process import serving_process
from benchmarks.peers.llamacpp_env import binary


@dataclass(frozen=True)
class LlamaServerConfig:
    """How one llama-server is started."""

    gguf: Path  # the model file
    port: int
    num_slots: int = 64  # --parallel: requests decoded at once
    ctx_per_slot: int = 2048  # --kv-unified-per-slot: longest prompt + output of a request
    kv_pool_tokens: int = 65536  # --ctx-size: the shared KV pool, in tokens
    kv_cache_type: str = "f16"  # --cache-type-k / -v: f32, bf16, f16, q8_0, ...
    threads: int = 0  # --threads / --threads-batch; 0: every core this process may use
    alias: str = ""  # the model id /v1/models lists; "" : the file's stem
    host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        if self.num_slots < 1 or self.ctx_per_slot < 1:
            raise ValueError("num_slots and ctx_per_slot must be >= 1")
        if self.kv_pool_tokens < self.ctx_per_slot:
            raise ValueError("kv_pool_tokens must hold at least one slot's context")


def server_command(config: LlamaServerConfig, server_binary: Path) -> list[str]:
    """The llama-server command line for `config`."""
    threads = config.threads or len(os.sched_getaffinity(0))
    # --kv-unified-per-slot would size the pool as num_slots * ctx_per_slot when --ctx-size is
    # absent; with it, it only caps each slot.
    return [
        str(server_binary),
        "--model",
        str(config.gguf),
        "--alias",
        config.alias or config.gguf.stem,
        "--host",
        config.host,
        "--port",
        str(config.port),
        "--parallel",
        str(config.num_slots),
        "--cont-batching",
        "--kv-unified",
        "--ctx-size",
        str(config.kv_pool_tokens),
        "--kv-unified-per-slot",
        str(config.ctx_per_slot),
        "--cache-type-k",
        config.kv_cache_type,
        "--cache-type-v",
        config.kv_cache_type,
        "--threads",
        str(threads),
        "--threads-batch",
        str(threads),
        "--no-webui",
    ]


@contextlib.contextmanager
def llamacpp_server(
    config: LlamaServerConfig, log_path: Path, startup_timeout_s: float = 300
) -> Iterator[str]:
    """Run llama-server for `config` and yield its base URL once /health answers 200; it is
    stopped when the block exits (benchmarks.common.server_process)."""
    command = server_command(config, binary("llama-server"))
    base_url = f"http://{config.host}:{config.port}"
    with serving_process(
        "llama-server", command, base_url, log_path, startup_timeout_s=startup_timeout_s
    ):
        yield base_url
