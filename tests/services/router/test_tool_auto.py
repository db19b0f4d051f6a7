"""tool_choice "auto" at the router: the tool template and structural tag it sends, the words
and calls it reads back (whole, streamed, per choice), tool-call history, and the 400s, against
fake executors that play scripted tokens (quire-tiny's ChatML template: the shipped tool
template applies)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from services.common.wire.executor import params_from_proto
from tests.services.conftest import LoopThread
from tests.services.router.conftest import Cluster, RouterHandle
from tests.services.router.fake_executor import EOS, Script
from tests.services.router.test_errors import assert_error
from tests.services.router.test_structured import (
    CHAT,
    TIME,
    TOOL_REQUEST,
    WEATHER,
    WEATHER_CALL_TURN,
    only_tool_call,
    play,
)

CALL = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>'
)
HISTORY = [
    *CHAT,
    WEATHER_CALL_TURN,
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
]


def sent(cluster: Cluster) -> list[Any]:
    return [r for f in cluster.fakes.values() for r in f.executor.requests]


@pytest.mark.parametrize("explicit", [True, False])
def test_auto_sends_the_tool_prompt_and_structural_tag(
    router_setup: tuple[Cluster, RouterHandle, Any], explicit: bool
) -> None:
    cluster, router, tokenizer = router_setup
    play(cluster, tokenizer, "Hello")
    body: dict[str, Any] = {"messages": CHAT, "tools": [WEATHER, TIME], "max_tokens": 8}
    if explicit:
        body["tool_choice"] = "auto"
    with router.http() as http:
        reply = http.post("/v1/chat/completions", json=body).json()
    assert reply["choices"][0]["message"] == {
        "role": "assistant",
        "content": "Hello",
        "refusal": None,
        "tool_calls": [],
    }
    assert reply["choices"][0]["finish_reason"] == "stop"
    (request,) = sent(cluster)
    spec = params_from_proto(request.params).structured
    assert spec is not None and spec.kind == "structural_tag"
    tag = json.loads(str(spec.structural_tag))
    assert tag["format"]["triggers"] == ["<tool_call>"]
    assert [t["begin"] for t in tag["format"]["tags"]] == [
        '<tool_call>\n{"name": "get_weather", "arguments": ',
        '<tool_call>\n{"name": "get_time", "arguments": ',
    ]
    prompt = tokenizer.decode(list(request.prompt_token_ids))
    assert "<tools>" in prompt and '"name": "get_weather"' in prompt


def test_auto_calls_whole_and_streamed(router_setup: tuple[Cluster, RouterHandle, Any]) -> None:
    cluster, router, tokenizer = router_setup
    text = "Let me look.\n" + CALL
    play(cluster, tokenizer, text)
    client = router.openai()
    call = only_tool_call(client.chat.completions.create(**TOOL_REQUEST), "Let me look.")
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 3}

    play(cluster, tokenizer, text)
    chunks = list(client.chat.completions.create(stream=True, **TOOL_REQUEST))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == "Let me look."
    deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].id and deltas[0].function and deltas[0].function.name == "get_weather"
    assert {d.index for d in deltas} == {0}
    assert "".join((d.function.arguments or "") if d.function else "" for d in deltas) == (
        call.function.arguments
    )
    assert len(deltas) > 2  # the arguments streamed in pieces, not in one go at the end
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_auto_parses_each_choice_on_its_own(
    router_setup: tuple[Cluster, RouterHandle, Any],
) -> None:
    cluster, router, tokenizer = router_setup

    def ids(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False)) + [EOS]

    script = Script(tokens_by_index={0: ids("Just words."), 1: ids(CALL)})
    for stream in (False, True):
        cluster.script(script)
        body = {"messages": CHAT, "tools": [WEATHER], "n": 2, "stream": stream}
        with router.http() as http:
            response = http.post("/v1/chat/completions", json=body)
        if not stream:
            choices = sorted(response.json()["choices"], key=lambda c: c["index"])
            assert [c["finish_reason"] for c in choices] == ["stop", "tool_calls"]
            assert choices[0]["message"]["content"] == "Just words."
            assert choices[0]["message"]["tool_calls"] == []
            assert choices[1]["message"]["content"] is None
            assert [c["function"]["name"] for c in choices[1]["message"]["tool_calls"]] == [
                "get_weather"
            ]
            continue
        events = [
            json.loads(line[6:])
            for line in response.text.splitlines()
            if line.startswith("data: {")
        ]
        finish = {
            c["index"]: c["finish_reason"]
            for e in events
            for c in e["choices"]
            if c["finish_reason"]
        }
        assert finish == {0: "stop", 1: "tool_calls"}
        calls = [c["index"] for e in events for c in e["choices"] if c["delta"].get("tool_calls")]
        assert set(calls) == {1}


def test_a_call_cut_short_comes_back_as_text(
    router_setup: tuple[Cluster, RouterHandle, Any],
) -> None:
    cluster, router, tokenizer = router_setup
    partial = tokenizer.encode("Ok " + CALL[:40], add_special_tokens=False)
    cluster.script(Script(tokens=partial))  # no EOS: the fake ends it with "length"
    body = {"messages": CHAT, "tools": [WEATHER], "max_tokens": len(partial)}
    with router.http() as http:
        reply = http.post("/v1/chat/completions", json=body).json()
    out = reply["choices"][0]
    assert out["finish_reason"] == "length" and out["message"]["tool_calls"] == []
    assert out["message"]["content"] == "Ok" + CALL[:40]


def test_tool_call_history_is_rendered(router_setup: tuple[Cluster, RouterHandle, Any]) -> None:
    cluster, router, tokenizer = router_setup
    play(cluster, tokenizer, "It is sunny.")
    with router.http() as http:
        body = {"messages": HISTORY, "tools": [WEATHER], "max_tokens": 8}
        reply = http.post("/v1/chat/completions", json=body).json()
        assert reply["choices"][0]["message"]["content"] == "It is sunny."
        [first] = sent(cluster)
        # Without tools, the history still renders with the tool template.
        no_tools = http.post("/v1/chat/completions", json={"messages": HISTORY, "max_tokens": 8})
        assert no_tools.status_code == 200, no_tools.text
    # The two prompts open differently, so they may go to different executors.
    [second] = [r for r in sent(cluster) if r is not first]
    with_tools, without = (tokenizer.decode(list(r.prompt_token_ids)) for r in (first, second))
    for prompt in (with_tools, without):
        assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in prompt
        assert "<tool_response>\nsunny, 21 C\n</tool_response>" in prompt
    assert "<tools>" in with_tools and "<tools>" not in without


@pytest.mark.parametrize(
    ("message", "param"),
    [
        (
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{x"}}
                ],
            },
            "messages.1.tool_calls.0.function.arguments",
        ),
        (
            {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f"}}]},
            "messages.1.tool_calls.0.function.arguments",
        ),
        ({"role": "tool", "content": "result"}, "messages.1"),
        (
            {
                "role": "user",
                "content": "hi",
                "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}],
            },
            "messages.1",
        ),
    ],
)
def test_bad_tool_history_is_a_400(
    router_setup: tuple[Cluster, RouterHandle, Any], message: dict[str, Any], param: str
) -> None:
    cluster, router, tokenizer = router_setup
    play(cluster, tokenizer, "x")
    with router.http() as http:
        body = {"messages": [*CHAT, message], "max_tokens": 4}
        assert_error(http.post("/v1/chat/completions", json=body), 400, param)
    assert not sent(cluster)


def test_without_a_tool_template_auto_is_a_400(
    bg_loop: LoopThread, router_setup: tuple[Cluster, RouterHandle, Any]
) -> None:
    cluster, _, tokenizer = router_setup
    router = cluster.router(tool_chat_template="none")
    play(cluster, tokenizer, " plain")
    with router.http() as http:
        body = {"messages": CHAT, "tools": [WEATHER], "max_tokens": 4}
        error = assert_error(
            http.post("/v1/chat/completions", json={**body, "tool_choice": "auto"}),
            400,
            "tool_choice",
        )
        assert "tool_chat_template" in error["message"]
        assert not sent(cluster)
        # The default with tools is then "none": unconstrained, the model's template.
        reply = http.post("/v1/chat/completions", json=body).json()
    assert reply["choices"][0]["message"]["content"] == " plain"
    (request,) = sent(cluster)
    assert not request.params.HasField("structured")
    assert "<tools>" not in tokenizer.decode(list(request.prompt_token_ids))
