"""What one engine step did and what the engine holds: the records metrics and benchmarks read.

`StepStats` is built once per step by `LLMEngine.step` from the scheduler's step object, the
model runner's output and the clocks around each part; nobody has to reach into the engine's
queues or patch its methods to learn what a step cost.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from quire.block.allocator import AllocatorStats
from quire.cache.block_transfer import PullStats

if TYPE_CHECKING:
    from quire.engine.model_runner import ModelRunnerOutput
    from quire.engine.scheduler import SchedulerOutput


@dataclass(frozen=True, slots=True)
class SwapStats:
    """KV blocks moved by preemption in swap mode (quire.engine.swap), and the host pool."""

    num_blocks_out: int  # blocks copied to the host pool from preempted sequences
    num_blocks_in: int  # blocks loaded back into resumed sequences (host hits)
    num_blocks_missed: int  # full blocks a resume looked for and had to recompute
    num_bytes_out: int
    num_bytes_in: int
    host_bytes_used: int  # held in the host pool (after the step, for a step's stats)
    host_bytes_capacity: int  # the pool's size (0: swapping is off)


NO_SWAP = SwapStats(0, 0, 0, 0, 0, 0, 0)  # an engine that recomputes preempted sequences


@dataclass(frozen=True, slots=True)
class StepStats:
    """One engine step: the work scheduled, the pool's answer and where the time went."""

    num_scheduled_seqs: int  # sequences that ran tokens through the model
    num_prefill_tokens: int  # tokens of sequences still catching up (prompt, recompute)
    num_decode_tokens: int  # one per sequence that was already caught up (its drafts aside)
    num_sampled: int  # logit rows sampled (n>1 forks sample one row several times)
    attended_context_tokens: int  # sum over computed tokens of the context each attends to
    num_preempted: int  # sequences preempted to make room (recompute or swap)
    num_not_admitted: int  # waiting sequences the pool could not take this step
    num_running: int  # after scheduling
    num_waiting: int  # after scheduling
    num_kv_tokens: int  # tokens the running sequences hold KV slots for, after allocation
    first_scheduled: tuple[str, ...]  # request ids that ran for the first time this step
    schedule_s: float  # the scheduler's decision, the allocator call included
    allocator_s: float  # the one allocator call (in process or the memory manager's RPC)
    forward_s: float  # block copies, input building and the model's forward pass
    sample_s: float  # sampling and logprobs
    update_s: float  # appending tokens, forks, stops and the step's deltas
    swap: SwapStats = NO_SWAP  # KV swapped out (preemptions) and in (resumes) this step
    pull: PullStats = field(default_factory=PullStats)  # blocks copied from peers this step
    num_draft_tokens: int = 0  # n-gram drafts run after decoding streams' last tokens
    num_kept_drafts: int = 0  # of them, kept (each one more token out of the step)

    @property
    def num_scheduled_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens + self.num_draft_tokens

    @property
    def is_pool_refusing(self) -> bool:
        """The pool turned work away this step (an admission refused or a preemption)."""
        return bool(self.num_preempted or self.num_not_admitted)

    @property
    def total_s(self) -> float:
        return self.schedule_s + self.forward_s + self.sample_s + self.update_s


@dataclass(frozen=True, slots=True)
class EngineStats:
    """Counters for dashboards and tests (prefix-cache figures in tokens)."""

    allocator: AllocatorStats
    num_running: int
    num_waiting: int
    num_preemptions: int
    num_steps: int
    num_generated_tokens: int
    swap: SwapStats = NO_SWAP  # totals since the engine started, and the host pool now
    pull: PullStats = field(default_factory=PullStats)  # blocks copied from peers, totals
    num_draft_tokens: int = 0  # n-gram drafts run since the engine started
    num_kept_drafts: int = 0  # of them, kept


def step_stats(
    step: SchedulerOutput,
    output: ModelRunnerOutput,
    occupancy: tuple[int, int, int],
    times: tuple[float, float, float],
    swap: SwapStats = NO_SWAP,
    pull: PullStats | None = None,
) -> StepStats:
    """`occupancy`: running, waiting and KV-holding tokens after scheduling; `times`: the
    schedule, execute and update parts' wall seconds; `swap`: what the step swapped."""
    num_decode = num_prefill = num_drafts = attended = 0
    for s in step.scheduled:
        c, n = s.num_computed_tokens, s.num_new_tokens
        if s.draft_token_ids:
            num_decode += 1
            num_drafts += n - 1
        elif n == 1 and c >= s.seq.num_prompt_tokens:
            num_decode += 1
        else:
            num_prefill += n
        attended += n * (2 * c + n + 1) // 2  # sum of (p + 1) over positions c .. c+n-1
    num_running, num_waiting, num_kv_tokens = occupancy
    schedule_s, execute_s, update_s = times
    return StepStats(
        num_scheduled_seqs=len(step.scheduled),
        num_prefill_tokens=num_prefill,
        num_decode_tokens=num_decode,
        num_sampled=len(output.sampled),
        attended_context_tokens=attended,
        num_preempted=len(step.preempted),
        num_not_admitted=step.num_not_admitted,
        num_running=num_running,
        num_waiting=num_waiting,
        num_kv_tokens=num_kv_tokens,
        first_scheduled=tuple(step.first_scheduled),
        schedule_s=schedule_s,
        allocator_s=step.allocator_s,
        forward_s=execute_s - output.sample_s,
        sample_s=output.sample_s,
        update_s=update_s,
        swap=swap,
        pull=pull or PullStats(),
        num_draft_tokens=num_drafts,
        num_kept_drafts=sum(output.num_kept_drafts.values()),
    )
