"""StructuredOutputParams: the grammar one request's output must follow (vLLM's names).

Exactly one constraint is set: a JSON schema, any JSON object, a regular expression, a fixed
list of choices, an EBNF grammar (xgrammar's dialect, GBNF-like) or a structural tag
(xgrammar's `{"type": "structural_tag", "format": {...}}`: free text with tagged regions
under their own schemas, what chat's `tool_choice: "auto"` decodes under). The engine enforces it
while decoding (`quire.engine.grammar_masks`): every step, tokens that cannot continue a match
are masked out of the logits, and the output ends ("stop") once the grammar is complete.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

MAX_CHOICES = 1024  # most alternatives in a `choice` constraint
MAX_SPEC_CHARS = 256 * 1024  # longest schema / regex / grammar / structural tag text
_TEXT_KINDS = ("json", "regex", "grammar", "structural_tag")  # the constraints given as text


@dataclass(frozen=True)
class StructuredOutputParams:
    """One output constraint; validated (shape only, not compiled) on construction.

    A `json` schema given as a dict is stored as JSON text (its key order kept: that is the
    order the output writes properties in); equal texts share one compiled grammar.
    """

    json: str | dict[str, Any] | None = None  # a JSON schema the output must validate against
    regex: str | None = None  # a regular expression the whole output must match
    choice: tuple[str, ...] | list[str] | None = None  # the output is exactly one of these
    grammar: str | None = None  # an EBNF grammar (root rule `root`)
    json_object: bool = False  # any JSON object (OpenAI's response_format json_object)
    # xgrammar's structural tag (JSON text or a dict): e.g. free text until a trigger, then a
    # tagged region under a schema (vLLM's `structural_tag`)
    structural_tag: str | dict[str, Any] | None = None

    def __post_init__(self) -> None:
        for name in ("json", "structural_tag"):
            value = getattr(self, name)
            if isinstance(value, dict | bool):
                # Key order kept: a schema's property order is the order the output writes.
                object.__setattr__(self, name, json.dumps(value))
        if self.choice is not None:
            object.__setattr__(self, "choice", tuple(self.choice))
        set_fields = [
            name for name in _TEXT_KINDS + ("choice",) if getattr(self, name) is not None
        ] + (["json_object"] if self.json_object else [])
        if len(set_fields) != 1:
            raise ValueError(
                "structured output needs exactly one of json, regex, choice, grammar, "
                f"structural_tag or json_object; got {set_fields or 'none'}"
            )
        for name in _TEXT_KINDS:
            value = getattr(self, name)
            if value is None:
                continue
            if not isinstance(value, str) or not value:
                raise ValueError(f"structured output {name} must be a non-empty string")
            if len(value) > MAX_SPEC_CHARS:
                raise ValueError(f"structured output {name} is longer than {MAX_SPEC_CHARS} chars")
        if isinstance(self.json, str):
            try:
                schema = json.loads(self.json)
            except ValueError as exc:
                raise ValueError(f"structured output json is not valid JSON: {exc}") from exc
            if not isinstance(schema, dict | bool):
                raise ValueError("structured output json must be a JSON schema object")
        if isinstance(self.structural_tag, str):
            try:
                tag = json.loads(self.structural_tag)
            except ValueError as exc:
                raise ValueError(
                    f"structured output structural_tag is not valid JSON: {exc}"
                ) from exc
            if not isinstance(tag, dict):
                raise ValueError("structured output structural_tag must be a JSON object")
        if self.choice is not None:
            if not self.choice or len(self.choice) > MAX_CHOICES:
                raise ValueError(f"structured output choice needs 1 to {MAX_CHOICES} strings")
            if any(not isinstance(c, str) or not c for c in self.choice):
                raise ValueError("structured output choice must be non-empty strings")

    @property
    def kind(self) -> str:
        """Which constraint this is: json, json_object, regex, choice, grammar or structural_tag."""
        for name in _TEXT_KINDS + ("choice",):
            if getattr(self, name) is not None:
                return name
        return "json_object"

    @property
    def key(self) -> tuple[str, str]:
        """(kind, spec text): equal keys compile to the same grammar."""
        if self.choice is not None:
            return ("choice", json.dumps(list(self.choice)))
        value = getattr(self, self.kind) if self.kind != "json_object" else ""
        return (self.kind, str(value))


def choice_grammar(choices: tuple[str, ...]) -> str:
    """An EBNF grammar whose language is exactly `choices` (JSON string literals are EBNF's)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def parse_grammar(params: StructuredOutputParams) -> Any:
    """The tokenizer-free xgrammar `Grammar` of a spec; ValueError naming what is wrong.

    Parsing catches the errors a spec can have (bad schema, regex or EBNF), so the router runs
    this without a tokenizer before any executor sees the request; the engine compiles the
    result against its model's tokenizer.
    """
    import xgrammar as xgr

    try:
        if params.json is not None:
            # No free whitespace: a model could otherwise pad the output with it forever.
            return xgr.Grammar.from_json_schema(str(params.json), any_whitespace=False)
        if params.json_object:
            return xgr.Grammar.builtin_json_grammar()
        if params.regex is not None:
            return xgr.Grammar.from_regex(params.regex)
        if params.choice is not None:
            return xgr.Grammar.from_ebnf(choice_grammar(tuple(params.choice)))
        if params.structural_tag is not None:
            return xgr.Grammar.from_structural_tag(str(params.structural_tag))
        assert params.grammar is not None, "a StructuredOutputParams sets one field"
        return xgr.Grammar.from_ebnf(params.grammar)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise ValueError(f"invalid {params.kind}: {first_line(exc)}") from exc


def first_line(exc: BaseException) -> str:
    """An exception's message, first line only and bounded (xgrammar's can be long)."""
    text = str(exc).strip() or type(exc).__name__
    # xgrammar prefixes "[hh:mm:ss] /path/file.cc:line: "; the client needs only the rest.
    return re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", text.splitlines()[0])[:500]
