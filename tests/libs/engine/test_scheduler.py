"""Scheduler budgets, chunking, FCFS and preemption order, with a real block manager."""

from __future__ import annotations

from typing import Any

from quire.block.allocator import StepAllocation, StepAllocationResult
from quire.block.manager import BlockManager
from quire.block.tables import BlockTables
from quire.config import EngineConfig
from quire.engine.model_runner import ModelRunnerOutput, SampledToken
from quire.engine.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from quire.engine.sequence import Request, Sequence
from quire.engine.update import StopRules, update_from_output
from quire.sampling_params import SamplingParams

RULES = StopRules(eos_token_ids=frozenset({2}), max_model_len=4096)


def budgets(**fields: Any) -> SchedulerConfig:
    """The engine's step budgets: its defaults, `fields` changed."""
    return SchedulerConfig.of(EngineConfig(model="unused", **fields))


def scheduler(config: SchedulerConfig, manager: BlockManager) -> Scheduler:
    """A scheduler over `manager`, its block tables held where a model runner would."""
    return Scheduler(config, manager, BlockTables(manager.block_size))


def make_seq(name: str, arrival: int, prompt_len: int, **params: Any) -> Sequence:
    ids = list(range(10 + arrival * 1000, 10 + arrival * 1000 + prompt_len))
    request = Request(name, None, ids, SamplingParams(**{"max_tokens": 100, **params}), arrival)
    seq = Sequence(f"{name}#0", request, 0, list(ids), arrival)
    request.seqs.append(seq)
    return seq


def run_step(scheduler: Scheduler, token_id: int = 7) -> SchedulerOutput:
    """Pretend the forward pass sampled `token_id` wherever due; apply it with the real update."""
    out = scheduler.schedule()
    sampled = [
        SampledToken(s.seq, index, token_id, -1.0, None)
        for s in out.scheduled
        for index in s.sample_indices
    ]
    update_from_output(scheduler, out, ModelRunnerOutput(sampled, 0.0, 0.0), RULES)
    return out


def test_token_budget_chunks_prefill_and_decodes_go_first() -> None:
    sched = scheduler(budgets(max_num_seqs=8, max_num_batched_tokens=40), BlockManager(64, 16))
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
    sched = scheduler(budgets(max_num_seqs=2, max_num_batched_tokens=1000), BlockManager(64, 16))
    for i in range(4):
        sched.add(make_seq(f"r{i}", i, 5))
    out = run_step(sched)
    assert [s.seq.seq_id for s in out.scheduled] == ["r0#0", "r1#0"]
    assert [s.seq_id for s in sched.waiting] == ["r2#0", "r3#0"]


def test_preemption_takes_latest_arrival_and_requeues_it_first() -> None:
    # 4 blocks of 4 tokens: two sequences of 7 tokens fill 4 blocks after one decode each.
    sched = scheduler(budgets(max_num_seqs=4, max_num_batched_tokens=100), BlockManager(4, 4))
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


def one_step_of_a(manager: BlockManager) -> tuple[Scheduler, Sequence]:
    """A scheduler over `manager` after one step of a 9-token prompt "a" (3 blocks)."""
    sched = scheduler(budgets(), manager)
    a = make_seq("a", 0, 9)
    sched.add(a)
    run_step(sched)
    return sched, a


def test_finished_sequences_are_freed_by_the_next_call() -> None:
    manager = BlockManager(16, 4)
    sched, a = one_step_of_a(manager)
    assert manager.stats().num_blocks_used == 3
    sched.finish(a)
    sched.flush()
    assert manager.stats().num_blocks_used == 0
    # Its two full, computed blocks stay findable by hash.
    assert manager.stats().num_blocks_cached == 2
    manager.check_integrity()


def test_flush_ships_frees_without_admitting_anyone() -> None:
    manager = BlockManager(16, 4)
    sched, a = one_step_of_a(manager)
    waiting = make_seq("w", 1, 5)
    sched.add(waiting)
    sched.finish(a)
    sched.flush()
    assert manager.stats().num_blocks_used == 0
    assert [s.seq_id for s in sched.waiting] == ["w#0"] and not sched.running


def test_update_forks_n_outputs_on_the_first_token_and_shares_blocks() -> None:
    manager = BlockManager(16, 4)
    sched = scheduler(budgets(), manager)
    seq = make_seq("f", 0, 6, n=3)
    sched.add(seq)
    out = run_step(sched)
    assert out.first_scheduled == ["f"]
    assert [s.sample_indices for s in out.scheduled] == [(0, 1, 2)]
    request = seq.request
    assert [s.seq_id for s in request.seqs] == ["f#0", "f#1", "f#2"]
    assert all(s.token_ids == seq.token_ids for s in request.seqs)
    out = run_step(sched)  # the forks reach the allocator with this call
    assert out.first_scheduled == []
    assert sorted(s.seq.seq_id for s in out.scheduled) == ["f#0", "f#1", "f#2"]
    assert all(s.sample_indices == (s.seq.index,) for s in out.scheduled)
    # The full first block is shared by all three; each wrote its own partial second block.
    tables = [sched.tables.get(s.seq.seq_id) for s in out.scheduled]
    assert len({t[0] for t in tables}) == 1 and len({t[1] for t in tables}) == 3
    manager.check_integrity()


def test_update_stops_on_eos_stop_token_and_length() -> None:
    manager = BlockManager(16, 4)
    sched = scheduler(budgets(), manager)
    eos, stop_id = make_seq("e", 0, 5), make_seq("s", 1, 5, stop_token_ids=[9])
    length = make_seq("l", 2, 5, max_tokens=2)
    for s in (eos, stop_id, length):
        sched.add(s)
    out = sched.schedule()
    tokens = {"e#0": 2, "s#0": 9, "l#0": 5}
    sampled = [SampledToken(s.seq, 0, tokens[s.seq.seq_id], -0.5, None) for s in out.scheduled]
    deltas = update_from_output(sched, out, ModelRunnerOutput(sampled, 0.0, 0.0), RULES)
    by_id = {d.request_id: d for d in deltas}
    assert by_id["e"].outputs[0].finish_reason == "stop" and by_id["e"].finished
    assert by_id["s"].outputs[0].stop_reason == 9 and by_id["s"].finished
    assert by_id["l"].outputs[0].finish_reason is None and not by_id["l"].finished
    assert by_id["l"].outputs[0].new_token_ids == [5]
    assert by_id["l"].outputs[0].cumulative_logprob == -0.5
    run_step(sched)
    assert length.finish_reason == "length" and not sched.running
    sched.flush()
    assert manager.stats().num_blocks_used == 0


class RecordingManager(BlockManager):
    """A BlockManager that keeps every request it was sent."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.requests: list[StepAllocation] = []

    def step(self, request: StepAllocation) -> StepAllocationResult:
        self.requests.append(request)
        return super().step(request)


def test_commits_are_sent_when_a_block_fills_and_prefix_hits_still_happen() -> None:
    manager = RecordingManager(64, 4)
    sched = scheduler(budgets(max_num_seqs=4, max_num_batched_tokens=100), manager)
    a = make_seq("a", 0, 6, max_tokens=8)
    sched.add(a)
    for _ in range(8):
        run_step(sched)
    commits = [c.num_computed_tokens for r in manager.requests for c in r.commits]
    # Computed 6 (1 full block), 7, 8 (2), 9, ..., 12 (3), 13: one commit per new full block.
    assert commits == [6, 8, 12]
    table = list(sched.tables.get(a.seq_id))
    assert table == manager.block_table("a#0")
    sched.finish(a)
    sched.flush()
    # A prompt repeating a's first 12 tokens hits its 3 committed blocks.
    b = make_seq("b", 1, 13)
    b.token_ids[:] = a.token_ids[:12] + [5]
    sched.add(b)
    out = sched.schedule()
    assert b.num_computed_tokens == 12
    assert sched.tables.get(out.scheduled[0].seq.seq_id)[:3] == table[:3]
