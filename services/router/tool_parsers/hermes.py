"""`hermes`: Hermes / Qwen2.5 tool calls, what the shipped ChatML tool template asks for.

    some text<tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

The grammar (`hermes_structural_tag`) is an xgrammar structural tag: free text until the
trigger `<tool_call>`, then a call of one of the tools with arguments under that tool's
`parameters` schema, then free text again (so the arguments always parse, whatever the
model). Text outside the tags is content, except the whitespace that separates a call from
what comes before it, or from the end of the output (the format's, not the model's words).
While streaming, text that could still become `<tool_call>` is held back, so no partial tag
ever reaches a client as content; arguments stream as they are generated.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from quire.structured_params import StructuredOutputParams
from services.router.tool_parsers.base import (
    CallDelta,
    ExtractedToolCalls,
    ParsedDelta,
    ToolParser,
    new_call_id,
    register_tool_parser,
)
from services.router.tool_parsers.json_text import stream_arguments
from services.router.tool_schemas import Tool

HERMES_OPEN = "<tool_call>"
HERMES_CLOSE = "</tool_call>"
# The grammar writes exactly this around a call (the template's example spells it so too).
_HERMES_BEGIN = '<tool_call>\n{"name": "'
_HERMES_ARGUMENTS = '", "arguments": '
_HERMES_END = "}\n</tool_call>"
MAX_ARGUMENT_WHITESPACE = 2  # consecutive whitespace the grammar allows inside arguments

_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:')
_TAIL = re.compile(r"\s*\}\s*</tool_call>")


def hermes_structural_tag(tools: list[Tool], parallel: bool) -> dict[str, Any]:
    """Free text until `<tool_call>`, then one of the tools' calls, then free text again."""
    tags = [
        {
            "type": "tag",
            "begin": _HERMES_BEGIN + t.function.name + _HERMES_ARGUMENTS,
            "content": {
                "type": "json_schema",
                "json_schema": t.function.arguments_schema,
                "max_whitespace_cnt": MAX_ARGUMENT_WHITESPACE,
            },
            "end": _HERMES_END,
        }
        for t in tools
    ]
    return {
        "type": "structural_tag",
        "format": {
            "type": "triggered_tags",
            "triggers": [HERMES_OPEN],
            "tags": tags,
            "stop_after_first": not parallel,
        },
    }


def _held_prefix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


@register_tool_parser("hermes")
class HermesToolParser(ToolParser):
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` calls amid free text."""

    def __init__(self, tools: Sequence[Tool] = ()) -> None:
        super().__init__(tools)
        self.text = ""
        self.calls: list[CallDelta] = []  # the calls begun so far, whole argument text so far
        self.content = ""  # all the content emitted so far
        self._pos = 0  # text before this is consumed
        self._state = "text"  # text | head | arguments | tail
        self._held_space = ""  # content whitespace not yet released (a tag may follow it)
        self._call_start = 0  # where the open call's `<tool_call>` starts
        self._args_start = 0
        self._num_complete = 0

    @classmethod
    def grammar(cls, tools: list[Tool], parallel: bool) -> StructuredOutputParams:
        return StructuredOutputParams(structural_tag=hermes_structural_tag(tools, parallel))

    def feed(self, new_text: str) -> ParsedDelta:
        self.text += new_text
        out = ParsedDelta()
        while self._step(out):
            pass
        self.content += out.content
        return out

    def finish(self, stopped: bool = True) -> ParsedDelta:
        out = ParsedDelta()
        if self._state == "text":
            rest = self._held_space + self.text[self._pos :]
            # Whitespace that ends an output with calls separates them from the end.
            out.content = rest.rstrip() if self.calls else rest
            self._held_space, self._pos = "", len(self.text)
        self.content += out.content
        return out

    def extracted(self) -> ExtractedToolCalls:
        return ExtractedToolCalls(self.content + self.unfinished_text(), self.complete_calls())

    def complete_calls(self) -> list[CallDelta]:
        """The calls whose closing tag was written."""
        return self.calls[: self._num_complete]

    def unfinished_text(self) -> str:
        """The raw text of a call that was begun but not closed ("" if none)."""
        return "" if self._state == "text" else self.text[self._call_start :]

    def _step(self, out: ParsedDelta) -> bool:
        """Advance through one state; False when more text is needed."""
        if self._state == "text":
            return self._step_text(out)
        if self._state == "head":
            head = _HEAD.match(self.text, self._pos)
            if head is None:
                return False
            call = CallDelta(len(self.calls), "", new_call_id(), json.loads(head.group(1)))
            self.calls.append(call)
            out.calls.append(CallDelta(call.index, "", call.id, call.name))
            self._state, self._args_start = "arguments", head.end()
            return True
        if self._state == "arguments":
            call = self.calls[-1]
            self._args_start, end = stream_arguments(self.text, self._args_start, call, out)
            if end is None:
                return False
            self._state, self._pos = "tail", end
            return True
        tail = _TAIL.match(self.text, self._pos)
        if tail is None:
            return False
        self._num_complete += 1
        self._state, self._pos = "text", tail.end()
        return True

    def _step_text(self, out: ParsedDelta) -> bool:
        rest = self.text[self._pos :]
        found = rest.find(HERMES_OPEN)
        if found >= 0:
            out.content += self._release(rest[:found])
            self._held_space = ""  # the whitespace before a call is the format's
            self._call_start = self._pos + found
            self._pos, self._state = self._call_start + len(HERMES_OPEN), "head"
            return True
        keep = _held_prefix(rest, HERMES_OPEN)
        out.content += self._release(rest[: len(rest) - keep])
        self._pos += len(rest) - keep
        return False

    def _release(self, text: str) -> str:
        """Content to emit now: held whitespace plus `text`, its trailing whitespace held."""
        body = text.rstrip()
        if not body:
            self._held_space += text
            return ""
        released = self._held_space + body
        self._held_space = text[len(body) :]
        return released
