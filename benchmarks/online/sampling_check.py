"""Whether vLLM's own ShareGPT sampler draws exactly the requests this benchmark sends."""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path
from typing import Any

from benchmarks.online.requests import sharegpt_requests
from benchmarks.peers import vllm_env


def check_sampling(
    model_dir: Path, args: argparse.Namespace, num_requests: int, tmp: Path
) -> dict[str, Any]:
    """Whether vLLM's own sampler, with the same seed, draws exactly our first `num_requests`."""
    if args.dataset != "sharegpt":
        return {"status": "skipped", "reason": "--dataset random"}
    try:
        python = vllm_env.ensure_installed()
    except vllm_env.PeerNotInstalledError as exc:
        return {"status": "skipped", "reason": str(exc)}
    out = tmp / "vllm-sample.json"
    proc = subprocess.run(
        [str(python), str(vllm_env.PEERS_DIR / "vllm_sample.py"), str(Path(args.data).resolve())]
        + [str(model_dir), str(num_requests), str(args.seed), str(out)],
        env=vllm_env.vllm_environment(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        return {"status": "failed", "reason": proc.stderr[-1500:]}
    theirs = [tuple(r) for r in json.loads(out.read_text())]
    uncapped = argparse.Namespace(**{**vars(args), "max_input_len": None, "max_output_len": None})
    ours = [
        (r.prompt, r.prompt_len, r.output_len)
        for r in sharegpt_requests(model_dir, num_requests, uncapped)
    ]
    mismatches = sum(a != b for a, b in zip(ours, theirs, strict=False)) + abs(
        len(ours) - len(theirs)
    )
    return {
        "status": "ok",
        "num_requests": len(ours),
        "identical": mismatches == 0,
        "num_mismatches": mismatches,
        "what": "(prompt text, prompt tokens, output tokens) of vllm.benchmarks.datasets."
        "get_samples(--dataset-name sharegpt, --seed, --num-prompts: every request of the run) "
        "against ours",
    }
