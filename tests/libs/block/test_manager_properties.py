"""Stateful property test: random engine steps against BlockManager and a simulated KV cache.

The machine plays the executor: it builds one `StepAllocation` per step (frees,
commits, forks, appends for every running sequence, admits of new and preempted
prompts), applies the returned copies to a simulated KV cache, "computes" a
random chunk of each sequence's pending tokens by writing token ids into their
slots, and checks that every sequence reads back its own tokens (with a sliding
window, those its next token's window and its pending tokens need: the blocks
before it may be released). That catches a block reused while still referenced,
a wrong prefix hit, a block released too early, or a missed copy-on-write, on top
of `check_integrity()` after every step. With several KV groups (a hybrid model's flat
tables) every group's block of a position holds its token, and only the sliding groups'
blocks before the window may be released.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from quire.block import (
    RELEASED_BLOCK,
    AdmitRequest,
    AppendRequest,
    BlockManager,
    CommitRequest,
    ForkRequest,
    StepAllocation,
    StepAllocationResult,
    TableLayout,
)
from tests.libs.block.mirror import checked_step

# Shared prompt prefixes so that prefix hits and duplicate blocks happen often.
PREFIXES = [list(range(10, 22)), list(range(30, 42)), [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4]]
EXTRA_KEYS = ["", "lora-a"]
MAX_WAITING = 6


@dataclass
class _Seq:
    tokens: list[int]
    extra_key: str
    num_computed: int  # tokens whose "KV" has been written into the simulated cache
    num_committed: int  # last mark sent in a commit


class BlockManagerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.live: dict[str, _Seq] = {}  # arrival order = priority order
        self.waiting: dict[str, _Seq] = {}  # preempted or not admitted
        self.next_id = 0

    @initialize(
        num_blocks=st.integers(3, 16),
        block_size=st.sampled_from([1, 2, 4]),
        caching=st.booleans(),
        window=st.sampled_from([None, None, 1, 3, 6]),
        num_groups=st.sampled_from([1, 1, 2, 3]),
    )
    def setup(
        self, num_blocks: int, block_size: int, caching: bool, window: int | None, num_groups: int
    ) -> None:
        if num_groups == 1:
            self.m = BlockManager(num_blocks, block_size, caching, sliding_window=window)
        else:  # a global group first, then sliding ones (all global without a window)
            layout = TableLayout((None, *[window] * (num_groups - 1)))
            self.m = BlockManager(num_blocks * num_groups, block_size, caching, layout=layout)
            num_blocks *= num_groups
        self.bs = block_size
        self.groups = num_groups
        self.windows = self.m.layout.windows
        # Simulated KV cache: the token id held in each slot of each block.
        self.kv: list[list[int | None]] = [[None] * block_size for _ in range(num_blocks)]

    def _new_id(self) -> str:
        self.next_id += 1
        return f"s{self.next_id}"

    def _draw_prompt(self, data: st.DataObject) -> list[int]:
        prefix = data.draw(st.sampled_from([[], *PREFIXES]))
        prefix = prefix[: data.draw(st.integers(0, len(prefix)))]
        tail = data.draw(st.lists(st.integers(0, 3), max_size=6))
        return (prefix + tail) or [0]

    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        # Forks only of fully computed sequences (n > 1 / beam search after prefill).
        forks = []
        forkable = [s for s, q in self.live.items() if q.num_computed == len(q.tokens)]
        if forkable:
            for parent in data.draw(st.lists(st.sampled_from(forkable), max_size=2)):
                forks.append(ForkRequest(parent, self._new_id()))
        parents = {f.child_seq_id: self.live[f.parent_seq_id] for f in forks}
        live_ids = list(self.live) + list(parents)

        commits = []
        for seq_id in live_ids:
            seq = self.live.get(seq_id) or parents[seq_id]
            if seq.num_computed > seq.num_committed and data.draw(st.integers(0, 3)) > 0:
                commits.append(CommitRequest(seq_id, seq.num_computed))
            elif data.draw(st.integers(0, 9)) == 0:  # a stale mark is harmless
                commits.append(CommitRequest(seq_id, data.draw(st.integers(0, seq.num_computed))))

        frees = (
            data.draw(st.lists(st.sampled_from(live_ids), unique=True, max_size=2))
            if live_ids
            else []
        )
        # Every running sequence is listed, in arrival order, so each is a preemption candidate.
        running = [s for s in live_ids if s not in frees]
        token_lists = st.lists(st.integers(0, 3), max_size=2 * self.bs + 1)
        appends = [AppendRequest(s, tuple(data.draw(token_lists))) for s in running]

        readmits = (
            data.draw(st.lists(st.sampled_from(sorted(self.waiting)), unique=True, max_size=2))
            if self.waiting
            else []
        )
        admits = [
            AdmitRequest(s, tuple(self.waiting[s].tokens), self.waiting[s].extra_key)
            for s in readmits
        ]
        for _ in range(data.draw(st.integers(0, 2))):
            extra_key = data.draw(st.sampled_from(EXTRA_KEYS))
            admits.append(AdmitRequest(self._new_id(), tuple(self._draw_prompt(data)), extra_key))

        request = StepAllocation(
            forks=tuple(forks),
            commits=tuple(commits),
            frees=tuple(frees),
            appends=tuple(appends),
            admits=tuple(admits),
        )
        stats_before = self.m.stats()
        # The table updates applied to a caller-side copy must give every table exactly.
        result = checked_step(self.m, request)
        self._check_result(request, result)
        for name, happened in [
            ("prefix hit", any(result.num_cached_tokens.values())),
            ("copy-on-write", bool(result.copies)),
            ("preemption", bool(result.preempted)),
            ("admit refused", bool(result.not_admitted)),
            ("window release", any(RELEASED_BLOCK in t for t in result.block_tables.values())),
        ]:
            if happened:
                event(name)
        self._update_mirror(request, result)
        self._simulate_forward(result.copies, list(result.block_tables), data)
        self.m.check_integrity()
        stats = self.m.stats()
        assert stats.num_copies == stats_before.num_copies + len(result.copies)
        assert stats.num_preemptions == stats_before.num_preemptions + len(result.preempted)
        assert stats.prefix_cache_hits <= stats.prefix_cache_queries

    def _check_result(self, request: StepAllocation, result: StepAllocationResult) -> None:
        append_ids = [a.seq_id for a in request.appends]
        admit_ids = [a.seq_id for a in request.admits]
        # Preempted from the end of appends; not admitted is a suffix of admits.
        assert result.preempted == append_ids[::-1][: len(result.preempted)]
        assert result.not_admitted == admit_ids[len(admit_ids) - len(result.not_admitted) :]
        if result.preempted:
            assert result.not_admitted == admit_ids
        kept = set(append_ids) - set(result.preempted)
        admitted = set(admit_ids) - set(result.not_admitted)
        assert set(result.block_tables) == kept | admitted
        assert set(result.num_cached_tokens) == admitted
        for seq_id, table in result.block_tables.items():
            assert table == self.m.block_table(seq_id)
        for seq_id, num_cached in result.num_cached_tokens.items():
            tokens = next(a.token_ids for a in request.admits if a.seq_id == seq_id)
            assert num_cached % self.bs == 0 and num_cached < len(tokens)
            if not self.m.enable_prefix_caching:
                assert num_cached == 0
        sources = [src for src, _ in result.copies]
        destinations = [dst for _, dst in result.copies]
        assert len(set(destinations)) == len(destinations)
        assert not set(sources) & set(destinations), f"copy chain in {result.copies}"
        # A source must stay held after the step (a copy is withdrawn rather than
        # letting its source be reallocated while the copy is pending).
        assert all(not self.m.pool.is_free(src) for src in sources)

    def _update_mirror(self, request: StepAllocation, result: StepAllocationResult) -> None:
        for fork in request.forks:
            self.live[fork.child_seq_id] = replace(
                self.live[fork.parent_seq_id], tokens=list(self.live[fork.parent_seq_id].tokens)
            )
        for commit in request.commits:
            self.live[commit.seq_id].num_committed = commit.num_computed_tokens
        for seq_id in request.frees:
            del self.live[seq_id]
        preempted = set(result.preempted)
        for append in request.appends:
            seq = self.live[append.seq_id]
            seq.tokens.extend(append.token_ids)
            if append.seq_id in preempted:
                # Requeued with every token so far; its KV is gone.
                del self.live[append.seq_id]
                self.waiting[append.seq_id] = replace(seq, num_computed=0, num_committed=0)
        for admit in request.admits:
            self.waiting.pop(admit.seq_id, None)
            if admit.seq_id in result.num_cached_tokens:
                cached = result.num_cached_tokens[admit.seq_id]
                self.live[admit.seq_id] = _Seq(
                    list(admit.token_ids), admit.extra_key, cached, cached
                )
            else:
                self.waiting[admit.seq_id] = _Seq(list(admit.token_ids), admit.extra_key, 0, 0)
        while len(self.waiting) > MAX_WAITING:  # abandon the oldest
            del self.waiting[next(iter(self.waiting))]
        assert all(self.m.has_seq(s) for s in self.live)
        assert not any(self.m.has_seq(s) for s in self.waiting)
        for seq_id, seq in self.live.items():
            assert self.m.num_tokens(seq_id) == len(seq.tokens)

    def _simulate_forward(
        self, copies: list[tuple[int, int]], scheduled: list[str], data: st.DataObject
    ) -> None:
        # Before the forward pass, all at once (one batched copy kernel): that is
        # only safe because no block is both a source and a destination.
        sources = [list(self.kv[src]) for src, _ in copies]
        for (_, dst), content in zip(copies, sources, strict=True):
            self.kv[dst] = content
        for seq_id in scheduled:
            seq = self.live[seq_id]
            pending = len(seq.tokens) - seq.num_computed
            chunk = (
                data.draw(st.integers(0, pending))
                if pending and data.draw(st.booleans())
                else pending
            )
            table = self.m.block_table(seq_id)
            for pos in range(seq.num_computed, seq.num_computed + chunk):
                for group in range(self.groups):
                    block_id = table[pos // self.bs * self.groups + group]
                    assert self.m.pool.refcount(block_id) == 1, (
                        f"{seq_id} writes shared block {block_id}"
                    )
                    assert self.m.pool.block_hash(block_id) is None, (
                        f"{seq_id} writes hashed block {block_id}"
                    )
                    self.kv[block_id][pos % self.bs] = seq.tokens[pos]
            seq.num_computed += chunk

    @invariant()
    def every_sequence_reads_its_own_tokens(self) -> None:
        if not hasattr(self, "m"):
            return
        for seq_id, seq in self.live.items():
            flat = self.m.block_table(seq_id)
            for group, window in enumerate(self.windows):
                table = flat[group :: self.groups]
                # The next token (at num_computed) reads from `first` on; pending tokens later.
                first = 0 if window is None else max(0, seq.num_computed - window + 1)
                needed = range(first // self.bs, len(table))
                assert all(table[i] != RELEASED_BLOCK for i in needed), f"{seq_id} released early"
                positions = range(first, seq.num_computed)
                cached = [self.kv[table[p // self.bs]][p % self.bs] for p in positions]
                assert cached == seq.tokens[first : seq.num_computed], (
                    f"{seq_id} reads corrupted KV (group {group})"
                )
        used = {b for s in self.live for b in self.m.block_table(s) if b != RELEASED_BLOCK}
        assert self.m.stats().num_blocks_used == len(used)

    def teardown(self) -> None:
        if not hasattr(self, "m"):
            return
        self.m.step(StepAllocation(frees=tuple(self.live)))
        self.m.check_integrity()
        stats = self.m.stats()
        assert stats.num_blocks_used == 0, "leaked blocks after freeing everything"
        assert self.m.num_free_blocks == self.m.num_blocks
        assert stats.num_blocks_cached <= self.m.num_blocks


BlockManagerMachine.TestCase.settings = settings(
    max_examples=250,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestBlockManagerMachine = BlockManagerMachine.TestCase
