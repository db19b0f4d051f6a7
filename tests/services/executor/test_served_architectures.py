"""The architectures beyond Llama served by an executor over gRPC: greedy streams equal
transformers' generate() token for token, requests batched together (Qwen3 with its q/k norms,
Phi-3 in both LongRoPE regimes, Qwen3-MoE and Mixtral through the grouped experts, DeepSeek-V2 over its latent
cache, Gemma 2 and 3 with their sliding and global layers in KV groups, gpt-oss with its sinks and clamped
experts)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from quire_tools.make_model import LONGROPE_ORIGINAL_MAX, make_checkpoint

from services.executor.executor_server import ExecutorServer
from services.executor.executor_settings import ExecutorSettings
from services.rpc import executor_pb2 as pb
from services.rpc import executor_pb2_grpc
from tests.libs.engine.conftest import HFOracle, assert_matches_reference
from tests.services.conftest import LoopThread

# preset -> prompt lengths: LongRoPE's long regime takes prompts longer than its original
# context (transformers uses the long factors there), the others any length.
MODELS = {
    "tiny-qwen3": [4, 19, 45, 100],
    "tiny-phi3": [3, 17, 40, 120],
    "tiny-phi3-longrope": [LONGROPE_ORIGINAL_MAX + n for n in (1, 9, 40, 100)],
    "tiny-qwen3-moe": [5, 16, 33, 90],
    "tiny-mixtral": [2, 31, 64, 150],
    "tiny-deepseek-v2": [4, 17, 48, 110],
    "tiny-deepseek-v2-q-lora": [1, 15, 32, 70],
    "tiny-gemma2": [6, 16, 30, 80],
    "tiny-gemma3": [3, 25, 47, 100],
    "tiny-gpt-oss": [2, 17, 36, 96],
    "tiny-gpt-oss-mqa": [7, 24, 50, 130],
}
MAX_TOKENS = 12


@pytest.fixture(scope="module", params=list(MODELS))
def served(
    request: pytest.FixtureRequest, aio: LoopThread, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path, ExecutorServer]]:
    preset = request.param
    path = make_checkpoint(tmp_path_factory.mktemp(preset), preset, seed=11)
    settings = ExecutorSettings(
        host="127.0.0.1",
        port=0,
        model=str(path),
        memory_manager="local",
        redis_url="",
        executor_id=f"test-{preset}",
        dtype="float32",
    )
    server = ExecutorServer(settings)
    assert aio.run(server.start())
    yield preset, path, server
    aio.run(server.close())


async def stream_tokens(address: str, request_id: str, prompt: list[int]) -> list[int]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = executor_pb2_grpc.ExecutorStub(channel)
        request = pb.GenerateRequest(
            request_id=request_id,
            prompt_token_ids=prompt,
            params=pb.SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS),
        )
        tokens: list[int] = []
        async for message in stub.Generate(request):
            for delta in message.outputs:
                tokens += delta.token_ids
        return tokens


async def stream_all(address: str, prompts: list[list[int]]) -> list[list[int]]:
    return list(
        await asyncio.gather(*(stream_tokens(address, f"r{i}", p) for i, p in enumerate(prompts)))
    )


def test_served_greedy_streams_equal_transformers(
    aio: LoopThread, served: tuple[str, Path, ExecutorServer]
) -> None:
    preset, path, server = served
    rng = random.Random(preset)
    prompts = [[rng.randrange(3, 4000) for _ in range(n)] for n in MODELS[preset]]
    streamed = aio.run(stream_all(f"127.0.0.1:{server.port}", prompts))
    oracle = HFOracle(path)
    for i, (prompt, got) in enumerate(zip(prompts, streamed, strict=True)):
        ref = oracle.generate(prompt, MAX_TOKENS)
        assert_matches_reference(got, ref, f"{preset} served prompt {i} (len {len(prompt)})")
