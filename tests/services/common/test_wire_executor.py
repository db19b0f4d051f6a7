"""The executor contract's codec: sampling params and step deltas, both directions."""

from __future__ import annotations

import pytest

from quire.outputs import Logprob, RequestDelta, SequenceDelta
from quire.sampling_params import SamplingParams
from quire.structured_params import StructuredOutputParams
from services.common.wire.executor import (
    aborted_response,
    delta_from_proto,
    delta_to_proto,
    params_from_proto,
    params_to_proto,
)
from services.rpc import executor_pb2 as pb


def test_unset_proto_fields_take_sampling_params_defaults() -> None:
    assert params_from_proto(pb.SamplingParams()) == SamplingParams()


def test_set_proto_fields_are_kept() -> None:
    msg = pb.SamplingParams(
        n=2,
        temperature=0.0,
        top_p=0.5,
        top_k=5,
        seed=3,
        max_tokens=9,
        stop_token_ids=[7],
        logprobs=0,
        repetition_penalty=1.5,
        ignore_eos=True,
        min_p=0.25,
    )
    params = params_from_proto(msg)
    assert (params.n, params.temperature, params.top_p, params.top_k) == (2, 0.0, 0.5, 5)
    assert (params.seed, params.max_tokens, params.stop_token_ids) == (3, 9, [7])
    assert (params.logprobs, params.repetition_penalty, params.min_p) == (0, 1.5, 0.25)
    assert params.ignore_eos is True


def test_params_round_trip_without_the_text_settings() -> None:
    params = SamplingParams(
        n=3,
        temperature=0.7,
        top_p=0.9,
        top_k=40,
        min_p=0.05,
        seed=2**64 + 5,  # the wire holds uint64
        max_tokens=33,
        stop=["never sent"],
        stop_token_ids=[4, 9],
        logprobs=3,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        repetition_penalty=1.25,
        include_stop_str_in_output=True,
        skip_special_tokens=False,
    )
    back = params_from_proto(params_to_proto(params))
    text_fields = {"stop": [], "include_stop_str_in_output": False, "skip_special_tokens": True}
    expected = SamplingParams(**{**vars(params), **text_fields, "seed": 5})
    assert back.temperature == pytest.approx(0.7) and back.top_p == pytest.approx(0.9)
    assert vars(back) == {
        **vars(expected),
        "temperature": back.temperature,
        "top_p": back.top_p,
        "min_p": back.min_p,
        "repetition_penalty": back.repetition_penalty,
    }


def test_invalid_proto_params_raise_value_error() -> None:
    with pytest.raises(ValueError, match="top_p"):
        params_from_proto(pb.SamplingParams(top_p=1.5))
    with pytest.raises(ValueError, match="finite"):
        params_from_proto(pb.SamplingParams(temperature=float("nan")))


def test_deltas_round_trip_with_logprobs_and_stop_ids() -> None:
    # top-2 plus the sampled token (rank 7), as the sampler builds them
    top = {11: Logprob(-0.5, 1), 12: Logprob(-1.5, 2), 30: Logprob(-4.0, 7)}
    delta = RequestDelta(
        "r",
        [
            SequenceDelta(0, [30], [top], cumulative_logprob=-4.0),
            SequenceDelta(1, [2], [{2: Logprob(-0.1, 1)}], -0.1, "stop", 2),
        ],
        finished=False,
        num_prompt_tokens=5,
        num_cached_tokens=4,
    )
    message = delta_to_proto(delta, num_top_logprobs=2)
    assert [list(d.token_ids) for d in message.outputs] == [[30], [2]]
    back = delta_from_proto("r", message)
    assert back.num_prompt_tokens == 5 and back.num_cached_tokens == 4 and not back.finished
    first, second = back.outputs
    assert first.new_logprobs is not None
    assert {t: (lp.rank, round(lp.logprob, 3)) for t, lp in first.new_logprobs[0].items()} == {
        11: (1, -0.5),
        12: (2, -1.5),
        30: (7, -4.0),
    }
    assert (first.finish_reason, first.stop_reason, first.cumulative_logprob) == (None, None, -4.0)
    assert (second.finish_reason, second.stop_reason) == ("stop", 2)


def test_no_logprobs_asked_means_none_on_both_sides() -> None:
    delta = RequestDelta("r", [SequenceDelta(0, [5, 6])], True, 3)
    back = delta_from_proto("r", delta_to_proto(delta, 0))
    assert back.outputs[0].new_logprobs is None and back.finished


def test_aborted_response_marks_every_unfinished_output() -> None:
    message = aborted_response([0, 2], num_prompt_tokens=2, num_cached_tokens=1)
    assert message.finished and message.num_cached_tokens == 1
    assert [(d.index, d.finish_reason) for d in message.outputs] == [(0, "abort"), (2, "abort")]


def test_load_is_one_record_in_redis_and_in_get_status() -> None:
    from quire.cluster.redis_keys import ExecutorLoad, ExecutorRecord
    from services.common.wire.executor import load_from_proto, load_to_proto

    load = ExecutorLoad(
        num_running=3, num_waiting=1, kv_blocks_total=64, kv_blocks_used=40, kv_blocks_cached=9
    )
    assert load_from_proto(load_to_proto(load)) == load
    record = ExecutorRecord("ex", "h:1", 5, "m", load=load, draining=True)
    assert ExecutorRecord.decode(record.encode()) == record
    # A record without a load (another version's) decodes with an empty one.
    bare = ExecutorRecord.decode(
        b"\x84\xabexecutor_id\xa2ex\xa7address\xa3h:1\xa5epoch\x05\xa5model\xa1m"
    )
    assert bare.load == ExecutorLoad() and bare.epoch == 5


def test_logit_bias_and_prompt_logprobs_cross_the_wire() -> None:
    params = SamplingParams(logit_bias={7: 100.0, 3: -2.5}, prompt_logprobs=0)
    back = params_from_proto(params_to_proto(params))
    assert (back.logit_bias, back.prompt_logprobs) == ({7: 100.0, 3: -2.5}, 0)
    assert params_from_proto(params_to_proto(SamplingParams())).prompt_logprobs is None
    for bias in (float("nan"), float("inf"), 101.0):
        with pytest.raises(ValueError, match="logit_bias"):
            params_from_proto(pb.SamplingParams(logit_bias={1: bias}))


def test_prompt_logprobs_are_named_by_the_prompt_ids() -> None:
    # Entry j scores prompt token j + 1: once among the top-k, once after them.
    entries = [
        {5: Logprob(-0.125, 1), 9: Logprob(-2.0, 2)},
        {5: Logprob(-0.25, 1), 8: Logprob(-3.0, 7)},
    ]
    delta = RequestDelta("r", [], False, 3, prompt_logprobs=entries)
    msg = delta_to_proto(delta, 0, [1, 9, 8], num_prompt_top_logprobs=1)
    assert [lp.token_id for lp in msg.prompt_logprobs] == [9, 8]
    assert [[t.token_id for t in lp.top] for lp in msg.prompt_logprobs] == [[5], [5]]
    assert delta_from_proto("r", msg).prompt_logprobs == entries
    assert (
        delta_from_proto("r", delta_to_proto(RequestDelta("r", [], False, 3), 0)).prompt_logprobs
        is None
    )


@pytest.mark.parametrize(
    "spec",
    [
        StructuredOutputParams(json={"type": "object", "properties": {"a": {"type": "integer"}}}),
        StructuredOutputParams(regex=r"\d+"),
        StructuredOutputParams(choice=["yes", "no"]),
        StructuredOutputParams(grammar='root ::= "a" | "b"'),
        StructuredOutputParams(json_object=True),
        StructuredOutputParams(
            structural_tag={
                "type": "structural_tag",
                "format": {"type": "const_string", "value": "hi"},
            }
        ),
    ],
    ids=["json", "regex", "choice", "grammar", "json_object", "structural_tag"],
)
def test_structured_outputs_round_trip(spec: StructuredOutputParams) -> None:
    params = SamplingParams(max_tokens=5, structured=spec)
    wire = params_to_proto(params)
    back = params_from_proto(pb.SamplingParams.FromString(wire.SerializeToString()))
    assert back.structured == spec
    assert params_from_proto(pb.SamplingParams()).structured is None


def test_structured_output_without_a_constraint_is_refused() -> None:
    msg = pb.SamplingParams(structured=pb.StructuredOutput())
    with pytest.raises(ValueError, match="no constraint"):
        params_from_proto(msg)
