"""What every system is sent: ShareGPT or random-token requests, split by phase, and arrival times."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from quire_tools.workloads.lengths import lognormal_lengths

from benchmarks.common.workload import LENGTH_SIGMA, random_token_ids, sample_sharegpt


@dataclass(frozen=True)
class Request:
    prompt: str
    prompt_len: int  # token ids drawn, any shared prefix included (the server's count differs)
    output_len: int


def shared_prefix_ids(
    vocab_size: int, num_prefixes: int, length: int, seed: int
) -> list[list[int]]:
    """The tenants' prefixes: num_prefixes seeded lists of random regular token ids."""
    # A stream of their own: the suffixes and lengths stay those of the same seed without them.
    rng = np.random.default_rng([seed, 1])
    return [random_token_ids(rng, vocab_size, length) for _ in range(num_prefixes)]


def make_requests(model_dir: Path, n: int, args: argparse.Namespace, seed: int) -> list[Request]:
    """Seeded prompts (text of random token ids, after prefix i % K if any) and output lengths."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    vocab = tokenizer.get_vocab_size()
    # Lengths come from the run's seed, token ids from `seed`: every rate gets the same shape
    # of work (a few long prompts dominate a p99) with content no cache has seen.
    length_rng = np.random.default_rng(args.seed)
    prompt_lens = lognormal_lengths(
        length_rng, args.input_len, LENGTH_SIGMA, n, 4, args.random_max_input_len
    ).tolist()
    output_lens = lognormal_lengths(
        length_rng, args.output_len, LENGTH_SIGMA, n, 2, args.random_max_output_len
    ).tolist()
    rng = np.random.default_rng(seed)
    prefix_len = args.shared_prefix_len
    prefixes = [""]
    if prefix_len > 0:
        # Decoded once, so every request of a tenant starts with the very same text.
        # The tenants' prompts outlive any one batch of requests: drawn from the run's seed.
        ids = shared_prefix_ids(vocab, args.num_shared_prefixes, prefix_len, args.seed)
        prefixes = [tokenizer.decode(p) for p in ids]
    requests = []
    for i, (p, o) in enumerate(zip(prompt_lens, output_lens, strict=True)):
        ids = random_token_ids(rng, vocab, p)
        prompt = prefixes[i % len(prefixes)] + tokenizer.decode(ids)
        requests.append(Request(prompt, prefix_len + p, o))
    return requests


def sharegpt_requests(model_dir: Path, n: int, args: argparse.Namespace) -> list[Request]:
    """The first n ShareGPT requests of the run's seed, by vLLM's rule, cut to any caps."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    requests = []
    for r in sample_sharegpt(args.data, tokenizer, n, args.seed):
        prompt, ids = str(r.prompt), r.prompt_token_ids
        if args.max_input_len and len(ids) > args.max_input_len:
            ids = ids[: args.max_input_len]
            prompt = tokenizer.decode(ids, skip_special_tokens=True)
        output_len = min(r.output_len, args.max_output_len or r.output_len)
        requests.append(Request(prompt, len(ids), output_len))
    return requests


@dataclass(frozen=True)
class RequestPlan:
    """Every request one system gets, the same for every system: disjoint sets per phase."""

    warmup: list[Request]
    curve: list[list[Request]]  # one fresh set per concurrency point
    rates: list[list[Request]]  # one fresh set per request rate

    @property
    def num_requests(self) -> int:
        return len(self.warmup) + sum(map(len, self.curve)) + sum(map(len, self.rates))


def plan_requests(model_dir: Path, args: argparse.Namespace) -> RequestPlan:
    """ShareGPT: one seeded sample (vLLM's rule: `sampling_check` holds it to vLLM's own
    sampler) split into phases, the curve's points first. Random: a seed per phase."""
    n, warmup, points = args.num_prompts, args.warmup, args.curve_prompts
    num_rates = len(args.rates)
    if args.dataset == "sharegpt":
        pool = sharegpt_requests(model_dir, sum(points) + warmup + num_rates * n, args)
        curve, start = [], 0
        for size in points:
            curve.append(pool[start : start + size])
            start += size
        rest = pool[start + warmup :]
        return RequestPlan(
            warmup=pool[start : start + warmup],
            curve=curve,
            rates=[rest[i * n : (i + 1) * n] for i in range(num_rates)],
        )
    # Fresh prompts in every phase: reusing them would let prefix caches answer from memory.
    return RequestPlan(
        warmup=make_requests(model_dir, warmup, args, args.seed + 1),
        curve=[make_requests(model_dir, k, args, args.seed + 50 + i) for i, k in enumerate(points)],
        rates=[make_requests(model_dir, n, args, args.seed + 100 * i) for i in range(num_rates)],
    )


def arrival_times(rate: float, n: int, seed: int) -> list[float]:
    """Poisson arrivals: cumulative exponential gaps (the first request at 0); all at 0 for
    an infinite rate."""
    if math.isinf(rate):
        return [0.0] * n
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, n)
    gaps[0] = 0.0
    return np.cumsum(gaps).tolist()
