"""Offline generation with vLLM's CPU backend, timed, for the engine benchmark.

    .venv-vllm/bin/python benchmarks/peers/vllm_offline.py --requests IN.json --out OUT.json

Runs in the peer venv (.venv-vllm/, from `make peer-vllm`) under the environment of
benchmarks/peers/vllm_env.py, so it imports nothing of Quire's. IN.json holds the engine
settings and the requests as token ids:

    {"model": DIR, "dtype": "float32" | "bfloat16", "max_model_len": 2048,
     "max_num_seqs": 64, "max_num_batched_tokens": 2048, "block_size": 128,
     "enable_prefix_caching": false, "seed": 0, "engine_args": {"enforce_eager": true},
     "warmup": [{"prompt_token_ids": [...], "max_tokens": 8}],
     "requests": [{"prompt_token_ids": [...], "max_tokens": 128}]}

Every request decodes greedily for exactly `max_tokens` tokens (ignore_eos), all submitted in
one `generate` call; the warmup requests run first, untimed. OUT.json gets the wall time, the
tokens produced, each request's output ids, and the peak RSS of this process and of its
children (the engine core and its model worker run in child processes).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

# Settings passed to vllm.LLM as given, with their defaults when IN.json leaves them out.
ENGINE_DEFAULTS: dict[str, Any] = {
    "dtype": "float32",
    "max_model_len": 2048,
    "max_num_seqs": 256,
    "max_num_batched_tokens": 2048,
    # None: vLLM's own choice (128 on the CPU); rounded up to a multiple of 32 otherwise.
    "block_size": None,
    "enable_prefix_caching": False,
    "seed": 0,
}
# Block sizes vLLM's CPU attention accepts are multiples of this.
CPU_BLOCK_MULTIPLE = 32
# Environment variables that decide how vLLM's CPU backend runs, recorded in OUT.json.
RECORDED_ENV = (
    "VLLM_TARGET_DEVICE",
    "VLLM_CPU_OMP_THREADS_BIND",
    "VLLM_CPU_NUM_OF_RESERVED_CPU",
    "VLLM_CPU_KVCACHE_SPACE",
)


def log(message: str) -> None:
    print(f"[vllm-offline] {message}", file=sys.stderr, flush=True)


def _children(pid: int) -> list[int]:
    """All descendants of `pid`, from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                # The command name is in parentheses and may hold spaces; ppid follows it.
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(ppid, []).append(int(entry))
    found: list[int] = []
    stack = [pid]
    while stack:
        for child in parents.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def _status_kib(pid: int, field: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


class MemorySampler:
    """Peak RSS of this process and of its descendants (engine core, worker).

    Each process's own peak is its VmHWM, read while it still lives (the engine's processes
    exit with it). A background thread also samples the sum of current RSS over the whole
    tree (`peak_tree_rss_mib`); `reset_tree_peak()` restarts that sum so the timed run is not
    charged for the short-lived torch.compile workers of start-up.
    """

    def __init__(self, interval_s: float = 0.1) -> None:
        self.interval_s = interval_s
        self.peak_tree_rss_kib = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def reset_tree_peak(self) -> None:
        with self._lock:
            self.peak_tree_rss_kib = 0

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        pid = os.getpid()
        total = _status_kib(pid, "VmRSS") or 0
        for child in _children(pid):
            total += _status_kib(child, "VmRSS") or 0
        with self._lock:
            self.peak_tree_rss_kib = max(self.peak_tree_rss_kib, total)

    def stop(self) -> dict[str, Any]:
        """Stop sampling and report, while the engine's processes are still alive."""
        self.sample()
        self._stop.set()
        self._thread.join()
        children = [
            {"pid": child, "name": _comm(child), "peak_rss_mib": hwm / 1024}
            for child in _children(os.getpid())
            if (hwm := _status_kib(child, "VmHWM")) is not None
        ]
        return {
            "peak_rss_mib": (_status_kib(os.getpid(), "VmHWM") or 0) / 1024,
            "peak_children_rss_mib": sum(c["peak_rss_mib"] for c in children),
            "children": children,
            "peak_tree_rss_mib": self.peak_tree_rss_kib / 1024,
        }


def _generate(llm: Any, requests: list[dict[str, Any]]) -> list[list[int]]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=list(r["prompt_token_ids"])) for r in requests]
    params = [
        SamplingParams(temperature=0.0, max_tokens=int(r["max_tokens"]), ignore_eos=True)
        for r in requests
    ]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return [list(out.outputs[0].token_ids) for out in outputs]


def run(spec: dict[str, Any]) -> dict[str, Any]:
    import vllm

    settings = {key: spec.get(key, default) for key, default in ENGINE_DEFAULTS.items()}
    settings["model"] = str(spec["model"])
    # Any further vllm.LLM keyword arguments, passed through as given.
    settings["engine_args"] = dict(spec.get("engine_args", {}))
    # vLLM's CPU attention kernels take only multiples of 32 tokens per block ("No common
    # block size" otherwise). The block size changes memory granularity, not the tokens, so
    # a smaller one (Quire's 16) is rounded up and both are recorded.
    settings["block_size_requested"] = requested = settings["block_size"]
    if requested is not None and requested % CPU_BLOCK_MULTIPLE != 0:
        settings["block_size"] = -(-requested // CPU_BLOCK_MULTIPLE) * CPU_BLOCK_MULTIPLE
        log(f"block_size {requested} -> {settings['block_size']} (CPU attention: multiples of 32)")
    requests = spec["requests"]
    warmup = spec.get("warmup", [])
    log(f"vllm {vllm.__version__}: {len(requests)} requests, {len(warmup)} warmup; {settings}")

    sampler = MemorySampler()
    sampler.start()
    started = time.perf_counter()
    engine_args = {
        key: settings[key] for key in [*ENGINE_DEFAULTS, "model"] if settings[key] is not None
    }
    llm = vllm.LLM(tokenizer=settings["model"], **engine_args, **settings["engine_args"])
    # What vLLM settled on where we left it the choice.
    settings["block_size"] = llm.llm_engine.vllm_config.cache_config.block_size
    load_s = time.perf_counter() - started
    log(f"engine ready in {load_s:.1f}s")

    warmup_s = 0.0
    if warmup:
        started = time.perf_counter()
        _generate(llm, warmup)
        warmup_s = time.perf_counter() - started
        log(f"warmup done in {warmup_s:.1f}s")

    sampler.reset_tree_peak()
    started = time.perf_counter()
    output_token_ids = _generate(llm, requests)
    wall_s = time.perf_counter() - started
    num_output_tokens = sum(len(ids) for ids in output_token_ids)
    memory = sampler.stop()
    log(
        f"{num_output_tokens} output tokens in {wall_s:.2f}s "
        f"({num_output_tokens / wall_s:.1f} tok/s); peak RSS {memory['peak_rss_mib']:.0f} MiB "
        f"+ children {memory['peak_children_rss_mib']:.0f} MiB"
    )
    return {
        "engine": "vllm",
        "vllm_version": vllm.__version__,
        "settings": settings,
        "env": {key: os.environ.get(key) for key in RECORDED_ENV},
        "num_requests": len(requests),
        "num_prompt_tokens": sum(len(r["prompt_token_ids"]) for r in requests),
        "num_output_tokens": num_output_tokens,
        "wall_s": wall_s,
        "output_tokens_per_s": num_output_tokens / wall_s if wall_s > 0 else None,
        "load_s": load_s,
        "warmup_s": warmup_s,
        **memory,
        "output_token_ids": output_token_ids,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=Path, required=True, help="settings and requests")
    parser.add_argument("--out", type=Path, required=True, help="where to write the result")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    result = run(json.loads(args.requests.read_text()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result) + "\n")
    log(f"wrote {args.out}")


# vLLM's engine core starts in a spawned process, which re-imports this module.
if __name__ == "__main__":
    main()
