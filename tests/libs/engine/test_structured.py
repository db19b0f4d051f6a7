"""Structured outputs in the offline engine: random weights, so outputs are checked against
their grammar (regex and choice match, JSON parses and validates)."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import jsonschema
import pytest

from quire import LLM, SamplingParams, StructuredOutputParams

# Bounded schemas: a random model would otherwise write integers and strings forever. The
# string is bounded by a pattern, not maxLength: xgrammar 0.2.8's maxLength rule lets control
# characters (raw \x08, say) into the string, which is not JSON, and random weights find them.
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z]{1,6}$"},
        "role": {"enum": ["admin", "user", "guest"]},
        "active": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
    },
    "required": ["name", "role", "active", "tags"],
    "additionalProperties": False,
}
NESTED = {
    "type": "object",
    "properties": {
        "point": {
            "type": "object",
            "properties": {"x": {"enum": [0, 1, 2]}, "y": {"const": -1}},
            "required": ["x", "y"],
            "additionalProperties": False,
        },
        "ok": {"type": "boolean"},
    },
    "required": ["point", "ok"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def llm(tiny_model: Path) -> LLM:
    return LLM(model=str(tiny_model), max_model_len=512)


def texts(llm: LLM, prompt: str, params: SamplingParams) -> list[tuple[str, str | None]]:
    out = llm.generate([prompt], params, use_tqdm=False)[0]
    return [(o.text, o.finish_reason) for o in out.outputs]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("schema", [PERSON, NESTED], ids=["person", "nested"])
def test_json_schema_outputs_validate(llm: LLM, schema: dict, temperature: float) -> None:
    params = SamplingParams(
        temperature=temperature,
        seed=3,
        n=1 if temperature == 0 else 2,
        max_tokens=120,
        structured=StructuredOutputParams(json=schema),
    )
    for text, finish in texts(llm, "Describe someone:", params):
        assert finish == "stop", text
        jsonschema.validate(json.loads(text), schema)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_regex_and_choice_outputs_match(llm: LLM, temperature: float) -> None:
    pattern = r"[a-z]{2,5}-\d{2}( [A-Z])?"
    regex = SamplingParams(
        temperature=temperature,
        seed=1,
        n=4 if temperature else 1,
        max_tokens=40,
        structured=StructuredOutputParams(regex=pattern),
    )
    outputs = texts(llm, "An id:", regex)
    assert all(re.fullmatch(pattern, t) and f == "stop" for t, f in outputs), outputs
    choices = ["yes", "no", "maybe so", "日本"]
    choice = SamplingParams(
        temperature=temperature,
        seed=2,
        n=4 if temperature else 1,
        max_tokens=20,
        structured=StructuredOutputParams(choice=choices),
    )
    outputs = texts(llm, "Answer:", choice)
    assert all(t in choices and f == "stop" for t, f in outputs), outputs


def test_ebnf_grammar_and_json_object(llm: LLM) -> None:
    grammar = 'root ::= "(" num ("+" num)* ")"\nnum ::= [1-9]'
    params = SamplingParams(
        temperature=1.0,
        seed=4,
        n=2,
        max_tokens=40,
        structured=StructuredOutputParams(grammar=grammar),
    )
    for text, finish in texts(llm, "Sum:", params):
        if finish == "stop":
            assert re.fullmatch(r"\([1-9](\+[1-9])*\)", text), text
        else:  # cut by max_tokens: still a prefix the grammar allows
            assert finish == "length" and re.fullmatch(r"\([1-9](\+[1-9])*\+?", text), text
    obj = SamplingParams(
        temperature=0, max_tokens=60, structured=StructuredOutputParams(json_object=True)
    )
    text, finish = texts(llm, "JSON:", obj)[0]
    assert text.startswith("{"), text
    if finish == "stop":
        assert isinstance(json.loads(text), dict)


# A structural tag: a fixed prefix, then a tagged region whose content is under a schema.
TAGGED = {
    "type": "structural_tag",
    "format": {
        "type": "sequence",
        "elements": [
            {"type": "const_string", "value": "answer: "},
            {
                "type": "tag",
                "begin": "<n>",
                "content": {"type": "json_schema", "json_schema": {"enum": [1, 2, 3]}},
                "end": "</n>",
            },
        ],
    },
}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_structural_tag_outputs_match_and_compile_once(llm: LLM, temperature: float) -> None:
    params = SamplingParams(
        temperature=temperature,
        seed=6,
        n=2,
        max_tokens=30,
        structured=StructuredOutputParams(structural_tag=TAGGED),
    )
    for text, finish in texts(llm, "Tag:", params):
        assert finish == "stop" and re.fullmatch(r"answer: <n>[123]</n>", text), text
    masks = llm.engine.structured_outputs()
    compiled = masks.compile(StructuredOutputParams(structural_tag=json.dumps(TAGGED)))
    assert masks.compile(StructuredOutputParams(structural_tag=TAGGED)) is compiled


def test_grammar_end_stops_even_with_ignore_eos(llm: LLM) -> None:
    params = SamplingParams(
        temperature=0,
        max_tokens=50,
        ignore_eos=True,
        structured=StructuredOutputParams(choice=["alpha", "beta"]),
    )
    ((text, finish),) = texts(llm, "Pick:", params)
    assert text in ("alpha", "beta") and finish == "stop"


def test_unconstrained_rows_are_untouched_in_a_mixed_batch(llm: LLM) -> None:
    plain = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    alone = llm.generate(["Plain text here"], plain, use_tqdm=False)[0].outputs[0].token_ids
    structured = SamplingParams(
        temperature=0, max_tokens=60, structured=StructuredOutputParams(json=PERSON)
    )
    mixed = llm.generate(
        ["Plain text here", "Describe:", "Describe again:"],
        [plain, structured, structured],
        use_tqdm=False,
    )
    assert mixed[0].outputs[0].token_ids == alone
    jsonschema.validate(json.loads(mixed[1].outputs[0].text), PERSON)
    # A step with no constrained row does no grammar work at all.
    masks = llm.engine.structured_outputs()
    before = masks.num_masked_rows
    llm.generate(["Plain again", "And again"], plain, use_tqdm=False)
    assert masks.num_masked_rows == before


def test_masks_are_filled_on_the_grammar_thread(llm: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    masks = llm.engine.structured_outputs()
    threads: list[str] = []
    fill = masks._fill

    def spy(*args: object) -> object:
        threads.append(threading.current_thread().name)
        return fill(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(masks, "_fill", spy)
    fill_before = masks.fill_seconds
    params = SamplingParams(
        temperature=0, max_tokens=60, structured=StructuredOutputParams(json=PERSON)
    )
    out = llm.generate(["Describe:"], params, use_tqdm=False)[0].outputs[0]
    jsonschema.validate(json.loads(out.text), PERSON)
    # one fill per decoded token, each off the calling thread
    assert len(threads) == len(out.token_ids)
    assert all(name.startswith("quire-grammar") for name in threads)
    assert threading.current_thread().name not in threads
    assert masks.fill_seconds > fill_before


def test_constrained_sampling_survives_preemption(tiny_model: Path) -> None:
    pattern = r"[a-z]{50,70}"
    params = SamplingParams(
        temperature=1.0, seed=5, max_tokens=80, structured=StructuredOutputParams(regex=pattern)
    )
    prompts = [{"prompt_token_ids": [(7 * s + i) % 4000 + 10 for i in range(60)]} for s in range(6)]
    roomy = LLM(model=str(tiny_model)).generate(prompts, params, use_tqdm=False)
    tight = LLM(model=str(tiny_model), num_kv_blocks=12)
    cramped = tight.generate(prompts, params, use_tqdm=False)
    assert tight.stats().num_preemptions > 0
    for a, b in zip(roomy, cramped, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert re.fullmatch(pattern, b.outputs[0].text), b.outputs[0].text


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"regex": "(unclosed"}, "invalid regex"),
        ({"grammar": "root ::= missing_rule"}, "invalid grammar"),
        ({"json": {"type": "object", "properties": {"a": {"type": "nonsense"}}}}, "invalid json"),
        (
            {"structural_tag": {"type": "structural_tag", "format": {"type": "nonsense"}}},
            "invalid structural_tag",
        ),
    ],
)
def test_specs_that_do_not_compile_raise_and_queue_nothing(
    llm: LLM, spec: dict, message: str
) -> None:
    good = SamplingParams(max_tokens=4)
    bad = SamplingParams(max_tokens=4, structured=StructuredOutputParams(**spec))
    with pytest.raises(ValueError, match=message):
        llm.generate(["fine", "bad"], [good, bad], use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"regex": "a", "choice": ["b"]},
        {"choice": []},
        {"json": "not json"},
        {"regex": ""},
        {"structural_tag": "[1]"},
        {"structural_tag": "not json"},
    ],
)
def test_malformed_params_raise(kwargs: dict) -> None:
    with pytest.raises(ValueError, match="structured output"):
        StructuredOutputParams(**kwargs)
