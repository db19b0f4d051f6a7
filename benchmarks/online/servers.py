"""The servers under test, each started on free ports and stopped afterwards: Quire's stack,
`vllm serve` and `transformers serve`."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.online.client import QuireServer, TransformersServer, VLLMServer
from benchmarks.online.config import QUIRE_KV_BLOCKS, REPO, VLLM_BLOCK_SIZE, VLLM_KV_CACHE_GIB
from services.stack.ports import free_port, stack_ports
from services.stack.runner import terminate


def served_model(base_url: str) -> str:
    """The first model id the server lists at /v1/models."""
    return str(httpx.get(f"{base_url}/v1/models", timeout=10).json()["data"][0]["id"])


@contextlib.contextmanager
def quire_server(model_dir: Path, num_executors: int, run_dir: Path) -> Any:
    """Quire's stack (Redis, memory manager, executors, router) on free ports; the rest of
    its settings from the environment (`StackConfig.from_env`), the KV pool
    `QUIRE_KV_BLOCKS` blocks per executor unless QUIRE_NUM_KV_BLOCKS says otherwise."""
    from services.stack.runner import Stack
    from services.stack.spec import StackConfig

    ports = stack_ports(num_executors)
    config = StackConfig.from_env(
        model=str(model_dir),
        **ports,
        num_executors=num_executors,
        redis_prefix=f"quire-bench-{ports['executor_base_port']}",
        python=sys.executable,
    )
    if config.num_kv_blocks is None:
        config = dataclasses.replace(config, num_kv_blocks=QUIRE_KV_BLOCKS)
    stack = Stack(config, run_dir, cwd=REPO)
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
def vllm_serve(model_dir: Path, log_path: Path) -> Any:
    """`vllm serve` on the checkpoint: float32, the whole machine, Quire's batch limits."""
    from benchmarks.peers.vllm_server import vllm_server

    extra = ["--block-size", str(VLLM_BLOCK_SIZE), "--max-num-seqs", "256"]
    extra += ["--max-num-batched-tokens", "2048"]
    with vllm_server(
        model_dir,
        free_port(),
        dtype="float32",
        kv_space_gib=VLLM_KV_CACHE_GIB,
        max_model_len=2048,
        extra_args=extra,
        log_path=log_path,
    ) as base_url:
        yield VLLMServer(base_url, served_model(base_url))


@contextlib.contextmanager
def transformers_server(model_dir: Path, log_path: Path, timeout_s: float = 180) -> Any:
    """`transformers serve --continuous-batching` on the CPU, on a free port."""
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "benchmarks.serving_hf",
        "--continuous-batching",
        "--device",
        "cpu",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        str(model_dir),
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                tail = log_path.read_text(errors="replace")[-1500:]
                raise RuntimeError(f"transformers serve exited ({proc.returncode}): {tail}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base_url}/health", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"transformers serve not healthy after {timeout_s} s")
            time.sleep(0.5)
        yield TransformersServer(base_url, served_model(base_url))
    finally:
        terminate(proc, timeout_s=20)
