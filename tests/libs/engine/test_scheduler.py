"""Scheduler budgets, chunking, FCFS and preemption order, with a real block manager."""

from __future__ import annotations

from quire.block.manager import BlockManager
from quire.engine.detokenizer import IncrementalDetokenizer
from quire.engine.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from quire.engine.sequence import Request, Sequence
from quire.sampling_params import SamplingParams


class NullTokenizer:
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return ""


def make_seq(name: str, arrival: int, prompt_len: int) -> Sequence:
    ids = list(range(10 + arrival * 1000, 10 + arrival * 1000 + prompt_len))
    request = Request(name, None, ids, SamplingParams(max_tokens=100), arrival)
    seq = Sequence(
        seq_id=f"{name}#0",
        request=request,
        index=0,
        token_ids=list(ids),
        arrival=arrival,
        detokenizer=IncrementalDetokenizer(NullTokenizer(), ids, True),
    )
    request.seqs.append(seq)
    return seq


def run_step(scheduler: Scheduler) -> SchedulerOutput:
    """Pretend the forward pass ran: advance computed counts, sample token 7 where due."""
    out = scheduler.schedule()
    for s in out.scheduled:
        s.seq.num_computed_tokens += s.num_new_tokens
        scheduler.commit(s.seq)
        if s.samples:
            s.seq.token_ids.append(7)
    return out


def test_token_budget_chunks_prefill_and_decodes_go_first() -> None:
    sched = Scheduler(
        SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=40), BlockManager(64, 16)
    )
    a, b = make_seq("a", 0, 30), make_seq("b", 1, 50)
    sched.add(a)
    sched.add(b)
    out = run_step(sched)
    assert [(s.seq.seq_id, s.num_new_tokens) for s in out.scheduled] == [("a#0", 30), ("b#0", 10)]
    out = run_step(sched)
    # a decodes one token; b continues its chunk with the rest of the budget.
    assert [(s.seq.seq_id, s.num_new_tokens) for s in out.scheduled] == [("a#0", 1), ("b#0", 39)]
    out = run_step(sched)
    assert [(s.seq.seq_id, s.num_new_tokens) for s in out.scheduled] == [("a#0", 1), ("b#0", 1)]
    assert all(s.samples for s in out.scheduled)


def test_max_num_seqs_caps_running() -> None:
    sched = Scheduler(
        SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=1000), BlockManager(64, 16)
    )
    for i in range(4):
        sched.add(make_seq(f"r{i}", i, 5))
    out = run_step(sched)
    assert [s.seq.seq_id for s in out.scheduled] == ["r0#0", "r1#0"]
    assert [s.seq_id for s in sched.waiting] == ["r2#0", "r3#0"]


def test_preemption_takes_latest_arrival_and_requeues_it_first() -> None:
    # 4 blocks of 4 tokens: two sequences of 7 tokens fill 4 blocks after one decode each.
    sched = Scheduler(
        SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=100), BlockManager(4, 4)
    )
    a, b, c = make_seq("a", 0, 7), make_seq("b", 1, 7), make_seq("c", 2, 3)
    for s in (a, b, c):
        sched.add(s)
    run_step(sched)  # admits a and b (2 blocks each); c does not fit
    assert [s.seq_id for s in sched.waiting] == ["c#0"]
    run_step(sched)  # both at 8 tokens: still 2 blocks each
    out = run_step(sched)  # both need a third block: b (latest) is preempted
    assert [s.seq_id for s in out.preempted] == ["b#0"]
    assert [s.seq_id for s in sched.waiting] == ["b#0", "c#0"]
    assert b.num_computed_tokens == 0 and len(b.token_ids) == 9
    assert sched.num_preemptions == 1


def test_finished_sequences_are_freed_by_the_next_call() -> None:
    manager = BlockManager(16, 4)
    sched = Scheduler(SchedulerConfig(), manager)
    a = make_seq("a", 0, 9)
    sched.add(a)
    run_step(sched)
    assert manager.stats().num_blocks_used == 3
    sched.finish(a)
    sched.flush()
    assert manager.stats().num_blocks_used == 0
    # Its two full, computed blocks stay findable by hash.
    assert manager.stats().num_blocks_cached == 2
    manager.check_integrity()
