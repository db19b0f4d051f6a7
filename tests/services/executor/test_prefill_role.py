"""What a prefill executor asks of the engine, and how it marks what it hands on."""

from __future__ import annotations

from quire.sampling_params import SamplingParams
from services.common.wire.executor import HANDOFF
from services.executor.prefill_role import mark_handoffs, prefill_params
from services.rpc import executor_pb2 as pb


def test_a_prefill_run_is_the_request_with_one_token_per_output() -> None:
    params = SamplingParams(n=2, temperature=0.7, seed=5, max_tokens=20, logprobs=2)
    run = prefill_params(params, num_prompt_tokens=100, max_model_len=2048)
    assert run is not None and run.max_tokens == 1
    assert (run.n, run.temperature, run.seed, run.logprobs) == (2, 0.7, 5, 2)
    assert params.max_tokens == 20  # the caller's params are left as they were


def test_no_prefill_run_when_the_first_token_ends_the_request_anyway() -> None:
    assert prefill_params(SamplingParams(max_tokens=1), 100, 2048) is None
    # The first token fills the context: the output ends there by length, nothing to hand on.
    assert prefill_params(SamplingParams(max_tokens=20), 2047, 2048) is None
    assert prefill_params(SamplingParams(max_tokens=20), 2046, 2048) is not None


def test_only_length_finishes_become_handoffs() -> None:
    response = pb.GenerateResponse(
        outputs=[
            pb.CompletionDelta(index=0, token_ids=[7], finish_reason="length"),
            pb.CompletionDelta(index=1, token_ids=[2], finish_reason="stop"),
            pb.CompletionDelta(index=2, token_ids=[9]),
        ],
        finished=True,
    )
    mark_handoffs(response)
    assert [o.finish_reason for o in response.outputs] == [HANDOFF, "stop", ""]
