"""Continuous-batching scheduler: admission, chunked prefill, preemption.

Each step it decides how many tokens every sequence runs (token budget
`max_num_batched_tokens`, at most `max_num_seqs` running), asks the block
allocator for room in ONE batched call, and emits a `SchedulerOutput`. It keeps
token accounting only: block tables are the executor's `BlockTables` (the model
runner's), through which the scheduler takes each allocator step.

A preempted sequence waits again with every token it has and `num_computed_tokens` 0; its
full computed blocks (block ids, as its table was before the step) go out in the step
object for the engine to swap out. When it is re-admitted, its computed tokens are the
allocator's prefix hits plus what a `PrefixLoader` (swap mode: quire.engine.swap) wrote
into the blocks after them: both are tokens it did not compute, counted the same way.

Admission order (SchedulerConfig.shortest_first, EngineConfig.scheduling_policy). "fcfs":
arrival order. "shortest" (shortest remaining prefill first): the prompts still to prefill,
those mid-prefill and those waiting alike, are ordered by their prefill's estimated time left
less the time they have waited (resumed sequences first; a long prompt outranks any newcomer
once it has waited its own prefill's length: nothing starves), and a step runs the first
batch of the split of that order into consecutive steps that minimizes the sum of their
first tokens' times (each step predicted by the fitted costs: a fixed part, its prompt tokens
and its decode rows). Shorter prompts in steps of their own get their first tokens before
the longer ones' prefill; one more step costs every prompt after it its fixed part. A prompt
that runs alone in a step runs in chunks about long enough that a step's fixed cost is a
tenth of one (CHUNK_FIXED_SHARE), so a long prompt, arriving first at an idle engine or
joining running streams, yields to shorter arrivals between its chunks at that price. In a
burst (more than one prompt to prefill; every prompt waiting then stays in it until
prefilled), a step beside streams that were already streaming when the burst arrived (a
whole step between a stream's first token and the burst's oldest prompt) runs at most
`max_decode_stall` times as long as its decodes alone, its prompt tokens chunked to fit: a
burst does not pause the streams users were already reading. The streams a burst starts
itself are not bounded by its rest: each of their tokens still comes no later than if the
whole burst had been one step. The costs are the engine's steps, fitted
(quire.engine.step_costs); until they are measured the order is arrival order, nothing is
split or chunked and nothing is bounded. A waiting prompt's prefill left counts out its
likely prefix hits, the leading blocks this engine computed lately
(quire.engine.recent_prefixes): a conversation's next turn goes by its new tokens, not its
whole length.

An admitted prompt's next blocks may also be offered from a peer executor (the memory
manager's `PullOffer`, right after the local hits): a `BlockPuller` copies them into the
prompt's new blocks and they count as computed too. Whether it pulled or not, the offer's
pin is released in the next allocator step.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from itertools import chain
from typing import Protocol

import numpy as np

from quire.block.allocator import (
    AdmitRequest,
    AppendRequest,
    BlockAllocator,
    CommitRequest,
    ForkRequest,
    PullOffer,
    StepAllocation,
)
from quire.block.tables import BlockTables
from quire.cache.block_transfer import PullStats
from quire.config import EngineConfig
from quire.engine.ngram_drafts import NgramIndex
from quire.engine.pull_choice import PullCostModel
from quire.engine.recent_prefixes import RecentPrefixes
from quire.engine.sequence import SeqStatus, Sequence
from quire.engine.step_costs import StepCostModel

# Shortest-first: a prompt's chunk is about long enough that one more step's fixed cost is this
# share of it (what a long prompt pays for yielding to shorter ones between its chunks).
CHUNK_FIXED_SHARE = 0.1
# ... and only where other prompts are likely to arrive during its prefill: chunking costs the
# prompt about CHUNK_FIXED_SHARE of its prefill P; a prompt arriving during it waits, without
# chunks, about P / 2 on average, and about half of the arrivals are shorter, so at an arrival
# rate r the expected gain r * P * P / 4 beats that cost where r * P >= 4 * CHUNK_FIXED_SHARE
# arrivals are expected during the prefill. The rate: the arrivals of the latest
# ARRIVAL_WINDOW_S seconds (one request at a time expects none: its prompts run whole).
CHUNK_MIN_ARRIVALS = 4 * CHUNK_FIXED_SHARE
ARRIVAL_WINDOW_S = 10.0
# N-gram drafts before the step costs are fitted: a step's fixed part taken to cost this many
# tokens' worth (a guess on the low side, so drafts are taken only where plainly worth it), so
# a lone stream drafts from its first tokens and a step of many streams does not.
DRAFT_TOKENS_PER_FIXED = 16.0


class BlockPuller(Protocol):
    """Copies blocks a peer executor holds into this executor's KV cache."""

    stats: PullStats  # what it pulled since it started

    def pull(self, offer: PullOffer, block_ids: Seq[int]) -> int:
        """Copy the offer's source blocks into `block_ids` (as many, same order); return how
        many leading blocks were written whole and verified (0 when it gave up: the caller
        computes the rest)."""
        ...


@dataclass(frozen=True)
class SchedulerConfig:
    """Budgets for one engine step (EngineConfig's, which defines and validates them)."""

    max_num_seqs: int  # most sequences running at once
    max_num_batched_tokens: int  # most tokens (prefill chunks + decodes) per step
    extra_key: str  # mixed into block hashes (model id)
    shortest_first: bool = False  # admission order (EngineConfig.scheduling_policy "shortest")
    # under shortest_first, in a burst: a step beside decoding streams runs at most this many
    # times the decodes alone (EngineConfig.max_decode_stall; 0: no bound)
    max_decode_stall: float = 0.0
    # the allocator answers prefix hits (EngineConfig.enable_prefix_caching): shortest-first
    # then counts a waiting prompt's likely hits out of its prefill (RecentPrefixes)
    prefix_caching: bool = False
    # n-gram speculation (EngineConfig.num_speculative_tokens, speculative_ngram_min/max):
    # most drafts per stream and step (0: off), the suffix lengths looked up
    num_speculative_tokens: int = 0
    ngram_min: int = 2
    ngram_max: int = 4
    max_model_len: int = 0  # a sequence's most tokens (drafts never run past it); 0: no cap

    @classmethod
    def of(
        cls, config: EngineConfig, extra_key: str = "", max_model_len: int = 0
    ) -> SchedulerConfig:
        return cls(
            config.max_num_seqs,
            config.max_num_batched_tokens,
            extra_key,
            shortest_first=config.scheduling_policy == "shortest",
            max_decode_stall=config.max_decode_stall,
            prefix_caching=config.enable_prefix_caching,
            num_speculative_tokens=config.num_speculative_tokens,
            ngram_min=config.speculative_ngram_min,
            ngram_max=config.speculative_ngram_max,
            max_model_len=max_model_len,
        )

    @property
    def measures_steps(self) -> bool:
        """Whether the scheduler reads fitted step costs (shortest-first, or drafts)."""
        return self.shortest_first or self.num_speculative_tokens > 0


class PrefixLoader(Protocol):
    """Fills a resumed sequence's new blocks after its prefix hits with KV kept elsewhere."""

    def load_prefix(self, token_ids: Seq[int], block_ids: Seq[int], num_cached_tokens: int) -> int:
        """Write KV into `block_ids` after the first `num_cached_tokens` (whole blocks) and
        return how many more leading tokens are now computed: whole blocks, never reaching
        the last token."""
        ...


@dataclass(frozen=True)
class ScheduledSeq:
    """One sequence in this step: run `num_new_tokens` starting at `num_computed_tokens`."""

    seq: Sequence
    num_computed_tokens: int
    num_new_tokens: int
    # Output indices sampled from this chunk's last logits row: empty until the chunk reaches
    # the sequence's end; every index 0..n-1 on an n>1 request's first token (the fork);
    # otherwise the sequence's own index.
    sample_indices: tuple[int, ...]
    # n-gram speculation: tokens guessed to follow the sequence's last one, run after it in
    # this step (counted in `num_new_tokens`); every position from the last token on is
    # sampled, and the drafts are kept up to the first one its sample differs from
    draft_token_ids: tuple[int, ...] = ()

    @property
    def samples(self) -> bool:
        return bool(self.sample_indices)


@dataclass
class SchedulerOutput:
    """The one plain step object the model runner reads."""

    scheduled: list[ScheduledSeq] = field(default_factory=list)
    copies: list[tuple[int, int]] = field(default_factory=list)  # (src, dst) blocks
    preempted: list[Sequence] = field(default_factory=list)
    # seq_id -> the block ids of each preempted sequence's full computed blocks, from its
    # table as it was before this step: their KV is intact until this step's copies and
    # forward pass, and can be swapped out before them.
    preempted_blocks: dict[str, list[int]] = field(default_factory=dict)
    num_not_admitted: int = 0  # waiting sequences offered to the pool and refused
    # Request ids admitted to the pool for the first time (their queue wait ends here).
    first_scheduled: list[str] = field(default_factory=list)
    allocator_s: float = 0.0  # the allocator call's wall time

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    """Owns the waiting and running queues; the allocator owns the blocks.

    `tables` is the executor's one record of the block tables (the model runner's); every
    allocator step goes through it, which applies the result once.
    """

    def __init__(
        self,
        config: SchedulerConfig,
        allocator: BlockAllocator,
        tables: BlockTables,
        prefix_loader: PrefixLoader | None = None,
        puller: BlockPuller | None = None,
    ) -> None:
        if tables.block_size != allocator.block_size:
            raise ValueError(
                f"block_size: the tables' {tables.block_size} != the allocator's "
                f"{allocator.block_size}"
            )
        self.config = config
        self.allocator = allocator
        self.tables = tables
        # Resumed sequences' blocks after their prefix hits (swap mode); None: recompute.
        self.prefix_loader = prefix_loader
        # Copies peers' blocks offered to admitted prompts; None: offers are declined.
        self.puller = puller
        self.pull_costs = PullCostModel()  # whether an offer is worth taking (measured)
        self.step_costs = StepCostModel()  # the engine's steps, for shortest-first admission
        # the blocks computed lately, for a waiting prompt's likely prefix hits (shortest-first)
        self.recent_prefixes = (
            RecentPrefixes(allocator.block_size, config.extra_key)
            if config.shortest_first and config.prefix_caching
            else None
        )
        self._pending_released_pins: list[str] = []
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._pending_frees: list[str] = []
        self._pending_forks: list[ForkRequest] = []
        self._pending_commits: dict[str, int] = {}
        self.num_preemptions = 0
        self.num_steps = 0  # schedule() calls so far: the steps sequences' arrivals are counted in
        # when the latest sequences arrived (add), for the arrival rate (`_arrival_rate`)
        self._arrivals: deque[float] = deque()

    # --- queue changes coming from the engine ---------------------------------------------

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)
        seq.waiting_since = time.monotonic()
        seq.arrived_step = self.num_steps
        if self.config.shortest_first:  # the arrival rate's one reader (`_prompt_chunk`)
            self._arrivals.append(seq.waiting_since)
            self._forget_arrivals(seq.waiting_since)

    def add_fork(self, parent: Sequence, child: Sequence) -> None:
        """`child` was sampled from `parent`'s logits; it shares the parent's blocks."""
        child.status = SeqStatus.RUNNING
        child.num_computed_tokens = parent.num_computed_tokens
        child.num_allocated_tokens = parent.num_allocated_tokens
        child.first_token_step = parent.first_token_step
        self._pending_forks.append(ForkRequest(parent.seq_id, child.seq_id))
        self.running.append(child)
        self.running.sort(key=lambda s: s.priority)

    def commit(self, seq: Sequence) -> None:
        """`seq`'s computed tokens, for the prefix index (sent once they fill a new block: a
        commit that registers no new full block changes nothing and is not sent)."""
        seq_id, block_size = seq.seq_id, self.allocator.block_size
        known = max(self.tables.num_committed_tokens(seq_id), self._pending_commits.get(seq_id, 0))
        # kept drafts are computed before the allocator has their tokens (the next step's
        # append): a commit covers only what it has
        computed = min(seq.num_computed_tokens, seq.num_allocated_tokens)
        if computed // block_size > known // block_size:
            self._pending_commits[seq_id] = computed
        if self.recent_prefixes is not None:
            self.recent_prefixes.record(seq)

    def finish(self, seq: Sequence) -> None:
        """Remove a finished or aborted sequence; its blocks are freed next step."""
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
            self._pending_frees.append(seq.seq_id)
        elif seq.status is SeqStatus.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = SeqStatus.FINISHED

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def flush(self) -> None:
        """Send pending forks, commits and frees now (when idle, nothing else would carry them)."""
        if (
            self._pending_frees
            or self._pending_commits
            or self._pending_forks
            or self._pending_released_pins
        ):
            self.tables.step(self.allocator, self._take_pending())

    def _take_pending(
        self,
        appends: tuple[AppendRequest, ...] = (),
        admits: tuple[AdmitRequest, ...] = (),
    ) -> StepAllocation:
        request = StepAllocation(
            released_pins=tuple(self._pending_released_pins),
            forks=tuple(self._pending_forks),
            commits=tuple(CommitRequest(k, v) for k, v in self._pending_commits.items()),
            frees=tuple(self._pending_frees),
            appends=appends,
            admits=admits,
        )
        self._pending_frees, self._pending_forks, self._pending_commits = [], [], {}
        self._pending_released_pins = []
        return request

    # --- one step --------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        """Pick this step's work and make room for it in one allocator call."""
        budget = self.config.max_num_batched_tokens
        pending = self._pending_prompts() if self.config.shortest_first else []
        in_burst = self.config.shortest_first and self._in_burst(pending)
        prefill_room = self._prefill_room(in_burst, pending)  # what prompts may take of it
        plan: dict[str, int] = {}  # seq_id -> tokens to compute this step (upper bound)
        # Under shortest-first the prompts mid-prefill are ordered with the waiting ones
        # (shortest remaining first), so a long prompt's chunks yield to shorter arrivals.
        prompting: list[Sequence] = []
        for seq in self.running:
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if n > 1 and self.config.shortest_first:
                prompting.append(seq)
                continue
            if n > 1:  # a prompt's next chunk, not a decode
                n = min(n, prefill_room)
                prefill_room -= n
            if n > 0:
                plan[seq.seq_id] = n
                budget -= n
        taken: list[Sequence] = []  # the prompts this step runs, mid-prefill and admitted
        num_slots = self.config.max_num_seqs - len(self.running)
        for seq, left in self._prompt_order(prompting):
            if min(budget, prefill_room) <= 0:
                break
            if seq.status is SeqStatus.WAITING:
                if num_slots <= 0:
                    if prompting:
                        continue  # no slot for it; a prompt already running may still fit
                    break
                num_slots -= 1
            taken.append(seq)
            n = min(left, budget, prefill_room)
            plan[seq.seq_id] = n
            budget -= n
            prefill_room -= n
        if self.config.shortest_first:
            kept = self._first_batch(taken, plan, len(self.running) - len(prompting))
            for seq in taken[len(kept) :]:
                del plan[seq.seq_id]
            taken = kept
            if len(taken) == 1:  # a prompt alone: chunked, to yield to shorter arrivals
                idle = not self.running and len(self.waiting) == 1
                plan[taken[0].seq_id] = self._prompt_chunk(plan[taken[0].seq_id], idle)
            if in_burst:  # every prompt waiting now is of it, admitted or not
                for seq in self.waiting:
                    seq.in_burst = True
        admits = [s for s in taken if s.status is SeqStatus.WAITING]

        request = self._take_pending(
            appends=tuple(
                AppendRequest(s.seq_id, tuple(s.token_ids[s.num_allocated_tokens :]))
                for s in self.running
            ),
            admits=tuple(
                AdmitRequest(
                    s.seq_id,
                    tuple(s.token_ids),
                    self.config.extra_key,
                    skip_prefix_cache=s.request.needs_prompt_logprobs,
                )
                for s in admits
            ),
        )
        started = time.perf_counter()
        result = self.tables.step(self.allocator, request)
        out = SchedulerOutput(
            copies=list(result.copies),
            num_not_admitted=len(result.not_admitted),
            allocator_s=time.perf_counter() - started,
        )
        by_id = {s.seq_id: s for s in self.running}
        block_size, num_groups = self.allocator.block_size, self.tables.num_groups
        for seq_id in result.preempted:
            seq = by_id[seq_id]
            table = self.tables.preempted_tables[seq_id]
            out.preempted_blocks[seq_id] = table[
                : num_groups * (seq.num_computed_tokens // block_size)
            ]
            self.running.remove(seq)
            self._requeue(seq)
            out.preempted.append(seq)
        self.num_preemptions += len(result.preempted)
        for seq in self.running:
            seq.num_allocated_tokens = seq.num_tokens
            if seq.seq_id in plan:
                out.scheduled.append(self._scheduled(seq, plan[seq.seq_id]))
        not_admitted = set(result.not_admitted)
        for seq in admits:
            if seq.seq_id in not_admitted:
                continue
            self.waiting.remove(seq)
            seq.status = SeqStatus.RUNNING
            seq.num_allocated_tokens = seq.num_tokens
            seq.num_computed_tokens = result.num_cached_tokens[seq.seq_id]
            offer = result.pulls.get(seq.seq_id)
            if offer is not None:
                seq.num_computed_tokens += self._pull(seq, offer)
            if seq.request.was_scheduled:  # a resume after preemption
                seq.num_computed_tokens += self._load_prefix(seq)
            if seq is seq.request.seqs[0] and seq.request.num_cached_tokens == 0:
                seq.request.num_cached_tokens = seq.num_computed_tokens
            if not seq.request.was_scheduled:
                seq.request.was_scheduled = True
                out.first_scheduled.append(seq.request.request_id)
            self.running.append(seq)
            n = min(plan[seq.seq_id], seq.num_tokens - seq.num_computed_tokens)
            out.scheduled.append(self._scheduled(seq, n))
        if self.config.num_speculative_tokens:
            self._add_drafts(out)
        if self.config.shortest_first:  # when each stream's first token came (the bound's)
            for scheduled in out.scheduled:
                seq = scheduled.seq
                if seq.first_token_step is None and (
                    scheduled.num_computed_tokens + scheduled.num_new_tokens >= seq.num_tokens
                ):
                    seq.first_token_step = self.num_steps
        self.num_steps += 1
        self.running.sort(key=lambda s: s.priority)
        return out

    def _prompt_order(self, prompting: list[Sequence]) -> Iterable[tuple[Sequence, int]]:
        """The prompts offered this step's room, in order, each with the tokens it still has
        to compute (`_prefill_left`, once a step): `prompting` (running, mid-prefill:
        shortest-first only) and the waiting sequences. Shortest-first with fitted costs:
        resumed sequences in arrival order, then the others by their prefill's estimated
        time left less the time they have waited (a long prompt outranks any newcomer once
        it has waited its own prefill's length: nothing starves). Otherwise arrival order,
        the running prompts first (lazily: the walk stops where the budget does)."""
        costs = self.step_costs
        if not self.config.shortest_first or costs.per_token_s is None:
            return ((seq, self._prefill_left(seq)) for seq in chain(prompting, self.waiting))
        now, per_token = time.monotonic(), costs.per_token_s

        def urgency(item: tuple[Sequence, int]) -> tuple[float, tuple[int, int]]:
            seq, left = item
            return (left * per_token - (now - seq.waiting_since), seq.priority)

        resumed = [(s, self._prefill_left(s)) for s in self.waiting if s.request.was_scheduled]
        fresh = [(s, self._prefill_left(s)) for s in prompting] + [
            (s, self._prefill_left(s)) for s in self.waiting if not s.request.was_scheduled
        ]
        return resumed + sorted(fresh, key=urgency)

    def _prefill_left(self, seq: Sequence) -> int:
        """The tokens `seq` still has to compute: a waiting prompt's likely prefix hits (the
        blocks this engine computed lately) left out under shortest-first, unless it asks for
        its prompt's logprobs (which bypass the prefix cache)."""
        left = seq.num_tokens - seq.num_computed_tokens
        if (
            self.recent_prefixes is None
            or seq.status is not SeqStatus.WAITING
            or seq.request.needs_prompt_logprobs
        ):
            return left
        return left - self.recent_prefixes.cached_tokens(seq)

    def _prompt_chunk(self, left: int, idle: bool) -> int:
        """How many of a prompt's `left` tokens a step that runs it alone computes, under
        shortest-first with fitted costs: chunks about long enough that one more step's fixed
        cost is CHUNK_FIXED_SHARE of one, so a long prompt pays about that for yielding to
        shorter arrivals between its chunks; `left` split evenly (no short tail chunk whose
        step would cost mostly its fixed part). The first chunk of a prompt that found the
        engine `idle` is shorter, about one fixed cost's worth of tokens: a burst's prompts
        reach the engine spread over a few steps, and a short first step lets the rest of its
        burst be ordered with it, for one more step's fixed cost. All of them where no other
        prompt is likely to arrive during its prefill (fewer than CHUNK_MIN_ARRIVALS at the
        recent arrival rate: one request at a time never waits for arrivals that do not come),
        or without fitted costs."""
        costs = self.step_costs
        if costs.per_token_s is None or not costs.fixed_s:
            return left
        prefill_s = costs.fixed_s + costs.per_token_s * left
        if self._arrival_rate(time.monotonic()) * prefill_s < CHUNK_MIN_ARRIVALS:
            return left  # no other prompt likely to arrive before it is done
        tokens_per_fixed = costs.fixed_s / costs.per_token_s
        target = tokens_per_fixed * (1 - CHUNK_FIXED_SHARE) / CHUNK_FIXED_SHARE
        target = max(self.allocator.block_size, target)
        num_chunks = round(left / target)
        if num_chunks <= 1:
            return left
        if idle:
            return max(self.allocator.block_size, int(tokens_per_fixed))
        return -(-left // num_chunks)

    def _forget_arrivals(self, now: float) -> None:
        """Drop the arrivals older than ARRIVAL_WINDOW_S seconds."""
        while self._arrivals and now - self._arrivals[0] > ARRIVAL_WINDOW_S:
            self._arrivals.popleft()

    def _arrival_rate(self, now: float) -> float:
        """Sequences arriving per second lately: those of the latest ARRIVAL_WINDOW_S seconds
        but the first, over the time since it (0 with fewer than two)."""
        self._forget_arrivals(now)
        if len(self._arrivals) < 2:
            return 0.0
        return (len(self._arrivals) - 1) / max(now - self._arrivals[0], 1e-3)

    def _prefill_room(self, in_burst: bool, pending: list[Sequence]) -> int:
        """How many prompt tokens this step may run. Under shortest-first, `in_burst` (more
        than one prompt to prefill, or the one left came in a burst: `_in_burst`), with a
        stream decoding that was streaming before the burst arrived: what keeps the step
        within `max_decode_stall` times the decodes alone, predicted from the fitted costs (at
        least a block's worth, so prompts progress). Otherwise the whole budget: a prompt
        that joins running streams alone is prefilled in one step, as under arrival order,
        and a burst beside only the streams it started runs as if unsplit."""
        budget, stall, costs = (
            self.config.max_num_batched_tokens,
            self.config.max_decode_stall,
            self.step_costs,
        )
        if not in_burst or not stall or costs.per_token_s is None:
            return budget
        decoding = [s for s in self.running if s.num_tokens - s.num_computed_tokens == 1]
        if not self._any_streamed_before_burst(decoding, pending):
            return budget
        decode_s = (costs.fixed_s or 0.0) + costs.per_token_s * len(decoding)
        room = int((stall - 1) * decode_s / costs.per_token_s)
        return min(budget, max(self.allocator.block_size, room))

    def _pending_prompts(self) -> list[Sequence]:
        """The prompts still to prefill: running ones mid-prefill, then the waiting ones."""
        running = [s for s in self.running if s.num_tokens - s.num_computed_tokens > 1]
        return running + list(self.waiting)

    @staticmethod
    def _any_streamed_before_burst(decoding: list[Sequence], pending: list[Sequence]) -> bool:
        """Whether one of the decoding streams had its first token before the oldest of the
        `pending` prompts arrived: a whole step ended between them. (A prompt that arrived
        during the step that gave a stream its first token may have come before that token:
        such a stream counts as the burst's own, and the bound does not hold for it.)"""
        if not pending:
            return False
        burst_step = min(s.arrived_step for s in pending)
        return any(
            s.first_token_step is not None and s.first_token_step <= burst_step - 2
            for s in decoding
        )

    @staticmethod
    def _in_burst(pending: list[Sequence]) -> bool:
        """More than one prompt waits or prefills, or the one that does came in a burst."""
        return len(pending) > 1 or any(s.in_burst for s in pending)

    def _first_batch(
        self, taken: list[Sequence], plan: dict[str, int], num_decoding: int
    ) -> list[Sequence]:
        """The leading prompts of `taken` this step runs: the first batch of the partition of
        `taken` (in its order) into consecutive steps that minimizes the sum of their first
        tokens' times, each step predicted at fixed_s + per_token_s * (its prompt tokens +
        its decode rows: `num_decoding` streams and the prompts of the earlier batches).
        Shorter prompts in a step of their own get their first tokens before the longer
        ones' prefill; one more step costs every prompt after it its fixed part. A prompt
        left out keeps its place in the order, where its wait counts against its length:
        shorter newcomers may go before it, and once it has waited its own prefill's time
        it leads."""
        costs = self.step_costs
        if len(taken) < 2 or costs.per_token_s is None or costs.fixed_s is None:
            return taken
        m, per_token = len(taken), costs.per_token_s
        ends = np.cumsum([0] + [plan[s.seq_id] for s in taken], dtype=np.float64)
        # best[j]: the least summed first-token time of taken[j:], counted from their start
        best = np.zeros(m + 1)
        first_end = 0
        for j in range(m - 1, -1, -1):
            step_s = costs.fixed_s + per_token * (num_decoding + j + ends[j + 1 :] - ends[j])
            total = step_s * (m - j) + best[j + 1 :]
            # on a tie the larger batch: fewer steps for the same first tokens
            e = int(m - j - 1 - np.argmin(total[::-1]))
            best[j] = total[e]
            first_end = j + 1 + e
        return taken[:first_end]

    def _add_drafts(self, out: SchedulerOutput) -> None:
        """Give the step's decoding streams the n-gram drafts that pay (quire.engine.ngram_drafts).

        A stream's j-th draft is kept with the estimated chance a**j (a: its drafts' record so
        far, `DraftStats.acceptance`) and costs per_token_s of step time (the fitted costs).
        Drafts are taken best first while the next one's expected tokens per second beat the
        step's as it stands (its sampled rows, plus the expected kept drafts taken, over its
        predicted time): a step bound by its fixed part (few streams) takes every draft worth
        having, a step of many streams few or none. A stream's drafts fit the slots left in
        its last block (its own after this step's append: nothing else is allocated or
        copied), its `max_tokens` and the context. Until the costs are fitted a step's fixed
        part counts as DRAFT_TOKENS_PER_FIXED tokens. A step that runs a prompt's tokens takes
        none: it is bound by arithmetic already, and each draft would delay the prompt's
        first token (or its next chunk) for the streams' sake."""
        if any(s.num_new_tokens > 1 for s in out.scheduled):
            return  # a prompt's chunk: compute-bound, and a draft would delay its first token
        costs = self.step_costs
        fixed, per_token = DRAFT_TOKENS_PER_FIXED, 1.0  # in units of one token's cost
        if costs.per_token_s is not None and costs.fixed_s is not None:
            fixed, per_token = costs.fixed_s, costs.per_token_s
        expected = float(sum(s.samples for s in out.scheduled))
        step_s = fixed + per_token * out.num_tokens
        proposals: dict[int, list[int]] = {}
        candidates: list[tuple[float, int, int]] = []  # (chance kept, draft j, step row)
        for row, s in enumerate(out.scheduled):
            seq = s.seq
            if not s.samples or not self._speculates(seq):  # every row a decode (above)
                continue
            kept = seq.draft_stats.acceptance()
            if kept * step_s <= expected * per_token:
                # not even its first draft could pay (drafts taken only raise the bar): no
                # proposal, and no n-gram index built for it
                continue
            room = self._draft_room(seq)
            if room <= 0:
                continue
            if seq.ngrams is None:
                seq.ngrams = NgramIndex(self.config.ngram_min, self.config.ngram_max)
            drafts = seq.ngrams.propose(seq.token_ids, room)
            if not drafts:
                continue
            proposals[row] = drafts
            candidates += [(kept ** (j + 1), j, row) for j in range(len(drafts))]
        if not candidates:
            return
        candidates.sort(key=lambda c: (-c[0], c[1]))
        budget = self.config.max_num_batched_tokens - out.num_tokens
        # a stream's chances fall with j (its acceptance is below 1), so each of its drafts
        # comes after the one before it: the first not worth it ends the walk
        taken: dict[int, int] = {}
        for chance, j, row in candidates:
            # worth it: chance / per_token > expected / step_s
            if budget <= 0 or chance * step_s <= expected * per_token:
                break
            taken[row] = j + 1
            expected += chance
            step_s += per_token
            budget -= 1
        for row, n in taken.items():
            s = out.scheduled[row]
            out.scheduled[row] = ScheduledSeq(
                s.seq, s.num_computed_tokens, 1 + n, s.sample_indices, tuple(proposals[row][:n])
            )

    @staticmethod
    def _speculates(seq: Sequence) -> bool:
        """Drafts run for one-output requests without a grammar (a grammar's masks follow
        the accepted tokens only; a fork samples one row several times)."""
        params = seq.request.params
        return params.n == 1 and params.structured is None

    def _draft_room(self, seq: Sequence) -> int:
        """How many drafts may follow `seq`'s last token this step: its last block's free
        slots, less what would pass its `max_tokens` or the context (the token sampled
        after the drafts counts too)."""
        room = min(
            self.tables.free_slots(seq.seq_id),  # the allocator has every token of it now
            self.config.num_speculative_tokens,
            seq.request.params.max_tokens - seq.num_output_tokens - 1,
        )
        if self.config.max_model_len:
            room = min(room, self.config.max_model_len - seq.num_tokens - 1)
        return room

    def _pull(self, seq: Sequence, offer: PullOffer) -> int:
        """Tokens copied from a peer into the blocks right after `seq`'s prefix hits."""
        self._pending_released_pins.append(offer.pin_id)
        block_size = self.allocator.block_size
        if self.puller is None or offer.first_block * block_size != seq.num_computed_tokens:
            return 0
        if not self.pull_costs.should_pull():
            self.puller.stats.num_declined += 1
            return 0
        # With several KV groups the offer's ids are every group's of each logical block.
        groups = self.tables.num_groups
        first, count = offer.first_block * groups, len(offer.source_block_ids)
        table = self.tables.get(seq.seq_id)
        started = time.perf_counter()
        num_pulled = self.puller.pull(offer, table[first : first + count]) // groups * block_size
        self.pull_costs.observe_pull(num_pulled, time.perf_counter() - started)
        assert seq.num_computed_tokens + num_pulled < seq.num_tokens, "the last token is computed"
        return num_pulled

    def _load_prefix(self, seq: Sequence) -> int:
        """Tokens the prefix loader wrote after a resumed sequence's prefix hits."""
        if self.prefix_loader is None or seq.request.needs_prompt_logprobs:
            return 0
        table = self.tables.get(seq.seq_id)
        num_loaded = self.prefix_loader.load_prefix(seq.token_ids, table, seq.num_computed_tokens)
        assert seq.num_computed_tokens + num_loaded < seq.num_tokens, "the last token is computed"
        return num_loaded

    @staticmethod
    def _scheduled(seq: Sequence, num_new_tokens: int) -> ScheduledSeq:
        indices: tuple[int, ...] = ()
        if seq.num_computed_tokens + num_new_tokens == seq.num_tokens:
            n = seq.request.params.n
            is_first_of_many = n > 1 and len(seq.request.seqs) == 1
            indices = tuple(range(n)) if is_first_of_many else (seq.index,)
        return ScheduledSeq(seq, seq.num_computed_tokens, num_new_tokens, indices)

    def _requeue(self, seq: Sequence) -> None:
        """Preempted: forget computed KV (what was swapped out may be loaded back on
        re-admission), wait again in arrival order."""
        seq.status = SeqStatus.WAITING
        seq.num_computed_tokens = 0
        seq.num_allocated_tokens = 0
        seq.waiting_since = time.monotonic()
        seq.arrived_step = self.num_steps
        seq.first_token_step = None
        seq.in_burst = False
        position = 0
        while position < len(self.waiting) and self.waiting[position].priority < seq.priority:
            position += 1
        self.waiting.insert(position, seq)
