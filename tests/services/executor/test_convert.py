"""Wire <-> engine translation: proto defaults, stop-string hold-back, deltas."""

from __future__ import annotations

import pytest

from quire.outputs import CompletionOutput, Logprob, RequestOutput
from quire.sampling_params import SamplingParams
from services.executor.convert import DeltaTracker, held_back_len, sampling_params_from_proto
from services.rpc import executor_pb2 as pb


def test_unset_proto_fields_take_sampling_params_defaults() -> None:
    assert sampling_params_from_proto(pb.SamplingParams()) == SamplingParams()


def test_set_proto_fields_are_kept() -> None:
    msg = pb.SamplingParams(
        n=2,
        temperature=0.0,
        top_p=0.5,
        top_k=5,
        seed=3,
        max_tokens=9,
        stop=["x"],
        stop_token_ids=[7],
        logprobs=0,
        repetition_penalty=1.5,
        skip_special_tokens=False,
    )
    params = sampling_params_from_proto(msg)
    assert (params.n, params.temperature, params.top_p, params.top_k) == (2, 0.0, 0.5, 5)
    assert (params.seed, params.max_tokens, params.stop, params.stop_token_ids) == (
        3,
        9,
        ["x"],
        [7],
    )
    assert (params.logprobs, params.repetition_penalty) == (0, 1.5)
    assert params.skip_special_tokens is False


def test_invalid_proto_params_raise_value_error() -> None:
    with pytest.raises(ValueError, match="top_p"):
        sampling_params_from_proto(pb.SamplingParams(top_p=1.5))


@pytest.mark.parametrize(
    ("text", "stops", "held"),
    [
        ("hello wor", ["world"], 3),
        ("hello", ["world"], 0),
        ("abcab", ["abcabd"], 5),
        ("x</", ["</s>", "/"], 2),
        ("", ["a"], 0),
    ],
)
def test_held_back_len(text: str, stops: list[str], held: int) -> None:
    assert held_back_len(text, stops) == held


def _output(text: str, ids: list[int], reason: str | None = None) -> RequestOutput:
    logprobs = [{t: Logprob(-1.0, 1)} for t in ids]
    completion = CompletionOutput(0, text, ids, logprobs=logprobs, finish_reason=reason)
    return RequestOutput("r", None, [1, 2], [completion], finished=reason is not None)


def test_deltas_hold_back_a_possible_stop_string() -> None:
    tracker = DeltaTracker(SamplingParams(stop=["STOP"], logprobs=1))
    first = tracker.response(_output("ab ST", [5, 6]))
    assert first is not None
    assert (first.outputs[0].text, list(first.outputs[0].token_ids)) == ("ab ", [5, 6])
    assert len(first.outputs[0].logprobs) == 2
    # The prefix did not become a stop string: it is released with the next token.
    second = tracker.response(_output("ab STx", [5, 6, 8]))
    assert second is not None
    assert (second.outputs[0].text, list(second.outputs[0].token_ids)) == ("STx", [8])
    last = tracker.response(_output("ab STx", [5, 6, 8, 2], reason="stop"))
    assert last is not None and last.finished
    assert (last.outputs[0].text, last.outputs[0].finish_reason) == ("", "stop")


def test_abort_releases_held_text_and_marks_every_output() -> None:
    tracker = DeltaTracker(SamplingParams(n=2, stop=["STOP"]))
    tracker.response(_output("ab ST", [5, 6]))
    message = tracker.aborted(num_prompt_tokens=2)
    assert message.finished
    assert [(d.index, d.text, d.finish_reason) for d in message.outputs] == [
        (0, "ST", "abort"),
        (1, "", "abort"),
    ]
