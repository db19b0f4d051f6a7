"""The scheduler's side of swapping: preempted blocks out, loaded tokens counted as computed."""

from __future__ import annotations

from collections.abc import Sequence as Seq

from quire.block.manager import BlockManager
from quire.engine.scheduler import Scheduler
from tests.libs.engine.test_scheduler import budgets, make_seq, run_step, scheduler


class FakeLoader:
    """Loads `num_blocks` blocks after the prefix hits of every resume it is asked about."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.calls: list[tuple[int, list[int], int]] = []

    def load_prefix(self, token_ids: Seq[int], block_ids: Seq[int], num_cached_tokens: int) -> int:
        self.calls.append((len(token_ids), list(block_ids), num_cached_tokens))
        return self.num_blocks * 4


def preempt_b(loader: FakeLoader) -> tuple[Scheduler, list[int]]:
    """Two 7-token prompts in 4 blocks of 4 tokens: b is preempted at 8 computed tokens.

    Returns the scheduler and b's table as it was before the preempting step."""
    sched = scheduler(
        budgets(max_num_seqs=4, max_num_batched_tokens=100),
        BlockManager(4, 4, enable_prefix_caching=False),
    )
    sched.prefix_loader = loader
    a, b = make_seq("a", 0, 7), make_seq("b", 1, 7)
    sched.add(a)
    sched.add(b)
    run_step(sched)
    run_step(sched)
    table = list(sched.tables.get("b#0"))
    out = run_step(sched)  # both need a third block: b is preempted
    assert [s.seq_id for s in out.preempted] == ["b#0"]
    # Its two full computed blocks (8 tokens), from the table before the step.
    assert out.preempted_blocks == {"b#0": table[:2]}
    assert loader.calls == [], "first admissions load nothing"
    sched.finish(a)
    return sched, table


def test_loaded_tokens_count_as_computed() -> None:
    loader = FakeLoader(num_blocks=2)
    sched, _ = preempt_b(loader)
    out = run_step(sched)  # b comes back: 9 tokens, 3 blocks, no prefix hits
    (resumed,) = out.scheduled
    assert resumed.seq.seq_id == "b#0"
    ((num_tokens, block_ids, num_cached),) = loader.calls
    assert (num_tokens, num_cached) == (9, 0)
    assert block_ids == sched.tables.get("b#0") and len(block_ids) == 3
    # 8 tokens loaded: only the 9th is computed, and it samples.
    assert (resumed.num_computed_tokens, resumed.num_new_tokens) == (8, 1)
    assert resumed.samples


def test_loaded_tokens_shorten_a_chunked_resume() -> None:
    loader = FakeLoader(num_blocks=1)
    sched, _ = preempt_b(loader)
    sched.config = budgets(max_num_seqs=4, max_num_batched_tokens=3)
    out = run_step(sched)
    (resumed,) = out.scheduled
    # 4 tokens loaded, then chunks of the 3-token budget: 4..7, then 7..9.
    assert (resumed.num_computed_tokens, resumed.num_new_tokens) == (4, 3)
    assert not resumed.samples
    out = run_step(sched)
    (resumed,) = out.scheduled
    assert (resumed.num_computed_tokens, resumed.num_new_tokens) == (7, 2)
    assert resumed.samples


def test_without_a_loader_a_resume_recomputes() -> None:
    loader = FakeLoader(num_blocks=2)
    sched, _ = preempt_b(loader)
    sched.prefix_loader = None
    (resumed,) = run_step(sched).scheduled
    assert (resumed.num_computed_tokens, resumed.num_new_tokens) == (0, 9)
    assert loader.calls == []
