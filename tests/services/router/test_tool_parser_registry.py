"""The tool-call format registry: an unknown `tool_call_parser` stops the router at start-up
naming the registered ones, and a format registered anywhere serves "auto" end to end,
through the one interface, without a line changed elsewhere."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from pydantic import ValidationError

from quire.structured_params import StructuredOutputParams
from services.common.wire.executor import params_from_proto
from services.router.router_settings import RouterSettings
from services.router.tool_parsers.base import (
    TOOL_PARSERS,
    CallDelta,
    ExtractedToolCalls,
    ParsedDelta,
    ToolParser,
    new_call_id,
    register_tool_parser,
)
from services.router.tool_parsers.hermes import HermesToolParser
from services.router.tool_parsers.registry import tool_parser_class, tool_parser_names
from services.router.tool_schemas import Tool
from tests.services.router.conftest import Cluster
from tests.services.router.test_structured import TOOL_REQUEST, only_tool_call, play
from tests.services.router.test_tool_parser_contract import TOOLS, assert_contract

_TOY_CALL = re.compile(r"\[\[([A-Za-z0-9_-]+) (\{.*?\})\]\]", re.S)


class ToyToolParser(ToolParser):
    """`[[name {...}]]` calls amid words, read once the output has ended (nothing streams
    before the end: the simplest reading the contract allows)."""

    def __init__(self, tools: Sequence[Tool] = ()) -> None:
        super().__init__(tools)
        self.text = ""
        self._read = ExtractedToolCalls("", [])

    @classmethod
    def grammar(cls, tools: list[Tool], parallel: bool) -> StructuredOutputParams:
        tags = [
            {
                "type": "tag",
                "begin": f"[[{t.function.name} ",
                "content": {"type": "json_schema", "json_schema": t.function.arguments_schema},
                "end": "]]",
            }
            for t in tools
        ]
        tag = {"triggers": ["[["], "tags": tags, "stop_after_first": not parallel}
        return StructuredOutputParams(
            structural_tag={"type": "structural_tag", "format": {"type": "triggered_tags", **tag}}
        )

    def feed(self, new_text: str) -> ParsedDelta:
        self.text += new_text
        return ParsedDelta()

    def finish(self, stopped: bool = True) -> ParsedDelta:
        calls = [
            CallDelta(i, m.group(2), new_call_id(), m.group(1))
            for i, m in enumerate(_TOY_CALL.finditer(self.text))
        ]
        self._read = ExtractedToolCalls(_TOY_CALL.sub("", self.text), calls)
        return ParsedDelta(self._read.content, calls)

    def extracted(self) -> ExtractedToolCalls:
        return self._read


@pytest.fixture
def toy() -> Iterator[type[ToolParser]]:
    """`toy` registered the way a format module registers, for this test only."""
    register_tool_parser("toy")(ToyToolParser)
    try:
        yield ToyToolParser
    finally:
        TOOL_PARSERS.pop("toy")


def test_an_unknown_name_is_refused_naming_the_registered_ones() -> None:
    with pytest.raises(ValueError, match=r"must be one of \['hermes'\], not 'nope'"):
        tool_parser_class("nope")
    with pytest.raises(ValidationError, match=r"tool_call_parser must be one of \['hermes'\]"):
        RouterSettings(tool_call_parser="nope")


def test_the_router_does_not_start_with_an_unknown_name(capsys: pytest.CaptureFixture[str]) -> None:
    from services.router.__main__ import main

    with pytest.raises(SystemExit) as stopped:
        main(["--tool-call-parser", "nope"])
    assert stopped.value.code == 2
    assert "--tool-call-parser = 'nope': tool_call_parser must be one of ['hermes']" in (
        capsys.readouterr().err
    )


def test_a_name_belongs_to_one_format() -> None:
    with pytest.raises(ValueError, match="'hermes' is already registered to .*HermesToolParser"):
        register_tool_parser("hermes")(ToyToolParser)
    assert register_tool_parser("hermes")(HermesToolParser) is HermesToolParser  # idempotent
    assert tool_parser_class("hermes") is HermesToolParser


def test_a_registered_format_is_found_by_name(toy: type[ToolParser]) -> None:
    assert tool_parser_names() == ["hermes", "toy"]
    assert tool_parser_class("toy") is toy
    assert RouterSettings(tool_call_parser="toy").tool_call_parser == "toy"
    text = 'Sure.[[get_weather {"city": "Paris"}]] And [[get_time {}]]'
    whole = assert_contract(lambda: toy(TOOLS), text)
    assert whole.content == "Sure. And " and [c.name for c in whole.calls] == [
        "get_weather",
        "get_time",
    ]


def test_a_registered_format_serves_auto_end_to_end(
    cluster: Cluster, tokenizer: Any, toy: type[ToolParser]
) -> None:
    router = cluster.router(tool_call_parser="toy")
    text = 'Checking.[[get_weather {"city": "Paris"}]]'
    play(cluster, tokenizer, text)
    client = router.openai()
    call = only_tool_call(client.chat.completions.create(**TOOL_REQUEST), "Checking.")
    assert call.id.startswith("call_") and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    (request,) = [r for f in cluster.fakes.values() for r in f.executor.requests]
    spec = params_from_proto(request.params).structured
    assert spec is not None and spec.kind == "structural_tag"
    tag = json.loads(str(spec.structural_tag))
    assert tag["format"]["triggers"] == ["[["]
    assert [t["begin"] for t in tag["format"]["tags"]] == ["[[get_weather ", "[[get_time "]

    play(cluster, tokenizer, text)
    chunks = list(client.chat.completions.create(stream=True, **TOOL_REQUEST))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == "Checking."
    deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert [(d.index, d.function.name if d.function else None) for d in deltas] == [
        (0, "get_weather")
    ]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
