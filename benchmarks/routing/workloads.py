"""The routing benchmark's workloads from ShareGPT, with their arrival schedule.

``multi-turn``  real multi-turn ShareGPT conversations: request k of a conversation is the
                chat template over user turns 0..k and the dataset's own assistant replies
                0..k-1, so each later turn's prompt holds the earlier ones. Conversations start
                at Poisson arrivals and interleave; a user "thinks" (exponential, seeded)
                between seeing a reply and sending the next turn.
``tenants``     a few long, distinct system prompts (one per tenant, built from long ShareGPT
                replies) in front of single-turn ShareGPT prompts, each request's tenant
                drawn at random, at Poisson arrivals.
``long-context`` llm-d's shape, scaled down: a few tenants, each with a long shared context
                (ShareGPT replies joined to `context_len` tokens, as the system message),
                and multi-turn users of those tenants (real ShareGPT conversations, each turn
                cut to `context_turn_len` tokens) starting at Poisson arrivals and thinking
                between turns as in ``multi-turn``. Its executors get `context_kv_blocks`
                blocks each (`kv_blocks`), fewer than the tenants' contexts take together, so
                no one executor can hold every context and a policy that mixes tenants evicts.

Every policy gets the very same requests and scheduled times (seeded). A later turn is sent
at its scheduled time or when the previous turn's reply has arrived, whichever is later.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from quire_tools.workloads import sharegpt

WORKLOADS = ("multi-turn", "tenants", "long-context")


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
    context_tenants: int = 6  # long-context: tenants, each with its own shared context
    context_len: int = 1024  # long-context: tokens of each tenant's context
    context_users: int = 18  # long-context: multi-turn users, spread evenly over the tenants
    context_turns: int = 3  # long-context: turns per user
    context_turn_len: int = 64  # long-context: tokens each user message and reply is cut to
    context_user_rate: float = 0.15  # long-context: users starting per second (Poisson)
    # long-context: KV blocks per executor; 6 contexts of 1,024 tokens take 384 blocks of 16,
    # 1.6x one executor's 240 (the pair holds them with room for the users' own blocks)
    context_kv_blocks: int = 240
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_conversations < 1 or self.max_turns < 2 or self.num_tenants < 1:
            raise ValueError("need >= 1 conversation, >= 2 turns and >= 1 tenant")
        if self.tenant_requests < 1:
            raise ValueError("need >= 1 tenant request")
        if self.conversation_rate <= 0 or self.request_rate <= 0 or self.think_s < 0:
            raise ValueError("rates must be > 0 and think_s >= 0")
        if self.context_tenants < 1 or self.context_users < self.context_tenants:
            raise ValueError("need >= 1 context tenant and at least one user per tenant")
        if self.context_turns < 1 or self.context_len < 1 or self.context_turn_len < 1:
            raise ValueError("context_turns, context_len and context_turn_len must be >= 1")
        if self.context_user_rate <= 0 or self.context_kv_blocks < 1:
            raise ValueError("context_user_rate and context_kv_blocks must be > 0")


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


def _interleave(
    dialogues: list[tuple[str, list[tuple[list[int], int]]]],
    rate: float,
    think_s: float,
    rng: np.random.Generator,
) -> list[BenchRequest]:
    """Dialogues (group, [(prompt ids, output len) per turn]) starting at Poisson arrivals of
    `rate`, a pause of mean `think_s` before each later turn; sorted by scheduled time."""
    starts = np.cumsum(rng.exponential(1.0 / rate, len(dialogues)))
    items: list[tuple[float, int, int, list[int], int]] = []
    for d, (start, (_, rounds)) in enumerate(zip(starts, dialogues, strict=True)):
        at = float(start)
        for k, (ids, output_len) in enumerate(rounds):
            if k:
                at += float(rng.exponential(think_s)) if think_s else 0.0
            items.append((at, d, k, ids, output_len))
    items.sort(key=lambda x: (x[0], x[1], x[2]))
    index: dict[tuple[int, int], int] = {}
    out: list[BenchRequest] = []
    for at, d, k, ids, output_len in items:
        index[(d, k)] = len(out)
        after = index[(d, k - 1)] if k else None
        out.append(BenchRequest(dialogues[d][0], k, ids, output_len, at, after))
    return out


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
    rounds = [
        (
            f"conversation-{d}",
            [(list(r.prompt_token_ids), min(r.output_len, c.max_output_len)) for r in rs],
        )
        for d, rs in enumerate(dialogues)
    ]
    return _interleave(rounds, c.conversation_rate, c.think_s, np.random.default_rng([c.seed, 2]))


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


def tenant_contexts(
    conversations: list[dict[str, Any]], tokenizer: Any, c: WorkloadConfig
) -> list[str]:
    """`context_tenants` distinct contexts of `context_len` tokens: ShareGPT replies joined."""
    contexts: list[str] = []
    ids: list[int] = []
    for record in sharegpt.shuffled(conversations, c.seed + 4):
        ids += tokenizer(str(record["conversations"][1].get("value", ""))).input_ids
        if len(ids) < c.context_len:
            continue
        body = tokenizer.decode(ids[: c.context_len], skip_special_tokens=True)
        n = len(contexts)
        contexts.append(
            f"You are the assistant of tenant {n}. Reference material follows.\n\n{body}"
        )
        ids = []
        if len(contexts) == c.context_tenants:
            return contexts
    raise ValueError(f"the data holds {len(contexts)} contexts of {c.context_len} tokens")


def _cut(tokenizer: Any, text: str, n: int) -> str:
    ids = tokenizer(text).input_ids
    return text if len(ids) <= n else tokenizer.decode(ids[:n], skip_special_tokens=True)


def long_context(
    conversations: list[dict[str, Any]], tokenizer: Any, c: WorkloadConfig
) -> list[BenchRequest]:
    """Users of tenants with long shared contexts, several turns each (module docstring)."""
    contexts = tenant_contexts(conversations, tokenizer, c)
    rng = np.random.default_rng([c.seed, 5])
    tenant_of = rng.permutation(np.arange(c.context_users) % c.context_tenants)
    dialogues: list[tuple[str, list[tuple[list[int], int]]]] = []
    for record in sharegpt.shuffled(conversations, c.seed + 5):
        if len(dialogues) == c.context_users:
            break
        messages = sharegpt.as_messages(record["conversations"])
        if messages is None or len(messages) < 2 * c.context_turns:
            continue
        tenant = int(tenant_of[len(dialogues)])
        history = [{"role": "system", "content": contexts[tenant]}]
        rounds: list[tuple[list[int], int]] = []
        for k in range(c.context_turns):
            user, reply = messages[2 * k], messages[2 * k + 1]
            history.append(
                {"role": "user", "content": _cut(tokenizer, user["content"], c.context_turn_len)}
            )
            output_len = len(tokenizer(reply["content"]).input_ids)
            rounds.append((_ids(tokenizer, history), max(1, min(output_len, c.max_output_len))))
            history.append(
                {
                    "role": "assistant",
                    "content": _cut(tokenizer, reply["content"], c.context_turn_len),
                }
            )
        dialogues.append((f"tenant-{tenant}/user-{len(dialogues)}", rounds))
    if len(dialogues) < c.context_users:
        raise ValueError(f"the data holds {len(dialogues)} users of {c.context_turns}+ turns")
    return _interleave(dialogues, c.context_user_rate, c.think_s, rng)


def kv_blocks(name: str, c: WorkloadConfig) -> int | None:
    """KV blocks per executor that workload `name` is run with; None: the benchmark's own."""
    return c.context_kv_blocks if name == "long-context" else None


def shared_context_blocks(name: str, c: WorkloadConfig, block_size: int) -> int | None:
    """Full blocks the tenants' contexts of workload `name` take together (long-context)."""
    return c.context_tenants * (c.context_len // block_size) if name == "long-context" else None


def build(name: str, data_path: str, tokenizer: Any, c: WorkloadConfig) -> list[BenchRequest]:
    """Workload `name` (one of WORKLOADS) from the ShareGPT file at `data_path`."""
    conversations = sharegpt.read_conversations(data_path)
    if name == "multi-turn":
        return multi_turn(conversations, tokenizer, c)
    if name == "tenants":
        return tenants(conversations, tokenizer, c)
    if name == "long-context":
        return long_context(conversations, tokenizer, c)
    raise ValueError(f"unknown workload {name!r}; one of {', '.join(WORKLOADS)}")
