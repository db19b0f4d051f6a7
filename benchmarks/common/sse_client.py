"""Streaming OpenAI requests over httpx, each read into a StreamRecord (benchmarks.common.sse).

Every benchmark that streams sends its requests through `stream`; it never raises for what a
server or the network does: the HTTP status, an error event, a broken connection or the
deadline all land in the record, so a run keeps going and reports them.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from benchmarks.common.sse import StreamRecord


async def stream(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    *,
    deadline_s: float | None = None,
    max_events: int | None = None,
    expect_done: bool = True,
    headers: dict[str, str] | None = None,
) -> StreamRecord:
    """POST `body` (a streaming completions or chat request) to `url` and read its events.

    `deadline_s` bounds the whole request, headers to last event (`timed_out` then);
    `max_events` closes the connection after that many events, as a client that goes away
    mid-stream (`closed_early`); `expect_done=False` is for servers that end a stream
    without `data: [DONE]`. `headers` go with the request (an x-request-id, say).
    """
    record = StreamRecord(start=time.perf_counter())
    try:
        async with asyncio.timeout(deadline_s):
            await _read(client, url, body, record, max_events, headers)
    except TimeoutError:
        record.timed_out = True
        record.fail(f"no end within {deadline_s} s")
    except httpx.HTTPError as exc:
        record.exception = exc
        record.fail(f"{type(exc).__name__}: {exc}")
    record.finish(time.perf_counter(), expect_done=expect_done)
    return record


async def _read(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    record: StreamRecord,
    max_events: int | None,
    headers: dict[str, str] | None = None,
) -> None:
    async with client.stream("POST", url, json=body, headers=headers) as resp:
        record.executor = resp.headers.get("x-quire-executor", "")
        record.retry_after = resp.headers.get("retry-after")
        if resp.status_code != 200:
            text = (await resp.aread()).decode(errors="replace")
            record.fail_status(resp.status_code, text)
            return
        record.status = 200
        async for line in resp.aiter_lines():
            if not record.feed_line(line, time.perf_counter()):
                return
            if max_events is not None and record.num_events >= max_events:
                record.closed_early = True
                return  # leaving the block closes the connection
