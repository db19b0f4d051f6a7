"""Structured outputs and forced tool calls end to end: the official openai client against a
real stack serving the default model (SmolLM2-135M-Instruct), one executor."""

from __future__ import annotations

import dataclasses
import json
import random
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from services.router.prompts import load_tokenizer
from services.stack.ports import free_port, stack_ports
from services.stack.runner import Stack, terminate
from services.stack.spec import StackConfig, stack_processes
from tests.integration.conftest import REPO, running_stack

MODEL = "smollm2-135m-instruct"
NUM_SCHEMAS = 50
TOPICS = ["a city", "a book", "a dog", "a planet", "a recipe", "a car", "a song", "a tree"]


@pytest.fixture(scope="module")
def smol_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    ports = stack_ports(1)
    config = StackConfig(
        model=str(REPO / "models" / MODEL),
        **ports,
        num_executors=1,
        num_kv_blocks=1024,
        redis_prefix=f"quire-so-{ports['executor_base_port']}",
    )
    run_dir = tmp_path_factory.mktemp("so-stack")
    with running_stack(config, run_dir, start_timeout_s=180, healthy_timeout_s=60) as stack:
        yield stack


@pytest.fixture(scope="module")
def client(smol_stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{smol_stack.config.router_url}/v1", api_key="unused", max_retries=0, timeout=120
    )


def random_schema(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    """A small object schema: string/integer/number/boolean/enum/array/nested fields."""
    kinds = ["string", "integer", "number", "boolean", "enum", "array"] + (
        ["object"] if depth == 0 else []
    )
    fields = rng.sample(
        ["name", "count", "score", "ok", "kind", "items", "info", "title", "year"],
        k=rng.randint(1, 3),
    )
    properties: dict[str, Any] = {}
    for name in fields:
        kind = rng.choice(kinds)
        if kind == "string":
            properties[name] = {"type": "string", "maxLength": rng.randint(4, 16)}
        elif kind == "integer":
            properties[name] = {"type": "integer", "minimum": 0, "maximum": 10 ** rng.randint(1, 4)}
        elif kind == "number":
            properties[name] = {"type": "number", "minimum": -100, "maximum": 100}
        elif kind == "boolean":
            properties[name] = {"type": "boolean"}
        elif kind == "enum":
            properties[name] = {
                "enum": rng.sample(["red", "green", "blue", "small", "large", "yes"], k=3)
            }
        elif kind == "array":
            item = rng.choice(
                [
                    {"type": "string", "maxLength": 8},
                    {"type": "integer", "minimum": 0, "maximum": 99},
                    {"type": "boolean"},
                ]
            )
            properties[name] = {"type": "array", "items": item, "maxItems": rng.randint(1, 3)}
        else:
            properties[name] = random_schema(rng, depth + 1)
    required = [n for n in fields if rng.random() < 0.7] or fields[:1]
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


def schema_cases() -> list[tuple[str, dict[str, Any]]]:
    rng = random.Random(1234)
    cases: list[tuple[str, dict[str, Any]]] = []
    seen: set[str] = set()
    while len(cases) < NUM_SCHEMAS:
        schema = random_schema(rng)
        key = json.dumps(schema, sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        topic = TOPICS[len(cases) % len(TOPICS)]
        cases.append((f"Describe {topic} as JSON (case {len(cases)}).", schema))
    return cases


def ask(
    client: openai.OpenAI, prompt: str, schema: dict[str, Any], stream: bool
) -> tuple[str, str | None]:
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 120,
        "temperature": 0,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": schema, "strict": True},
        },
    }
    if not stream:
        reply = client.chat.completions.create(**kwargs)
        return reply.choices[0].message.content or "", reply.choices[0].finish_reason
    text, finish = "", None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    return text, finish


def test_fifty_schemas_validate_streaming_and_not(client: openai.OpenAI) -> None:
    cases = schema_cases()
    assert len({json.dumps(s, sort_keys=True) for _, s in cases}) == NUM_SCHEMAS
    jobs = [(p, s, i % 2 == 1) for i, (p, s) in enumerate(cases)]
    with ThreadPoolExecutor(max_workers=NUM_SCHEMAS) as pool:
        results = list(pool.map(lambda job: ask(client, *job), jobs))
    unfinished = [(p, t) for (p, _, _), (t, f) in zip(jobs, results, strict=True) if f != "stop"]
    assert not unfinished, unfinished
    for (_, schema, _), (text, _) in zip(jobs, results, strict=True):
        jsonschema.validate(json.loads(text), schema)
    # Greedy: streaming and not give the same text for the same schema.
    assert ask(client, *cases[0], stream=True) == ask(client, *cases[0], stream=False)


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather forecast for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "unit": {"enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "unit", "days"],
            "additionalProperties": False,
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "maxLength": 30}},
            "required": ["query"],
            "additionalProperties": False,
        },
    },
}
MESSAGES = [{"role": "user", "content": "What will the weather be in Paris for three days?"}]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, SEARCH)}  # type: ignore[index]


@pytest.mark.parametrize(
    "tool_choice", [{"type": "function", "function": {"name": "get_weather"}}, "required"]
)
def test_forced_tool_calls_validate_streaming_and_not(
    client: openai.OpenAI, tool_choice: Any
) -> None:
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "messages": MESSAGES,
        "tools": [WEATHER, SEARCH],
        "tool_choice": tool_choice,
        "max_tokens": 120,
        "temperature": 0,
    }
    if tool_choice == "required":
        # Shown its tools by the tool template, SmolLM2-135M picks get_weather with the right
        # arguments, then repeats that call until max_tokens when more than one is allowed.
        kwargs["parallel_tool_calls"] = False
    reply = client.chat.completions.create(**kwargs)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls, choice
    whole = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]
    for call in choice.message.tool_calls:
        assert call.id.startswith("call_") and call.type == "function"
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    if isinstance(tool_choice, dict):
        assert [name for name, _ in whole] == ["get_weather"]
    streamed: dict[int, list[str]] = {}
    names: dict[int, str] = {}
    finish = None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for d in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            if d.function and d.function.name:
                names[d.index] = d.function.name
            streamed.setdefault(d.index, []).append(
                (d.function.arguments or "") if d.function else ""
            )
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    assert finish == "tool_calls"
    assert [(names[i], "".join(streamed[i])) for i in sorted(streamed)] == whole


def test_n_samples_each_follow_the_grammar(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "size": {"type": "integer", "minimum": 1, "maximum": 9},
        },
        "required": ["color", "size"],
        "additionalProperties": False,
    }
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Pick a color and a size."}],
        response_format={"type": "json_schema", "json_schema": {"name": "pick", "schema": schema}},
        n=4,
        temperature=1.0,
        seed=7,
        max_tokens=40,
    )
    assert len(reply.choices) == 4
    for choice in reply.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content or ""), schema)
    choice_reply = client.completions.create(
        model=MODEL,
        prompt="The answer is",
        n=3,
        temperature=1.0,
        seed=3,
        max_tokens=10,
        extra_body={"guided_choice": ["yes", "no"]},
    )
    assert all(c.text in ("yes", "no") and c.finish_reason == "stop" for c in choice_reply.choices)


def test_bad_schema_is_a_400_from_the_real_router(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "nonsense"}},
            },
        )
    assert info.value.body["param"] == "response_format"  # type: ignore[index]
    bad_tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "frob"}}}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            tools=[bad_tool],  # type: ignore[list-item]
            tool_choice="auto",
        )
    assert info.value.body["param"] == "tools"  # type: ignore[index]


# --- tool_choice "auto": the router's ChatML tool template, the hermes format -------------


TAG = "<tool_call>"


def chat(client: openai.OpenAI, stream: bool, **kwargs: Any) -> dict[str, Any]:
    """One choice as {content, calls: [(id, name, arguments)], finish}, streamed or not.

    Streamed, content chunks are checked never to carry a `<tool_call>` tag or its start."""
    kwargs = {"model": MODEL, "temperature": 0, "max_tokens": 80, **kwargs}
    if not stream:
        choice = client.chat.completions.create(**kwargs).choices[0]
        calls = [
            (c.id, c.function.name, c.function.arguments)
            for c in choice.message.tool_calls or []
            if c.type == "function"
        ]
        return {
            "content": choice.message.content or "",
            "calls": calls,
            "finish": choice.finish_reason,
        }
    content, finish = "", None
    parts: dict[int, list[str]] = {}
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        if not chunk.choices:
            continue
        delta, piece = chunk.choices[0].delta, chunk.choices[0].delta.content or ""
        assert "<tool_call>" not in piece and "</tool_call>" not in piece, piece
        if not chunk.choices[0].finish_reason:  # what could still become a tag is held back
            assert not any(piece.endswith(TAG[:n]) for n in range(1, len(TAG))), piece
        content += piece
        for d in delta.tool_calls or []:
            if d.id:
                parts[d.index] = [d.id, (d.function.name if d.function else None) or "", ""]
            parts[d.index][2] += (d.function.arguments or "") if d.function else ""
        finish = chunk.choices[0].finish_reason or finish
    return {"content": content, "calls": [tuple(p) for p in parts.values()], "finish": finish}


def assert_well_formed(answer: dict[str, Any]) -> None:
    """Words, or calls of the given tools whose arguments validate; the finish says which."""
    if answer["calls"]:
        assert answer["finish"] in ("tool_calls", "length"), answer
    else:
        assert answer["finish"] in ("stop", "length") and answer["content"], answer
    for call_id, name, arguments in answer["calls"]:
        assert call_id.startswith("call_")
        if answer["finish"] == "tool_calls":
            jsonschema.validate(json.loads(arguments), SCHEMAS[name])


@pytest.fixture(scope="module")
def open_angle() -> int:
    """The default model's token for "<", with which a Hermes call starts."""
    (token,) = load_tokenizer(str(REPO / "models" / MODEL)).encode("<", add_special_tokens=False)
    return int(token)


@pytest.mark.parametrize("stream", [False, True])
def test_auto_tool_choice_answers_well_formed(client: openai.OpenAI, stream: bool) -> None:
    for tool_choice in ("auto", None):  # None: auto is the default with tools
        extra = {"tool_choice": tool_choice} if tool_choice else {}
        answer = chat(client, stream, messages=MESSAGES, tools=[WEATHER, SEARCH], **extra)
        assert_well_formed(answer)


@pytest.mark.parametrize("stream", [False, True])
def test_auto_tool_call_end_to_end(client: openai.OpenAI, stream: bool, open_angle: int) -> None:
    # SmolLM2-135M answers this in words, greedily. A small bias on "<" makes its first token
    # "<"; the model itself goes on to write "tool_call>" (the tool template shows it the
    # format), the grammar holds the rest to get_weather's or search's schema, and
    # parallel_tool_calls=false ends the output after the call.
    kwargs: dict[str, Any] = {
        "messages": MESSAGES,
        "tools": [WEATHER, SEARCH],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "logit_bias": {str(open_angle): 5},
    }
    answer = chat(client, stream, **kwargs)
    assert answer["finish"] == "tool_calls" and len(answer["calls"]) == 1, answer
    (_, name, arguments), content = answer["calls"][0], answer["content"]
    assert name == "get_weather" and content == ""
    jsonschema.validate(json.loads(arguments), SCHEMAS[name])
    other = chat(client, not stream, **kwargs)  # greedy: streamed and whole agree
    assert [c[1:] for c in other["calls"]] == [c[1:] for c in answer["calls"]]


HISTORY = [
    *MESSAGES,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "arguments": '{"city": "Paris", "unit": "celsius", "days": 3}',
                },
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 24 C, then rain."},
]


@pytest.mark.parametrize("stream", [False, True])
def test_tool_call_history_is_answered(client: openai.OpenAI, stream: bool) -> None:
    answer = chat(client, stream, messages=HISTORY, tools=[WEATHER, SEARCH])
    assert_well_formed(answer)
    assert_well_formed(chat(client, stream, messages=HISTORY))  # history, no tools


@pytest.fixture(scope="module")
def plain_router(smol_stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A second router over the same executors, with tool_chat_template=none."""
    port = free_port()
    config = dataclasses.replace(smol_stack.config, router_port=port, router_admin_port=free_port())
    (router,) = [p for p in stack_processes(config) if p.name == "router"]
    argv = [*router.argv, "--tool-chat-template", "none"]
    log = (tmp_path_factory.mktemp("plain-router") / "router.log").open("w")
    proc = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "router did not start"
            time.sleep(0.2)
        yield url
    finally:
        terminate(proc, timeout_s=10)
        log.close()


@pytest.mark.parametrize("stream", [False, True])
def test_auto_without_a_tool_template_is_a_400(plain_router: str, stream: bool) -> None:
    plain = openai.OpenAI(base_url=f"{plain_router}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        chat(plain, stream, messages=MESSAGES, tools=[WEATHER], tool_choice="auto")
    assert info.value.body["param"] == "tool_choice"  # type: ignore[index]
    # The default with tools is then "none": the model's own template, plain words.
    answer = chat(plain, stream, messages=MESSAGES, tools=[WEATHER], max_tokens=8)
    assert answer["calls"] == [] and answer["content"]
