"""The offline benchmark's workloads: real ShareGPT requests (the default) or synthetic lengths.

- `sharegpt`: vLLM's sampling rule over the real trace (quire_tools.workloads.sharegpt): the same
  seed gives the same requests as `vllm bench serve --dataset-name sharegpt`; each request must
  produce its ShareGPT answer's token count.
- `sharegpt-multiturn`: ShareGPT conversations, every later turn's prompt holding the earlier
  turns through the chat template; all turns queued at once, in turn order (turn 0 of every
  conversation first), so later turns find their prefix cached.
- `synthetic-sharegpt` / `synthetic-alpaca`: random token ids with lognormal lengths whose means
  are the PagedAttention paper's (ShareGPT 161 / 338, Alpaca 19 / 58), sigma 0.9.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from quire_tools.workloads import sharegpt
from quire_tools.workloads.lengths import lognormal_lengths

from benchmarks.common.workload import LENGTH_SIGMA, random_token_ids


@dataclass(frozen=True)
class WorkloadSpec:
    """A synthetic trace: the mean lengths the PagedAttention paper reports for it."""

    name: str
    mean_prompt_len: float
    mean_output_len: float


SYNTHETIC = {
    "synthetic-sharegpt": WorkloadSpec("synthetic-sharegpt", 161, 338),
    "synthetic-alpaca": WorkloadSpec("synthetic-alpaca", 19, 58),
}
WORKLOAD_NAMES = ("sharegpt", "sharegpt-multiturn", *SYNTHETIC)
DEFAULT_NUM_REQUESTS = {
    "sharegpt": 64,
    "sharegpt-multiturn": 16,  # conversations (each 2-8 requests)
    "synthetic-sharegpt": 24,
    "synthetic-alpaca": 96,
}


@dataclass(frozen=True)
class Workload:
    """Prompts (token ids) and the exact number of tokens each request must produce."""

    name: str
    prompts: list[list[int]]
    output_lens: list[int]

    @property
    def num_output_tokens(self) -> int:
        return sum(self.output_lens)

    @property
    def num_prompt_tokens(self) -> int:
        return sum(map(len, self.prompts))

    def head(self, n: int) -> Workload:
        return Workload(self.name, self.prompts[:n], self.output_lens[:n])


def make_workload(
    spec: WorkloadSpec,
    n: int,
    seed: int,
    vocab_size: int,
    context_len: int,
    max_prompt_len: int | None = None,
    max_output_len: int | None = None,
) -> Workload:
    """A seeded synthetic workload; its first k requests are the same for every n >= k."""
    stream = list(SYNTHETIC).index(spec.name)
    prompt_lens = lognormal_lengths(
        np.random.default_rng([seed, stream, 0]), spec.mean_prompt_len, LENGTH_SIGMA, n
    )
    output_lens = lognormal_lengths(
        np.random.default_rng([seed, stream, 1]), spec.mean_output_len, LENGTH_SIGMA, n
    )
    token_rng = np.random.default_rng([seed, stream, 2])
    prompts, outputs = [], []
    for p, o in zip(prompt_lens.tolist(), output_lens.tolist(), strict=True):
        p = min(p, context_len - 1, max_prompt_len or context_len)
        o = min(o, context_len - p, max_output_len or context_len)
        prompts.append(random_token_ids(token_rng, vocab_size, p))
        outputs.append(o)
    return Workload(spec.name, prompts, outputs)


def capped(
    name: str,
    requests: list[tuple[list[int], int]],
    max_prompt_len: int | None,
    max_output_len: int | None,
) -> Workload:
    """A workload from (prompt ids, output length) pairs, optionally cut to the caps."""
    prompts = [p[-max_prompt_len:] if max_prompt_len else p for p, _ in requests]
    outputs = [min(o, max_output_len) if max_output_len else o for _, o in requests]
    return Workload(name, prompts, outputs)


def build_workload(
    name: str,
    n: int,
    seed: int,
    tokenizer: Any,
    vocab_size: int,
    context_len: int,
    data_path: Path = sharegpt.DEFAULT_PATH,
    max_prompt_len: int | None = None,
    max_output_len: int | None = None,
) -> Workload:
    """Workload `name` with n requests (n conversations for sharegpt-multiturn).

    The caps cut prompts (keeping their end) and outputs after sampling; the default runs use
    none, so the requests are exactly the sampled ones.
    """
    if name in SYNTHETIC:
        return make_workload(
            SYNTHETIC[name], n, seed, vocab_size, context_len, max_prompt_len, max_output_len
        )
    conversations = _conversations(data_path)
    if name == "sharegpt":
        sampled = sharegpt.sample_requests(conversations, tokenizer, n, seed)
        pairs = [(r.prompt_token_ids, r.output_len) for r in sampled]
    elif name == "sharegpt-multiturn":
        dialogues = sharegpt.sample_multi_turn(conversations, tokenizer, n, seed)
        by_turn = sorted((r.turn, i) for i, d in enumerate(dialogues) for r in d)
        pairs = [(dialogues[i][t].prompt_token_ids, dialogues[i][t].output_len) for t, i in by_turn]
    else:
        raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOAD_NAMES)}")
    too_long = [len(p) + o for p, o in pairs if len(p) + o > context_len]
    if too_long:
        raise ValueError(
            f"{len(too_long)} {name} requests exceed the model's context ({context_len} tokens)"
        )
    return capped(name, pairs, max_prompt_len, max_output_len)


@functools.cache
def _conversations(path: Path) -> list[dict[str, Any]]:
    """The trace, read once per process (each workload samples it twice: throughput, concurrency)."""
    return sharegpt.read_conversations(path)
