"""Sampling through the engine: n>1 forks with copy-on-write, seeds, stops, logprobs, penalties."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch

from quire import LLM, SamplingParams
from tests.libs.engine.conftest import HFOracle, Reference, assert_matches_reference


@pytest.fixture(scope="module")
def llm(tiny_model: Path) -> LLM:
    return LLM(model=str(tiny_model))


def ids(n: int, seed: int = 0) -> dict[str, list[int]]:
    rng = random.Random(seed)
    return {"prompt_token_ids": [rng.randrange(3, 1000) for _ in range(n)]}


def test_n4_shares_prompt_blocks_and_copies_on_write(llm: LLM) -> None:
    engine = llm.engine
    prompt = ids(40)  # two full blocks + 8 tokens in a partial third block
    params = SamplingParams(n=4, temperature=1.0, seed=3, max_tokens=20, ignore_eos=True)
    copies_before = engine.allocator.stats().num_copies
    engine.add_request("fork", prompt, params)
    peak_used = 0
    tokens: dict[int, list[int]] = {}
    finished = False
    while engine.has_unfinished_requests():
        for out in engine.step().outputs:
            for seq in out.outputs:
                tokens.setdefault(seq.index, []).extend(seq.new_token_ids)
            finished = out.finished
        peak_used = max(peak_used, engine.allocator.stats().num_blocks_used)
    assert finished
    assert sorted(tokens) == [0, 1, 2, 3]
    assert all(len(t) == 20 for t in tokens.values())
    separate = 4 * math.ceil((40 + 20) / 16)
    assert peak_used < separate, f"n=4 used {peak_used} blocks, 4 separate requests use {separate}"
    # The shared partial block is written by all four: the first three copy it.
    assert engine.allocator.stats().num_copies - copies_before >= 3
    texts = {tuple(t) for t in tokens.values()}
    assert len(texts) > 1, "four seeded samples at temperature 1 should not all coincide"
    assert engine.allocator.stats().num_blocks_used == 0


def test_seeded_sampling_is_reproducible_whatever_the_batch(llm: LLM) -> None:
    params = SamplingParams(temperature=0.9, top_p=0.9, top_k=50, seed=1234, max_tokens=24)
    alone = llm.generate([ids(30, 1)], params, use_tqdm=False)[0].outputs[0].token_ids
    others = [ids(n, n) for n in (5, 50, 17)]
    unseeded = SamplingParams(temperature=1.0, max_tokens=30)
    mixed = llm.generate(others + [ids(30, 1)], [unseeded] * 3 + [params], use_tqdm=False)
    assert mixed[3].outputs[0].token_ids == alone
    other_seed = SamplingParams(temperature=0.9, top_p=0.9, top_k=50, seed=99, max_tokens=24)
    assert llm.generate([ids(30, 1)], other_seed, use_tqdm=False)[0].outputs[0].token_ids != alone


def test_seeded_sampling_survives_preemption(tiny_model: Path) -> None:
    params = SamplingParams(temperature=1.0, seed=5, max_tokens=40, ignore_eos=True)
    prompts = [ids(60, s) for s in range(6)]
    # float32: the check is on the draws, not on rounding. In bfloat16 a recomputed
    # prefix's KV is rounded from a larger batch's product than the decode steps that first
    # wrote it (float32-widened weights from 32 rows up), and one bfloat16 ulp can move a
    # sampled token.
    roomy = LLM(model=str(tiny_model), dtype="float32").generate(prompts, params, use_tqdm=False)
    tight = LLM(model=str(tiny_model), dtype="float32", num_kv_blocks=12)
    cramped = tight.generate(prompts, params, use_tqdm=False)
    assert tight.stats().num_preemptions > 0
    for a, b in zip(roomy, cramped, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids


def test_a_seeded_continuation_draws_what_the_original_would_have(tiny_model: Path) -> None:
    """Draws are keyed on (seed, output index, position): the prompt plus an output's first k
    tokens, sent again with the same seed, continues with that output's next tokens, as an
    executor continuing a request elsewhere must."""
    llm = LLM(model=str(tiny_model), dtype="float32")
    prompt = ids(23, 4)["prompt_token_ids"]
    params = SamplingParams(temperature=1.0, top_p=0.95, seed=31, max_tokens=20, ignore_eos=True)
    whole = (
        llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0].outputs[0].token_ids
    )
    for k in (1, 9, 16):
        rest = SamplingParams(
            temperature=1.0, top_p=0.95, seed=31, max_tokens=20 - k, ignore_eos=True
        )
        again = llm.generate([{"prompt_token_ids": prompt + list(whole[:k])}], rest, use_tqdm=False)
        assert list(again[0].outputs[0].token_ids) == list(whole[k:]), k
    # The draws do depend on the seed: another one parts somewhere in 20 tokens.
    other = SamplingParams(temperature=1.0, top_p=0.95, seed=32, max_tokens=20, ignore_eos=True)
    parted = llm.generate([{"prompt_token_ids": prompt}], other, use_tqdm=False)
    assert parted[0].outputs[0].token_ids != whole


def test_top_k_one_is_greedy(llm: LLM) -> None:
    greedy = llm.generate([ids(20)], SamplingParams(temperature=0, max_tokens=10), use_tqdm=False)
    top1 = llm.generate(
        [ids(20)], SamplingParams(temperature=1.5, top_k=1, seed=0, max_tokens=10), use_tqdm=False
    )
    assert greedy[0].outputs[0].token_ids == top1[0].outputs[0].token_ids


def test_stop_string_truncates_text(llm: LLM) -> None:
    prompt = "Once upon a time"
    base = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=40), use_tqdm=False)
    text = base[0].outputs[0].text
    assert len(text) > 6, text
    stop = text[3:6]
    out = llm.generate(
        [prompt], SamplingParams(temperature=0, max_tokens=40, stop=[stop]), use_tqdm=False
    )[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.text == text[: text.index(stop)]
    kept = llm.generate(
        [prompt],
        SamplingParams(temperature=0, max_tokens=40, stop=[stop], include_stop_str_in_output=True),
        use_tqdm=False,
    )[0].outputs[0]
    assert kept.text == text[: text.index(stop) + len(stop)]


def test_stop_token_ids_and_max_tokens(llm: LLM) -> None:
    base = llm.generate([ids(12)], SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)
    tokens = base[0].outputs[0].token_ids
    assert base[0].outputs[0].finish_reason in ("length", "stop")
    stop_at = tokens[4]
    out = llm.generate(
        [ids(12)],
        SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[stop_at]),
        use_tqdm=False,
    )[0].outputs[0]
    assert out.token_ids == tokens[: tokens.index(stop_at) + 1]
    assert out.finish_reason == "stop" and out.stop_reason == stop_at


def test_logprobs_top_k_include_chosen(llm: LLM) -> None:
    out = llm.generate(
        [ids(10)], SamplingParams(temperature=0, max_tokens=6, logprobs=3), use_tqdm=False
    )[0].outputs[0]
    assert out.logprobs is not None and len(out.logprobs) == 6
    for token, entry in zip(out.token_ids, out.logprobs, strict=True):
        assert token in entry and entry[token].rank == 1  # greedy picks the top token
        assert len(entry) == 3
        assert sum(math.exp(lp.logprob) for lp in entry.values()) <= 1.0 + 1e-5
    assert out.cumulative_logprob == pytest.approx(
        sum(e[t].logprob for t, e in zip(out.token_ids, out.logprobs, strict=True)), rel=1e-5
    )


def test_repetition_penalty_matches_transformers(tiny_model: Path, llm: LLM) -> None:
    oracle = HFOracle(tiny_model)
    prompt = ids(25, 4)["prompt_token_ids"]
    with torch.inference_mode():
        out = oracle.model.generate(
            torch.tensor([prompt]),
            max_new_tokens=20,
            do_sample=False,
            repetition_penalty=1.3,
            pad_token_id=0,
            output_scores=True,
            return_dict_in_generate=True,
        )
    gaps = [float(s[0].topk(2).values[0] - s[0].topk(2).values[1]) for s in out.scores]
    ref = Reference(out.sequences[0, len(prompt) :].tolist(), gaps)
    got = (
        llm.generate(
            [{"prompt_token_ids": prompt}],
            SamplingParams(temperature=0, max_tokens=20, repetition_penalty=1.3),
            use_tqdm=False,
        )[0]
        .outputs[0]
        .token_ids
    )
    assert_matches_reference(got, ref, "repetition_penalty=1.3")
