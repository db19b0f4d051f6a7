"""The whole pipeline through the official openai client: real processes, real Redis."""

from __future__ import annotations

import asyncio
import random
import time

import httpx
import openai
import pytest

from quire import LLM, SamplingParams
from services.stack.runner import Stack
from tests.integration.conftest import REPO, STACK_DTYPE, wait_idle

MODEL = "quire-tiny"


@pytest.fixture(scope="module")
def client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.config.router_url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def offline() -> LLM:
    return LLM(model=str(REPO / "models" / "quire-tiny"), dtype=STACK_DTYPE)  # as the stack


def test_models_and_health(stack: Stack, client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(f"{stack.config.router_url}/health").status_code == 200


def test_greedy_completions_equal_offline_engine(client: openai.OpenAI, offline: LLM) -> None:
    prompts = ["The paged cache", "Once upon a time there", "def fibonacci(n):", "Ünïcödé 漢字 🙂"]
    expected = offline.generate(
        prompts, SamplingParams(temperature=0, max_tokens=24), use_tqdm=False
    )
    for prompt, ref in zip(prompts, expected, strict=True):
        got = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0)
        assert got.choices[0].text == ref.outputs[0].text
        assert got.usage.completion_tokens == len(ref.outputs[0].token_ids)
        assert got.usage.prompt_tokens == len(ref.prompt_token_ids)


def test_streaming_completion_concatenates_to_the_same_text(
    client: openai.OpenAI, offline: LLM
) -> None:
    prompt = "Streaming through the router"
    ref = offline.generate([prompt], SamplingParams(temperature=0, max_tokens=30), use_tqdm=False)
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt=prompt,
            max_tokens=30,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == ref[0].outputs[0].text
    usage = chunks[-1].usage  # the last chunk, whether the output ran to 30 tokens or stopped
    assert usage is not None
    assert usage.completion_tokens == len(ref[0].outputs[0].token_ids)
    assert usage.prompt_tokens == len(ref[0].prompt_token_ids)


def test_chat_streaming_and_not(client: openai.OpenAI, offline: LLM) -> None:
    messages = [{"role": "user", "content": "Tell me about paged attention."}]
    full = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=20, temperature=0
    )
    assert full.choices[0].message.role == "assistant"
    assert full.usage.total_tokens == full.usage.prompt_tokens + full.usage.completion_tokens
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=20, temperature=0, stream=True
    )
    text = "".join((c.choices[0].delta.content or "") for c in stream if c.choices)
    assert text == full.choices[0].message.content
    tok = offline.get_tokenizer()
    rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tok.encode(rendered, add_special_tokens=False)
    ref = offline.generate(
        [{"prompt_token_ids": ids}], SamplingParams(temperature=0, max_tokens=20), use_tqdm=False
    )
    assert full.choices[0].message.content == ref[0].outputs[0].text


def test_n3_stop_strings_and_token_id_prompts(client: openai.OpenAI, offline: LLM) -> None:
    rng = random.Random(3)
    ids = [rng.randrange(5, 4000) for _ in range(40)]
    got = client.completions.create(model=MODEL, prompt=ids, max_tokens=12, temperature=0)
    ref = offline.generate(
        [{"prompt_token_ids": ids}], SamplingParams(temperature=0, max_tokens=12), use_tqdm=False
    )
    assert got.choices[0].text == ref[0].outputs[0].text

    three = client.completions.create(
        model=MODEL, prompt="Three ways", n=3, max_tokens=10, temperature=1.0, seed=7
    )
    assert sorted(c.index for c in three.choices) == [0, 1, 2]
    # Seeded: each choice is the offline engine's output of the same index, token for token.
    seeded = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=10)
    ref_three = offline.generate(["Three ways"], seeded, use_tqdm=False)[0].outputs
    by_index = {c.index: c.text for c in three.choices}
    assert by_index == {o.index: o.text for o in ref_three}
    assert len(set(by_index.values())) > 1, "three seeded samples at temperature 1 coincide"

    base = client.completions.create(model=MODEL, prompt="A stop", max_tokens=40, temperature=0)
    text = base.choices[0].text
    assert len(text) > 8
    stop = text[4:7]
    stopped = client.completions.create(
        model=MODEL, prompt="A stop", max_tokens=40, temperature=0, stop=[stop]
    )
    assert stopped.choices[0].text == text[: text.index(stop)]
    assert stopped.choices[0].finish_reason == "stop"


def test_shared_prefix_goes_to_one_executor_and_hits(stack: Stack) -> None:
    rng = random.Random(11)
    prefix = [rng.randrange(5, 4000) for _ in range(160)]
    served = []
    cached = []
    for i in range(6):
        body = {
            "model": MODEL,
            "prompt": prefix + [100 + i, 200 + i],
            "max_tokens": 4,
            "temperature": 0,
        }
        r = httpx.post(f"{stack.config.router_url}/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        served.append(r.headers["x-quire-executor"])
        details = r.json()["usage"].get("prompt_tokens_details") or {}
        cached.append(details.get("cached_tokens", 0))
    assert len(set(served)) == 1, served
    assert max(cached[1:]) >= 144, cached  # the 9 full prefix blocks were served from cache
    # The memory manager itself counts the hits for that executor.
    import grpc

    from services.rpc import memory_manager_pb2, memory_manager_pb2_grpc

    target = f"{stack.config.host}:{stack.config.memory_manager_port}"
    with grpc.insecure_channel(target) as channel:
        stats = memory_manager_pb2_grpc.MemoryManagerStub(channel).GetStats(
            memory_manager_pb2.GetStatsRequest(executor_id=served[0]), timeout=5
        )
    assert stats.prefix_cache_hits >= 5 * 144, stats


def test_client_disconnect_frees_blocks(stack: Stack) -> None:
    async def disconnect_midway() -> None:
        async with httpx.AsyncClient(timeout=60) as http:
            body = {
                "model": MODEL,
                "prompt": "Disconnect me " * 8,
                "max_tokens": 400,
                "temperature": 0,
                "stream": True,
                "ignore_eos": True,
            }
            async with http.stream(
                "POST", f"{stack.config.router_url}/v1/completions", json=body
            ) as resp:
                n = 0
                async for line in resp.aiter_lines():
                    if line.startswith("data:"):
                        n += 1
                    if n >= 5:
                        break  # leaving the block closes the connection mid-stream

    async def many() -> None:
        await asyncio.gather(*(disconnect_midway() for _ in range(6)))

    asyncio.run(many())
    executors = wait_idle(stack)
    assert all(e["kv_blocks_used"] == 0 for e in executors if e["healthy"])


def test_flood_gets_429_never_5xx(stack: Stack) -> None:
    async def one(http: httpx.AsyncClient, i: int) -> int:
        body = {
            "model": MODEL,
            "prompt": f"flood {i}",
            "max_tokens": 64,
            "temperature": 0,
            "ignore_eos": True,
        }
        r = await http.post(f"{stack.config.router_url}/v1/completions", json=body)
        if r.status_code == 429:
            assert "retry-after" in r.headers
            assert r.json()["error"]["message"]
        return r.status_code

    async def flood() -> list[int]:
        async with httpx.AsyncClient(timeout=120) as http:
            return await asyncio.gather(*(one(http, i) for i in range(400)))

    codes = asyncio.run(flood())
    assert all(c < 500 for c in codes), sorted(set(codes))
    assert 429 in codes and 200 in codes, sorted(set(codes))
    wait_idle(stack, timeout_s=120)


def test_hot_prefix_under_load_spreads_past_the_cap(stack: Stack) -> None:
    """Many concurrent requests on one shared prefix do not all pile onto its holder."""
    rng = random.Random(5)
    prefix = [rng.randrange(5, 4000) for _ in range(96)]

    async def one(http: httpx.AsyncClient, i: int) -> str:
        body = {
            "model": MODEL,
            "prompt": prefix + [300 + i],
            "max_tokens": 48,
            "temperature": 0,
            "ignore_eos": True,
        }
        r = await http.post(f"{stack.config.router_url}/v1/completions", json=body)
        assert r.status_code == 200, r.text
        return r.headers["x-quire-executor"]

    async def burst() -> list[str]:
        async with httpx.AsyncClient(timeout=120) as http:
            await one(http, 0)  # warm: one executor now holds the prefix
            return await asyncio.gather(*(one(http, i) for i in range(1, 25)))

    served = asyncio.run(burst())
    assert len(set(served)) == 2, f"all {len(served)} requests went to {set(served)}"
    wait_idle(stack, timeout_s=60)


def test_dead_executor_stops_receiving_traffic(stack: Stack) -> None:
    """Last: it kills an executor (the package fixture is not reused afterwards)."""
    import signal

    def complete(i: int) -> httpx.Response:
        body = {"model": MODEL, "prompt": f"after death {i}", "max_tokens": 2}
        return httpx.post(f"{stack.config.router_url}/v1/completions", json=body, timeout=30)

    def healthy() -> set[str]:
        status = httpx.get(f"{stack.config.router_admin_url}/cluster/status").json()
        return {e["id"] for e in status["executors"] if e["healthy"]}

    stack.signal("executor-1", signal.SIGKILL)
    # Until the router sees it gone, requests still arrive for it: none may fail.
    statuses = []
    deadline = time.monotonic() + 30
    while "executor-1" in healthy():
        assert time.monotonic() < deadline, "the router never noticed executor-1 died"
        statuses.append(complete(len(statuses)).status_code)
    responses = [complete(1000 + i) for i in range(12)]
    assert set(statuses) <= {200}, statuses
    assert [r.status_code for r in responses] == [200] * 12
    assert {r.headers["x-quire-executor"] for r in responses} == {"executor-0"}
    status = httpx.get(f"{stack.config.router_admin_url}/cluster/status").json()["executors"]
    assert not any(e["id"] == "executor-1" and e["healthy"] for e in status)
