"""A small OpenAI-compatible streaming server for the SSE client's tests, on a real socket.

The request body's `scenario` picks what the server does; `chunk_gap_s` spaces its events.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

WORDS = ["Once", " upon", " a", " time"]
USAGE = {"prompt_tokens": 5, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 2}}


def sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"


def chunk(chat: bool, text: str | None, finish: str | None = None) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
    if chat:
        choice["delta"] = {} if text is None else {"content": text}
    else:
        choice["text"] = text or ""
    return {"object": "chat.completion.chunk" if chat else "text_completion", "choices": [choice]}


async def events(chat: bool, scenario: str, gap_s: float) -> AsyncIterator[str]:
    if chat:
        yield sse({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})
    for i, word in enumerate(WORDS):
        await asyncio.sleep(gap_s)
        if scenario == "error-event" and i == 2:
            error = {"message": "executor lost", "type": "server_error", "code": 503}
            yield sse({"error": error})
            yield "data: [DONE]\n\n"
            return
        if scenario == "cut" and i == 2:
            raise RuntimeError("the server goes away mid-stream")
        if scenario == "hang" and i == 2:
            await asyncio.sleep(60)
        yield sse(chunk(chat, word))
    yield sse(chunk(chat, None, finish="length"))
    yield sse({"choices": [], "usage": USAGE})
    if scenario != "no-done":
        yield "data: [DONE]\n\n"


async def endpoint(request: Request) -> Response:
    body = await request.json()
    scenario = body.get("scenario", "normal")
    if scenario == "refused":
        error = {"message": "queue full", "type": "rate_limit_error", "code": 429}
        return JSONResponse({"error": error}, status_code=429, headers={"Retry-After": "1"})
    if scenario == "plain-500":
        return PlainTextResponse("Internal Server Error", status_code=500)
    chat = request.url.path.endswith("/chat/completions")
    gap_s = float(body.get("chunk_gap_s", 0.0))
    return StreamingResponse(
        events(chat, scenario, gap_s),
        media_type="text/event-stream",
        headers={"x-quire-executor": "ex-a"},
    )


APP = Starlette(
    routes=[
        Route("/v1/completions", endpoint, methods=["POST"]),
        Route("/v1/chat/completions", endpoint, methods=["POST"]),
    ]
)


@contextmanager
def serve() -> Iterator[str]:
    """The fake server on a free local port, in a thread; yields its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(APP, log_level="critical", lifespan="off", timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10.0
    while not server.started:
        assert time.monotonic() < deadline, "the fake server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10.0)
        sock.close()
