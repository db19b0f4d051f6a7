"""Tool calling on chat: the request's tools, the grammar the output follows, its parser.

`plan_tool_calls` turns `tools` + `tool_choice` into what the output is held to:

- A named function (`tool_choice: {"type": "function", "function": {"name": N}}`) generates
  N's arguments object under its `parameters` schema; `"required"` generates a JSON array of
  one or more `{"name": <const>, "arguments": <that tool's parameters>}` objects (anyOf over
  the tools; one when `parallel_tool_calls` is false). Both are JSON-schema structured
  outputs, and `ToolCallParser` reads that text, whole or as it streams, into `tool_calls`.
- `"auto"` lets the model choose between words and calls. It needs a chat template that
  renders the tools and the call history (`services.router.tool_templates`: the model's own
  when it renders tools, else the router's ChatML tool template for a ChatML model) and the
  call format that template asks for (router setting `tool_call_parser`, a registry in
  `services.router.tool_parsers`; `hermes`: `<tool_call>{"name", "arguments"}</tool_call>`).
  The output is decoded under the format's xgrammar structural tag: free text until the
  trigger `<tool_call>`, then a call of one of the tools with arguments under its schema,
  then free text again, so every call's arguments parse and validate whatever the model.
  With a tool template, "auto" is the default when `tools` are given (OpenAI's); without
  one, "auto" is a 400 naming tool_choice and the default stays "none".
- `"none"` ignores the tools (they still reach the template).

finish_reason is "tool_calls" when the output stopped with at least one whole call.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from quire.structured_params import StructuredOutputParams
from services.router.errors import bad_request

if TYPE_CHECKING:
    from services.router.tool_parsers import ToolCallFormat


class FunctionDefinition(BaseModel):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema; None = no arguments
    strict: bool | None = None


class Tool(BaseModel):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice
NO_ARGUMENTS = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass(frozen=True)
class ForcedCall:
    """A tool call the output is constrained to: one named function, or any of the tools."""

    name: str | None  # the function of a named tool_choice; None for "required"
    spec: StructuredOutputParams


@dataclass(frozen=True)
class AutoCalls:
    """`tool_choice: "auto"`: words or calls, the calls in `format` and held to its grammar."""

    format: ToolCallFormat
    spec: StructuredOutputParams


def plan_tool_calls(
    tools: list[Tool] | None,
    choice: ToolChoice | None,
    parallel_tool_calls: bool | None,
    auto_format: ToolCallFormat | None = None,
) -> ForcedCall | AutoCalls | None:
    """What `tools` and `tool_choice` ask of the output; a 400 naming the field if invalid.

    `auto_format` is the call format of the served tool template; None when there is no tool
    template, so "auto" cannot be served.
    """
    if not tools:
        if choice is not None and choice != "none":
            raise bad_request("tool_choice needs tools", "tool_choice")
        return None
    names = [t.function.name for t in tools]
    if len(set(names)) != len(names):
        raise bad_request("tool function names must be unique", "tools")
    if choice is None:
        choice = "auto" if auto_format is not None else "none"
    if choice == "none":
        return None
    if choice == "auto":
        if auto_format is None:
            raise bad_request(
                '"auto" tool choice needs a chat template that renders tools, and this router '
                'has none for its model (setting tool_chat_template); use "required", a named '
                'function or "none"',
                "tool_choice",
            )
        tag = auto_format.structural_tag(tools, parallel_tool_calls is not False)
        return AutoCalls(auto_format, StructuredOutputParams(structural_tag=tag))
    schemas = {t.function.name: t.function.parameters or NO_ARGUMENTS for t in tools}
    if isinstance(choice, NamedToolChoice):
        name = choice.function.name
        if name not in schemas:
            raise bad_request(f"tool_choice names {name!r}, which is not in tools", "tool_choice")
        return ForcedCall(name, StructuredOutputParams(json=schemas[name]))
    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": name}, "arguments": schema},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for name, schema in schemas.items()
    ]
    array: dict[str, Any] = {"type": "array", "items": {"anyOf": calls}, "minItems": 1}
    if parallel_tool_calls is False:
        array["maxItems"] = 1
    return ForcedCall(None, StructuredOutputParams(json=array))


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class CallDelta:
    """What one tool call has new: its id and name the first time, then argument text."""

    index: int
    arguments: str
    id: str | None = None
    name: str | None = None


_CALL_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*')
_CALL_TAIL = re.compile(r"\s*\}\s*(,|\])")


@dataclass
class ToolCallParser:
    """Turns a forced call's generated text into tool calls, incrementally.

    Feed it the choice's text as it grows; each `feed` returns the calls' new parts. Argument
    text is passed through as the model wrote it (OpenAI's `arguments` is a JSON string).
    """

    name: str | None  # the named function, or None for the array of "required"
    text: str = ""
    calls: list[CallDelta] = field(default_factory=list)  # whole calls so far
    _pos: int = 0  # where the next unread call starts ("required")
    _open: int | None = None  # the index of a call whose arguments are still streaming
    _args_start: int = 0

    def feed(self, new_text: str) -> list[CallDelta]:
        self.text += new_text
        if self.name is not None:
            if not self.calls:
                self.calls.append(CallDelta(0, "", new_call_id(), self.name))
                first = CallDelta(0, self.text, self.calls[0].id, self.name)
                self.calls[0].arguments = self.text
                return [first]
            self.calls[0].arguments += new_text
            return [CallDelta(0, new_text)] if new_text else []
        return self._feed_array()

    def _feed_array(self) -> list[CallDelta]:
        out: list[CallDelta] = []
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
                out.append(CallDelta(call.index, "", call.id, name))
            call = self.calls[self._open]
            while (
                not call.arguments and self.text[self._args_start : self._args_start + 1].isspace()
            ):
                self._args_start += 1  # the head matched before the space after its colon
            end = json_value_end(self.text, self._args_start)
            stop = len(self.text) if end is None else end
            new = self.text[self._args_start + len(call.arguments) : stop]
            if new:
                call.arguments += new
                out.append(CallDelta(call.index, new))
            if end is None:
                return out
            tail = _CALL_TAIL.match(self.text, end)
            if tail is None:
                return out
            self._open, self._pos = None, tail.end()
            if tail.group(1) == "]":
                return out

    def is_complete(self) -> bool:
        """Whether the text so far holds every call in full (the grammar finished)."""
        if self.name is not None:
            try:
                json.loads(self.text)
            except ValueError:
                return False
            return True
        return self._open is None and bool(self.calls) and self.text.rstrip().endswith("]")


def json_value_end(text: str, start: int) -> int | None:
    """The index just past the JSON value starting at `start`, or None if it is unfinished."""
    depth, in_string, escaped = 0, False, False
    i = start
    while i < len(text):
        c = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
                if depth == 0:
                    return i + 1
        elif c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            if depth == 0:  # a scalar value ends at its container's close
                return i if i > start else None
            depth -= 1
            if depth == 0:
                return i + 1
        elif depth == 0 and c in ", \n\t":
            return i if i > start else None
        i += 1
    return None
