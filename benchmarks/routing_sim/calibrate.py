"""Service rates of one executor core, measured on the offline engine (one torch thread).

prefill: one prompt of `PREFILL_TOKENS` random tokens, one output token, timed alone.
decode: `b` requests of 32 tokens decoding together, the mean step time after their
prefill, at b = 1 and b = 8; the simulation interpolates linearly (a + c * b).
Written to bench/results/routing-rates.json and reused unless --recalibrate.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

PREFILL_TOKENS = 512
DECODE_BATCHES = (1, 8)
DECODE_STEPS = 24


def _engine(model: str, dtype: str) -> Any:
    import torch

    from quire import LLM

    torch.set_num_threads(1)
    return LLM(model=model, dtype=dtype).engine


def _run(engine: Any, prompts: list[list[int]], max_tokens: int) -> list[float]:
    from quire import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"cal-{time.monotonic_ns()}-{i}", {"prompt_token_ids": p}, params)
    steps = []
    while engine.has_unfinished_requests():
        start = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - start)
    return steps


def measure(model: str, dtype: str = "float32") -> dict[str, Any]:
    """Prefill tokens/s and decode step seconds at each batch size."""
    engine = _engine(model, dtype)
    vocab = engine.model.config.vocab_size
    rng = np.random.default_rng(7)

    def prompt(n: int) -> list[int]:
        return rng.integers(100, vocab, n).tolist()

    _run(engine, [prompt(64) for _ in range(2)], 4)  # warm-up
    prefill_s = sum(_run(engine, [prompt(PREFILL_TOKENS)], 1))
    decode: dict[str, float] = {}
    for b in DECODE_BATCHES:
        steps = _run(engine, [prompt(32) for _ in range(b)], DECODE_STEPS + 1)
        decode[str(b)] = float(np.mean(steps[1:]))
    return {
        "model": Path(model).name,
        "dtype": str(engine.dtype),
        "torch_threads": 1,
        "prefill_tokens": PREFILL_TOKENS,
        "prefill_tok_s": PREFILL_TOKENS / prefill_s,
        "decode_step_s": decode,
    }
