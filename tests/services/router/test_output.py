"""OutputState and Admission on their own: detokenization, stops, hold-back, bounds."""

from __future__ import annotations

from typing import Any

import pytest

from quire.sampling_params import SamplingParams
from services.router.admission import Admission
from services.router.output import OutputState, TokenText
from services.rpc import executor_pb2 as pb


def feed(state: OutputState, token_ids: list[int], finish: str = "") -> str:
    """Feed tokens one message each; return the text taken along the way."""
    taken = ""
    for i, token_id in enumerate(token_ids):
        last = i == len(token_ids) - 1
        state.add(pb.CompletionDelta(token_ids=[token_id], finish_reason=finish if last else ""))
        taken += state.take_text()
    return taken


def test_stream_holds_back_a_possible_stop_prefix(tokenizer: Any) -> None:
    ids = tokenizer.encode("hello world and more", add_special_tokens=False)
    state = OutputState(tokenizer, [1], SamplingParams(stop=["o w", "xyz"]), stream=True)
    state.add(pb.CompletionDelta(token_ids=ids[:1]))
    assert state.take_text() == tokenizer.decode(ids[:1])[:-2]  # 2 = len("xyz") - 1
    state.add(pb.CompletionDelta(token_ids=ids[1:]))
    assert state.take_text() == "l"
    assert (state.text, state.finish_reason, state.stop_reason) == ("hell", "stop", "o w")
    assert len(state.token_ids) == 2  # tokens after the stop are not ours


def test_include_stop_str_and_stop_token_ids(tokenizer: Any) -> None:
    ids = tokenizer.encode("hello world and more", add_special_tokens=False)
    keep = OutputState(
        tokenizer, [1], SamplingParams(stop=["world"], include_stop_str_in_output=True), False
    )
    feed(keep, ids)
    assert keep.text == "hello world"
    by_id = OutputState(tokenizer, [1], SamplingParams(stop_token_ids=[ids[1]]), False)
    feed(by_id, ids)
    assert (by_id.finish_reason, by_id.stop_reason) == ("stop", ids[1])
    assert by_id.token_ids == ids[:2]


def test_executor_finish_and_stop_reason(tokenizer: Any) -> None:
    state = OutputState(tokenizer, [1], SamplingParams(), stream=True)
    state.add(pb.CompletionDelta(token_ids=[50, 2], finish_reason="stop", stop_reason="2"))
    assert (state.finish_reason, state.stop_reason) == ("stop", 2)
    assert state.take_text() == tokenizer.decode([50])
    state.add(pb.CompletionDelta(token_ids=[51]))  # after the finish: ignored
    assert state.token_ids == [50, 2]


def test_token_text_bytes_of_partial_characters(tokenizer: Any) -> None:
    token_text = TokenText(tokenizer)
    ids = tokenizer.encode("日本", add_special_tokens=False)
    raw = b"".join(bytes(token_text.get(i)[1]) for i in ids)
    assert raw.decode("utf-8") == "日本"
    assert token_text.get(1) == ("<s>", list(b"<s>"))


def test_admission_bounds() -> None:
    admission = Admission(max_pending_per_executor=2, max_pending_total=3)
    assert admission.try_acquire("a") and admission.try_acquire("a")
    assert not admission.try_acquire("a")
    assert admission.full_executors() == {"a"}
    assert admission.try_acquire("b")
    assert not admission.can_admit() and not admission.try_acquire("c")
    admission.release("a")
    assert admission.full_executors() == set() and admission.can_admit()
    assert admission.pending("a") == 1 and admission.num_pending == 2
    with pytest.raises(ValueError):
        Admission(0, 1)


def test_admission_tickets_hold_a_place_until_they_become_slots() -> None:
    admission = Admission(max_pending_per_executor=2, max_pending_total=2)
    first, second = admission.enter(), admission.enter()
    assert first is not None and second is not None
    assert admission.enter() is None  # two tickets fill the overall bound
    assert not admission.try_acquire("a")  # no ticket: no place left for it
    # A ticket turns into its slot without counting twice ...
    assert admission.try_acquire("a", first) and not first.held
    assert (admission.num_pending, admission.num_entering) == (1, 1)
    assert admission.can_admit(1, second) and not admission.can_admit(2, second)
    # ... and a used ticket is no longer a pass past the overall bound.
    assert not admission.try_acquire("b", first)
    admission.leave(first)  # leaving after conversion gives nothing back twice
    assert (admission.num_pending, admission.num_entering) == (1, 1)
    admission.leave(second)  # a request refused after the door gives its place back
    assert admission.num_taken == 1 and admission.enter() is not None
    # The per-executor bound holds for ticket holders too.
    one = Admission(max_pending_per_executor=1, max_pending_total=4)
    ticket = one.enter()
    assert one.try_acquire("a") and not one.try_acquire("a", ticket)
    assert ticket is not None and ticket.held
