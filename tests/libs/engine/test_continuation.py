"""A continuation (one output resumed from its first tokens) goes on exactly as the output
would have: same tokens, logprobs, cumulative logprob and finish, for greedy and seeded
sampling, n > 1 outputs, penalties over the output and a grammar part-way through."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from quire import LLM, SamplingParams
from quire.engine.inputs import Continuation
from quire.engine.llm_engine import LLMEngine
from quire.outputs import Logprob
from quire.structured_params import StructuredOutputParams

PROMPT = [random.Random(7).randrange(3, 1000) for _ in range(21)]
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 6}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@dataclass
class Output:
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    cumulative: list[float] = field(default_factory=list)  # after each token
    finish_reason: str | None = None


@pytest.fixture(scope="module")
def engine(tiny_model: Path) -> LLMEngine:
    # float32: the check is on the continuation, not on rounding (a continuation computes
    # the output's first tokens as one prefill, the original one decode step at a time).
    return LLM(model=str(tiny_model), dtype="float32").engine


def run(
    engine: LLMEngine,
    request_id: str,
    params: SamplingParams,
    continuation: Continuation | None = None,
) -> tuple[dict[int, Output], int]:
    """Every output's deltas, by the index they carry, and the prompt tokens reported."""
    engine.add_request(request_id, {"prompt_token_ids": PROMPT}, params, continuation)
    outputs: dict[int, Output] = {}
    num_prompt_tokens = 0
    while engine.has_unfinished_requests():
        for delta in engine.step().outputs:
            num_prompt_tokens = delta.num_prompt_tokens
            for seq in delta.outputs:
                out = outputs.setdefault(seq.index, Output())
                out.token_ids += seq.new_token_ids
                out.logprobs += seq.new_logprobs or []
                out.cumulative += [seq.cumulative_logprob] * len(seq.new_token_ids)
                out.finish_reason = seq.finish_reason or out.finish_reason
    return outputs, num_prompt_tokens


def resumed(whole: Output, index: int, k: int) -> Continuation:
    return Continuation(index, tuple(whole.token_ids[:k]), whole.cumulative[k - 1])


def assert_continues(whole: Output, rest: Output, k: int) -> None:
    assert rest.token_ids == whole.token_ids[k:], k
    expected = whole.logprobs[k:]
    assert [{t: lp.rank for t, lp in top.items()} for top in rest.logprobs] == [
        {t: lp.rank for t, lp in top.items()} for top in expected
    ]
    values = [lp.logprob for top in rest.logprobs for lp in top.values()]
    assert values == pytest.approx(
        [lp.logprob for top in expected for lp in top.values()], abs=1e-4
    )
    assert rest.cumulative == pytest.approx(whole.cumulative[k:], abs=1e-4)
    assert rest.finish_reason == whole.finish_reason


def test_seeded_outputs_with_penalties_continue_exactly(engine: LLMEngine) -> None:
    """n = 2, seeded, with penalties that see the output (not the prompt) and logprobs: each
    output resumed after k tokens makes the rest of that output, under its own index."""
    params = SamplingParams(
        n=2,
        temperature=1.0,
        top_p=0.95,
        seed=11,
        max_tokens=14,
        ignore_eos=True,
        logprobs=2,
        frequency_penalty=1.5,
        presence_penalty=0.5,
        prompt_logprobs=1,
    )
    whole, num_prompt_tokens = run(engine, "whole", params)
    assert whole[0].token_ids != whole[1].token_ids
    for index in (0, 1):
        for k in (1, 9):
            rest, reported = run(
                engine, f"rest-{index}-{k}", params, resumed(whole[index], index, k)
            )
            assert list(rest) == [index]  # the one output, under its own index
            assert_continues(whole[index], rest[index], k)
            assert reported == num_prompt_tokens == len(PROMPT)  # the output is not prompt
    # The penalties matter here: without them the output goes elsewhere.
    plain = SamplingParams(
        n=2, temperature=1.0, top_p=0.95, seed=11, max_tokens=14, ignore_eos=True
    )
    assert run(engine, "plain", plain)[0][0].token_ids != whole[0].token_ids


def test_a_grammar_resumes_part_way(engine: LLMEngine) -> None:
    """Greedy under a JSON schema: the continuation's grammar has accepted the output's
    first tokens, so it ends the JSON where the original did."""
    params = SamplingParams(
        temperature=0, max_tokens=40, structured=StructuredOutputParams(json=SCHEMA)
    )
    whole = run(engine, "json", params)[0][0]
    assert whole.finish_reason == "stop"
    for k in (1, len(whole.token_ids) // 2, len(whole.token_ids) - 1):
        rest = run(engine, f"json-{k}", params, resumed(whole, 0, k))[0][0]
        assert_continues(whole, rest, k)


@pytest.mark.parametrize(
    ("continuation", "message"),
    [
        (Continuation(2, (5, 6)), "output_index 2"),
        (Continuation(0, tuple(range(3, 7))), "already has 4 of its 4 max_tokens"),
        (Continuation(0, (10**7,)), "token ids must be in"),
    ],
)
def test_impossible_continuations_are_refused(
    engine: LLMEngine, continuation: Continuation, message: str
) -> None:
    params = SamplingParams(n=2, temperature=1.0, seed=1, max_tokens=4)
    with pytest.raises(ValueError, match=message):
        engine.add_request("bad", {"prompt_token_ids": PROMPT}, params, continuation)
    assert not engine.has_unfinished_requests()


def test_a_continuation_breaking_its_grammar_is_refused(engine: LLMEngine) -> None:
    params = SamplingParams(temperature=0, structured=StructuredOutputParams(json=SCHEMA))
    not_json = tuple(engine.tokenizer.encode("hello"))
    with pytest.raises(ValueError, match="breaks its grammar"):
        engine.add_request("bad", {"prompt_token_ids": PROMPT}, params, Continuation(0, not_json))
    assert not engine.has_unfinished_requests()
