"""Stateful property test: random steps with manager restarts and a mirrored prefix index.

Extends the BlockManager machine (see test_manager_properties) with a `restart`
rule: a fresh manager is rebuilt with `restore()` from what the executor knows
(token ids, block tables, tokens whose KV is written), keeping the simulated KV
cache. The inherited invariant that every sequence reads back its own tokens then
also covers prefix hits on restored hashes. A second invariant replays
`drain_index_events()` into a set, as the Redis publisher does, and checks that
it always equals the index.
"""

from __future__ import annotations

from hypothesis import event, settings
from hypothesis.stateful import invariant, rule

from quire.block import (
    RELEASED_BLOCK,
    BlockManager,
    LiveSequenceState,
    group_block_hash,
    hash_full_blocks,
)
from tests.libs.block.test_manager_properties import BlockManagerMachine


class RestoringMachine(BlockManagerMachine):
    def __init__(self) -> None:
        super().__init__()
        self.published: set[bytes] = set()

    @rule()
    def restart(self) -> None:
        old = self.m
        live = [
            LiveSequenceState(
                seq_id,
                tuple(seq.tokens),
                tuple(old.block_table(seq_id)),
                seq.num_computed,
                seq.extra_key,
            )
            for seq_id, seq in self.live.items()
        ]
        self.m = BlockManager(
            old.num_blocks,
            old.block_size,
            old.enable_prefix_caching,
            layout=old.layout,
        )
        self.m.restore(live)
        self.m.check_integrity()
        event("restart")
        for block_id in range(old.num_blocks):
            assert self.m.pool.refcount(block_id) == old.pool.refcount(block_id)
        for seq_id in self.live:
            assert self.m.block_table(seq_id) == old.block_table(seq_id)
        # Indexed now: exactly the computed full blocks live sequences still hold (cached ones
        # are lost, and so are those released outside a sliding window).
        computed = set()
        if self.m.enable_prefix_caching:
            for state in live:
                hashes = hash_full_blocks(state.token_ids, self.bs, state.extra_key)
                for slot, block_id in enumerate(state.block_table):
                    index, group = divmod(slot, self.groups)
                    if block_id != RELEASED_BLOCK and index < state.num_computed_tokens // self.bs:
                        computed.add(group_block_hash(hashes[index], group))
        assert set(self.m.indexed_hashes()) == computed
        added, removed = self.m.drain_index_events()
        assert removed == []
        self.published = set(added)  # the publisher's reset: DEL, then SADD of all

    @invariant()
    def published_index_matches(self) -> None:
        if not hasattr(self, "m"):
            return
        added, removed = self.m.drain_index_events()
        assert not set(added) & set(removed)
        assert not set(added) & self.published, "added a hash that was already indexed"
        assert set(removed) <= self.published, "removed a hash that was not indexed"
        self.published |= set(added)
        self.published -= set(removed)
        assert self.published == set(self.m.indexed_hashes())


# The block machine's settings (no deadline, the same health checks off), fewer examples.
RestoringMachine.TestCase.settings = settings(
    BlockManagerMachine.TestCase.settings, max_examples=200, stateful_step_count=30
)
TestRestoringMachine = RestoringMachine.TestCase
