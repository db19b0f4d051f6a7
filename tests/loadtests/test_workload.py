"""The Locust workload without Locust: lengths, tenants, context limits, env configuration."""

from __future__ import annotations

import random
import statistics
from pathlib import Path
from typing import Any

import pytest
from quire_tools.workloads.lengths import lognormal_length

from loadtests.workload import (
    LoadConfig,
    plan_request,
    tenant_system_prompts,
    words_for,
)
from services.router.prompts import load_tokenizer

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_tokenizer(str(REPO / "models" / "quire-tiny"))


def test_lognormal_lengths_keep_the_mean_and_the_caps() -> None:
    rng = random.Random(0)
    samples = [lognormal_length(rng, 161, 0.9, 1, 100_000) for _ in range(20_000)]
    assert statistics.fmean(samples) == pytest.approx(161, rel=0.05)
    capped = [lognormal_length(rng, 338, 0.8, 1, 64) for _ in range(2_000)]
    assert max(capped) == 64 and min(capped) >= 1


def test_text_length_is_close_in_tokens(tokenizer: Any) -> None:
    rng = random.Random(1)
    for num_tokens in (64, 161, 600):
        got = len(tokenizer.encode(words_for(num_tokens, rng), add_special_tokens=False))
        assert got == pytest.approx(num_tokens, rel=0.1), (num_tokens, got)


def test_tenants_are_fixed_and_distinct() -> None:
    config = LoadConfig(num_tenants=3, system_tokens=50)
    prompts = tenant_system_prompts(config)
    assert prompts == tenant_system_prompts(config)  # same text in every process
    assert len(set(prompts)) == 3
    assert all(p.startswith(f"You are the assistant of tenant {i}.") for i, p in enumerate(prompts))


def test_plans_fit_the_context(tokenizer: Any) -> None:
    config = LoadConfig(system_tokens=200, max_prompt_tokens=4096, max_tokens=4096)
    system = tenant_system_prompts(config)[0]
    rng = random.Random(2)
    for _ in range(200):
        plan = plan_request(config, system, rng, max_model_len=1024)
        body = plan.chat_body(config, "quire-tiny")
        num_prompt = len(tokenizer.apply_chat_template(body["messages"], tokenize=True))
        assert num_prompt + plan.max_tokens <= 1024
        assert body["stream"] and body["stream_options"] == {"include_usage": True}
    completion = plan.completion_body(config, "")
    assert "model" not in completion and completion["prompt"].startswith(system)


def test_config_from_env() -> None:
    config = LoadConfig.from_env(
        {"QUIRE_LOAD_MAX_TOKENS": "24", "QUIRE_LOAD_IGNORE_EOS": "0", "QUIRE_LOAD_MODEL": "m"}
    )
    assert (config.max_tokens, config.ignore_eos, config.model) == (24, False, "m")
    assert config.prompt_mean == 161.0 and config.output_mean == 338.0
    with pytest.raises(ValueError, match="max_tokens"):
        LoadConfig.from_env({"QUIRE_LOAD_MAX_TOKENS": "0"})


def test_sharegpt_requests_are_real_prompts_within_the_caps(tokenizer: Any) -> None:
    from loadtests.workload import plan_sharegpt_request, sharegpt_pool

    config = LoadConfig(
        tokenizer=str(REPO / "models" / "quire-tiny"),
        data=str(REPO / "data" / "sharegpt" / "ShareGPT_V3_unfiltered_cleaned_split.json"),
        pool_size=20,
        max_prompt_tokens=64,
        max_tokens=32,
        system_tokens=50,
    )
    pool = sharegpt_pool(config)
    assert len(pool) == 20 and pool == sharegpt_pool(config)  # seeded: the same in every process
    system = tenant_system_prompts(config)[0]
    for prompt in pool:
        plan = plan_sharegpt_request(config, system, prompt, 2048, tokenizer.decode)
        assert 1 <= plan.max_tokens <= min(32, prompt.output_len)
        if len(prompt.token_ids) <= 64:
            assert plan.user == prompt.text
        else:
            assert len(tokenizer.encode(plan.user, add_special_tokens=False)) <= 64 + 2
    with pytest.raises(ValueError, match="dataset"):
        LoadConfig(dataset="lognormal")
