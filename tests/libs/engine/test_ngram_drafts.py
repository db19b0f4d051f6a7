"""N-gram speculation: the index's proposals, the verdict on drafts, and the tokens, which are
those of decoding without drafts (greedy and seeded sampling, stops, logprobs, prefix hits)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from quire import LLM, SamplingParams
from quire.engine.ngram_drafts import DraftStats, NgramIndex
from quire.engine.scheduler import SchedulerOutput

from .conftest import REPO
from .test_shortest_first import frozen

SMOLLM2 = REPO / "models" / "smollm2-135m-instruct"


def brute_force(token_ids: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """The k tokens after the latest earlier occurrence of the longest suffix found."""
    num_tokens = len(token_ids)
    for n in range(min(max_n, num_tokens - 1), min_n - 1, -1):
        suffix = token_ids[num_tokens - n :]
        for end in range(num_tokens - 1, n - 1, -1):
            if token_ids[end - n : end] == suffix:
                return token_ids[end : end + k]
    return []


@pytest.mark.parametrize("seed", range(6))
def test_the_index_proposes_what_a_full_search_finds_as_tokens_are_appended(seed: int) -> None:
    rng = random.Random(seed)
    min_n, max_n = rng.choice([(1, 3), (2, 4), (3, 3)])
    index = NgramIndex(min_n, max_n)
    token_ids = [rng.randrange(6) for _ in range(rng.randrange(1, 30))]
    for _ in range(120):
        k = rng.randrange(0, 6)
        assert index.propose(token_ids, k) == (brute_force(token_ids, min_n, max_n, k) if k else [])
        token_ids += [rng.randrange(6) for _ in range(rng.randrange(1, 4))]


def test_the_longest_suffix_found_wins_at_its_latest_occurrence() -> None:
    index = NgramIndex(1, 3)
    #            0  1  2  3  4  5  6  7  8  9 10 11
    token_ids = [1, 2, 3, 9, 2, 3, 8, 5, 1, 2, 3]
    # (1, 2, 3) occurred once, ending at 3: what followed it is 9, 2, 3
    assert index.propose(token_ids, 3) == [9, 2, 3]
    assert index.propose([*token_ids, 7], 2) == []  # 7 never came before
    assert NgramIndex(2, 2).propose([4, 2, 3, 5, 2, 3, 6, 2, 3], 2) == [6, 2]  # the latest


def test_acceptance_starts_even_and_follows_the_record() -> None:
    stats = DraftStats()
    assert stats.acceptance() == 0.5
    stats.record(num_drafts=4, num_accepted=4)
    stats.record(num_drafts=4, num_accepted=1)
    assert (stats.num_accepted, stats.num_rejected) == (5, 1)
    assert stats.acceptance() == pytest.approx(6 / 8)


class Steps:
    """Every step object the engine's model runner executed."""

    def __init__(self, llm: LLM) -> None:
        self.seen: list[SchedulerOutput] = []
        runner = llm.engine.runner
        execute = runner.execute

        def recording(step: SchedulerOutput) -> Any:
            self.seen.append(step)
            return execute(step)

        runner.execute = recording  # type: ignore[method-assign]

    def drafted(self) -> Iterator[tuple[SchedulerOutput, int]]:
        for step in self.seen:
            yield step, sum(len(s.draft_token_ids) for s in step.scheduled)


def run(
    model: Path, prompts: list[list[int]], params: list[SamplingParams], **engine: Any
) -> tuple[list[Any], LLM]:
    llm = LLM(model=str(model), dtype="float32", **engine)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert llm.stats().allocator.num_blocks_used == 0, "blocks leaked after generate()"
    return outputs, llm


def oracle_drafts(
    monkeypatch: pytest.MonkeyPatch, expected: dict[tuple[int, ...], list[int]], seed: int
) -> None:
    """Drafts from the known outputs, every few of them wrong: a draft at every step, kept up
    to a chosen mistake, so the verdict and what follows it run on every step."""
    rng = random.Random(seed)

    def propose(self: NgramIndex, token_ids: list[int], k: int) -> list[int]:
        for prompt, output in expected.items():
            n = len(prompt)
            if tuple(token_ids[:n]) == prompt and token_ids[n:] == output[: len(token_ids) - n]:
                drafts = output[len(token_ids) - n : len(token_ids) - n + k]
                if drafts and rng.random() < 0.5:
                    wrong = rng.randrange(len(drafts))
                    drafts[wrong] = (drafts[wrong] + 1) % 100 + 3
                return drafts
        return []

    monkeypatch.setattr(NgramIndex, "propose", propose)


@pytest.mark.parametrize("seed", range(3))
def test_drafts_give_the_tokens_of_decoding_without_them(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """Greedy and seeded sampling, with logprobs, lengths around block boundaries: the same
    tokens and logprobs with drafts as without; every draft within its last block, its
    max_tokens and the context, and none beside a prompt's chunk."""
    rng = random.Random(seed)
    lengths = [15, 16, 17, 31, 40]
    prompts = [[rng.randrange(3, 1000) for _ in range(n)] for n in lengths]
    params = [
        SamplingParams(temperature=0.0, max_tokens=33, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True),
        SamplingParams(temperature=0.9, seed=seed, max_tokens=47, ignore_eos=True),
        SamplingParams(temperature=0.7, top_k=20, max_tokens=30, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=25, repetition_penalty=1.3, ignore_eos=True),
    ]
    plain, _ = run(tiny_model, prompts, params)
    expected = {
        tuple(p): list(out.outputs[0].token_ids) for p, out in zip(prompts, plain, strict=True)
    }
    oracle_drafts(monkeypatch, expected, seed)
    # all at once; then 24 tokens a step, the later prompts' chunks beside earlier streams;
    # then one request at a time
    for one_at_a_time, budget in ((False, 2048), (False, 24), (True, 2048)):
        llm = LLM(
            model=str(tiny_model),
            dtype="float32",
            num_speculative_tokens=4,
            max_num_batched_tokens=budget,
        )
        steps = Steps(llm)
        if one_at_a_time:
            got = [
                llm.generate([{"prompt_token_ids": p}], [sp], use_tqdm=False)[0]
                for p, sp in zip(prompts, params, strict=True)
            ]
        else:
            got = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        assert llm.stats().allocator.num_blocks_used == 0
        for want, out in zip(plain, got, strict=True):
            assert out.outputs[0].token_ids == want.outputs[0].token_ids
            assert out.outputs[0].finish_reason == want.outputs[0].finish_reason == "length"
        first, again = plain[0].outputs[0].logprobs, got[0].outputs[0].logprobs
        assert first is not None and again is not None and len(first) == len(again)
        for a, b in zip(first, again, strict=True):
            assert a.keys() == b.keys()
            assert all(a[t].logprob == pytest.approx(b[t].logprob, abs=1e-4) for t in a)
        stats = llm.stats()
        assert stats.num_kept_drafts > 0, "no draft was kept: nothing was verified"
        assert stats.num_draft_tokens > stats.num_kept_drafts, "no draft was rejected"
        for step, num_drafts in steps.drafted():
            prompting = any(s.num_new_tokens > 1 and not s.draft_token_ids for s in step.scheduled)
            assert not (prompting and num_drafts), "drafts delayed a prompt's chunk"
            for s in step.scheduled:
                if not s.draft_token_ids:
                    continue
                seq = s.seq
                assert s.num_new_tokens == 1 + len(s.draft_token_ids)
                end = s.num_computed_tokens + s.num_new_tokens
                assert end <= -(-(s.num_computed_tokens + 1) // 16) * 16, "past its last block"
                num_output = s.num_computed_tokens + 1 - seq.num_prompt_tokens  # at the step
                assert num_output + len(s.draft_token_ids) < seq.request.params.max_tokens


def test_a_stop_inside_kept_drafts_ends_the_output_there(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompt = list(range(20, 45))
    greedy = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    (full,), _ = run(tiny_model, [prompt], [greedy])
    tokens = list(full.outputs[0].token_ids)
    stop_at = next(i for i in range(3, len(tokens)) if tokens[i] not in tokens[:i])
    stopping = SamplingParams(
        temperature=0.0, max_tokens=40, ignore_eos=True, stop_token_ids=[tokens[stop_at]]
    )
    monkeypatch.setattr(  # every draft right: the stop comes mid-draft
        NgramIndex,
        "propose",
        lambda self, ids, k: tokens[len(ids) - len(prompt) :][:k],
    )
    (out,), llm = run(tiny_model, [prompt], [stopping], num_speculative_tokens=4)
    assert out.outputs[0].token_ids == tokens[: stop_at + 1]
    assert (out.outputs[0].finish_reason, out.outputs[0].stop_reason) == ("stop", tokens[stop_at])
    assert llm.stats().num_kept_drafts > 0


def test_kept_drafts_fill_blocks_the_prefix_cache_serves(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A conversation's next turn (the first turn's prompt and output, then more) finds the
    blocks the drafts filled: its prefix hits reach into the first turn's output."""
    prompt = [7, *range(100, 120)]
    greedy = SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True)
    (first,), _ = run(tiny_model, [prompt], [greedy])
    tokens = list(first.outputs[0].token_ids)
    monkeypatch.setattr(
        NgramIndex, "propose", lambda self, ids, k: tokens[len(ids) - len(prompt) :][:k]
    )
    llm = LLM(model=str(tiny_model), dtype="float32", num_speculative_tokens=4)
    (again,) = llm.generate([{"prompt_token_ids": prompt}], [greedy], use_tqdm=False)
    assert list(again.outputs[0].token_ids) == tokens
    assert llm.stats().num_kept_drafts > 0
    turn = [*prompt, *tokens, 5, 6, 7]
    (second,) = llm.generate([{"prompt_token_ids": turn}], [greedy], use_tqdm=False)
    assert second.num_cached_tokens == (len(prompt) + len(tokens) - 1) // 16 * 16
    assert second.num_cached_tokens > len(prompt)
    (plain,), _ = run(tiny_model, [turn], [greedy])
    assert second.outputs[0].token_ids == plain.outputs[0].token_ids


def test_a_step_of_many_streams_takes_no_drafts_a_lone_stream_does(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Drafts are taken while their expected tokens per second beat the step's: a lone stream
    (a step bound by its fixed part) takes them, 32 streams (each draft's 0.5 chance worth less
    than the step's rate) none. n>1 never drafts."""
    monkeypatch.setattr(NgramIndex, "propose", lambda self, ids, k: [5] * k)  # always a guess
    llm = LLM(model=str(tiny_model), dtype="float32", num_speculative_tokens=4)
    llm.engine.scheduler.step_costs = frozen(0.02, 0.001)  # fixed part = 20 tokens
    steps = Steps(llm)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    llm.generate([{"prompt_token_ids": [3, 4, 5]}], [params], use_tqdm=False)
    # a decode step at every output count from 1 to 5; room for drafts until the 5th
    num_outputs = {step.scheduled[0].num_computed_tokens - 2: n for step, n in steps.drafted()}
    assert num_outputs.keys() >= {1, 2, 3, 4, 5}
    assert all(num_outputs[i] > 0 for i in (1, 2, 3, 4)) and num_outputs[5] == 0
    steps.seen.clear()
    many = [{"prompt_token_ids": [3, 4, i]} for i in range(6, 38)]
    llm.generate(many, [params] * 32, use_tqdm=False)
    wide = [step for step, _ in steps.drafted() if len(step.scheduled) == 32]
    assert wide and all(not s.draft_token_ids for step in wide for s in step.scheduled)
    # no stream's first draft could pay: none was even proposed, no n-gram index built
    assert all(s.seq.ngrams is None for step in wide for s in step.scheduled)
    steps.seen.clear()
    forked = SamplingParams(n=2, temperature=0.8, seed=1, max_tokens=8, ignore_eos=True)
    llm.generate([{"prompt_token_ids": [3, 4, 5]}], [forked], use_tqdm=False)
    assert steps.seen and all(n == 0 for _, n in steps.drafted())


def test_smollm2_drafts_from_its_own_repeats_give_its_greedy_tokens() -> None:
    """The packaged model's own n-grams, no oracle: drafts are proposed and kept, and the
    greedy tokens are those of decoding without them."""
    prompts = [
        "List the days of the week, one per line, three times over.",
        "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n",
    ]
    params = SamplingParams(temperature=0.0, max_tokens=96, ignore_eos=True)
    outputs = {}
    for k in (0, 4):
        llm = LLM(model=str(SMOLLM2), dtype="float32", num_speculative_tokens=k)
        outputs[k] = [
            list(llm.generate([p], [params], use_tqdm=False)[0].outputs[0].token_ids)
            for p in prompts
        ]
        if k:
            stats = llm.stats()
            assert stats.num_kept_drafts > 0
            assert stats.num_generated_tokens == 2 * 96
    assert outputs[4] == outputs[0]
