"""The Hermes tool-call parser: whole text and the same text streamed at every split give the
same content and calls, and no partial `<tool_call>` tag ever leaves as content."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from quire.structured_params import StructuredOutputParams, parse_grammar
from services.router.prompts import load_tokenizer
from services.router.tool_parsers.hermes import HermesToolParser, hermes_structural_tag
from services.router.tool_parsers.registry import tool_parser_class
from services.router.tool_schemas import Tool

WEATHER_CALL = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>'
)
TRICKY_CALL = '<tool_call>\n{"name": "search", "arguments": {"q": "a}</tool_call>\\"<tool_call>{"}}\n</tool_call>'

CASES = {
    "no calls": ("Just words, no calls.", "Just words, no calls.", []),
    "no calls, stray brackets": (
        "a < b and <tool but not <tool_cal",
        "a < b and <tool but not <tool_cal",
        [],
    ),
    "one call": (WEATHER_CALL, "", [("get_weather", {"city": "Paris", "days": 3})]),
    "text then call": (
        "Let me check.\n" + WEATHER_CALL + "\n",
        "Let me check.",
        [("get_weather", {"city": "Paris", "days": 3})],
    ),
    "several calls with text between": (
        "First " + WEATHER_CALL + "\n" + TRICKY_CALL + " and done.",
        "First and done.",
        [
            ("get_weather", {"city": "Paris", "days": 3}),
            ("search", {"q": 'a}</tool_call>"<tool_call>{'}),
        ],
    ),
    "whitespace only": ("  \n ", "  \n ", []),
}


def parse_whole(text: str) -> HermesToolParser:
    parser = HermesToolParser()
    parser.feed(text)
    parser.finish()
    return parser


def parse_streamed(
    text: str, step: int, final_content: str
) -> tuple[str, dict[int, tuple[str, str, str]]]:
    """(content, {index: (id, name, arguments)}) from the deltas of `text` fed `step` at a time.

    Content is never taken back: after every delta, what was sent is a prefix of the final
    content, so no piece of a tag (which the final content lacks) ever went out as content.
    """
    parser = HermesToolParser()
    content = ""
    calls: dict[int, tuple[str, str, str]] = {}
    pieces = [text[i : i + step] for i in range(0, len(text), step)]
    deltas = [parser.feed(piece) for piece in pieces] + [parser.finish()]
    for delta in deltas:
        content += delta.content
        assert final_content.startswith(content), (step, content)
        for call in delta.calls:
            if call.id is not None:
                assert call.index not in calls and call.name, call
                calls[call.index] = (call.id, call.name, "")
            call_id, name, arguments = calls[call.index]
            calls[call.index] = (call_id, name, arguments + call.arguments)
    return content, calls


@pytest.mark.parametrize("case", list(CASES))
def test_whole_and_streamed_at_every_split_agree(case: str) -> None:
    text, content, expected = CASES[case]
    whole = parse_whole(text)
    assert whole.content == content
    if expected:
        assert "tool_call" not in content
    got = [(c.name, json.loads(c.arguments)) for c in whole.complete_calls()]
    assert got == expected
    assert whole.unfinished_text() == ""
    assert len({c.id for c in whole.calls}) == len(whole.calls)
    assert all(c.id and c.id.startswith("call_") for c in whole.calls)
    for step in range(1, len(text) + 1):
        streamed_content, streamed = parse_streamed(text, step, content)
        assert streamed_content == content, step
        assert [(name, args) for _, name, args in streamed.values()] == [
            (c.name, c.arguments) for c in whole.complete_calls()
        ], step


def test_arguments_stream_as_they_are_generated() -> None:
    parser = HermesToolParser()
    head = '<tool_call>\n{"name": "get_weather", "arguments": '
    assert parser.feed(head[:5]).calls == []
    first = parser.feed(head[5:])
    assert [(c.name, c.arguments) for c in first.calls] == [("get_weather", "")]
    assert [c.arguments for c in parser.feed('{"city": "Pa').calls] == ['{"city": "Pa']
    assert [c.arguments for c in parser.feed('ris"}').calls] == ['ris"}']
    assert parser.complete_calls() == []  # no closing tag yet
    parser.feed("}\n</tool_call>")
    assert [c.arguments for c in parser.complete_calls()] == ['{"city": "Paris"}']


def test_held_back_tag_prefix_is_content_when_the_output_ends() -> None:
    parser = HermesToolParser()
    assert parser.feed("x <tool_").content == "x"  # " <tool_" could still become a tag
    assert parser.finish().content == " <tool_"
    assert parser.content == "x <tool_"


def test_a_call_cut_short_stays_unfinished() -> None:
    text = 'Sure.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa'
    parser = parse_whole(text)
    assert parser.content == "Sure."
    assert parser.complete_calls() == [] and len(parser.calls) == 1
    assert parser.unfinished_text() == text[len("Sure.") :]


def test_registry_has_hermes() -> None:
    fmt = tool_parser_class("hermes")
    assert fmt is HermesToolParser
    assert fmt() is not fmt()  # one parser per choice


# --- the grammar "auto" decodes under, on the default model's real tokenizer ---------------

SMOL = Path(__file__).resolve().parents[3] / "models" / "smollm2-135m-instruct"
TOOLS = [
    Tool.model_validate(
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                    "required": ["city", "days"],
                    "additionalProperties": False,
                },
            },
        }
    ),
    Tool.model_validate({"type": "function", "function": {"name": "get_time"}}),
]


@pytest.fixture(scope="module")
def smol_tokenizer() -> Any:
    return load_tokenizer(str(SMOL))


def matcher(tokenizer: Any, parallel: bool = True) -> tuple[Any, int]:
    """A fresh matcher of the hermes structural tag, and the model's end-of-turn token."""
    import xgrammar as xgr

    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, stop_token_ids=[end])
    spec = StructuredOutputParams(structural_tag=hermes_structural_tag(TOOLS, parallel))
    compiled = xgr.GrammarCompiler(info, max_threads=1).compile_grammar(parse_grammar(spec))
    return xgr.GrammarMatcher(compiled), end


def accepts(tokenizer: Any, text: str, parallel: bool = True) -> bool:
    """Whether the grammar takes `text`'s tokens, one by one, and then the end of the turn."""
    m, end = matcher(tokenizer, parallel)
    ids = tokenizer.encode(text, add_special_tokens=False)
    return all(m.accept_token(t) for t in ids) and m.accept_token(end) and m.is_terminated()


def test_grammar_takes_free_text_and_calls_that_match_the_schemas(smol_tokenizer: Any) -> None:
    assert accepts(smol_tokenizer, "Sure! It is sunny in Paris, < 30 degrees.")
    assert accepts(smol_tokenizer, WEATHER_CALL)
    assert accepts(
        smol_tokenizer,
        "Checking.\n" + WEATHER_CALL + '\n<tool_call>\n{"name": "get_time", "arguments": {}}\n'
        "</tool_call>",
    )


@pytest.mark.parametrize(
    "call",
    [
        '{"name": "get_weather", "arguments": {"city": "Paris", "days": "3"}}',  # days a string
        '{"name": "get_weather", "arguments": {"city": "Paris"}}',  # days missing
        '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3, "x": 1}}',  # extra
        '{"name": "get_wether", "arguments": {"city": "Paris", "days": 3}}',  # unknown tool
        '{"name": "get_time", "arguments": {"now": true}}',  # get_time takes none
        "not json at all",
    ],
)
def test_after_the_trigger_only_a_valid_call_is_accepted(smol_tokenizer: Any, call: str) -> None:
    assert not accepts(smol_tokenizer, "Hi <tool_call>\n" + call + "\n</tool_call>")


def test_an_unfinished_call_cannot_end_the_turn(smol_tokenizer: Any) -> None:
    m, end = matcher(smol_tokenizer)
    for t in smol_tokenizer.encode(WEATHER_CALL[:30], add_special_tokens=False):
        assert m.accept_token(t)
    assert not m.accept_token(end)


def test_parallel_tool_calls_false_allows_one_call(smol_tokenizer: Any) -> None:
    assert accepts(smol_tokenizer, WEATHER_CALL, parallel=False)
    assert not accepts(smol_tokenizer, WEATHER_CALL + "\n" + WEATHER_CALL, parallel=False)
