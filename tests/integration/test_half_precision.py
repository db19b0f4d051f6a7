"""Served bfloat16 against transformers in bfloat16 (tolerances: tests/libs/engine/
half_precision.py): greedy tokens, their logprobs and the prompt's, through the router."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator

import httpx
import pytest
import torch

from services.stack.ports import stack_ports
from services.stack.runner import Stack
from tests.integration.conftest import REPO, running_stack
from tests.libs.engine.half_precision import Agreement, HalfPrecisionOracle

PROMPT_LENGTHS = [1, 9, 16, 33, 80]


@pytest.fixture(scope="module")
def bfloat16_stack(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The shared stack where it serves bfloat16 (a CPU with AVX512_BF16 or AMX), else a stack of
    one bfloat16 executor of its own."""
    if stack.config.executor_dtype == "bfloat16":
        yield stack
        return
    ports = stack_ports(1)
    config = dataclasses.replace(
        stack.config,
        **ports,
        num_executors=1,
        executor_dtype="bfloat16",
        redis_prefix=f"quire-test-{ports['executor_base_port']}",
    )
    with running_stack(config, tmp_path_factory.mktemp("bfloat16-stack")) as s:
        yield s


def test_served_bfloat16_matches_transformers_in_bfloat16(bfloat16_stack: Stack) -> None:
    stack = bfloat16_stack
    assert stack.config.executor_dtype == "bfloat16"
    path = REPO / "models" / "quire-tiny"
    oracle = HalfPrecisionOracle(path, torch.bfloat16)
    vocab_size = oracle.model.config.vocab_size
    rng = random.Random(29)
    agreement = Agreement("served quire-tiny bfloat16")
    for n in PROMPT_LENGTHS:
        prompt = [rng.randrange(3, vocab_size) for _ in range(n)]
        body = {
            "model": "quire-tiny",
            "prompt": prompt,
            "max_tokens": 16,
            "temperature": 0,
            "ignore_eos": True,
            "logprobs": 0,
            "prompt_logprobs": 0,
            "return_token_ids": True,
        }
        response = httpx.post(f"{stack.config.router_url}/v1/completions", json=body, timeout=60)
        assert response.status_code == 200, response.text
        choice = response.json()["choices"][0]
        assert choice["prompt_token_ids"] == prompt
        prompt_lps = [
            entry[str(token)]["logprob"]
            for entry, token in zip(choice["prompt_logprobs"][1:], prompt[1:], strict=True)
        ]
        agreement.check(
            oracle, prompt, choice["token_ids"], choice["logprobs"]["token_logprobs"], prompt_lps
        )
    agreement.assert_as_accurate()
    print(agreement.summary())
