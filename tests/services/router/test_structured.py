"""Structured outputs and tool calls at the router: the wire spec, the 400s, the tool_calls
shape (whole and streamed), against fake executors that play scripted tokens."""

from __future__ import annotations

import json
from typing import Any

import pytest

from quire.structured_params import StructuredOutputParams
from services.common.wire.executor import params_from_proto
from tests.services.conftest import LoopThread
from tests.services.router.conftest import Cluster, RouterHandle
from tests.services.router.fake_executor import EOS, Script
from tests.services.router.test_errors import assert_error

CHAT = [{"role": "user", "content": "What is the weather?"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}
# What the openai client sends to offer both tools.
TOOL_REQUEST: dict[str, Any] = {"model": "quire-tiny", "messages": CHAT, "tools": [WEATHER, TIME]}
# An assistant turn that called get_weather, as a client sends it back in the history.
WEATHER_CALL_TURN = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        }
    ],
}
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
TAG_FORMAT = {
    "type": "tag",
    "begin": "<n>",
    "content": {"type": "json_schema", "json_schema": SCHEMA},
    "end": "</n>",
}


def play(cluster: Cluster, tokenizer: Any, text: str) -> None:
    cluster.script(Script(tokens=tokenizer.encode(text, add_special_tokens=False) + [EOS]))


def only_tool_call(reply: Any, content: str) -> Any:
    """The one tool call of a chat reply's first choice, which must end in tool_calls after
    the words `content`."""
    out = reply.choices[0]
    assert out.finish_reason == "tool_calls" and out.message.content == content
    (call,) = out.message.tool_calls or []
    return call


def sent_spec(cluster: Cluster) -> StructuredOutputParams | None:
    requests = [r for f in cluster.fakes.values() for r in f.executor.requests]
    assert len(requests) == 1
    return params_from_proto(requests[0].params).structured


@pytest.mark.parametrize(
    ("path", "extra", "expected"),
    [
        (
            "chat",
            {"response_format": {"type": "json_object"}},
            StructuredOutputParams(json_object=True),
        ),
        (
            "chat",
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": SCHEMA},
                }
            },
            StructuredOutputParams(json=SCHEMA),
        ),
        ("completions", {"guided_json": SCHEMA}, StructuredOutputParams(json=SCHEMA)),
        ("completions", {"guided_regex": r"\d+"}, StructuredOutputParams(regex=r"\d+")),
        ("chat", {"guided_choice": ["a", "b"]}, StructuredOutputParams(choice=["a", "b"])),
        (
            "completions",
            {"guided_grammar": 'root ::= "x"'},
            StructuredOutputParams(grammar='root ::= "x"'),
        ),
        ("chat", {"structured_outputs": {"regex": "[ab]+"}}, StructuredOutputParams(regex="[ab]+")),
        ("completions", {"response_format": {"type": "text"}}, None),
        (
            "chat",
            {"response_format": {"type": "structural_tag", "format": TAG_FORMAT}},
            StructuredOutputParams(structural_tag={"type": "structural_tag", "format": TAG_FORMAT}),
        ),
        (
            "completions",
            {
                "response_format": {
                    "type": "structural_tag",
                    "structures": [{"begin": "<n>", "schema": SCHEMA, "end": "</n>"}],
                    "triggers": ["<n>"],
                }
            },
            StructuredOutputParams(
                structural_tag={
                    "type": "structural_tag",
                    "format": {
                        "type": "triggered_tags",
                        "triggers": ["<n>"],
                        "tags": [
                            {
                                "type": "tag",
                                "begin": "<n>",
                                "content": {"type": "json_schema", "json_schema": SCHEMA},
                                "end": "</n>",
                            }
                        ],
                    },
                }
            ),
        ),
        (
            "chat",
            {
                "structured_outputs": {
                    "structural_tag": {"type": "structural_tag", "format": TAG_FORMAT}
                }
            },
            StructuredOutputParams(structural_tag={"type": "structural_tag", "format": TAG_FORMAT}),
        ),
    ],
)
def test_every_way_of_asking_reaches_the_executor(
    router_setup: tuple[Cluster, RouterHandle, Any], path: str, extra: dict, expected: Any
) -> None:
    cluster, router, tokenizer = router_setup
    play(cluster, tokenizer, "42")
    body: dict[str, Any] = {"max_tokens": 8, **extra}
    body.update({"messages": CHAT} if path == "chat" else {"prompt": "x"})
    with router.http() as http:
        response = http.post(
            f"/v1/{'chat/completions' if path == 'chat' else 'completions'}", json=body
        )
    assert response.status_code == 200, response.text
    assert sent_spec(cluster) == expected


@pytest.mark.parametrize(
    ("extra", "param", "fragment"),
    [
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "schema"),
        ({"response_format": {"type": "xml"}}, "response_format.type", None),
        ({"guided_json": {"type": "nonsense"}}, "guided_json", "nonsense"),
        ({"guided_json": "{not json"}, "guided_json", "JSON"),
        ({"guided_regex": "(unclosed"}, "guided_regex", "parenthesis"),
        ({"guided_grammar": "root ::= nowhere"}, "guided_grammar", "nowhere"),
        ({"guided_choice": []}, "guided_choice", "choice"),
        (
            {"structured_outputs": {"json": {"type": "object", "minProperties": "x"}}},
            "structured_outputs",
            "minProperties",
        ),
        ({"structured_outputs": {"bogus": 1}}, "structured_outputs.bogus", None),
        ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice", "at most one"),
        ({"tools": [{"type": "function"}]}, "tools.0.function", None),
        (
            {"tools": [{"type": "function", "function": {"name": "bad name!"}}]},
            "tools.0.function.name",
            None,
        ),
        ({"tools": [WEATHER, WEATHER], "tool_choice": "required"}, "tools", "unique"),
        (
            {
                "tools": [
                    {"type": "function", "function": {"name": "f", "parameters": {"type": "frob"}}}
                ],
                "tool_choice": "auto",
            },
            "tools",
            "frob",
        ),
        (
            {"response_format": {"type": "structural_tag", "format": {"type": "frob"}}},
            "response_format",
            "structural_tag",
        ),
        ({"response_format": {"type": "structural_tag"}}, "response_format", "structures"),
        (
            {"structured_outputs": {"structural_tag": "{not json"}},
            "structured_outputs.structural_tag",
            "JSON",
        ),
        ({"tools": [WEATHER], "tool_choice": "auto", "guided_regex": "a"}, "guided_regex", "tool"),
        ({"tool_choice": "required"}, "tool_choice", "needs tools"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
            "nope",
        ),
        (
            {
                "tools": [
                    {"type": "function", "function": {"name": "f", "parameters": {"type": "frob"}}}
                ],
                "tool_choice": "required",
            },
            "tools",
            "frob",
        ),
        (
            {"tools": [WEATHER], "tool_choice": "required", "guided_regex": "a"},
            "guided_regex",
            "tool call",
        ),
    ],
)
def test_bad_constraints_are_400s_before_any_executor(
    router_setup: tuple[Cluster, RouterHandle, Any], extra: dict, param: str, fragment: str | None
) -> None:
    cluster, router, tokenizer = router_setup
    play(cluster, tokenizer, "x")
    with router.http() as http:
        error = assert_error(
            http.post("/v1/chat/completions", json={"messages": CHAT, **extra}), 400, param
        )
    if fragment is not None:
        assert fragment in error["message"], error
    assert not [r for f in cluster.fakes.values() for r in f.executor.requests]


def test_named_tool_call_whole_and_streamed(
    router_setup: tuple[Cluster, RouterHandle, Any],
) -> None:
    cluster, router, tokenizer = router_setup
    arguments = '{"city": "Paris", "days": 3}'
    play(cluster, tokenizer, arguments)
    choice = {"type": "function", "function": {"name": "get_weather"}}
    client = router.openai()
    reply = client.chat.completions.create(
        model="quire-tiny",
        messages=CHAT,
        tools=[WEATHER, TIME],
        tool_choice=choice,  # type: ignore[list-item]
    )
    assert sent_spec(cluster) == StructuredOutputParams(json=WEATHER["function"]["parameters"])  # type: ignore[index]
    out = reply.choices[0]
    assert out.finish_reason == "tool_calls" and out.message.content is None
    (call,) = out.message.tool_calls or []
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {
        "city": "Paris",
        "days": 3,
    }

    play(cluster, tokenizer, arguments)
    chunks = list(
        client.chat.completions.create(
            model="quire-tiny",
            messages=CHAT,
            tools=[WEATHER],
            tool_choice=choice,
            stream=True,  # type: ignore[list-item]
        )
    )
    deltas = [d for c in chunks for d in (c.choices[0].delta.tool_calls or [])]
    assert (
        deltas[0].id
        and deltas[0].id.startswith("call_")
        and deltas[0].function.name == "get_weather"
    )
    assert {d.index for d in deltas} == {0}
    assert "".join(d.function.arguments or "" for d in deltas) == arguments
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_required_tool_calls_parse_several_calls(
    router_setup: tuple[Cluster, RouterHandle, Any],
) -> None:
    cluster, router, tokenizer = router_setup
    text = '[{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "get_time", "arguments": {}}]'
    client = router.openai()
    play(cluster, tokenizer, text)
    reply = client.chat.completions.create(
        model="quire-tiny",
        messages=CHAT,
        tools=[WEATHER, TIME],
        tool_choice="required",  # type: ignore[list-item]
    )
    spec = sent_spec(cluster)
    assert spec is not None and spec.json is not None
    schema = json.loads(str(spec.json))
    assert schema["type"] == "array" and len(schema["items"]["anyOf"]) == 2
    calls = reply.choices[0].message.tool_calls or []
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Oslo"}),
        ("get_time", {}),
    ]
    assert len({c.id for c in calls}) == 2 and reply.choices[0].finish_reason == "tool_calls"

    play(cluster, tokenizer, text)
    chunks = list(
        client.chat.completions.create(
            model="quire-tiny",
            messages=CHAT,
            tools=[WEATHER, TIME],
            tool_choice="required",
            stream=True,  # type: ignore[list-item]
        )
    )
    deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    by_index: dict[int, list[Any]] = {}
    for d in deltas:
        by_index.setdefault(d.index, []).append(d)
    assert [parts[0].function.name for parts in by_index.values()] == ["get_weather", "get_time"]
    assert [
        json.loads("".join(p.function.arguments or "" for p in parts))
        for parts in by_index.values()
    ] == [
        {"city": "Oslo"},
        {},
    ]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tool_choice_none_ignores_the_tools(
    router_setup: tuple[Cluster, RouterHandle, Any],
) -> None:
    cluster, router, tokenizer = router_setup
    play(cluster, tokenizer, " plain words")
    with router.http() as http:
        # A structured output asked for, and no tool_choice: the tools default to "none".
        for extra in ({"tool_choice": "none"}, {"guided_choice": [" plain words"]}):
            body = {"messages": CHAT, "tools": [WEATHER], "max_tokens": 8, **extra}
            reply = http.post("/v1/chat/completions", json=body).json()
            assert reply["choices"][0]["message"]["content"] == " plain words"
            assert reply["choices"][0]["finish_reason"] == "stop"
    requests = [r for f in cluster.fakes.values() for r in f.executor.requests]
    assert len(requests) == 2 and not requests[0].params.HasField("structured")
    assert requests[1].params.structured.WhichOneof("spec") == "choice"


def test_cut_short_tool_call_comes_back_as_text(
    bg_loop: LoopThread, router_setup: tuple[Cluster, RouterHandle, Any]
) -> None:
    cluster, router, tokenizer = router_setup
    partial = tokenizer.encode('{"city": "Par', add_special_tokens=False)
    cluster.script(Script(tokens=partial))  # no EOS: the fake ends it with "length"
    choice = {"type": "function", "function": {"name": "get_weather"}}
    with router.http() as http:
        body = {
            "messages": CHAT,
            "tools": [WEATHER],
            "tool_choice": choice,
            "max_tokens": len(partial),
        }
        reply = http.post("/v1/chat/completions", json=body).json()
    out = reply["choices"][0]
    assert out["finish_reason"] == "length" and out["message"]["content"] == '{"city": "Par'
    assert out["message"]["tool_calls"] == []


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_tool_call_parser_handles_strings_with_brackets(step: int) -> None:
    from services.router.tool_parsers.forced import RequiredCallsParser

    text = '[{"name": "f", "arguments": {"q": "a}]\\"[{"}}]'
    parser = RequiredCallsParser()
    pieces = [parser.feed(text[i : i + step]).calls for i in range(0, len(text), step)]
    assert parser.is_complete()
    (call,) = parser.calls
    assert call.name == "f" and json.loads(call.arguments) == {"q": 'a}]"[{'}
    assert "".join(d.arguments for p in pieces for d in p) == call.arguments
