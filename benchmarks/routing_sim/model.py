"""A discrete-event model of executors behind the router's real policy classes.

Each executor runs continuous batching in steps. A step decodes one token for every running
request and prefills up to `prefill_chunk` uncached prompt tokens of the requests being
admitted; it lasts decode_step(batch) + prefill_tokens / prefill_tok_s, from the measured
rates (calibrate.py). A request's first token comes at the end of the step that finishes its
prefill. Each executor has its own prefix cache: an LRU of block hashes bounded at
`cache_blocks`; a request hits its leading cached blocks (at most (len - 1) // block_size, as
the block manager caps it), and its prompt blocks enter the cache when its prefill ends.

With pulls, a request whose leading blocks another executor holds beyond what its own cache
holds copies them instead of computing them (the memory manager's offer): those tokens cost
`pull_s_per_token` each, paid in the first step the request runs in, and count as cached.

The router sees what a real one sees: each executor's running + waiting count (fresh, like
its own in-flight count) and, for the prefix policy, each cache's exact contents (what the
Redis index mirrors).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from quire.block.hashing import hash_full_blocks
from quire.cluster.policies import RoutingPolicy, RoutingRequest
from quire.cluster.redis_keys import ExecutorLoad, ExecutorRecord
from quire.cluster.routing import Candidate


@dataclass(frozen=True)
class Rates:
    """Service rates of one executor."""

    prefill_tok_s: float  # uncached prompt tokens per second
    decode_base_s: float  # step time at batch 0 (extrapolated)
    decode_per_seq_s: float  # added step time per running request
    # seconds to pull one token's K/V from a peer (`make bench-pulls`; main.load_pull_rate)
    pull_s_per_token: float = 0.0

    def decode_step_s(self, batch: int) -> float:
        return self.decode_base_s + self.decode_per_seq_s * batch if batch else 0.0


@dataclass(frozen=True)
class SimRequest:
    prompt_token_ids: list[int]
    output_len: int
    at: float  # scheduled arrival
    after: int | None = None  # request whose last token must come first


@dataclass
class _Live:
    index: int
    remaining_prefill: int
    remaining_output: int
    arrived: float
    pull_s: float = 0.0  # pull time still to pay (in the first step it runs in)


@dataclass
class SimExecutor:
    executor_id: str
    cache_blocks: int
    max_num_seqs: int = 64
    prefill_chunk: int = 512
    cache: OrderedDict[bytes, None] = field(default_factory=OrderedDict)
    waiting: list[_Live] = field(default_factory=list)
    running: list[_Live] = field(default_factory=list)
    busy: bool = False

    def cached_blocks(self, hashes: Sequence[bytes], max_hit: int) -> int:
        n = 0
        for h in hashes[:max_hit]:
            if h not in self.cache:
                break
            n += 1
        return n

    def touch(self, hashes: Sequence[bytes]) -> None:
        for h in hashes:
            self.cache[h] = None
            self.cache.move_to_end(h)
        while len(self.cache) > self.cache_blocks:
            self.cache.popitem(last=False)

    @property
    def load(self) -> int:
        return len(self.waiting) + len(self.running)


@dataclass
class SimResult:
    ttft: list[float]
    e2e: list[float]
    output_tokens: list[int]
    prompt_tokens: int
    cached_tokens: int  # local hits and pulled tokens
    pulled_tokens: int
    duration_s: float
    requests_per_executor: dict[str, int]


def simulate(
    policy: RoutingPolicy,
    requests: Sequence[SimRequest],
    num_executors: int,
    rates: Rates,
    cache_blocks: int,
    block_size: int = 16,
    extra_key: str = "",
    pulls: bool = False,
) -> SimResult:
    """Every request through `policy` onto `num_executors` modelled executors; with `pulls`,
    blocks a peer holds are pulled at `rates.pull_s_per_token` (module docstring)."""
    execs = [SimExecutor(f"executor-{i:02d}", cache_blocks) for i in range(num_executors)]
    hashes = [hash_full_blocks(r.prompt_token_ids, block_size, extra_key) for r in requests]
    followers: dict[int, int] = {r.after: i for i, r in enumerate(requests) if r.after is not None}
    done = [False] * len(requests)
    ttft = [0.0] * len(requests)
    e2e = [0.0] * len(requests)
    served: dict[str, int] = {}
    cached_total = 0
    pulled_total = 0
    events: list[tuple[float, int, str, int]] = []  # (time, seq, kind, index)
    seq = 0

    def push(t: float, kind: str, i: int) -> None:
        nonlocal seq
        heapq.heappush(events, (t, seq, kind, i))
        seq += 1

    for i, r in enumerate(requests):
        if r.after is None:
            push(r.at, "arrive", i)
    clock = 0.0

    def start_step(e: int, now: float) -> None:
        ex = execs[e]
        while ex.waiting and len(ex.running) < ex.max_num_seqs:
            ex.running.append(ex.waiting.pop(0))
        if not ex.running:
            ex.busy = False
            return
        budget = ex.prefill_chunk
        prefill = 0
        decoding = 0
        for live in ex.running:
            if live.remaining_prefill > 0:
                take = min(budget, live.remaining_prefill)
                budget -= take
                prefill += take
            else:
                decoding += 1
        pull_s = sum(live.pull_s for live in ex.running)
        ex.busy = True
        step_s = rates.decode_step_s(decoding) + prefill / rates.prefill_tok_s + pull_s
        push(now + step_s, "step", e)

    def end_step(e: int, now: float) -> None:
        ex = execs[e]
        budget = ex.prefill_chunk
        still: list[_Live] = []
        for live in ex.running:
            live.pull_s = 0.0
            if live.remaining_prefill > 0:
                take = min(budget, live.remaining_prefill)
                budget -= take
                live.remaining_prefill -= take
                if live.remaining_prefill == 0:
                    ttft[live.index] = now - live.arrived
                    live.remaining_output -= 1
                    ex.touch(hashes[live.index])
            else:
                live.remaining_output -= 1
            if live.remaining_output <= 0 and live.remaining_prefill == 0:
                e2e[live.index] = now - live.arrived
                done[live.index] = True
                nxt = followers.get(live.index)
                if nxt is not None:
                    push(max(now, requests[nxt].at), "arrive", nxt)
            else:
                still.append(live)
        ex.running = still
        start_step(e, now)

    while events:
        clock, _, kind, i = heapq.heappop(events)
        if kind == "step":
            end_step(i, clock)
            continue
        r = requests[i]
        max_hit = (len(r.prompt_token_ids) - 1) // block_size
        cands = []
        for ex in execs:
            record = ExecutorRecord(
                ex.executor_id,
                ex.executor_id,
                1,
                "sim",
                ExecutorLoad(
                    num_running=len(ex.running),
                    num_waiting=len(ex.waiting),
                    kv_blocks_total=ex.cache_blocks,
                ),
            )
            hit = ex.cached_blocks(hashes[i], max_hit) if policy.uses_prefix_cache else 0
            cands.append(Candidate(record, hit, ex.load))
        request = RoutingRequest(r.prompt_token_ids, hashes[i], block_size, clock)
        decision = policy.choose(cands, request)
        assert decision is not None, "the simulation never excludes an executor"
        e = int(decision.executor_id.rsplit("-", 1)[1])
        ex = execs[e]
        hit = ex.cached_blocks(hashes[i], max_hit)
        ex.touch(hashes[i][:hit])
        held = max(x.cached_blocks(hashes[i], max_hit) for x in execs) if pulls else hit
        pulled = (held - hit) * block_size
        cached_total += held * block_size
        pulled_total += pulled
        served[ex.executor_id] = served.get(ex.executor_id, 0) + 1
        remaining = len(r.prompt_token_ids) - held * block_size
        pull_s = pulled * rates.pull_s_per_token
        ex.waiting.append(_Live(i, remaining, r.output_len, clock, pull_s))
        if not ex.busy:
            start_step(e, clock)
    assert all(done), "every request finishes"
    return SimResult(
        ttft=ttft,
        e2e=e2e,
        output_tokens=[r.output_len for r in requests],
        prompt_tokens=sum(len(r.prompt_token_ids) for r in requests),
        cached_tokens=cached_total,
        pulled_tokens=pulled_total,
        duration_s=clock,
        requests_per_executor=dict(sorted(served.items())),
    )
