"""Forced calls: `tool_choice` names a function, or is "required". Not registered: whatever
the model's own call format, the router asks for JSON and reads it back.

- A named function N: the output is N's arguments object, generated under its `parameters`
  schema; it is one call of N.
- "required": the output is a JSON array of one or more
  `{"name": <const>, "arguments": <that tool's parameters>}` objects (anyOf over the tools;
  at most one unless parallel).

Both grammars are JSON-schema structured outputs; argument text streams as it is generated.
A forced output is calls only if it stopped with its grammar complete; one cut short by a
limit is returned whole as content, with no calls.
"""

from __future__ import annotations

import json
import re
from abc import abstractmethod
from collections.abc import Sequence
from typing import Any

from quire.structured_params import StructuredOutputParams
from services.router.tool_parsers.base import (
    CallDelta,
    ExtractedToolCalls,
    ParsedDelta,
    ToolParser,
    new_call_id,
)
from services.router.tool_parsers.json_text import stream_arguments
from services.router.tool_schemas import Tool

_CALL_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*')
_CALL_TAIL = re.compile(r"\s*\}\s*(,|\])")


class _ForcedParser(ToolParser):
    """What both forced formats share: the text, its calls, and the cut-short rule."""

    def __init__(self, tools: Sequence[Tool] = ()) -> None:
        super().__init__(tools)
        self.text = ""
        self.calls: list[CallDelta] = []  # the calls begun so far, whole argument text so far
        self._cut_short = False  # the output ended at a limit, not by its grammar

    @abstractmethod
    def is_complete(self) -> bool:
        """Whether the text so far holds every call in full (the grammar finished)."""

    def finish(self, stopped: bool = True) -> ParsedDelta:
        self._cut_short = not stopped
        return ParsedDelta()

    def extracted(self) -> ExtractedToolCalls:
        if self._cut_short or not self.is_complete():
            return ExtractedToolCalls(self.text, [])
        return ExtractedToolCalls("", self.calls)


class NamedCallParser(_ForcedParser):
    """`tool_choice: {"type": "function", "function": {"name": N}}`: the text is N's arguments."""

    def __init__(self, tools: Sequence[Tool] = ()) -> None:
        super().__init__(tools)
        if len(self.tools) != 1:
            raise ValueError(f"a named tool_choice calls one tool, not {len(self.tools)}")
        self.name = self.tools[0].function.name

    @classmethod
    def grammar(cls, tools: list[Tool], parallel: bool) -> StructuredOutputParams:
        (tool,) = tools
        return StructuredOutputParams(json=tool.function.arguments_schema)

    def feed(self, new_text: str) -> ParsedDelta:
        self.text += new_text
        if not self.calls:
            call = CallDelta(0, self.text, new_call_id(), self.name)
            self.calls.append(call)
            return ParsedDelta(calls=[CallDelta(0, self.text, call.id, self.name)])
        self.calls[0].arguments += new_text
        return ParsedDelta(calls=[CallDelta(0, new_text)] if new_text else [])

    def is_complete(self) -> bool:
        try:
            json.loads(self.text)
        except ValueError:
            return False
        return True


class RequiredCallsParser(_ForcedParser):
    """`tool_choice: "required"`: the text is a JSON array of `{"name", "arguments"}` calls."""

    def __init__(self, tools: Sequence[Tool] = ()) -> None:
        super().__init__(tools)
        self._pos = 0  # where the next unread call starts
        self._open: int | None = None  # the index of a call whose arguments still stream
        self._args_start = 0

    @classmethod
    def grammar(cls, tools: list[Tool], parallel: bool) -> StructuredOutputParams:
        calls = [
            {
                "type": "object",
                "properties": {
                    "name": {"const": t.function.name},
                    "arguments": t.function.arguments_schema,
                },
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for t in tools
        ]
        array: dict[str, Any] = {"type": "array", "items": {"anyOf": calls}, "minItems": 1}
        if not parallel:
            array["maxItems"] = 1
        return StructuredOutputParams(json=array)

    def feed(self, new_text: str) -> ParsedDelta:
        self.text += new_text
        out = ParsedDelta()
        while True:
            if self._open is None:
                start = self._pos
                if start == 0:
                    if not self.text.lstrip().startswith("["):
                        return out
                    start = self.text.index("[") + 1
                head = _CALL_HEAD.match(self.text, start)
                if head is None:
                    return out
                name = json.loads(head.group(1))
                call = CallDelta(len(self.calls), "", new_call_id(), name)
                self.calls.append(call)
                self._open, self._args_start = call.index, head.end()
                out.calls.append(CallDelta(call.index, "", call.id, name))
            call = self.calls[self._open]
            # (the head matched before any space after its colon, which this skips)
            self._args_start, end = stream_arguments(self.text, self._args_start, call, out)
            if end is None:
                return out
            tail = _CALL_TAIL.match(self.text, end)
            if tail is None:
                return out
            self._open, self._pos = None, tail.end()
            if tail.group(1) == "]":
                return out

    def is_complete(self) -> bool:
        return self._open is None and bool(self.calls) and self.text.rstrip().endswith("]")
