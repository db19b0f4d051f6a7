"""Structured outputs at the door: the request fields that ask for one, and their check.

A request names its constraint in one of OpenAI's or vLLM's ways: `response_format`
(`json_object`, `json_schema`, vLLM's `structural_tag`), vLLM's `guided_json` /
`guided_regex` / `guided_choice` / `guided_grammar`, or vLLM's newer `structured_outputs`
object; chat's tool calls add one more (`services.router.tool_calls`). `requested_spec` turns whichever is set into one
`StructuredOutputParams` (two at once is a 400 naming the second), and `check_spec` parses it
with xgrammar without a tokenizer (the executor compiles it against its own) so a schema,
regex or grammar that cannot compile is a 400 naming the field before any executor sees the
request. Parsed specs are cached by their text.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from quire.structured_params import StructuredOutputParams, parse_grammar
from services.router.errors import bad_request

CHECK_CACHE_SIZE = 1024  # specs whose parse result the router remembers


class JsonSchemaFormat(BaseModel):
    """OpenAI's `response_format.json_schema`."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    # `schema` shadows a BaseModel attribute, hence the alias.
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class StructureItem(BaseModel):
    """One tag of vLLM's legacy structural tag: `begin`, JSON under `schema`, then `end`."""

    model_config = ConfigDict(populate_by_name=True)

    begin: str
    json_schema: dict[str, Any] = Field(alias="schema")
    end: str


class ResponseFormat(BaseModel):
    """OpenAI's `response_format`: text (no constraint), any JSON object, or a schema; vLLM's
    `structural_tag` too, as xgrammar's `format` or the legacy `structures` + `triggers`."""

    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None
    format: dict[str, Any] | None = None  # structural_tag: xgrammar's format object
    structures: list[StructureItem] | None = None  # structural_tag, legacy shape
    triggers: list[str] | None = None  # structural_tag, legacy shape

    def structural_tag(self) -> dict[str, Any]:
        """The structural tag this format asks for, in xgrammar's current shape."""
        if self.format is not None:
            return {"type": "structural_tag", "format": self.format}
        if self.structures is None or self.triggers is None:
            raise bad_request(
                "response_format structural_tag needs format, or structures and triggers",
                "response_format",
            )
        tags = [
            {
                "type": "tag",
                "begin": item.begin,
                "content": {"type": "json_schema", "json_schema": item.json_schema},
                "end": item.end,
            }
            for item in self.structures
        ]
        return {
            "type": "structural_tag",
            "format": {"type": "triggered_tags", "triggers": self.triggers, "tags": tags},
        }


class StructuredOutputsField(BaseModel):
    """vLLM's `structured_outputs` object: one of its constraint fields."""

    model_config = ConfigDict(extra="forbid")

    json_: str | dict[str, Any] | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | dict[str, Any] | None = None


class StructuredFields(BaseModel):
    """The fields completions and chat share for structured outputs (a mixin of the bodies)."""

    response_format: ResponseFormat | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    structured_outputs: StructuredOutputsField | None = None

    def requested_structured(self) -> tuple[str, StructuredOutputParams] | None:
        """(field, spec) of the constraint the body asks for; a 400 naming the field if bad."""
        found: list[tuple[str, dict[str, Any]]] = []
        fmt = self.response_format
        if fmt is not None and fmt.type == "json_object":
            found.append(("response_format", {"json_object": True}))
        elif fmt is not None and fmt.type == "json_schema":
            if fmt.json_schema is None or fmt.json_schema.json_schema is None:
                raise bad_request(
                    "response_format json_schema needs json_schema.schema",
                    "response_format.json_schema",
                )
            found.append(("response_format", {"json": fmt.json_schema.json_schema}))
        elif fmt is not None and fmt.type == "structural_tag":
            found.append(("response_format", {"structural_tag": fmt.structural_tag()}))
        for name, key in (
            ("guided_json", "json"),
            ("guided_regex", "regex"),
            ("guided_choice", "choice"),
            ("guided_grammar", "grammar"),
        ):
            value = getattr(self, name)
            if value is not None:
                found.append((name, {key: _json_text(value, name) if key == "json" else value}))
        so = self.structured_outputs
        if so is not None:
            spec: dict[str, Any] = {
                k: v
                for k, v in (
                    (
                        "json",
                        None
                        if so.json_ is None
                        else _json_text(so.json_, "structured_outputs.json"),
                    ),
                    ("regex", so.regex),
                    ("choice", so.choice),
                    ("grammar", so.grammar),
                    ("json_object", so.json_object or None),
                    (
                        "structural_tag",
                        None
                        if so.structural_tag is None
                        else _json_text(so.structural_tag, "structured_outputs.structural_tag"),
                    ),
                )
                if v is not None
            }
            found.append(("structured_outputs", spec))
        if not found:
            return None
        if len(found) > 1:
            names = ", ".join(name for name, _ in found)
            raise bad_request(
                f"at most one structured output constraint per request, got {names}",
                found[1][0],
            )
        name, values = found[0]
        try:
            return name, StructuredOutputParams(**values)
        except ValueError as exc:
            raise bad_request(f"{name}: {exc}", name) from exc


def _json_text(value: str | dict[str, Any], field: str) -> str:
    if isinstance(value, dict):
        return json.dumps(value)  # key order kept: the output follows it
    try:
        json.loads(value)
    except ValueError as exc:
        raise bad_request(f"{field} is not valid JSON: {exc}", field) from exc
    return value


def check_spec(spec: StructuredOutputParams, field: str) -> None:
    """A 400 naming `field` unless xgrammar can parse `spec` (cached by the spec's text)."""
    error = _parse_error(spec.key)
    if error is not None:
        raise bad_request(f"{field}: {error}", field, "invalid_structured_output")


@functools.lru_cache(maxsize=CHECK_CACHE_SIZE)
def _parse_error(key: tuple[str, str]) -> str | None:
    kind, text = key
    if kind == "choice":
        spec = StructuredOutputParams(choice=json.loads(text))
    elif kind == "json_object":
        spec = StructuredOutputParams(json_object=True)
    elif kind == "structural_tag":
        spec = StructuredOutputParams(structural_tag=text)
    elif kind == "json":
        spec = StructuredOutputParams(json=text)
    elif kind == "regex":
        spec = StructuredOutputParams(regex=text)
    else:
        spec = StructuredOutputParams(grammar=text)
    try:
        parse_grammar(spec)
    except ValueError as exc:
        return str(exc)
    return None
