"""Which executor serves a request: prefix-cache affinity weighed against load. Pure, no I/O.

The router gathers, for one prompt, the live executors (`ExecutorRecord`s from Redis) and how
many of the prompt's leading full blocks each one holds in its prefix cache; this module
turns that into one choice and the reason for it:

``prefix_hit``       an executor holding part of the prompt wins on score (cached tokens
                     minus a cost per queued request and for KV pressure).
``consistent_hash``  nobody holds the prompt's first block, and the executors tied for the
                     least load (within `max_hash_load_gap`) are split by rendezvous (HRW)
                     hashing of the first block hash (or of the token ids of a prompt shorter
                     than a block): siblings of a new prefix arriving together land on the
                     same executor, which then caches it for the rest of the burst.
``placement``        nobody holds the prompt's first block and, among the executors tied for the
                     least load, the one whose recent working set (the blocks this router sent
                     it lately, `quire.cluster.placement`) is the smallest share of its KV
                     cache takes it, or the one a sibling of the prompt went to (its home),
                     rather than the consistent-hash choice: new prefixes fill the cluster's
                     caches evenly instead of piling on whichever executor the hash favours.
``load_balance``     the load-aware pick overrode affinity: a cache miss went to a less loaded
                     executor than its HRW choice (misses spread by load), or a lightly
                     loaded executor out-scored the prefix holders.
``prefix_pull``      (executors that pull) the chosen executor holds fewer of the prompt's
                     blocks than another live one and will copy the rest from it: its
                     score counts those tokens at `1 - pull_cost_fraction` of a cached one
                     (the fraction the executor measured and published, else the config's),
                     so a conversation whose history sits on a busy executor can go to an
                     idle one, which pulls the history instead of computing it.
``prefix_capped``    the prefix is cached only on executors too loaded to take more (their
                     load exceeds the least-loaded one's by more than the gap and the ratio
                     of `RoutingConfig`), so the request goes to the least-loaded one instead.
                     This is what stops one hot shared prefix from piling every request on
                     one executor.

Draining and excluded executors (marked down, at their admission bound, already tried) are
never chosen. Ties are broken by HRW rank, so equal inputs always give the same choice.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from quire.cluster.redis_keys import ExecutorRecord
from quire.config import engine_default

REASONS = (
    "prefix_hit",
    "prefix_pull",
    "consistent_hash",
    "placement",
    "load_balance",
    "prefix_capped",
)


@dataclass(frozen=True)
class RoutingConfig:
    """Knobs of the policy; the defaults suit executors of equal size."""

    block_size: int = engine_default("block_size")  # tokens per KV block (the executors')
    load_cost_tokens: float = 16.0  # score cost of one running/waiting request, in cached tokens
    kv_cost_tokens: float = 64.0  # score cost of a full KV cache (scaled by the used fraction)
    max_load_gap: int = 4  # an executor this many requests above the least loaded ...
    max_load_ratio: float = 2.0  # ... and this many times its load loses its prefix bonus
    # A prompt nobody caches goes to the least loaded executor; executors at most this many
    # requests above it count as tied, and ties go by consistent hash (0: strictly by load).
    max_hash_load_gap: int = 0
    # Whether executors pull prompt blocks a peer holds (the memory manager's offers), and what
    # a pulled token costs as a fraction of a computed one (`make bench-pulls` measures it).
    pulls: bool = False
    pull_cost_fraction: float = 0.25

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.load_cost_tokens < 0 or self.kv_cost_tokens < 0:
            raise ValueError("load_cost_tokens and kv_cost_tokens must be >= 0")
        if self.max_load_gap < 0:
            raise ValueError(f"max_load_gap must be >= 0, got {self.max_load_gap}")
        if self.max_hash_load_gap < 0:
            raise ValueError(f"max_hash_load_gap must be >= 0, got {self.max_hash_load_gap}")
        if self.max_load_ratio < 1:
            raise ValueError(f"max_load_ratio must be >= 1, got {self.max_load_ratio}")
        if not 0 <= self.pull_cost_fraction <= 1:
            raise ValueError(f"pull_cost_fraction must be in [0, 1], got {self.pull_cost_fraction}")


@dataclass(frozen=True)
class Candidate:
    """One live executor as the router sees it for this prompt."""

    record: ExecutorRecord
    num_cached_blocks: int = 0  # leading prompt blocks in its prefix cache
    num_pending: int = 0  # requests this router has in flight there (fresher than the record)
    # Distinct blocks this router sent there lately (quire.cluster.placement), and whether one
    # of them opens this prompt: a sibling of it went there.
    num_placed_blocks: int = 0
    is_home: bool = False

    @property
    def executor_id(self) -> str:
        return self.record.executor_id

    @property
    def load(self) -> int:
        """Queued work: the record's running + waiting, or this router's own count if higher."""
        load = self.record.load
        return max(load.num_running + load.num_waiting, self.num_pending)

    @property
    def placed_share(self) -> float:
        """Its recent working set as a share of its KV cache, 0.0 when the size is unknown."""
        total = self.record.load.kv_blocks_total
        return self.num_placed_blocks / total if total else 0.0

    @property
    def kv_usage(self) -> float:
        """Fraction of the KV pool in use, 0.0 when unknown."""
        return min(1.0, self.record.load.kv_cache_usage)


@dataclass(frozen=True)
class RoutingDecision:
    """The chosen executor and why."""

    executor_id: str
    address: str
    reason: str  # one of REASONS
    num_cached_tokens: int  # prompt tokens expected not to be computed (cached or pulled)


def routing_key(block_hashes: Sequence[bytes], prompt_token_ids: Sequence[int]) -> bytes:
    """What consistent hashing hashes: the first block hash, or the tokens of a short prompt."""
    if block_hashes:
        return block_hashes[0]
    return struct.pack(f"<{len(prompt_token_ids)}I", *prompt_token_ids)


def hrw_weight(key: bytes, executor_id: str) -> int:
    """Rendezvous-hashing weight of one executor for one key (stable across processes)."""
    digest = hashlib.blake2b(key + b"\x00" + executor_id.encode("utf-8"), digest_size=8)
    return int.from_bytes(digest.digest(), "little")


def is_overloaded(load: int, least_load: int, config: RoutingConfig) -> bool:
    """True when `load` exceeds the least load by more than both the gap and the ratio."""
    return load - least_load > config.max_load_gap and load > least_load * config.max_load_ratio


def choose_executor(
    candidates: Sequence[Candidate],
    block_hashes: Sequence[bytes],
    prompt_token_ids: Sequence[int],
    config: RoutingConfig | None = None,
    exclude: Collection[str] = (),
    block_size: int | None = None,
) -> RoutingDecision | None:
    """Pick the executor for a prompt; None when no candidate may take it.

    `block_hashes` are the prompt's chained full-block hashes (`hash_full_blocks`), used only
    for the consistent-hash key; `candidates[i].num_cached_blocks` says how many of them
    executor i holds. `block_size` (default `config.block_size`) is what they were hashed
    with: the executors' own, as their records announce it.
    """
    config = config or RoutingConfig()
    tokens_per_block = block_size or config.block_size
    eligible = [c for c in candidates if not c.record.draining and c.executor_id not in exclude]
    if not eligible:
        return None
    key = routing_key(block_hashes, prompt_token_ids)
    rank = {c.executor_id: hrw_weight(key, c.executor_id) for c in eligible}
    least_load = min(c.load for c in eligible)
    open_ = [c for c in eligible if not is_overloaded(c.load, least_load, config)]
    open_ids = {c.executor_id for c in open_}

    # Blocks any live executor holds can be pulled by the others (draining ones still serve).
    most_cached = max(c.num_cached_blocks for c in candidates) if config.pulls else 0

    def pull_cost_fraction(c: Candidate) -> float:
        measured = c.record.pull_cost_fraction
        return config.pull_cost_fraction if measured is None else measured

    def cached_tokens(c: Candidate) -> int:
        return c.num_cached_blocks * tokens_per_block

    def pulled_tokens(c: Candidate) -> int:
        if pull_cost_fraction(c) >= 1:
            return 0  # it measured pulling dearer than computing: it computes
        return max(0, most_cached - c.num_cached_blocks) * tokens_per_block

    def score(c: Candidate) -> float:
        saved = cached_tokens(c) + pulled_tokens(c) * (1 - pull_cost_fraction(c))
        return saved - config.load_cost_tokens * c.load - config.kv_cost_tokens * c.kv_usage

    holders = [c for c in eligible if c.num_cached_blocks > 0]
    if holders:
        best = max(open_, key=lambda c: (score(c), -c.load, rank[c.executor_id]))
        if pulled_tokens(best) > 0:
            reason = "prefix_pull"
        elif best.num_cached_blocks > 0:
            reason = "prefix_hit"
        elif any(c.executor_id in open_ids for c in holders):
            reason = "load_balance"
        else:
            reason = "prefix_capped"
        return _decision(best, reason, cached_tokens(best) + pulled_tokens(best))
    # Nobody caches this prompt: no bonus to weigh, so misses spread by load; among executors
    # about equally loaded a sibling's executor keeps it, then the emptiest working set takes
    # it, and hashing decides what is left.
    top = max(eligible, key=lambda c: rank[c.executor_id])
    tied = [c for c in eligible if c.load - least_load <= config.max_hash_load_gap]
    best = max(tied, key=lambda c: (c.is_home, -c.placed_share, rank[c.executor_id], -c.kv_usage))
    if best is top:
        reason = "consistent_hash"
    elif top in tied:
        reason = "placement"
    else:
        reason = "load_balance"
    return _decision(best, reason, 0)


def _decision(c: Candidate, reason: str, num_cached_tokens: int) -> RoutingDecision:
    return RoutingDecision(c.executor_id, c.record.address, reason, num_cached_tokens)
