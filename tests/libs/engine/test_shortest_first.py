"""Shortest-first admission: the fitted step costs, the order, the split of a burst, aging, and
the tokens, which are those of arrival order."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from quire import LLM, SamplingParams
from quire.block.manager import BlockManager
from quire.engine.recent_prefixes import RecentPrefixes
from quire.engine.scheduler import Scheduler
from quire.engine.step_costs import MIN_STEPS, WINDOW, StepCostModel

from .test_scheduler import budgets, make_seq, run_step, scheduler


def shortest(**fields: int) -> Scheduler:
    """A shortest-first scheduler over a roomy pool, step budgets `fields`."""
    return scheduler(budgets(scheduling_policy="shortest", **fields), BlockManager(256, 16))


def fitted(fixed_s: float, per_token_s: float) -> StepCostModel:
    model = StepCostModel()
    for tokens in (8, 64, 200, 512, 16, 1024, 90, 300):
        model.observe(tokens, fixed_s + per_token_s * tokens)
    return model


class FrozenCosts(StepCostModel):
    """Costs set by the test, deaf to the machine's step times."""

    def observe(self, num_tokens: int, seconds: float) -> None:
        pass


def frozen(*costs: float) -> FrozenCosts:
    """Costs (fixed_s, per_token_s) that the steps run in the test do not move."""
    model = FrozenCosts()
    model.fixed_s, model.per_token_s = costs
    return model


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The scheduler's monotonic clock, set by the test: [now]."""
    now = [100.0]
    monkeypatch.setattr("quire.engine.scheduler.time.monotonic", lambda: now[0])
    return now


def test_the_line_is_fitted_from_steps_once_there_are_enough() -> None:
    model = StepCostModel()
    for tokens in (10, 100, 1000, 50, 500, 5, 2000)[: MIN_STEPS - 1]:
        model.observe(tokens, 0.02 + 0.001 * tokens)
    assert not model.fitted
    model.observe(300, 0.02 + 0.001 * 300)
    assert model.per_token_s == pytest.approx(0.001)
    assert model.fixed_s == pytest.approx(0.02)

    same = StepCostModel()
    for _ in range(MIN_STEPS * 2):
        same.observe(64, 0.05)
    assert not same.fitted, "steps of one size cannot tell the fixed cost from the per-token one"


def test_a_window_of_decodes_alone_keeps_the_last_fit() -> None:
    model = fitted(fixed_s=0.02, per_token_s=0.001)
    # a stretch of decode steps, 1-4 rows each, whose times barely grow with their rows
    for i in range(3 * WINDOW):
        rows = 1 + i % 4
        model.observe(rows, 0.015 + 0.00001 * rows)
    # the last fit over a window that still held prompts' steps: a prompt's token, not a
    # decode row's 0.01 ms
    assert model.per_token_s == pytest.approx(0.001, rel=0.1)
    # a prompt's step in the window again: the line follows the latest steps
    model.observe(500, 0.015 + 0.0004 * 500)
    assert model.per_token_s is not None and model.per_token_s < 0.001


def burst(sched: Scheduler, lengths: list[int]) -> None:
    for i, n in enumerate(lengths):
        sched.add(make_seq(f"p{i}", i, n))


def test_a_burst_runs_its_shortest_prompts_first_in_steps_of_their_own() -> None:
    sched = shortest(max_num_batched_tokens=2048)
    # a step's fixed cost of 0.1 s: chunks of about 900 tokens (no prompt here is chunked)
    sched.step_costs = fitted(fixed_s=0.1, per_token_s=0.001)
    burst(sched, [700, 10, 300, 12])
    # Sorted 10, 12, 300, 700, the summed first-token times of each split into steps (a step
    # costs 0.1 s + 1 ms per prompt token and per decode row): 10 and 12 together, then 300,
    # then 700, 2.095 s, least of all (one step for all four: 4.088 s; each alone: 2.386 s)
    steps = [{s.seq.seq_id: s.num_new_tokens for s in run_step(sched).scheduled} for _ in range(3)]
    assert steps == [
        {"p1#0": 10, "p3#0": 12},
        {"p1#0": 1, "p3#0": 1, "p2#0": 300},
        {"p1#0": 1, "p3#0": 1, "p2#0": 1, "p0#0": 700},
    ]


def summed_first_tokens(lengths: list[int], cuts: list[int], costs: tuple[float, float]) -> float:
    """The summed first-token times of prompts of `lengths` run in the steps that `cuts` (the
    ends of the steps) splits them into, idle engine, by the scheduler's cost line."""
    fixed_s, per_token_s = costs
    now, total, start = 0.0, 0.0, 0
    for end in cuts:
        now += fixed_s + per_token_s * (start + sum(lengths[start:end]))
        total += now * (end - start)
        start = end
    return total


@pytest.mark.parametrize("seed", range(12))
def test_a_burst_runs_in_the_steps_of_its_best_split(seed: int) -> None:
    rng = random.Random(seed)
    lengths = rng.sample(range(2, rng.choice((30, 400))), rng.randint(2, 9))  # distinct
    per_token_s = rng.uniform(0.0002, 0.005)
    # a fixed cost of at least 50 tokens': chunks of 450 or more, so no prompt here is chunked
    costs = (per_token_s * rng.uniform(50, 500), per_token_s)
    sched = shortest(max_num_batched_tokens=4096)
    sched.step_costs = frozen(*costs)
    burst(sched, lengths)
    # every split of the sorted burst into consecutive steps, tried one by one
    ordered = sorted(lengths)
    m = len(ordered)
    splits = [[*(i + 1 for i in range(m - 1) if mask >> i & 1), m] for mask in range(2 ** (m - 1))]
    best = min(splits, key=lambda cuts: summed_first_tokens(ordered, cuts, costs))
    steps = []
    while sched.waiting or any(s.num_computed_tokens < s.num_prompt_tokens for s in sched.running):
        out = run_step(sched)
        steps.append(sorted(s.num_new_tokens for s in out.scheduled if s.num_new_tokens > 1))
    assert steps == [ordered[a:b] for a, b in zip([0, *best], best, strict=False)]


def test_a_deferred_prompt_waits_for_shorter_ones_until_it_waited_its_own_prefill(
    clock: list[float],
) -> None:
    now = clock
    sched = shortest(max_num_batched_tokens=4096)
    sched.step_costs = frozen(0.1, 0.001)
    burst(sched, [700, 10])
    out = run_step(sched)  # 10 first: it saves 0.70 s against a step of 0.1 s
    assert [s.seq.seq_id for s in out.scheduled] == ["p1#0"]
    now[0] += 0.1
    for i, n in enumerate([12, 300, 320, 720], start=2):
        sched.add(make_seq(f"p{i}", i, n))
    # The 700 has waited 0.1 s of its 0.7 s: it stands at 0.6 s, after 12, 300 and 320 (its
    # deferral does not promote it). The best split of 12, 300, 320, 700, 720 beside one
    # stream runs 12 and 300 first.
    by_id = {s.seq.seq_id: s.num_new_tokens for s in run_step(sched).scheduled}
    assert by_id == {"p1#0": 1, "p2#0": 12, "p3#0": 300}
    # 0.8 s on, the 700 has waited more than its prefill: it goes no later than a 5-token
    # newcomer (which, fresh, it would follow)
    now[0] += 0.7
    sched.add(make_seq("p6", 6, 5))
    first_step: dict[str, int] = {}
    for step in range(6):
        for s in run_step(sched).scheduled:
            if s.num_new_tokens > 1 or s.seq.num_prompt_tokens == 5:
                first_step.setdefault(s.seq.seq_id, step)
    assert first_step["p0#0"] <= first_step["p6#0"]
    assert first_step["p4#0"] <= first_step["p6#0"]  # the 320: waited longer than its own


def test_no_split_where_one_more_step_costs_more_than_it_saves() -> None:
    sched = shortest(max_num_batched_tokens=2048)
    # A step's fixed cost of 5 s dwarfs what 10-20 tokens cost: one step for all.
    sched.step_costs = fitted(fixed_s=5.0, per_token_s=0.001)
    burst(sched, [20, 10, 15])
    out = run_step(sched)
    assert [s.seq.seq_id for s in out.scheduled] == ["p1#0", "p2#0", "p0#0"]
    assert not sched.waiting


def test_fcfs_and_unmeasured_costs_keep_arrival_order() -> None:
    fcfs = scheduler(
        budgets(max_num_batched_tokens=2048, scheduling_policy="fcfs"), BlockManager(256, 16)
    )
    fcfs.step_costs = fitted(fixed_s=0.02, per_token_s=0.001)
    unmeasured = shortest(max_num_batched_tokens=2048)
    for sched in (fcfs, unmeasured):
        burst(sched, [700, 10, 300, 12])
        out = run_step(sched)
        assert [s.seq.seq_id for s in out.scheduled] == ["p0#0", "p1#0", "p2#0", "p3#0"]


def test_a_long_prompt_that_waited_its_own_prefill_goes_first(clock: list[float]) -> None:
    now = clock
    sched = shortest(max_num_batched_tokens=700)
    sched.step_costs = fitted(fixed_s=0.02, per_token_s=0.001)
    sched.add(make_seq("long", 0, 700))
    now[0] += 0.9
    sched.add(make_seq("short", 1, 10))
    now[0] += 0.1
    # long: 0.7 s of prefill, waited 1.0 s; short: 0.01 s, waited 0.1 s.
    out = run_step(sched)
    assert [s.seq.seq_id for s in out.scheduled] == ["long#0"]

    fresh = shortest(max_num_batched_tokens=700)
    fresh.step_costs = fitted(fixed_s=0.02, per_token_s=0.001)
    fresh.add(make_seq("long", 0, 700))
    fresh.add(make_seq("short", 1, 10))
    out = run_step(fresh)
    assert [s.seq.seq_id for s in out.scheduled][0] == "short#0"


def decoding_then(sched: Scheduler, num_streams: int, later: list[int]) -> None:
    """`num_streams` 20-token prompts prefilled and streaming (a decode step since the last
    first token), then prompts of `later` tokens."""
    burst(sched, [20] * num_streams)
    while sched.waiting:
        run_step(sched)
    run_step(sched)
    assert len(sched.running) == num_streams
    assert all(s.num_tokens - s.num_computed_tokens == 1 for s in sched.running)
    for i, n in enumerate(later):
        sched.add(make_seq(f"later{i}", num_streams + i, n))


def test_a_burst_beside_decoding_streams_is_chunked_to_the_stall_bound() -> None:
    sched = shortest(max_num_batched_tokens=2048, max_decode_stall=4)
    sched.step_costs = frozen(0.02, 0.001)
    decoding_then(sched, 4, [700, 650])
    # The decodes alone: 20 ms + 4 x 1 ms = 24 ms; four times that leaves 72 ms = 72 prompt
    # tokens per step, the shorter prompt first (its last 2 tokens in a step of their own: its
    # first token 70 ms sooner); then five streams (20 + 5 ms) x 3 = 75 tokens of the longer
    # one, which, left last, is still of the burst.
    prompt_tokens: list[int] = []
    while sum(prompt_tokens) < 1350:
        by_id = {s.seq.seq_id: s.num_new_tokens for s in run_step(sched).scheduled}
        assert all(by_id[f"p{i}#0"] == 1 for i in range(4)), "a stream skipped a step"
        if len(prompt_tokens) == 9:
            assert by_id["later1#0"] == 2 and "later0#0" not in by_id
        prompt_tokens.append(sum(n for i, n in by_id.items() if i.startswith("later") and n > 1))
    assert prompt_tokens == [72] * 9 + [2] + [75] * 9 + [25]


def test_a_burst_arriving_during_a_streams_first_step_is_not_bounded_by_it() -> None:
    # One prompt reaches an idle engine and starts a step of its own; the rest of its burst
    # arrives during that step, before (for all the scheduler knows) its first token.
    sched = shortest(max_num_batched_tokens=2048, max_decode_stall=4)
    sched.step_costs = frozen(0.02, 0.001)
    sched.add(make_seq("first", 0, 20))
    run_step(sched)
    sched.add(make_seq("a", 1, 700))
    sched.add(make_seq("b", 2, 650))
    by_id = {s.seq.seq_id: s.num_new_tokens for s in run_step(sched).scheduled}
    # bounded it would be 3 x (20 + 1) = 63 tokens; the split runs the shorter one first,
    # alone, in the chunks of a prompt alone (650 in four)
    assert by_id == {"first#0": 1, "b#0": 163}


def test_a_prompt_alone_is_chunked_and_shorter_arrivals_go_between_its_chunks() -> None:
    # A step's fixed cost of 20 ms is a tenth of a chunk of 180 tokens: a 700-token prompt
    # joining four streams runs in four chunks of 175, bound or no bound.
    for stall in (4, 0):
        sched = shortest(max_num_batched_tokens=2048, max_decode_stall=stall)
        sched.step_costs = frozen(0.02, 0.001)
        decoding_then(sched, 4, [700])
        chunks = [
            {s.seq.seq_id: s.num_new_tokens for s in run_step(sched).scheduled}["later0#0"]
            for _ in range(4)
        ]
        assert chunks == [175] * 4
        assert sched.running[-1].num_tokens - sched.running[-1].num_computed_tokens == 1

    # A 30-token prompt that arrives after the first chunk gets its step before the rest.
    sched = shortest(max_num_batched_tokens=2048, max_decode_stall=0)
    sched.step_costs = frozen(0.02, 0.001)
    decoding_then(sched, 4, [700])
    run_step(sched)
    sched.add(make_seq("short", 9, 30))
    by_id = {s.seq.seq_id: s.num_new_tokens for s in run_step(sched).scheduled}
    assert by_id["short#0"] == 30 and "later0#0" not in by_id
    by_id = {s.seq.seq_id: s.num_new_tokens for s in run_step(sched).scheduled}
    assert (by_id["short#0"], by_id["later0#0"]) == (1, 175)


def after_arrivals(clock: list[float], seconds: float, count: int) -> Scheduler:
    """A shortest-first scheduler (fixed part 20 ms, 1 ms a token) that saw `count` one-token
    requests arrive `seconds` apart, the last just now, and finish."""
    sched = shortest(max_num_batched_tokens=2048)
    sched.step_costs = frozen(0.02, 0.001)
    for i in range(count):
        seq = make_seq(f"gone{i}", 100 + i, 1)
        sched.add(seq)
        sched.finish(seq)
        clock[0] += seconds
    return sched


def test_a_long_prompt_finding_the_engine_idle_runs_a_short_first_chunk(
    clock: list[float],
) -> None:
    sched = after_arrivals(clock, 0.5, 4)  # 2 arrivals a second: 1.4 during its 0.72 s prefill
    sched.add(make_seq("long", 0, 700))
    # one fixed cost's worth of tokens (20 ms / 1 ms): the rest of a burst arriving during
    # that short step is ordered with the 680 left
    assert {s.seq.seq_id: s.num_new_tokens for s in run_step(sched).scheduled} == {"long#0": 20}
    sched.add(make_seq("short", 1, 30))
    assert {s.seq.seq_id: s.num_new_tokens for s in run_step(sched).scheduled} == {"short#0": 30}
    # then the 680 left in chunks of 170, beside the short one's stream
    by_id = {s.seq.seq_id: s.num_new_tokens for s in run_step(sched).scheduled}
    assert by_id == {"short#0": 1, "long#0": 170}

    # a prompt short enough to run whole runs whole, idle engine or not
    sched = after_arrivals(clock, 0.5, 4)
    sched.add(make_seq("one", 0, 250))
    assert {s.seq.seq_id: s.num_new_tokens for s in run_step(sched).scheduled} == {"one#0": 250}


def test_a_long_prompt_runs_whole_where_no_other_is_likely_to_arrive_during_it(
    clock: list[float],
) -> None:
    """One request at a time (an arrival every 3 s: 0.24 expected during a 0.72 s prefill,
    under CHUNK_MIN_ARRIVALS): a long prompt at an idle engine, or joining streams, is
    prefilled in one step; no shorter arrival is likely to need the gaps (the same prompt
    after arrivals half a second apart is chunked: the test above)."""
    sched = after_arrivals(clock, 3.0, 3)
    sched.add(make_seq("long", 0, 700))
    assert {s.seq.seq_id: s.num_new_tokens for s in run_step(sched).scheduled} == {"long#0": 700}
    clock[0] += 3.0
    sched.add(make_seq("next", 1, 700))
    by_id = {s.seq.seq_id: s.num_new_tokens for s in run_step(sched).scheduled}
    assert by_id == {"long#0": 1, "next#0": 700}


def test_recent_prefixes_count_a_prompts_leading_blocks_computed_lately() -> None:
    recent = RecentPrefixes(block_size=16, capacity=8)
    first = make_seq("first", 0, 100)
    first.num_computed_tokens = 100  # 6 full blocks
    recent.record(first)
    again = make_seq("again", 1, 0)
    again.token_ids = first.token_ids[:70] + [5] * 50  # 4 blocks the same, then others
    assert recent.cached_tokens(again) == 64
    whole = make_seq("whole", 2, 0)
    whole.token_ids = first.token_ids[:96]  # every block recorded: its last token computed
    assert recent.cached_tokens(whole) == 95
    assert recent.cached_tokens(make_seq("other", 3, 100)) == 0
    # the oldest blocks go first: the chain's head is lost, and with it the whole prefix
    later = make_seq("later", 4, 80)
    later.num_computed_tokens = 80
    recent.record(later)
    assert recent.cached_tokens(again) == 0


def test_a_conversation_this_engine_computed_goes_by_the_prefill_it_still_needs() -> None:
    sched = shortest(max_num_batched_tokens=4096)
    sched.step_costs = frozen(0.1, 0.001)  # chunks of 900: none here
    burst(sched, [600])
    for _ in range(3):
        run_step(sched)
    (turn,) = sched.running
    sched.finish(turn)
    # the next turn: the first one's 600 tokens and its 3 outputs, then 60 new tokens; and a
    # fresh 100-token prompt that arrived before it
    sched.add(make_seq("fresh", 1, 100))
    follow_up = make_seq("next", 2, 0)
    follow_up.token_ids = [*turn.token_ids, *range(500, 560)]
    sched.add(follow_up)
    # 37 of its blocks (592 tokens) computed here lately: 71 tokens left, fewer than the
    # fresh prompt's 100, so it goes first (by their whole lengths, 663 against 100, it would
    # wait); then the allocator's hits agree and it computes just those 71
    out = run_step(sched)
    assert [(s.seq.seq_id, s.num_new_tokens) for s in out.scheduled][0] == ("next#0", 71)

    # without prefix caching nothing is counted as cached
    plain = shortest(max_num_batched_tokens=4096, enable_prefix_caching=False)
    assert plain.recent_prefixes is None


def test_without_streams_decoding_a_step_takes_its_whole_budget() -> None:
    sched = shortest(max_num_batched_tokens=1000, max_decode_stall=2)
    sched.step_costs = fitted(fixed_s=5.0, per_token_s=0.001)  # no split either
    burst(sched, [600, 700])
    out = run_step(sched)
    assert {s.seq.seq_id: s.num_new_tokens for s in out.scheduled} == {"p0#0": 600, "p1#0": 400}
    # then p1's rest beside p0, a stream of its own burst: no stall bound, the budget's rest
    out = run_step(sched)
    assert {s.seq.seq_id: s.num_new_tokens for s in out.scheduled} == {"p0#0": 1, "p1#0": 300}


def test_a_bound_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_decode_stall"):
        budgets(max_decode_stall=0.5)


def test_greedy_tokens_are_those_of_arrival_order(tiny_model: Path) -> None:
    rng = random.Random(21)
    lengths = [300, 5, 90, 17, 250, 33, 8, 140]
    prompts = [[rng.randrange(3, 1000) for _ in range(n)] for n in lengths]
    params = [SamplingParams(temperature=0, max_tokens=12 + i) for i in range(len(lengths))]
    runs = {}
    for policy in ("fcfs", "shortest"):
        llm = LLM(model=str(tiny_model), dtype="float32", scheduling_policy=policy)
        llm.engine.scheduler.step_costs = frozen(0.002, 0.001)
        admitted: list[str] = []
        schedule = llm.engine.scheduler.schedule

        def recording(schedule=schedule, admitted=admitted):  # type: ignore[no-untyped-def]
            out = schedule()
            admitted.extend(out.first_scheduled)
            return out

        llm.engine.scheduler.schedule = recording  # type: ignore[method-assign]
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        arrival_order = [o.request_id for o in outputs]
        runs[policy] = ([o.outputs[0].token_ids for o in outputs], admitted, arrival_order)
    fcfs_tokens, fcfs_order, arrivals = runs["fcfs"]
    shortest_tokens, shortest_order, shortest_arrivals = runs["shortest"]
    assert shortest_tokens == fcfs_tokens
    assert fcfs_order == arrivals
    by_length = sorted(shortest_arrivals, key=lambda rid: lengths[shortest_arrivals.index(rid)])
    assert shortest_order == by_length, "shortest-first did not admit the burst by length"
