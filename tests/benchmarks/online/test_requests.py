"""What the online benchmark sends: ShareGPT plans, random requests, tenants' prefixes, arrivals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from quire_tools.workloads.lengths import lognormal_lengths
from tokenizers import Tokenizer

from benchmarks.common.workload import LENGTH_SIGMA
from benchmarks.online.cli import parse_args
from benchmarks.online.requests import (
    arrival_times,
    make_requests,
    plan_requests,
    shared_prefix_ids,
    sharegpt_requests,
)


def args_for(*flags: str) -> Any:
    return parse_args(["--quick", *flags])


def test_sharegpt_plan_splits_one_seeded_sample(tiny: Path) -> None:
    args = args_for(
        "--concurrency", "1,all", "--curve-prompts", "2,3", "--num-prompts", "2", "--warmup", "1"
    )
    assert args.dataset == "sharegpt" and args.rates == [1.0, 2.0]
    plan = plan_requests(tiny, args)
    pool = sharegpt_requests(tiny, 2 + 3 + 1 + 2 * 2, args)
    assert plan.curve == [pool[:2], pool[2:5]]  # the head, a fresh set per point
    assert plan.warmup == pool[5:6]
    assert plan.rates == [pool[6:8], pool[8:10]]
    assert plan.num_requests == len(pool)
    for r in pool:  # --quick caps both lengths
        assert r.prompt_len <= args.max_input_len and 1 <= r.output_len <= args.max_output_len


def test_random_plan_gives_every_phase_fresh_prompts(tiny: Path) -> None:
    args = args_for("--dataset", "random", "--concurrency", "1,4", "--curve-prompts", "3")
    plan = plan_requests(tiny, args)
    assert [len(p) for p in plan.curve] == [3, 3] and len(plan.rates) == 2
    prompts = [r.prompt for phase in (plan.warmup, *plan.curve, *plan.rates) for r in phase]
    assert len(set(prompts)) == len(prompts)


def test_requests_without_shared_prefix_are_the_lognormal_lengths(tiny: Path) -> None:
    args = args_for()
    assert args.shared_prefix_len == 0
    requests = make_requests(tiny, 12, args, seed=7)
    rng = np.random.default_rng(args.seed)
    sigma = LENGTH_SIGMA
    prompt_lens = lognormal_lengths(rng, args.input_len, sigma, 12, 4, args.random_max_input_len)
    prompt_lens = prompt_lens.tolist()
    output_lens = lognormal_lengths(rng, args.output_len, sigma, 12, 2, args.random_max_output_len)
    output_lens = output_lens.tolist()
    assert [r.prompt_len for r in requests] == prompt_lens
    assert [r.output_len for r in requests] == output_lens
    assert requests == make_requests(tiny, 12, args, seed=7)
    # Another rate: the same lengths, other prompts.
    other = make_requests(tiny, 12, args, seed=8)
    assert [(r.prompt_len, r.output_len) for r in other] == list(
        zip(prompt_lens, output_lens, strict=True)
    )
    assert all(a.prompt != b.prompt for a, b in zip(requests, other, strict=True))


def test_requests_with_shared_prefixes(tiny: Path) -> None:
    k, n = 3, 24
    args = args_for(
        "--dataset", "random", "--shared-prefix-len", str(n), "--num-shared-prefixes", str(k)
    )
    requests = make_requests(tiny, 10, args, seed=5)
    tokenizer = Tokenizer.from_file(str(tiny / "tokenizer.json"))
    # The prefixes come from the run's seed, so every rate's requests share the same tenants.
    ids = shared_prefix_ids(tokenizer.get_vocab_size(), k, n, seed=args.seed)
    assert [len(p) for p in ids] == [n] * k
    texts = [tokenizer.decode(p) for p in ids]
    assert len(set(texts)) == k and all(texts)
    for i, req in enumerate(requests):
        assert req.prompt.startswith(texts[i % k])
        assert not any(req.prompt.startswith(t) for j, t in enumerate(texts) if j != i % k)
        if i + k < len(requests):
            prefix = texts[i % k]
            assert requests[i + k].prompt[: len(prefix)] == req.prompt[: len(prefix)]
    # The suffixes, their lengths and the output lengths are those of the same seed without
    # a prefix; prompt_len counts the prefix too.
    plain = make_requests(tiny, 10, args_for(), seed=5)
    for i, (req, base) in enumerate(zip(requests, plain, strict=True)):
        assert req.prompt == texts[i % k] + base.prompt
        assert req.prompt_len == n + base.prompt_len
        assert req.output_len == base.output_len
    assert requests == make_requests(tiny, 10, args, seed=5)
    next_rate = make_requests(tiny, 10, args, seed=6)
    assert requests != next_rate
    assert all(r.prompt.startswith(texts[i % k]) for i, r in enumerate(next_rate))
    other = shared_prefix_ids(tokenizer.get_vocab_size(), k, n, seed=6)
    assert other != ids


def test_arrivals_are_seeded_poisson() -> None:
    a = arrival_times(4.0, 2000, seed=3)
    assert a == arrival_times(4.0, 2000, seed=3)
    assert a[0] == 0.0 and all(x <= y for x, y in zip(a, a[1:], strict=False))
    assert a[-1] / (len(a) - 1) == pytest.approx(0.25, rel=0.1)
