"""Migration through real executors: two in-process executors serving the tiny model and a
router over them. A request's first call loses its executor after k messages (the executor
ends the stream with UNAVAILABLE, as a dead or handed-off one does); the router continues it
on the other executor, and the client gets exactly what the uninterrupted request gets: the
same chunks, text, logprobs, tool calls, finish reasons and usage."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from typing import Any, cast

import grpc
import pytest

from services.executor import executor_server
from services.executor.executor_server import ExecutorServer
from services.executor.executor_servicer import ExecutorServicer
from services.executor.executor_settings import ExecutorSettings
from services.rpc import executor_pb2 as pb
from tests.checkpoints import tiny_checkpoint
from tests.services.conftest import LoopThread
from tests.services.router.conftest import MODEL_NAME, Cluster, RouterHandle
from tests.services.router.test_migration import metric

LOSE_AFTER = 4  # messages (one token per output each) before the executor is lost
CHAT = [{"role": "user", "content": "Tell me about Paris."}]
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 8}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


class LosingServicer(ExecutorServicer):
    """The real servicer, except that while `lose_after` is set a request's first call ends
    with UNAVAILABLE after that many messages (continuations are served in full)."""

    lose_after: int | None = None

    async def Generate(  # noqa: N802 (gRPC method name)
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateResponse]:
        limit = None if request.HasField("continuation") else LosingServicer.lose_after
        responses = cast(
            AsyncGenerator[pb.GenerateResponse, None], super().Generate(request, context)
        )
        try:
            num_sent = 0
            async for response in responses:
                if num_sent == limit:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "executor lost")
                yield response
                num_sent += 1
        finally:
            await responses.aclose()  # aborts the request in the engine, as a dead one would


@pytest.fixture(scope="module")
def executors(bg_loop: LoopThread) -> Iterator[list[ExecutorServer]]:
    """Two executors of the tiny model in float32 (a continuation computes its output's first
    tokens as one prefill, the original one token at a time; in bfloat16 that rounding alone
    can move a token), without prefix caching (so cached_tokens is 0 in both runs)."""
    model = tiny_checkpoint()
    servers = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(executor_server, "ExecutorServicer", LosingServicer)
        for name in ("mig-a", "mig-b"):
            settings = ExecutorSettings(
                host="127.0.0.1",
                port=0,
                model=str(model),
                memory_manager="local",
                redis_url="",
                num_kv_blocks=64,
                executor_id=name,
                dtype="float32",
                enable_prefix_caching=False,
            )
            server = ExecutorServer(settings)
            assert bg_loop.run(server.start())
            servers.append(server)
    yield servers
    for server in servers:
        bg_loop.run(server.close())


@pytest.fixture
def router(cluster: Cluster, executors: list[ExecutorServer]) -> RouterHandle:
    addresses = ",".join(f"127.0.0.1:{s.port}" for s in executors)
    return cluster.router(redis_url="", executors=addresses, executor_down_s=0)


def post(router: RouterHandle, path: str, body: dict[str, Any], lose: bool) -> Any:
    """The response body (JSON, or the list of SSE events), with the executor lost or not."""
    LosingServicer.lose_after = LOSE_AFTER if lose else None
    try:
        with router.http(timeout=60) as http:
            response = http.post(path, json={"model": MODEL_NAME, **body})
    finally:
        LosingServicer.lose_after = None
    assert response.status_code == 200, response.text
    if not body.get("stream"):
        return response.json()
    events = [e.removeprefix("data: ") for e in response.text.strip().split("\n\n")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def by_choice(events: list[dict[str, Any]]) -> dict[int, list[Any]]:
    """A stream's chunks per choice, in order (choices may interleave differently once their
    outputs run on separate executors); the usage chunk under -1."""
    out: dict[int, list[Any]] = {}
    for event in events:
        for choice in event["choices"]:
            out.setdefault(choice["index"], []).append(choice)
        if event.get("usage"):
            out.setdefault(-1, []).append(event["usage"])
    return out


def split_floats(value: Any, floats: list[float]) -> Any:
    """`value` with every float moved into `floats` (compared apart, within a tolerance) and
    the ids and timestamps that differ between any two requests left out."""
    if isinstance(value, float):
        floats.append(value)
        return "<float>"
    if isinstance(value, dict):
        return {k: split_floats(v, floats) for k, v in value.items() if k not in ("id", "created")}
    if isinstance(value, list):
        return [split_floats(v, floats) for v in value]
    return value


def assert_same(whole: Any, moved: Any) -> None:
    whole_floats: list[float] = []
    moved_floats: list[float] = []
    assert split_floats(moved, moved_floats) == split_floats(whole, whole_floats)
    assert moved_floats == pytest.approx(whole_floats, abs=1e-3)


SEEDED = {"temperature": 1.0, "top_p": 0.9, "seed": 1234}
GREEDY = {"temperature": 0}
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "completions-greedy-stream": (
        "/v1/completions",
        {**GREEDY, "prompt": "The city of", "max_tokens": 12, "logprobs": 2, "stream": True},
    ),
    "completions-seeded-n2": (
        "/v1/completions",
        {**SEEDED, "prompt": "Once upon", "max_tokens": 12, "n": 2, "logprobs": 1},
    ),
    "chat-seeded-n2-stream": (
        "/v1/chat/completions",
        {**SEEDED, "messages": CHAT, "max_tokens": 12, "n": 2, "logprobs": True, "stream": True},
    ),
    "chat-json-schema": (
        "/v1/chat/completions",
        {
            **GREEDY,
            "messages": CHAT,
            "max_tokens": 40,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "person", "schema": PERSON},
            },
        },
    ),
    "chat-forced-tool-stream": (
        "/v1/chat/completions",
        {
            **GREEDY,
            "messages": CHAT,
            "max_tokens": 40,
            "tools": [WEATHER],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "stream": True,
        },
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_migrated_request_answers_as_the_uninterrupted_one(
    router: RouterHandle, case: str
) -> None:
    path, body = CASES[case]
    if body.get("stream"):
        body = {**body, "stream_options": {"include_usage": True}}
    whole = post(router, path, body, lose=False)
    assert metric(router, "continued") == 0
    moved = post(router, path, body, lose=True)
    assert metric(router, "continued") == 1
    if body.get("stream"):
        whole, moved = by_choice(whole), by_choice(moved)
        usage = whole[-1][0]
    else:
        usage = whole["usage"]
    # The loss came mid-stream: every output had more tokens to go.
    assert usage["completion_tokens"] > (LOSE_AFTER + 1) * body.get("n", 1)
    assert_same(whole, moved)
