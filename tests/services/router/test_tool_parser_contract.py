"""The contract every tool-call format keeps (`services.router.tool_parsers.base`): an output
that stopped with its calls whole reads the same streamed, at every split, as read whole.

Every registered format (the names `tool_call_parser` accepts) needs sample outputs here;
the forced-call parsers, which are not registered, are held to the same contract.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from services.router.tool_parsers.base import CallDelta, ExtractedToolCalls, ToolParser
from services.router.tool_parsers.forced import NamedCallParser, RequiredCallsParser
from services.router.tool_parsers.registry import tool_parser_class, tool_parser_names
from services.router.tool_schemas import Tool

WEATHER = Tool.model_validate(
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
)
TIME = Tool.model_validate({"type": "function", "function": {"name": "get_time"}})
TOOLS = [WEATHER, TIME]

HERMES_WEATHER = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)
HERMES_TIME = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
# Outputs of each registered format, every call in them whole.
SAMPLES: dict[str, list[str]] = {
    "hermes": [
        "Just words.",
        "a < b and <tool but not <tool_cal",
        HERMES_WEATHER,
        "Let me check.\n" + HERMES_WEATHER + "\n",
        "First " + HERMES_WEATHER + "\n" + HERMES_TIME + " and done.",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "a}</tool_call>\\"{"}}\n'
        "</tool_call>",
    ],
}
# The forced-call parsers: (a parser for one choice, outputs their grammars allow).
FORCED: dict[str, tuple[Callable[[], ToolParser], list[str]]] = {
    "named": (
        lambda: NamedCallParser([WEATHER]),
        ['{"city": "Paris"}', '{"city": "a}\\"{"}', "{}"],
    ),
    "required": (
        lambda: RequiredCallsParser(TOOLS),
        [
            '[{"name": "get_weather", "arguments": {"city": "Paris"}}]',
            '[{"name": "get_weather", "arguments": {"city": "]}"}}, '
            '{"name": "get_time", "arguments": {}}]',
        ],
    ),
}


def read_streamed(parser: ToolParser, text: str, step: int) -> ExtractedToolCalls:
    """The deltas of `text` fed `step` characters at a time, then `finish`, concatenated."""
    deltas = [parser.feed(text[i : i + step]) for i in range(0, len(text), step)]
    deltas.append(parser.finish(True))
    content = "".join(d.content for d in deltas)
    calls: dict[int, list[str]] = {}
    for delta in deltas:
        for call in delta.calls:
            if call.id is not None:
                assert call.index not in calls, f"call {call.index} began twice"
                assert call.id.startswith("call_") and call.name, call
                calls[call.index] = [call.id, call.name, ""]
            assert call.index in calls, f"call {call.index} has parts before its id and name"
            calls[call.index][2] += call.arguments
    assert list(calls) == list(range(len(calls)))  # indices from 0, in order
    return ExtractedToolCalls(
        content,
        [CallDelta(i, arguments, call_id, name) for i, (call_id, name, arguments) in calls.items()],
    )


def assert_contract(new_parser: Callable[[], ToolParser], text: str) -> ExtractedToolCalls:
    """Streamed at every split equals whole; the whole reading, for further checks."""
    whole = new_parser().extract(text)
    assert len({c.id for c in whole.calls}) == len(whole.calls)
    expected = (whole.content, [(c.index, c.name, c.arguments) for c in whole.calls])
    for step in range(1, len(text) + 1):
        parser = new_parser()
        streamed = read_streamed(parser, text, step)
        got = (streamed.content, [(c.index, c.name, c.arguments) for c in streamed.calls])
        assert got == expected, step
        after = parser.extracted()  # the streamed parser reads the same whole reply too
        assert (after.content, [(c.index, c.name, c.arguments) for c in after.calls]) == expected
    return whole


def test_every_registered_format_has_samples() -> None:
    missing = set(tool_parser_names()) - set(SAMPLES)
    assert not missing, f"add sample outputs of {sorted(missing)} to SAMPLES"


@pytest.mark.parametrize(
    ("name", "text"), [(name, text) for name in tool_parser_names() for text in SAMPLES[name]]
)
def test_registered_formats_stream_what_they_extract(name: str, text: str) -> None:
    parser = tool_parser_class(name)
    assert_contract(lambda: parser(TOOLS), text)


@pytest.mark.parametrize(
    ("name", "text"), [(name, text) for name, (_, texts) in FORCED.items() for text in texts]
)
def test_forced_calls_stream_what_they_extract(name: str, text: str) -> None:
    new_parser, _ = FORCED[name]
    whole = assert_contract(new_parser, text)
    assert whole.content == "" and whole.tools_called


@pytest.mark.parametrize("name", tool_parser_names())
def test_every_format_has_a_grammar_for_the_tools(name: str) -> None:
    from services.router.structured_fields import check_spec

    parser = tool_parser_class(name)
    for parallel in (True, False):
        check_spec(parser.grammar(TOOLS, parallel), "tools")  # xgrammar parses it
