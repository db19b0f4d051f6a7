"""StreamRecord: event framing, text and timing per chunk, usage, error events, the end."""

from __future__ import annotations

import json
from typing import Any

import pytest

from benchmarks.common.sse import StreamRecord, Usage


def event(payload: dict[str, Any]) -> list[str]:
    return [f"data: {json.dumps(payload)}", ""]


def completion(text: str, index: int = 0, finish: str | None = None) -> list[str]:
    return event({"choices": [{"index": index, "text": text, "finish_reason": finish}]})


def chat(delta: dict[str, Any], finish: str | None = None) -> list[str]:
    return event({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


USAGE = {
    "prompt_tokens": 12,
    "completion_tokens": 3,
    "prompt_tokens_details": {"cached_tokens": 8},
}


def feed(record: StreamRecord, lines: list[str], times: list[float] | None = None) -> None:
    """Each line at its time (default: line i at 1.0 + i)."""
    for i, line in enumerate(lines):
        record.feed_line(line, times[i] if times else 1.0 + i)


def test_completion_stream_times_every_text_chunk() -> None:
    record = StreamRecord(start=0.5, status=200)
    lines = [
        *completion("Hel"),  # lines 0-1: dispatched at the blank line, t=2
        *completion("lo"),  # t=4
        *completion(""),  # no text: neither timed nor counted
        *completion(" you", finish="length"),  # t=8
        *event({"choices": [], "usage": USAGE}),
        "data: [DONE]",
        "",
    ]
    feed(record, lines, times=[float(i + 1) for i in range(len(lines))])
    record.finish(20.5)
    assert record.done and record.ok and record.failure == ""
    assert record.text == "Hello you"
    assert record.finish_reason == "length"
    assert record.ttft == pytest.approx(1.5)
    assert record.itl == pytest.approx([2.0, 4.0])
    assert record.num_text_chunks == 3 and record.num_events == 5
    assert record.usage == Usage(prompt_tokens=12, completion_tokens=3, cached_tokens=8)
    assert (record.prompt_tokens, record.output_tokens, record.cached_tokens) == (12, 3, 8)
    assert record.e2e == pytest.approx(20.0)
    assert record.tpot == pytest.approx((20.0 - 1.5) / 2)


def test_chat_deltas_count_content_not_the_role() -> None:
    record = StreamRecord(start=0.0, status=200)
    feed(
        record,
        [
            *chat({"role": "assistant"}),  # t=2: no content yet
            *chat({"content": "Hi"}),  # t=4: the first text
            *chat({"content": " there"}),  # t=6
            *chat({}, finish="stop"),
            "data: [DONE]",
            "",
        ],
    )
    record.finish(10.0)
    assert record.ok
    assert record.text == "Hi there" and record.finish_reason == "stop"
    assert record.ttft == 4.0 and record.itl == [2.0]
    assert record.usage is None and record.cached_tokens is None
    assert record.output_tokens == 2  # no usage chunk: one per text chunk


def test_choices_are_kept_apart() -> None:
    record = StreamRecord(start=0.0)
    feed(record, [*completion("a", 0), *completion("x", 1), *completion("b", 0, "stop")])
    feed(record, [*completion("y", 1, "length"), "data: [DONE]", ""])
    assert record.texts == {0: "ab", 1: "xy"}
    assert record.finish_reasons == {0: "stop", 1: "length"}
    assert record.num_text_chunks == 4


def test_framing_follows_the_event_stream_rules() -> None:
    record = StreamRecord(start=0.0)
    feed(
        record,
        [
            ": a comment, then fields other than data",
            "event: message",
            "id: 7",
            'data:{"choices": [{"index": 0,',  # no space after the colon
            'data:  "text": "a"}]}',  # one space dropped, the rest is JSON's
            "",
            "",  # a second blank line dispatches nothing
            "data: [DONE]",
            "",
        ],
    )
    assert record.done and record.text == "a" and record.num_events == 1


def test_an_unterminated_event_is_dropped_and_done_is_missing() -> None:
    record = StreamRecord(start=0.0, status=200)
    feed(record, [*completion("a"), "data: [DONE]"])  # no blank line after [DONE]
    record.finish(5.0)
    assert not record.done
    assert record.error == "stream ended without [DONE]"
    assert not record.ok


def test_a_server_without_done_can_be_expected() -> None:
    record = StreamRecord(start=0.0, status=200)
    feed(record, completion("a"))
    record.finish(5.0, expect_done=False)
    assert record.ok


@pytest.mark.parametrize(
    ("error", "message"),
    [
        ({"message": "executor lost", "type": "server_error", "code": 503}, "executor lost"),
        ("out of memory", "out of memory"),  # transformers serve's bare string
    ],
)
def test_error_event_mid_stream(error: object, message: str) -> None:
    record = StreamRecord(start=0.0, status=200)
    feed(record, [*completion("a"), *event({"error": error}), "data: [DONE]", ""])
    record.finish(5.0)
    assert record.done  # the server still ends the stream
    assert record.error_event == error
    assert record.error == f"error event: {message}"
    assert record.failure == record.error and not record.ok
    assert record.text == "a" and record.num_events == 1
    assert record.tpot is None


def test_a_malformed_event_stops_the_read() -> None:
    record = StreamRecord(start=0.0, status=200)
    assert record.feed_line("data: {not json", 1.0)
    assert not record.feed_line("", 1.0)
    assert record.error.startswith("malformed event")


def test_nothing_is_read_after_done() -> None:
    record = StreamRecord(start=0.0, status=200)
    feed(record, ["data: [DONE]", ""])
    assert not record.feed_line("data: {}", 9.0)
    assert record.num_events == 0


def test_a_stream_without_text_is_not_ok() -> None:
    record = StreamRecord(start=0.0, status=200)
    feed(record, [*event({"choices": [], "usage": USAGE}), "data: [DONE]", ""])
    record.finish(1.0)
    assert record.error == "" and record.failure == "no text in the stream"


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ('{"error": {"message": "queue full", "code": 429}}', "HTTP 429: queue full"),
        ("<html>Bad gateway</html>", "HTTP 429: <html>Bad gateway</html>"),
    ],
)
def test_a_refusal_keeps_its_status_body_and_message(body: str, error: str) -> None:
    record = StreamRecord(start=0.0)
    record.fail_status(429, body)
    record.finish(1.0)
    assert record.status == 429 and record.body == body
    assert record.error == error and not record.ok


def test_tokens_listed_by_logprobs_are_counted_per_choice() -> None:
    record = StreamRecord(start=0.0, status=200)
    lines = [
        *event({"choices": [{"index": 0, "text": "ab", "logprobs": {"tokens": ["a", "b"]}}]}),
        *event({"choices": [{"index": 1, "text": "c", "logprobs": {"tokens": ["c"]}}]}),
        *event({"choices": [{"index": 0, "text": "", "logprobs": {"tokens": ["<eos>"]}}]}),
        *event(
            {"choices": [{"index": 0, "delta": {"content": "d"}, "logprobs": {"content": [{}]}}]}
        ),
        *completion("e"),  # no logprobs asked: nothing to count
        "data: [DONE]",
    ]
    feed(record, lines)
    assert record.num_tokens == {0: 4, 1: 1}
