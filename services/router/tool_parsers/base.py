"""The interface every tool-call format implements, and how a format registers its name.

A `ToolParser` subclass is one way calls are written in a model's output. Its class method
`grammar(tools, parallel)` is the structured output the model decodes under, so every call
it writes names one of the tools and its arguments validate against that tool's schema. An
instance reads one choice's output (one per choice) into content, the model's words, and
tool calls:

- streamed: `feed(new_text)` as the text grows, then `finish(stopped)` once it ends; each
  returns a `ParsedDelta`: the content and the calls' parts it makes certain (a call's id
  and name the first time, then pieces of its argument text). Text that may yet turn out to
  be part of a call is held back until it is known not to be.
- whole: `extract(text, stopped)`, or `extracted()` after streaming: the content and the
  calls written in full (`ExtractedToolCalls`); the raw text of a call that was begun but
  not finished is content.

The contract every format keeps: for an output that stopped with every call it began
written in full, the deltas of `feed` and `finish`, concatenated, are what `extract`
returns for the same text, however the text was split.

Formats for `tool_choice: "auto"` register under the name the router setting
`tool_call_parser` selects:

    @register_tool_parser("hermes")
    class HermesToolParser(ToolParser): ...

`services.router.tool_parsers.registry` imports every module of this package before it
looks a name up, so a new format is one new module there and nothing else. Forced calls
(`tool_choice` "required" or a named function) implement the same interface, unregistered
(`forced`): their format is the JSON the router's grammar asks for, whatever the model's.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from quire.structured_params import StructuredOutputParams
from services.router.tool_schemas import Tool


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class CallDelta:
    """What one tool call has new: its id and name the first time, then argument text.

    A whole call is one `CallDelta` holding all of it. Argument text is passed through as
    the model wrote it (OpenAI's `arguments` is a JSON string).
    """

    index: int  # the call's place among the choice's calls, from 0
    arguments: str
    id: str | None = None
    name: str | None = None


@dataclass
class ParsedDelta:
    """What one `feed` or `finish` made certain: new content text and the calls' new parts."""

    content: str = ""
    calls: list[CallDelta] = field(default_factory=list)


@dataclass(frozen=True)
class ExtractedToolCalls:
    """An output read whole (vLLM's `ExtractedToolCallInformation`)."""

    content: str  # the words, and the raw text of a call begun but not finished
    calls: list[CallDelta]  # the calls written in full, in order

    @property
    def tools_called(self) -> bool:
        return bool(self.calls)


class ToolParser(ABC):
    """Reads one choice's output, as it grows or whole, into content and tool calls."""

    def __init__(self, tools: Sequence[Tool] = ()) -> None:
        self.tools = list(tools)  # the tools its calls may name (a named tool_choice: that one)

    @classmethod
    @abstractmethod
    def grammar(cls, tools: list[Tool], parallel: bool) -> StructuredOutputParams:
        """The structured output the model decodes under: calls of `tools` only, written in
        this format, with arguments under each tool's schema; one call at most unless
        `parallel`."""

    @abstractmethod
    def feed(self, new_text: str) -> ParsedDelta:
        """Read the output's next piece; the content and call parts it makes certain."""

    @abstractmethod
    def finish(self, stopped: bool = True) -> ParsedDelta:
        """The output ended, `stopped` on its own (finish_reason "stop") or cut short by a
        limit: what was held back, released."""

    @abstractmethod
    def extracted(self) -> ExtractedToolCalls:
        """The output read so far as a whole reply: its content and its whole calls."""

    def extract(self, text: str, stopped: bool = True) -> ExtractedToolCalls:
        """Read a whole output at once (vLLM's `extract_tool_calls`)."""
        self.feed(text)
        self.finish(stopped)
        return self.extracted()


ParserT = TypeVar("ParserT", bound=type[ToolParser])

# tool_call_parser name -> format, filled by `register_tool_parser`; read it through
# `services.router.tool_parsers.registry`, which first imports every format module.
TOOL_PARSERS: dict[str, type[ToolParser]] = {}


def register_tool_parser(name: str) -> Callable[[ParserT], ParserT]:
    """Class decorator: `tool_call_parser = name` makes the class "auto"'s call format."""

    def register(cls: ParserT) -> ParserT:
        known = TOOL_PARSERS.get(name)
        if known is not None and known is not cls:
            raise ValueError(
                f"tool_call_parser {name!r} is already registered to "
                f"{known.__module__}.{known.__qualname__}"
            )
        TOOL_PARSERS[name] = cls
        return cls

    return register
