"""DeepSeek-V2 (MLA's latent cache, shared + routed experts) served by the Executor gRPC
service: concurrent greedy streams give transformers' tokens, with a pool small enough that
they preempt each other."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from quire_tools.make_model import make_checkpoint

from services.executor.executor_server import ExecutorServer
from services.executor.executor_settings import ExecutorSettings
from tests.libs.engine.conftest import HFOracle, assert_matches_reference
from tests.services.conftest import LoopThread
from tests.services.executor.test_generate import (
    StreamResult,
    generate,
    request_ignoring_eos,
    target,
)

PROMPT_LENGTHS = [5, 40, 70, 17]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def deepseek_v2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("deepseek-v2"), "tiny-deepseek-v2", seed=11)


@pytest.fixture(scope="module")
def mla_executor(aio: LoopThread, deepseek_v2: Path) -> Iterator[ExecutorServer]:
    settings = ExecutorSettings(
        host="127.0.0.1",
        port=0,
        model=str(deepseek_v2),
        dtype="float32",
        memory_manager="local",
        redis_url="",
        num_kv_blocks=10,  # 160 slots for four sequences of up to 94 tokens: some preempt
        executor_id="mla-executor",
    )
    server = ExecutorServer(settings)
    assert aio.run(server.start())
    yield server
    aio.run(server.close())


def test_streams_give_transformers_tokens(
    aio: LoopThread, mla_executor: ExecutorServer, deepseek_v2: Path
) -> None:
    rng = random.Random(5)
    prompts = [[rng.randrange(3, 1000) for _ in range(n)] for n in PROMPT_LENGTHS]

    async def all_streams() -> list[StreamResult]:
        return await asyncio.gather(
            *(
                generate(
                    target(mla_executor),
                    request_ignoring_eos(f"mla-{i}", p, temperature=0.0, max_tokens=MAX_TOKENS),
                )
                for i, p in enumerate(prompts)
            )
        )

    results = aio.run(all_streams())
    oracle = HFOracle(deepseek_v2)
    for i, (prompt, result) in enumerate(zip(prompts, results, strict=True)):
        got = result.outputs[0].token_ids
        assert len(got) == MAX_TOKENS
        ref = oracle.generate(prompt, MAX_TOKENS)
        # transformers stops at EOS; the stream ignores it, so compare up to the reference's end
        assert_matches_reference(got[: len(ref.token_ids)], ref, f"served prompt {i}")
    assert mla_executor.engine is not None
    assert mla_executor.engine.stats().num_preemptions > 0, "the pool was meant to preempt"
