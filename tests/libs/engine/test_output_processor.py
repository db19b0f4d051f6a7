"""The output processor on its own: detokenization, stop strings, hold-back, finish reasons."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from quire.engine.output_processor import OutputProcessor, SequenceText, top_alternatives
from quire.outputs import Logprob, RequestDelta, SequenceDelta
from quire.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model, local_files_only=True)


def delta(
    token_ids: list[int], finish: str | None = None, stop: int | None = None
) -> SequenceDelta:
    return SequenceDelta(0, token_ids, finish_reason=finish, stop_reason=stop)


def feed(state: SequenceText, token_ids: list[int], finish: str | None = None) -> str:
    """Feed tokens one delta each; return the text taken along the way."""
    taken = ""
    for i, token_id in enumerate(token_ids):
        state.add(delta([token_id], finish if i == len(token_ids) - 1 else None))
        taken += state.take_text()
    return taken


def test_stream_holds_back_a_possible_stop_prefix(tokenizer: Any) -> None:
    ids = tokenizer.encode("hello world and more", add_special_tokens=False)
    state = SequenceText(tokenizer, [1], SamplingParams(stop=["o w", "xyz"]), stream=True)
    assert not state.add(delta(ids[:1]))
    assert state.take_text() == tokenizer.decode(ids[:1])[:-2]  # 2 = len("xyz") - 1
    assert state.add(delta(ids[1:]))  # the stop string completes: the caller ends it
    assert state.take_text() == "l"
    assert (state.text, state.finish_reason, state.stop_reason) == ("hell", "stop", "o w")
    assert len(state.token_ids) == 2  # tokens after the stop are not ours
    assert not state.add(delta([5], "abort"))  # what the engine made meanwhile is ignored
    assert state.finish_reason == "stop" and len(state.token_ids) == 2


def test_streamed_and_whole_text_agree_with_a_stop_split_across_tokens(tokenizer: Any) -> None:
    text = "naïve café 漢字 déjà vu, the end"
    ids = tokenizer.encode(text, add_special_tokens=False)
    for stop in ("é 漢", "字 d", ", the"):
        streamed = SequenceText(tokenizer, [1], SamplingParams(stop=[stop]), stream=True)
        whole = SequenceText(tokenizer, [1], SamplingParams(stop=[stop]), stream=False)
        taken = feed(streamed, ids)
        feed(whole, ids)
        assert taken == streamed.text == whole.text == text[: text.index(stop)]
        assert streamed.stop_reason == stop


def test_include_stop_str_and_stop_token_ids(tokenizer: Any) -> None:
    ids = tokenizer.encode("hello world and more", add_special_tokens=False)
    keep = SequenceText(
        tokenizer, [1], SamplingParams(stop=["world"], include_stop_str_in_output=True), False
    )
    feed(keep, ids)
    assert keep.text == "hello world"
    # The engine stops on a stop token id; the processor takes its reason.
    by_id = SequenceText(tokenizer, [1], SamplingParams(stop_token_ids=[ids[1]]), False)
    by_id.add(delta(ids[:2], "stop", ids[1]))
    assert (by_id.finish_reason, by_id.stop_reason) == ("stop", ids[1])
    assert by_id.token_ids == ids[:2]


def test_engine_stop_on_the_last_token_wins_over_a_stop_string(tokenizer: Any) -> None:
    ids = tokenizer.encode("hello world", add_special_tokens=False)
    stop = tokenizer.decode(ids[-1:]).strip()
    state = SequenceText(tokenizer, [1], SamplingParams(stop=[stop]), stream=False)
    state.add(delta(ids, "stop", ids[-1]))
    assert (state.finish_reason, state.stop_reason) == ("stop", ids[-1])


def test_logprobs_and_alternatives_by_rank(tokenizer: Any) -> None:
    state = SequenceText(tokenizer, [1], SamplingParams(logprobs=2), stream=False)
    top = {7: Logprob(-0.1, 1), 8: Logprob(-2.0, 2), 50: Logprob(-5.0, 9)}
    state.add(SequenceDelta(0, [50], new_logprobs=[top], cumulative_logprob=-5.0))
    token_ids, logprobs, offsets = state.take_tokens()
    assert (token_ids, offsets, state.cumulative_logprob) == ([50], [0], -5.0)
    assert top_alternatives(logprobs[0], state.num_logprobs) == [(7, -0.1), (8, -2.0)]
    assert state.take_tokens() == ([], [], [])


def test_processor_builds_whole_outputs_and_reports_stop_strings(tokenizer: Any) -> None:
    processor = OutputProcessor(tokenizer)
    ids = tokenizer.encode("one two three", add_special_tokens=False)
    processor.add_request("r", "p", [1], SamplingParams(n=2, stop=["two"]))

    def step(index: int, token_id: int, finish: str | None = None) -> RequestDelta:
        seq = SequenceDelta(index, [token_id], finish_reason=finish)
        return RequestDelta("r", [seq], finished=False, num_prompt_tokens=1, num_cached_tokens=1)

    first = processor.process([step(0, ids[0]), step(1, ids[0])])
    assert first.finished == [] and first.stopped == []
    second = processor.process([step(0, ids[1])])
    assert second.stopped == [("r", [0])] and second.finished == []
    third = processor.process([step(0, ids[2]), step(1, ids[1], "length")])
    assert third.stopped == [("r", [1])]  # a stop string beats a length finish
    [output] = third.finished
    assert [(o.index, o.text, o.finish_reason, o.stop_reason) for o in output.outputs] == [
        (0, "one ", "stop", "two"),
        (1, "one ", "stop", "two"),
    ]
    assert output.outputs[0].token_ids == ids[:2] and output.num_cached_tokens == 1
    assert not processor.has_unfinished_requests()
    assert processor.process([step(0, ids[2])]).finished == []  # late deltas are ignored
