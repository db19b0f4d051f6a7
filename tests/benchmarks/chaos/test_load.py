"""The bucket a chaos stream ends in, from what the SSE client recorded (no stack needed)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from benchmarks.chaos.load import Outcome, classify_stream
from benchmarks.common.sse import StreamRecord

ERROR_BODY = '{"error": {"message": "queue full", "type": "rate_limit_error"}}'


def bucket(record: StreamRecord) -> tuple[str, str]:
    out = Outcome("stream", "hung", 0.0, 0.0)
    classify_stream(record, out)
    return out.bucket, out.detail


def stream_200(**fields: Any) -> StreamRecord:
    return StreamRecord(start=0.0, status=200, **fields)


def test_a_stream_up_to_done_is_completed() -> None:
    assert bucket(stream_200(done=True, ttft=0.1)) == ("completed", "")


def test_an_error_event_is_a_clean_failure_even_if_the_stream_then_breaks() -> None:
    record = stream_200(error="error event: executor lost", error_event={"message": "x"})
    assert bucket(record) == ("failed_clean", "error event: executor lost")


def test_accepted_then_cut_is_lost() -> None:
    cut = stream_200(error="RemoteProtocolError: peer closed")
    assert bucket(cut) == ("lost", "RemoteProtocolError: peer closed")
    assert bucket(stream_200(error="stream ended without [DONE]"))[0] == "lost"


def test_a_refused_connection_is_clean() -> None:
    exc = httpx.ConnectError("connection refused")
    record = StreamRecord(start=0.0, exception=exc, error="ConnectError: connection refused")
    kind, detail = bucket(record)
    assert kind == "failed_clean" and detail.startswith("refused")


@pytest.mark.parametrize(
    ("status", "retry_after", "body", "expected"),
    [
        (429, None, ERROR_BODY, "failed_clean"),  # an OpenAI error object
        (503, "1", "busy", "failed_clean"),  # Retry-After
        (502, None, "<html>Bad gateway</html>", "lost"),  # a bare status
    ],
)
def test_error_statuses(status: int, retry_after: str | None, body: str, expected: str) -> None:
    record = StreamRecord(start=0.0, retry_after=retry_after)
    record.fail_status(status, body)
    assert bucket(record)[0] == expected


def test_deadline_and_disconnect() -> None:
    assert bucket(stream_200(timed_out=True, error="no end within 30 s"))[0] == "hung"
    assert bucket(StreamRecord(start=0.0, timed_out=True))[0] == "hung"  # before headers
    assert bucket(stream_200(closed_early=True, ttft=0.1)) == ("disconnected", "")
