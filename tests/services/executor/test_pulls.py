"""Executor processes pulling blocks from each other through a real memory manager: the
follow-up's context is copied from the executor that computed it (cached tokens it did not
compute), the tokens equal a computation from scratch, and a dead source means recompute."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from quire import LLM, SamplingParams
from services.common.wire.executor import params_to_proto
from services.rpc import executor_pb2 as pb
from services.rpc import executor_pb2_grpc
from tests.services.conftest import ServiceProcess
from tests.services.executor.test_cluster import Executor, executor_factory, manager_stats  # noqa: F401

CONTEXT = [(i * 37) % 4000 + 10 for i in range(70)]  # 4 full blocks of 16 and 6 tokens
FOLLOW_UP = CONTEXT + [7, 8, 9]


def generate(executor: Executor, request_id: str, prompt: list[int]) -> tuple[list[int], int]:
    """Greedy, 8 tokens: (the tokens, the prompt tokens it did not compute)."""
    params = params_to_proto(SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    request = pb.GenerateRequest(request_id=request_id, prompt_token_ids=prompt, params=params)
    tokens: list[int] = []
    cached = 0
    with grpc.insecure_channel(executor.address) as channel:
        for message in executor_pb2_grpc.ExecutorStub(channel).Generate(request, timeout=60):
            cached = max(cached, message.num_cached_tokens)
            for delta in message.outputs:
                tokens += delta.token_ids
    return tokens, cached


def computed_alone(tiny_model: Path) -> list[int]:
    """FOLLOW_UP's tokens computed from scratch in this process (the executors' dtype)."""
    alone = LLM(model=str(tiny_model), dtype="auto")
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    outputs = alone.generate([{"prompt_token_ids": FOLLOW_UP}], params, use_tqdm=False)
    return list(outputs[0].outputs[0].token_ids)


@pytest.fixture
def context_on_first(
    executor_factory: Callable[[str], Executor],  # noqa: F811
    request: pytest.FixtureRequest,
) -> tuple[Executor, Executor]:
    """Two executors; the first has computed CONTEXT, the second holds nothing."""
    name = request.node.name.removeprefix("test_")[:24]
    first, second = executor_factory(f"{name}-src"), executor_factory(f"{name}-dst")
    assert len(generate(first, "ctx", CONTEXT)[0]) == 8
    return first, second


def test_a_follow_up_pulls_its_context_from_the_executor_that_computed_it(
    context_on_first: tuple[Executor, Executor], memory_manager: ServiceProcess, tiny_model: Path
) -> None:
    first, second = context_on_first
    tokens, cached = generate(second, "follow-up", FOLLOW_UP)
    assert cached == 64  # "pull-dst" had nothing: all four full blocks came from "pull-src"
    assert tokens == computed_alone(tiny_model)
    stats = manager_stats(memory_manager.target, first.executor_id)
    assert stats is not None and stats.num_blocks_used == 0  # the pin was released


def test_a_dead_source_means_the_prompt_is_computed(
    context_on_first: tuple[Executor, Executor], tiny_model: Path
) -> None:
    first, second = context_on_first
    # Stopped, not gone: the manager still offers its blocks, and the pull cannot connect.
    first.proc.send_signal(signal.SIGSTOP)
    try:
        tokens, cached = generate(second, "follow-up", FOLLOW_UP)
    finally:
        first.proc.send_signal(signal.SIGCONT)
    assert cached == 0
    assert tokens == computed_alone(tiny_model)
    assert "pull failed; computing instead" in second.log()
