"""Server-sent events and disconnects: `data:` framing, the stream's error event and
`[DONE]`, and cancelling the work of a client that went away."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

import structlog
from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel

from services.router.errors import ApiError, error_body
from services.router.generation import Generation

log = structlog.get_logger("router")
T = TypeVar("T")

DONE = "data: [DONE]\n\n"
CLIENT_CLOSED = 499  # nginx's "client closed request", for logs and metrics


def sse(payload: BaseModel | dict[str, Any], exclude: set[str] | None = None) -> str:
    """One server-sent event carrying JSON (a model without the fields in `exclude`)."""
    if isinstance(payload, BaseModel):
        return f"data: {payload.model_dump_json(exclude=exclude)}\n\n"
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


class ClientDisconnected(Exception):
    """The client went away before its response was ready."""


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it and raising ClientDisconnected if the client leaves first.

    Cancelling an executor call aborts the request there and frees its blocks, so a client
    that gives up while queued or mid-generation costs nothing more.
    """
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        log.info("client disconnected, aborting")
        raise ClientDisconnected()
    finally:
        for pending in (task, watch):
            if not pending.done():
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await pending


async def client_closed(request: Request, exc: Exception) -> Response:
    """Exception handler: nobody reads this response; it is logged and counted as 499."""
    return Response(status_code=CLIENT_CLOSED)


def event_stream(
    generation: Generation,
    chunks: AsyncIterator[str],
    headers: dict[str, str],
) -> StreamingResponse:
    """An SSE response: the route's chunks, then an error event if one happened, then [DONE].

    A client disconnect cancels the iteration, which cancels the executor calls.
    """

    async def body() -> AsyncIterator[str]:
        try:
            async for chunk in chunks:
                yield chunk
        except ApiError as error:
            log.warning("stream failed", status=error.status, error=error.message)
            yield sse(error.body())
        except Exception as error:
            log.exception("stream failed", error=repr(error))
            yield sse(error_body(500, "internal error"))
        finally:
            generation.close()
        yield DONE

    return StreamingResponse(
        body(),
        media_type="text/event-stream",
        headers={**headers, "Cache-Control": "no-cache"},
    )
