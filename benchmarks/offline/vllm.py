"""The vLLM baseline of the engine benchmark: the same token ids through vLLM's offline LLM.

vLLM lives in its own venv (.venv-vllm/, `make peer-vllm`), so it runs as a child process
(benchmarks/peers/vllm_offline.py) that reads the requests from a JSON file and writes its
timing, output tokens and memory back. It gets every core, as Quire does, and a KV cache of
the size Quire's pool defaults to on the CPU.
"""

from __future__ import annotations

import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.offline.workloads import Workload
from benchmarks.peers import vllm_env
from quire.config import DEFAULT_CPU_KV_CACHE_BYTES

TIMEOUT_S = 3600.0  # one workload, load and warmup included


@dataclass
class VLLMRun:
    """One workload through vLLM; `error` says why it did not run."""

    wall_s: float | None = None
    tok_s: float | None = None
    token_ids: list[list[int]] | None = None
    peak_rss_mib: float | None = None
    error: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


def _requests(workload: Workload) -> list[dict[str, Any]]:
    return [
        {"prompt_token_ids": p, "max_tokens": n}
        for p, n in zip(workload.prompts, workload.output_lens, strict=True)
    ]


def run_vllm(
    model: str,
    workload: Workload,
    warmup: Workload,
    dtype: str,
    block_size: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    max_model_len: int,
    label: str,
    num_threads: int | None = None,
) -> VLLMRun:
    """Run the workload through vLLM in a child process; errors are reported, not raised.

    num_threads: the worker's OpenMP threads, pinned to the first that many of this process's
    cores (None: all of them), the same count Quire's torch runs with.
    """
    try:
        vllm_env.ensure_installed()
    except vllm_env.PeerNotInstalledError as exc:
        return VLLMRun(error=str(exc))
    spec = {
        "model": str(Path(model).resolve()),
        "dtype": dtype,
        "max_model_len": max_model_len,
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": max_num_batched_tokens,
        "block_size": block_size,
        "enable_prefix_caching": True,  # as Quire's default
        "seed": 0,
        "warmup": _requests(warmup),
        "requests": _requests(workload),
    }
    kv_gib = max(1, DEFAULT_CPU_KV_CACHE_BYTES >> 30)
    print(f"{label}: {len(workload.prompts)} requests in vLLM (child process) ...", flush=True)
    with tempfile.TemporaryDirectory(prefix="quire-bench-vllm-") as tmp:
        try:
            cores = vllm_env.default_cores()
            result = vllm_env.run_vllm_offline(
                spec,
                Path(tmp),
                cores=cores[:num_threads] if num_threads else cores,
                kv_space_gib=kv_gib,
                timeout_s=TIMEOUT_S,
            )
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            return VLLMRun(error=str(exc)[-3000:])
    token_ids = result.pop("output_token_ids")
    produced = [len(t) for t in token_ids]
    if produced != workload.output_lens:
        bad = sum(a != b for a, b in zip(produced, workload.output_lens, strict=True))
        return VLLMRun(error=f"vllm produced the wrong number of tokens for {bad} requests")
    return VLLMRun(
        wall_s=result["wall_s"],
        tok_s=workload.num_output_tokens / result["wall_s"],
        token_ids=token_ids,
        peak_rss_mib=result.get("peak_tree_rss_mib"),
        details={**result, "kv_cache_space_gib": kv_gib},
    )
