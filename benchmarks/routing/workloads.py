"""The routing benchmark's two workloads from ShareGPT, with their arrival schedule.

``multi-turn``  real multi-turn ShareGPT conversations: request k of a conversation is the
                chat template over user turns 0..k and the dataset's own assistant replies
                0..k-1, so each later turn's prompt holds the earlier ones. Conversations start
                at Poisson arrivals and interleave; a user "thinks" (exponential, seeded)
                between seeing a reply and sending the next turn.
``tenants``     a few long, distinct system prompts (one per tenant, built from long ShareGPT
                replies) in front of single-turn ShareGPT prompts, each request's tenant
                drawn at random, at Poisson arrivals.

Every policy gets the very same requests and scheduled times (seeded). A later turn is sent
at its scheduled time or when the previous turn's reply has arrived, whichever is later.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from quire_tools.workloads import sharegpt

WORKLOADS = ("multi-turn", "tenants")


@dataclass(frozen=True)
class WorkloadConfig:
    """Size of one workload run."""

    num_conversations: int = 10  # multi-turn: conversations
    max_turns: int = 4  # multi-turn: turns kept per conversation
    conversation_rate: float = 0.12  # multi-turn: conversations started per second (Poisson)
    think_s: float = 2.0  # multi-turn: mean pause between a reply and the next turn
    num_tenants: int = 4  # tenants: distinct system prompts
    tenant_requests: int = 20  # tenants: requests
    system_prompt_len: int = 384  # tenants: tokens of each system prompt's body
    request_rate: float = 0.3  # tenants: requests per second (Poisson)
    max_prompt_len: int = 1024  # prompts longer than this are left out (tokens)
    max_output_len: int = 16  # output tokens per request at most (the reply's length below)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_conversations < 1 or self.max_turns < 2 or self.num_tenants < 1:
            raise ValueError("need >= 1 conversation, >= 2 turns and >= 1 tenant")
        if self.tenant_requests < 1:
            raise ValueError("need >= 1 tenant request")
        if self.conversation_rate <= 0 or self.request_rate <= 0 or self.think_s < 0:
            raise ValueError("rates must be > 0 and think_s >= 0")


@dataclass(frozen=True)
class BenchRequest:
    """One request of a workload, in arrival order."""

    group: str  # conversation or tenant it belongs to
    turn: int  # 0 for tenants
    prompt_token_ids: list[int]
    output_len: int
    at: float  # scheduled send time, seconds from the start
    after: int | None = None  # index of the request whose reply must arrive first


def _ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    out = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    return [int(t) for t in out]


def multi_turn(
    conversations: list[dict[str, Any]], tokenizer: Any, c: WorkloadConfig
) -> list[BenchRequest]:
    """Interleaved conversations (module docstring), sorted by scheduled time."""
    dialogues = sharegpt.sample_multi_turn(
        conversations,
        tokenizer,
        c.num_conversations,
        seed=c.seed,
        max_turns=c.max_turns,
        max_prompt_len=c.max_prompt_len,
        max_total_len=c.max_prompt_len + 1024,
    )
    rng = np.random.default_rng([c.seed, 2])
    starts = np.cumsum(rng.exponential(1.0 / c.conversation_rate, len(dialogues)))
    items: list[tuple[float, int, int, sharegpt.SampleRequest]] = []
    for d, (start, rounds) in enumerate(zip(starts, dialogues, strict=True)):
        at = float(start)
        for k, r in enumerate(rounds):
            if k:
                at += float(rng.exponential(c.think_s)) if c.think_s else 0.0
            items.append((at, d, k, r))
    items.sort(key=lambda x: (x[0], x[1], x[2]))
    index: dict[tuple[int, int], int] = {}
    out: list[BenchRequest] = []
    for at, d, k, r in items:
        index[(d, k)] = len(out)
        out.append(
            BenchRequest(
                f"conversation-{d}",
                k,
                list(r.prompt_token_ids),
                min(r.output_len, c.max_output_len),
                at,
                index[(d, k - 1)] if k else None,
            )
        )
    return out


def system_prompts(
    conversations: list[dict[str, Any]], tokenizer: Any, c: WorkloadConfig
) -> list[str]:
    """`num_tenants` distinct system prompts of about `system_prompt_len` tokens each."""
    prompts: list[str] = []
    for record in sharegpt.shuffled(conversations, c.seed + 1):
        turns = record["conversations"]
        reply = str(turns[1].get("value", ""))
        ids = tokenizer(reply).input_ids
        if len(ids) < c.system_prompt_len:
            continue
        body = tokenizer.decode(ids[: c.system_prompt_len], skip_special_tokens=True)
        n = len(prompts)
        prompts.append(f"You are the assistant of tenant {n}. House notes follow.\n\n{body}")
        if len(prompts) == c.num_tenants:
            return prompts
    raise ValueError(f"the data holds {len(prompts)} replies of {c.system_prompt_len}+ tokens")


def tenants(
    conversations: list[dict[str, Any]], tokenizer: Any, c: WorkloadConfig
) -> list[BenchRequest]:
    """System prompt of a random tenant + one ShareGPT prompt per request, Poisson arrivals."""
    systems = system_prompts(conversations, tokenizer, c)
    n = c.tenant_requests
    samples = sharegpt.sample_requests(conversations, tokenizer, 4 * n, seed=c.seed)
    rng = np.random.default_rng([c.seed, 3])
    times = np.cumsum(rng.exponential(1.0 / c.request_rate, n))
    out: list[BenchRequest] = []
    for s in samples:
        if len(out) == n:
            break
        tenant = int(rng.integers(len(systems)))
        messages = [
            {"role": "system", "content": systems[tenant]},
            {"role": "user", "content": str(s.prompt)},
        ]
        ids = _ids(tokenizer, messages)
        if len(ids) > c.max_prompt_len:
            continue
        out.append(
            BenchRequest(
                f"tenant-{tenant}",
                0,
                ids,
                min(s.output_len, c.max_output_len),
                float(times[len(out)]),
            )
        )
    if len(out) < n:
        raise ValueError(f"only {len(out)} tenant requests fit max_prompt_len, {n} asked for")
    return out


def build(name: str, data_path: str, tokenizer: Any, c: WorkloadConfig) -> list[BenchRequest]:
    """Workload `name` (one of WORKLOADS) from the ShareGPT file at `data_path`."""
    conversations = sharegpt.read_conversations(data_path)
    if name == "multi-turn":
        return multi_turn(conversations, tokenizer, c)
    if name == "tenants":
        return tenants(conversations, tokenizer, c)
    raise ValueError(f"unknown workload {name!r}; one of {', '.join(WORKLOADS)}")
