"""Quire through the offline benchmark: a workload driven through `LLM.engine`, sampled every step."""

from __future__ import annotations

from dataclasses import dataclass
from time import perf_counter
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from benchmarks.common.workload import random_token_ids
from benchmarks.offline.workloads import Workload
from quire import LLM, SamplingParams
from quire.block.window import num_released
from quire.engine.llm_engine import LLMEngine, StepResult
from quire.model.model_config import ModelConfig


@dataclass(frozen=True)
class StepSample:
    """KV occupancy right after one step's block allocation, before its forward pass."""

    time_s: float  # since the run started, at the end of the step
    duration_s: float  # the step's wall time, recording excluded (the sample's weight)
    num_running: int
    num_waiting: int
    num_tokens: int  # sum of seq.num_tokens over running sequences
    # of those, the tokens of blocks released outside a sliding window (every other token
    # holds a slot now)
    num_released_tokens: int
    num_block_slots: int  # num_blocks_used * block_size
    num_reserved_exact: int  # sum of prompt_len + max_tokens over running sequences
    num_reserved_context: int  # num_running * context length
    pool_refused: bool  # the allocator refused an admission or preempted in this step

    @property
    def num_slot_tokens(self) -> int:
        """Tokens of running sequences that hold a KV slot now."""
        return self.num_tokens - self.num_released_tokens


@dataclass
class QuireRun:
    """One workload through Quire: time, per-step samples and the work the model did."""

    wall_s: float
    num_output_tokens: int
    num_steps: int
    num_preemptions: int
    samples: list[StepSample]
    num_tokens_computed: int  # prefill + decode tokens through the decoder
    num_logit_rows: int  # rows through the lm_head
    attention_context_sum: int  # sum over computed tokens of their context length
    token_ids: list[list[int]]  # each request's output tokens, in workload order


class _StepRecorder:
    """Turns each step's `StepStats` (and the queue it leaves) into a `StepSample`.

    Reads the engine, never changes it; its own time is measured so the caller can take it
    out of the engine's.
    """

    def __init__(self, engine: LLMEngine, reservations: dict[str, int]) -> None:
        self.engine = engine
        self.reservations = reservations  # request id -> prompt_len + max_tokens
        self.overhead_s = 0.0
        self.num_tokens_computed = 0
        self.num_logit_rows = 0
        self.attention_context_sum = 0
        self.samples: list[StepSample] = []

    def record(self, result: StepResult, time_s: float, duration_s: float) -> None:
        start = perf_counter()
        stats = result.stats
        self.num_tokens_computed += stats.num_scheduled_tokens
        self.num_logit_rows += stats.num_sampled
        self.attention_context_sum += stats.attended_context_tokens
        allocator = self.engine.allocator
        num_block_slots = allocator.stats().num_blocks_used * allocator.block_size
        if num_block_slots == 0:
            # The last step: everything finished and was freed at once (nothing to weigh).
            self.overhead_s += perf_counter() - start
            return
        # Running when the step was scheduled: still running, or finished by this step.
        running = {s.request.request_id for s in self.engine.scheduler.running}
        running.update(d.request_id for d in result.outputs if d.finished)
        # Tables as this step's forward read them (finished sequences' go in the next step).
        num_released_tokens = allocator.block_size * sum(
            num_released(live.block_table) for live in self.engine.runner.tables.live_sequences()
        )
        self.samples.append(
            StepSample(
                time_s=time_s,
                duration_s=duration_s,
                num_running=stats.num_running,
                num_waiting=stats.num_waiting,
                num_tokens=stats.num_kv_tokens,
                num_released_tokens=num_released_tokens,
                num_block_slots=num_block_slots,
                num_reserved_exact=sum(self.reservations[r] for r in running),
                num_reserved_context=stats.num_running * self.engine.max_model_len,
                pool_refused=stats.is_pool_refusing,
            )
        )
        self.overhead_s += perf_counter() - start


class ZeroLogitsModel:
    """Stands in for the model: no forward pass, zero logits for every row asked.

    With it the engine does everything else (scheduling, the allocator, inputs and block
    copies, sampling, updates), so a run measures the engine's own overhead.
    """

    def __init__(self, config: ModelConfig, device: torch.device) -> None:
        self.config = config
        self.device = device

    def forward(self, input_ids: torch.Tensor, *_: Any) -> torch.Tensor:
        return torch.zeros(input_ids.numel(), 1, device=self.device)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.zeros(hidden.shape[0], self.config.vocab_size, device=self.device)


def run_quire(llm: LLM, workload: Workload, label: str, stub_forward: bool = False) -> QuireRun:
    """Queue every request, step until all are done, sample each step.

    `stub_forward`: the model is a `ZeroLogitsModel` for the run (the engine's overhead)."""
    engine = llm.engine
    steps_before = engine.num_steps
    preemptions_before = engine.scheduler.num_preemptions
    model = engine.runner.model
    if stub_forward:
        engine.runner.model = ZeroLogitsModel(model.config, engine.device)  # type: ignore[assignment]
    expected: dict[str, int] = {}
    reservations: dict[str, int] = {}
    token_ids: dict[str, list[int]] = {}
    recorder = _StepRecorder(engine, reservations)
    try:
        with tqdm(total=workload.num_output_tokens, desc=label, unit="tok") as bar:
            start = perf_counter()
            for i, (prompt, n) in enumerate(
                zip(workload.prompts, workload.output_lens, strict=True)
            ):
                request_id = f"{label}-{i}"
                expected[request_id] = n
                reservations[request_id] = len(prompt) + n
                token_ids[request_id] = []
                params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
                engine.add_request(request_id, {"prompt_token_ids": prompt}, params)
            last = start
            while engine.has_unfinished_requests():
                result = engine.step()
                now = perf_counter()
                recorder.record(result, now - start, now - last)
                for out in result.outputs:
                    tokens = token_ids[out.request_id]
                    for seq in out.outputs:
                        tokens.extend(seq.new_token_ids)
                    bar.update(sum(len(seq.new_token_ids) for seq in out.outputs))
                    if out.finished:
                        got = len(tokens)
                        assert got == expected[out.request_id], (
                            f"{out.request_id} produced {got} tokens, asked for "
                            f"{expected[out.request_id]}"
                        )
                last = perf_counter()  # the next step's time starts here
            wall_s = perf_counter() - start - recorder.overhead_s
    finally:
        engine.runner.model = model
    return QuireRun(
        wall_s=wall_s,
        num_output_tokens=workload.num_output_tokens,
        num_steps=engine.num_steps - steps_before,
        num_preemptions=engine.scheduler.num_preemptions - preemptions_before,
        samples=recorder.samples,
        num_tokens_computed=recorder.num_tokens_computed,
        num_logit_rows=recorder.num_logit_rows,
        attention_context_sum=recorder.attention_context_sum,
        token_ids=[token_ids[request_id] for request_id in expected],
    )


def warmup_workload(vocab_size: int) -> Workload:
    """What every system runs before it is timed: a few prompts of growing length."""
    rng = np.random.default_rng(12345)
    prompts = [random_token_ids(rng, vocab_size, n) for n in (16, 64, 256, 512)]
    return Workload("warmup", prompts, [8, 8, 8, 8])


def warm_up_quire(llm: LLM, warmup: Workload) -> None:
    """Run the warmup workload through Quire, untimed."""
    prompts = [{"prompt_token_ids": p} for p in warmup.prompts]
    params = [
        SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in warmup.output_lens
    ]
    llm.generate(prompts, params, False)
