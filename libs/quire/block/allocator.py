"""The block-allocator contract: one batched call per engine step.

The scheduler never touches allocator internals. Once per step it sends a
`StepAllocation` (what finished, what was computed, new tokens, forks, prompts
to admit) and receives a `StepAllocationResult` (block tables, prefix-cache
hits, copy-on-write copies, who was preempted or not admitted). The same
message pair is served in-process by `LocalBlockAllocator` and, across a
process boundary, by the memory manager over gRPC.

Processing order inside one call (every implementation must follow it):

0. `released_pins` -- drop the pins of earlier `pulls` the caller is done with (it pulled
                   the blocks, or gave up); a pin this allocator does not hold (it expired,
                   or the allocator restarted since granting it) is ignored.
0b. `deferred_appends` -- tokens of earlier steps that needed nothing from the allocator,
                   which the caller did not send then (quiet steps, see below): added to their
                   sequences first. Each fits in its sequence's last block, which no other
                   sequence shares, so it allocates and copies nothing; one that would is
                   refused as invalid.
1. `forks`      -- the child shares all of the parent's blocks (refcount + 1).
2. `commits`    -- record how many tokens of each sequence now have their KV in
                   the cache; every full block below that mark gets its chained
                   hash registered in the prefix index (first writer wins).
3. `frees`      -- release every block of these sequences (finished, aborted),
                   tail blocks first. (Forks and commits come first so that a
                   parent finishing on its first token can still be forked and
                   a finished sequence's computed blocks stay reusable.)
4. `appends`    -- in priority order (earliest arrival first): add the new token
                   ids to the sequence, making room for them. Writing into a
                   block whose refcount > 1 first copies it (copy-on-write,
                   reported in `copies`). When the pool is empty, sequences are
                   preempted from the END of `appends` (latest arrival first):
                   their blocks are freed and they are listed in `preempted`;
                   a sequence that would have to preempt itself is preempted.
5. `admits`     -- in FCFS order: look up the longest cached prefix of full
                   blocks (never the whole prompt: the last token is always
                   recomputed; no lookup for `skip_prefix_cache`), then allocate blocks for every remaining token.
                   The first admit that does not fit stops admission; it and all
                   after it are listed in `not_admitted`, holding nothing. If any
                   sequence was preempted in this call, no admit is processed
                   (all are `not_admitted`): preempted work goes back first.

6. `pulls`      -- (only an allocator that sees other executors' pools: the memory manager)
                   for each admitted prompt, the run of full blocks right after its
                   local hits that one peer holds (never the block of the last token),
                   pinned on the peer (refcount + 1) until the caller releases the pin
                   or its lease runs out. The caller may copy those blocks' KV from the
                   peer into its table's blocks at the same positions and count them as
                   computed, or ignore the offer and compute them; either way it
                   releases the pin in a later step.

Quiet steps. A step whose appends all fit in their sequences' own partial last blocks and
whose commits complete no new full block, with nothing else in it, changes no table and
copies nothing: its result is known in advance. A caller across a process boundary may
skip the call for it and send what it held back with the next step that needs the
allocator, as `deferred_appends` and that step's commits (a commit never goes backwards, so
the latest one stands for the held-back ones). Nothing the allocator publishes changes by
waiting: prefix hashes are registered only for full blocks.

The result carries block tables as deltas (`table_updates`: only the sequences
whose table changed, and only the changed tail; see quire.block.tables), so a
step's result is proportional to what changed, not to what is running. The
executor holds the tables once (`quire.block.tables.BlockTables`, which applies each
result and asks the allocator to `resync` when its tables and the allocator's drift).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class AdmitRequest:
    """A sequence entering the pool (new prompt, or a preempted one re-entering)."""

    seq_id: str
    # Every token the sequence has so far (prompt, plus outputs after a preemption).
    token_ids: tuple[int, ...]
    # Mixed into the first block's hash: model id, LoRA id, ... ("" for none).
    extra_key: str = ""
    # Read nothing from the prefix cache (every token is computed; its full blocks are still
    # registered once written): a request that needs logits at every prompt position.
    skip_prefix_cache: bool = False


@dataclass(frozen=True)
class AppendRequest:
    """New tokens of a running sequence that need KV slots this step."""

    seq_id: str
    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class CommitRequest:
    """`num_computed_tokens` of `seq_id` now have their KV written in the cache."""

    seq_id: str
    num_computed_tokens: int


@dataclass(frozen=True)
class ForkRequest:
    """`child_seq_id` starts as a copy of `parent_seq_id` sharing all its blocks."""

    parent_seq_id: str
    child_seq_id: str


@dataclass(frozen=True)
class PullOffer:
    """Blocks of an admitted prompt that a peer executor holds: copy them instead of computing.

    Pulled block i lands in the caller's table at `first_block + i` (`first_block` =
    the admit's cached tokens // block size) and holds tokens
    [(first_block + i) * block_size, (first_block + i + 1) * block_size). With several KV
    groups (quire.block.window.TableLayout, the same on both sides) the source ids are flat
    table entries, every group's of each logical block: entry i lands at slot
    `first_block * num_groups + i` of the caller's flat table.
    """

    # Names the pin on the source blocks; released in a later StepAllocation.
    pin_id: str
    source_executor_id: str
    # host:port of the source executor's gRPC server (its ReadBlocks call)
    source_address: str
    # The allocator instance that granted the pin: the source refuses a read whose pin
    # another instance granted (a restarted manager holds no such pin).
    granted_by: str
    first_block: int
    # Physical block ids on the source, in table order (every group's of each logical block).
    source_block_ids: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class StepAllocation:
    """Everything one engine step asks of the allocator, applied in the module's order."""

    # Pins of earlier pulls the caller no longer needs (`PullOffer.pin_id`).
    released_pins: tuple[str, ...] = ()
    # Tokens of earlier quiet steps, each within its sequence's own last block (step 0b).
    deferred_appends: tuple[AppendRequest, ...] = ()
    forks: tuple[ForkRequest, ...] = ()
    commits: tuple[CommitRequest, ...] = ()
    frees: tuple[str, ...] = ()
    appends: tuple[AppendRequest, ...] = ()
    admits: tuple[AdmitRequest, ...] = ()
    # Also return `table_checksums` for every sequence the step names (drift check).
    verify_tables: bool = False


@dataclass(frozen=True)
class TableUpdate:
    """A changed block table: new table = the caller's old table[:start] + block_ids."""

    # Entries of the caller's previous table that stay (0: a new table).
    start: int
    # Physical block ids from position `start` on, in logical order.
    block_ids: tuple[int, ...]

    @property
    def num_blocks(self) -> int:
        """Length of the table after the update."""
        return self.start + len(self.block_ids)


@dataclass
class StepAllocationResult:
    """What the step got: tables for every live sequence touched, hits, copies."""

    # seq_id -> how its table changed, for every live sequence whose table changed:
    # fork children and admitted prompts (start 0), appends that took a new block or
    # copied their last one. Unchanged tables are absent.
    table_updates: dict[str, TableUpdate] = field(default_factory=dict)
    # seq_id -> number of leading tokens whose KV is already cached (admits only).
    num_cached_tokens: dict[str, int] = field(default_factory=dict)
    # (src, dst) physical block copies to perform before the forward pass.
    copies: list[tuple[int, int]] = field(default_factory=list)
    # Sequences whose blocks were freed to make room (latest arrival first).
    preempted: list[str] = field(default_factory=list)
    # Admit requests that did not fit, in request order.
    not_admitted: list[str] = field(default_factory=list)
    # With `verify_tables`: seq_id -> quire.block.tables.table_checksum of its full
    # table, for every sequence the step names (fork children, appends, admits).
    table_checksums: dict[str, int] = field(default_factory=dict)
    # seq_id -> blocks a peer holds past its local hits (admitted prompts; see PullOffer).
    pulls: dict[str, PullOffer] = field(default_factory=dict)


@dataclass(frozen=True)
class AllocatorStats:
    """Counters every allocator exposes (tokens for prefix-cache figures)."""

    num_blocks_total: int
    num_blocks_used: int  # refcount > 0
    num_blocks_cached: int  # refcount 0 but still findable by hash
    num_blocks_shared: int  # refcount > 1
    prefix_cache_queries: int  # prompt tokens looked up at admission
    prefix_cache_hits: int  # of those, tokens found cached
    num_copies: int  # copy-on-write block copies so far
    num_preemptions: int


class BlockAllocator(Protocol):
    """One interface, two implementations: in-process and the memory manager."""

    block_size: int
    num_blocks: int

    def step(self, request: StepAllocation) -> StepAllocationResult: ...

    def resync(self, request: StepAllocation, reason: str) -> StepAllocationResult:
        """The caller's tables and this allocator's disagree (`reason` says how): rebuild
        this allocator's view from the caller's live sequences, then do `request` (not
        applied by the failed attempt, or undone by the rebuild) and return its result.
        An allocator that cannot drift raises."""
        ...

    def stats(self) -> AllocatorStats: ...
