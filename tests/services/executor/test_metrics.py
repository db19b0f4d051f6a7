"""Executor metrics (vLLM's series as quire_executor_*) and the request ids of Step calls."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from quire.block.allocator import AdmitRequest, AppendRequest, ForkRequest, StepAllocation
from quire.cluster.redis_keys import ExecutorLoad
from quire.engine.stats import StepStats
from services.executor.executor_logging import RequestIds, safe_request_id
from services.executor.executor_metrics import ExecutorMetrics
from services.executor.executor_server import ExecutorServer
from services.executor.executor_settings import ExecutorSettings
from services.rpc import executor_pb2 as pb
from services.rpc import executor_pb2_grpc
from tests.services.conftest import LoopThread

PROMPT = list(range(5, 45))  # 40 tokens: two full 16-token blocks


def samples(metrics: ExecutorMetrics) -> dict[str, float]:
    text = generate_latest(metrics.registry).decode()
    return {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.labels.get("model_name") == "quire-tiny" and "le" not in s.labels
    }


def step_stats(
    num_sampled: int, num_preempted: int, num_drafts: int = 0, num_kept: int = 0
) -> StepStats:
    return StepStats(
        num_scheduled_seqs=num_sampled,
        num_prefill_tokens=0,
        num_decode_tokens=num_sampled,
        num_sampled=num_sampled,
        attended_context_tokens=0,
        num_preempted=num_preempted,
        num_not_admitted=0,
        num_running=num_sampled,
        num_waiting=0,
        num_kv_tokens=0,
        first_scheduled=(),
        schedule_s=0.0,
        allocator_s=0.0,
        forward_s=0.0,
        sample_s=0.0,
        update_s=0.0,
        num_draft_tokens=num_drafts,
        num_kept_drafts=num_kept,
    )


def test_load_gauges_and_totals_and_step_counts_become_counters() -> None:
    metrics = ExecutorMetrics("quire-tiny")
    # The first totals only set the baseline.
    metrics.observe_prefix_cache(num_queries=10, num_hits=4)
    metrics.observe_prefix_cache(num_queries=42, num_hits=20)
    # A memory manager that restarted forgets its totals: never a negative increment.
    metrics.observe_prefix_cache(num_queries=0, num_hits=0)
    metrics.observe_step(step_stats(num_sampled=4, num_preempted=1))
    metrics.observe_step(step_stats(num_sampled=3, num_preempted=0, num_drafts=5, num_kept=2))
    metrics.observe_load(ExecutorLoad(num_running=3, num_waiting=2, kv_blocks_total=8))
    got = samples(metrics)
    assert got["quire_executor_num_requests_running"] == 3
    assert got["quire_executor_num_requests_waiting"] == 2
    assert got["quire_executor_prefix_cache_queries_total"] == 32
    assert got["quire_executor_prefix_cache_hits_total"] == 16
    assert got["quire_executor_num_preemptions_total"] == 1
    assert got["quire_executor_generation_tokens_total"] == 7
    assert got["quire_executor_spec_decode_num_draft_tokens_total"] == 5
    assert got["quire_executor_spec_decode_num_accepted_tokens_total"] == 2
    metrics.observe_load(ExecutorLoad(num_running=3, kv_blocks_total=8, kv_blocks_used=2))
    assert samples(metrics)["quire_executor_kv_cache_usage_perc"] == 0.25


def test_memory_manager_steps_count_sent_and_quiet_from_the_allocator_totals() -> None:
    metrics = ExecutorMetrics("quire-tiny")
    metrics.observe_allocator_steps(num_sent=3, num_quiet=0)
    metrics.observe_allocator_steps(num_sent=4, num_quiet=15)
    text = generate_latest(metrics.registry).decode()
    got = {
        s.labels["call"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "quire_executor_memory_manager_steps_total"
    }
    assert got == {"sent": 4, "quiet": 15}


def test_step_metadata_lists_request_ids_lifecycle_first() -> None:
    ids = RequestIds(max_ids=3)
    for engine_id, request_id in [("e1", "r1"), ("e2", "r2"), ("e3", "r3"), ("e4", "r4")]:
        ids.bind(engine_id, request_id)
    step = StepAllocation(
        appends=(AppendRequest("e1#0", (1,)), AppendRequest("e2#0", (1,))),
        frees=("e3#0",),
        admits=(AdmitRequest("e4#0", (1, 2)), AdmitRequest("unknown#0", (3,))),
        forks=(ForkRequest("e2#0", "e2#1"),),
    )
    assert ids.step_metadata(step) == (("x-request-ids", "r4,r3,r2"),)
    assert ids.step_metadata(StepAllocation()) == ()


def test_released_ids_last_until_the_step_after_next() -> None:
    ids = RequestIds()
    ids.bind("e1", "r1")
    frees = StepAllocation(frees=("e1#0",))
    ids.release("e1")  # finished in this step; its frees go out with the next one
    ids.step_done()
    assert ids.step_metadata(frees) == (("x-request-ids", "r1"),)
    ids.step_done()
    assert ids.step_metadata(frees) == ()


@pytest.mark.parametrize(
    ("value", "expected"),
    [("abc-123", "abc-123"), ("a" * 129, None), ("x y", None), ("a,b", None), ("", None)],
)
def test_safe_request_id(value: str, expected: str | None) -> None:
    assert safe_request_id(value) == expected


@pytest.fixture(scope="module")
def executor(tiny_model: Path) -> Iterator[tuple[LoopThread, ExecutorServer]]:
    loop = LoopThread()
    settings = ExecutorSettings(
        port=0,
        model=str(tiny_model),
        memory_manager="local",
        redis_url="",
        num_kv_blocks=64,
        executor_id="metrics-executor",
    )
    server = ExecutorServer(settings)
    assert loop.run(server.start())
    yield loop, server
    loop.run(server.close())
    loop.close()


def test_latency_histograms_and_prefix_counters_follow_requests(
    executor: tuple[LoopThread, ExecutorServer],
) -> None:
    loop, server = executor

    async def generate(request_id: str) -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = executor_pb2_grpc.ExecutorStub(channel)
            request = pb.GenerateRequest(
                request_id=request_id,
                prompt_token_ids=PROMPT,
                params=pb.SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True),
            )
            call = stub.Generate(request, metadata=(("x-request-id", f"trace-{request_id}"),))
            async for _ in call:
                pass

    loop.run(generate("first"))
    loop.run(generate("second"))  # the same prompt: its two full blocks are cached
    assert server.loop is not None
    server.loop.fresh_load().result(10)
    assert server.metrics is not None
    got = samples(server.metrics)
    assert got["quire_executor_prompt_tokens_total"] == 2 * len(PROMPT)
    assert got["quire_executor_generation_tokens_total"] == 10
    assert got["quire_executor_prefix_cache_queries_total"] >= 2 * len(PROMPT) - 2
    assert got["quire_executor_prefix_cache_hits_total"] == 32
    assert got["quire_executor_time_to_first_token_seconds_count"] == 2
    assert got["quire_executor_request_queue_time_seconds_count"] == 2
    assert got["quire_executor_e2e_request_latency_seconds_count"] == 2
    assert got["quire_executor_inter_token_latency_seconds_count"] == 2 * 4  # 5 tokens, 4 gaps
    assert got["quire_executor_num_requests_running"] == 0
