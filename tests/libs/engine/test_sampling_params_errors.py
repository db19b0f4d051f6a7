"""Invalid sampling parameters raise ParamError naming their field (the API's 400 names it)."""

from __future__ import annotations

from typing import Any

import pytest

from quire.sampling_params import ParamError, SamplingParams


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 0}, "n"),
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"min_p": 2.0}, "min_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"logprobs": 99}, "logprobs"),
        ({"presence_penalty": 3.0}, "presence_penalty"),
        ({"frequency_penalty": -3.0}, "frequency_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"stop": [""]}, "stop"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"prompt_logprobs": -1}, "prompt_logprobs"),
        ({"logit_bias": {1: 1000.0}}, "logit_bias"),
    ],
)
def test_each_invalid_field_is_named(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(ParamError) as info:
        SamplingParams(**fields)
    assert info.value.param == param
    assert isinstance(info.value, ValueError)  # callers that catch ValueError still do


def test_a_token_outside_the_vocab_is_named() -> None:
    with pytest.raises(ParamError) as info:
        SamplingParams(logit_bias={50: 1.0}).check_vocab(10)
    assert info.value.param == "logit_bias"
