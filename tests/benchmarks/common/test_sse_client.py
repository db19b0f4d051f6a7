"""The benchmarks' streaming client against a fake OpenAI server on a local socket."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from benchmarks.common.sse import StreamRecord, Usage
from benchmarks.common.sse_client import stream
from tests.benchmarks.common.fake_openai import USAGE, serve


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with serve() as url:
        yield url


def run(url: str, body: dict[str, Any], **kwargs: Any) -> StreamRecord:
    async def go() -> StreamRecord:
        async with httpx.AsyncClient(timeout=30.0) as client:
            return await stream(client, url, body, **kwargs)

    return asyncio.run(go())


def completions(
    base_url: str, scenario: str = "normal", chunk_gap_s: float = 0.0, **kwargs: Any
) -> StreamRecord:
    """A completions stream; `kwargs` go to `stream`."""
    body = {"prompt": "x", "stream": True, "scenario": scenario, "chunk_gap_s": chunk_gap_s}
    return run(f"{base_url}/v1/completions", body, **kwargs)


def test_completion_stream(base_url: str) -> None:
    record = completions(base_url)
    assert record.ok, record.failure
    assert record.status == 200 and record.done and record.executor == "ex-a"
    assert record.text == "Once upon a time" and record.finish_reason == "length"
    assert record.usage == Usage.from_json(USAGE)
    assert (record.prompt_tokens, record.output_tokens, record.cached_tokens) == (5, 4, 2)
    assert record.num_text_chunks == 4 and len(record.itl) == 3
    assert record.ttft is not None and record.e2e is not None
    assert 0 < record.ttft <= record.e2e


def test_chat_stream(base_url: str) -> None:
    body = {"messages": [{"role": "user", "content": "x"}], "stream": True}
    record = run(f"{base_url}/v1/chat/completions", body)
    assert record.ok, record.failure
    assert record.text == "Once upon a time" and record.finish_reason == "length"
    assert record.num_text_chunks == 4  # the role-only first delta is not text
    assert record.num_events == 7  # role, four words, finish, usage


def test_gaps_between_chunks_are_measured(base_url: str) -> None:
    record = completions(base_url, chunk_gap_s=0.05)
    assert record.ok, record.failure
    assert record.ttft is not None and record.ttft >= 0.045
    # Three gaps of 50 ms at the server; a busy client may read one chunk late, not all.
    assert len(record.itl) == 3 and sum(record.itl) >= 0.1
    assert record.tpot is not None and record.tpot > 0


def test_error_event_mid_stream(base_url: str) -> None:
    record = completions(base_url, "error-event")
    assert not record.ok and record.done
    assert record.error == "error event: executor lost"
    assert record.error_event == {"message": "executor lost", "type": "server_error", "code": 503}
    assert record.text == "Once upon"


def test_refusal(base_url: str) -> None:
    record = completions(base_url, "refused")
    assert record.status == 429 and record.retry_after == "1"
    assert record.error == "HTTP 429: queue full" and not record.ok
    assert '"rate_limit_error"' in record.body
    assert record.ttft is None and record.end is not None


def test_non_200_without_an_error_object(base_url: str) -> None:
    record = completions(base_url, "plain-500")
    assert record.status == 500 and record.retry_after is None
    assert record.error == "HTTP 500: Internal Server Error"


def test_stream_cut_by_the_server(base_url: str) -> None:
    record = completions(base_url, "cut")
    assert record.status == 200 and not record.done and not record.ok
    assert isinstance(record.exception, httpx.TransportError)
    assert record.text == "Once upon"


def test_missing_done(base_url: str) -> None:
    record = completions(base_url, "no-done")
    assert record.error == "stream ended without [DONE]"
    assert completions(base_url, "no-done", expect_done=False).ok


def test_deadline(base_url: str) -> None:
    record = completions(base_url, "hang", deadline_s=0.5)
    assert record.timed_out and not record.ok and not record.done
    assert record.status == 200 and record.text == "Once upon"
    assert record.e2e is not None and 0.5 <= record.e2e < 5.0


def test_client_goes_away_after_max_events(base_url: str) -> None:
    record = completions(base_url, chunk_gap_s=0.01, max_events=2)
    assert record.closed_early and not record.done
    assert record.error == "" and record.num_events == 2 and record.text == "Once upon"


def test_connection_refused() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    record = run(f"http://127.0.0.1:{port}/v1/completions", {"stream": True})
    assert record.status == 0 and not record.ok
    assert isinstance(record.exception, httpx.ConnectError)
    assert record.error.startswith("ConnectError")
