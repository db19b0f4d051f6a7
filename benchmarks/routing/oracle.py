"""The oracle prefix-cache hit rate: what one cache of unlimited size would have served.

Requests in arrival order; a request's hit is its leading full blocks whose chained hash an
earlier request's prompt already produced (a chained hash stands for its whole prefix), capped
as the block manager caps it: the last prompt token is always computed, so at most
(prompt_len - 1) // block_size blocks hit. No eviction, no routing: an upper bound for any
policy over any number of executors.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from quire.block.hashing import hash_full_blocks


def cached_tokens_per_request(
    prompts: Iterable[Sequence[int]], block_size: int, extra_key: str
) -> list[int]:
    """Prompt tokens each request would find cached, prompts in arrival order."""
    seen: set[bytes] = set()
    out: list[int] = []
    for ids in prompts:
        hashes = hash_full_blocks(list(ids), block_size, extra_key)
        max_hit = (len(ids) - 1) // block_size if ids else 0
        hit = 0
        for h in hashes[:max_hit]:
            if h not in seen:
                break
            hit += 1
        out.append(hit * block_size)
        seen.update(hashes)
    return out


def oracle_hit_rate(prompts: Sequence[Sequence[int]], block_size: int, extra_key: str) -> float:
    """Cached prompt tokens / prompt tokens under one unlimited cache."""
    total = sum(len(p) for p in prompts)
    if not total:
        return 0.0
    return sum(cached_tokens_per_request(prompts, block_size, extra_key)) / total
