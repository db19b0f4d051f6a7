"""One OpenAI streaming response, read as server-sent events: what it delivered and when.

`StreamRecord.feed_line` takes the body a line at a time (without its line break) with the
time the line arrived, and keeps what the benchmarks report per request: the time to the
first text, every gap between text chunks, each choice's text and finish reason, the usage
chunk, an error event, and whether `data: [DONE]` came. It does no I/O, so every client
shares it: benchmarks.common.sse_client feeds it from httpx, loadtests/locustfile.py from
Locust's own client.

Framing follows the event-stream rules of the HTML standard: an event's `data:` lines
(one space after the colon is dropped) are joined by newlines and dispatched at the blank
line that ends the event; comments (`:`) and other fields are skipped; an event left
unterminated when the body ends is dropped.

A text chunk is an event with a non-empty `choices[i].text` (completions) or
`choices[i].delta.content` (chat). An error event is a JSON object with an `error` key:
`{"error": {"message": ...}}` as OpenAI, vLLM and Quire send it, or `transformers serve`'s
`{"error": "..."}`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

DONE = "[DONE]"


@dataclass(frozen=True)
class Usage:
    """The stream's usage chunk (`stream_options.include_usage`)."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None = None  # prompt_tokens_details.cached_tokens, when reported

    @classmethod
    def from_json(cls, usage: dict[str, Any]) -> Usage:
        details = usage.get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens")
        return cls(
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            cached_tokens=None if cached is None else int(cached),
        )


def error_message(error: Any) -> str:
    """The message of an OpenAI error object (or of a bare error string)."""
    if isinstance(error, dict):
        return str(error.get("message", error))
    return str(error)


@dataclass
class StreamRecord:
    """What one streaming request delivered; times are seconds on the `start` clock."""

    start: float  # when the request was sent (time.perf_counter())
    status: int = 0  # HTTP status; 0 when no response came
    executor: str = ""  # x-quire-executor: who served it
    retry_after: str | None = None  # the Retry-After header, if any
    body: str = ""  # the body of a non-200 response
    error: str = ""  # the first failure: status, error event, broken stream, deadline
    error_event: Any = None  # the `error` value of the first error event
    exception: Exception | None = None  # the transport error that ended the stream
    timed_out: bool = False  # the client's deadline passed before the stream ended
    closed_early: bool = False  # the client stopped reading on purpose (max_events)
    done: bool = False  # `data: [DONE]` arrived
    ttft: float | None = None  # send -> first text chunk
    itl: list[float] = field(default_factory=list)  # gaps between consecutive text chunks
    end: float | None = None  # when the stream ended (or failed)
    texts: dict[int, str] = field(default_factory=dict)  # choice index -> its text so far
    finish_reasons: dict[int, str] = field(default_factory=dict)  # choice index -> reason
    # choice index -> tokens its chunks' logprobs listed (requests that ask for logprobs):
    # completions' `logprobs.tokens`, chat's `logprobs.content`
    num_tokens: dict[int, int] = field(default_factory=dict)
    usage: Usage | None = None
    num_events: int = 0  # JSON events other than error events
    num_text_chunks: int = 0
    _data: list[str] = field(default_factory=list, repr=False)  # the pending event's lines
    _last_text_at: float | None = field(default=None, repr=False)

    def feed_line(self, line: str, now: float) -> bool:
        """One line of the body, arrived at `now`; False once nothing more is to be read."""
        if self.done:
            return False
        if not line:
            if not self._data:
                return True
            data, self._data = "\n".join(self._data), []
            return self._on_event(data, now)
        if line.startswith(":"):
            return True
        name, _, value = line.partition(":")
        if name == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)
        return True

    def _on_event(self, data: str, now: float) -> bool:
        if data == DONE:
            self.done = True
            return False
        try:
            chunk = json.loads(data)
        except ValueError:
            self.fail(f"malformed event: {data[:200]!r}")
            return False
        if not isinstance(chunk, dict):
            self.fail(f"malformed event: {data[:200]!r}")
            return False
        if "error" in chunk:
            if self.error_event is None:
                self.error_event = chunk["error"]
            self.fail(f"error event: {error_message(chunk['error'])}")
            return True  # the server ends the stream (Quire and vLLM with [DONE])
        self.num_events += 1
        if chunk.get("usage"):
            self.usage = Usage.from_json(chunk["usage"])
        has_text = False
        for choice in chunk.get("choices") or ():
            index = int(choice.get("index") or 0)
            text = choice.get("text")
            if text is None:
                text = (choice.get("delta") or {}).get("content")
            if text:
                self.texts[index] = self.texts.get(index, "") + text
                has_text = True
            if choice.get("finish_reason"):
                self.finish_reasons[index] = choice["finish_reason"]
            logprobs = choice.get("logprobs")
            if isinstance(logprobs, dict):
                listed = logprobs.get("tokens", logprobs.get("content")) or ()
                self.num_tokens[index] = self.num_tokens.get(index, 0) + len(listed)
        if has_text:
            if self._last_text_at is None:
                self.ttft = now - self.start
            else:
                self.itl.append(now - self._last_text_at)
            self._last_text_at = now
            self.num_text_chunks += 1
        return True

    def fail(self, error: str) -> None:
        """Record a failure; the first one is the one reported."""
        if not self.error:
            self.error = error

    def fail_status(self, status: int, body: str) -> None:
        """A non-200 response: its status, its body, and the error object's message."""
        self.status = status
        self.body = body
        message = body[:300]
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict) and "error" in parsed:
            message = error_message(parsed["error"])
        self.fail(f"HTTP {status}: {message}")

    def finish(self, now: float, expect_done: bool = True) -> None:
        """The body ended (or the client stopped) at `now`.

        A 200 stream that ends without `[DONE]`, no error and no early close has lost its
        end, unless the server never sends one (`expect_done=False`: `transformers serve`).
        """
        self.end = now
        cut_short = not self.done and not self.closed_early
        if expect_done and self.status == 200 and cut_short:
            self.fail("stream ended without [DONE]")

    @property
    def text(self) -> str:
        """The first choice's text."""
        return self.texts.get(0, "")

    @property
    def finish_reason(self) -> str | None:
        """The first choice's finish reason."""
        return self.finish_reasons.get(0)

    @property
    def failure(self) -> str:
        """Why the request did not deliver text; '' when it did."""
        if self.error:
            return self.error
        if self.status != 200:
            return f"HTTP {self.status}"
        if self.ttft is None:
            return "no text in the stream"
        return ""

    @property
    def ok(self) -> bool:
        """A 200 stream with text and no failure."""
        return not self.failure

    @property
    def e2e(self) -> float | None:
        """Send -> end of the stream."""
        return None if self.end is None else self.end - self.start

    @property
    def output_tokens(self) -> int:
        """The usage chunk's completion tokens, else one per text chunk."""
        if self.usage is not None and self.usage.completion_tokens:
            return self.usage.completion_tokens
        return self.num_text_chunks

    @property
    def prompt_tokens(self) -> int:
        return self.usage.prompt_tokens if self.usage is not None else 0

    @property
    def cached_tokens(self) -> int | None:
        return self.usage.cached_tokens if self.usage is not None else None

    @property
    def tpot(self) -> float | None:
        """(e2e - ttft) / (output tokens - 1), for a successful request of two tokens or more."""
        e2e = self.e2e
        if not self.ok or self.ttft is None or e2e is None or self.output_tokens < 2:
            return None
        return (e2e - self.ttft) / (self.output_tokens - 1)
