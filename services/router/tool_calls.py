"""Tool calling on chat: what the request's `tools` and `tool_choice` hold the output to.

`plan_tool_calls` picks the call format (a `services.router.tool_parsers` parser) and the
grammar it decodes under; every choice then gets its own parser, through one interface:

- A named function (`tool_choice: {"type": "function", "function": {"name": N}}`) or
  `"required"` are forced calls: JSON-schema structured outputs read back by
  `tool_parsers.forced` (N's arguments object; an array of one or more calls, one when
  `parallel_tool_calls` is false).
- `"auto"` lets the model choose between words and calls. It needs a chat template that
  renders the tools and the call history (`services.router.tool_templates`: the model's own
  when it renders tools, else the router's ChatML tool template for a ChatML model) and the
  call format that template asks for (router setting `tool_call_parser`, a name in
  `services.router.tool_parsers.registry`; `hermes`: `<tool_call>{"name", "arguments"}
  </tool_call>`). The output decodes under that format's grammar, so every call it makes
  names one of the tools and its arguments parse and validate, whatever the model. With a
  tool template, "auto" is the default when `tools` are given (OpenAI's); without one,
  "auto" is a 400 naming tool_choice and the default stays "none".
- `"none"` ignores the tools (they still reach the template).

finish_reason is "tool_calls" when the output stopped with at least one whole call.
"""

from __future__ import annotations

from dataclasses import dataclass

from quire.structured_params import StructuredOutputParams
from services.router.errors import bad_request
from services.router.tool_parsers.base import ToolParser
from services.router.tool_parsers.forced import NamedCallParser, RequiredCallsParser
from services.router.tool_schemas import NamedToolChoice, Tool, ToolChoice


@dataclass(frozen=True)
class ToolCallPlan:
    """What the output is held to and who reads it back: a format, its tools, its grammar."""

    parser: type[ToolParser]
    tools: list[Tool]  # the tools the calls may name (a named tool_choice: that one)
    spec: StructuredOutputParams  # the format's grammar for these tools

    def new_parser(self) -> ToolParser:
        """A parser for one choice's output."""
        return self.parser(self.tools)


def plan_tool_calls(
    tools: list[Tool] | None,
    choice: ToolChoice | None,
    parallel_tool_calls: bool | None,
    auto_parser: type[ToolParser] | None = None,
) -> ToolCallPlan | None:
    """What `tools` and `tool_choice` ask of the output; a 400 naming the field if invalid.

    `auto_parser` is the call format of the served tool template; None when there is no
    tool template, so "auto" cannot be served.
    """
    if not tools:
        if choice is not None and choice != "none":
            raise bad_request("tool_choice needs tools", "tool_choice")
        return None
    names = [t.function.name for t in tools]
    if len(set(names)) != len(names):
        raise bad_request("tool function names must be unique", "tools")
    if choice is None:
        choice = "auto" if auto_parser is not None else "none"
    if choice == "none":
        return None
    parser: type[ToolParser]
    if choice == "auto":
        if auto_parser is None:
            raise bad_request(
                '"auto" tool choice needs a chat template that renders tools, and this router '
                'has none for its model (setting tool_chat_template); use "required", a named '
                'function or "none"',
                "tool_choice",
            )
        parser = auto_parser
    elif isinstance(choice, NamedToolChoice):
        name = choice.function.name
        if name not in names:
            raise bad_request(f"tool_choice names {name!r}, which is not in tools", "tool_choice")
        parser, tools = NamedCallParser, [tools[names.index(name)]]
    else:
        parser = RequiredCallsParser
    return ToolCallPlan(parser, tools, parser.grammar(tools, parallel_tool_calls is not False))
